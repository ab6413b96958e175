"""Trainer backends of the outer loop (ait.outer.types.TrainerBackend): local and tinker."""

from __future__ import annotations

import inspect
from typing import Any

from ait.outer.config import OuterConfig


def make_backend(config: OuterConfig) -> Any:
    """The backend `[trainer] backend` names, warm-started from `[policy] init_checkpoint` if set."""
    if config.trainer.backend == "local":
        from ait.outer.backends.local import LocalBackend

        return LocalBackend(config)  # loads init_checkpoint itself
    from ait.outer.backends.tinker import TinkerBackend

    p = config.policy
    # seed=None: a fixed sampler seed would give every episode of a group the same replies.
    backend = TinkerBackend(p.model, lora_rank=config.trainer.lora_r, learning_rate=config.trainer.learning_rate,
                            temperature=p.temperature, max_new_tokens=p.max_new_tokens, max_context=p.max_context,
                            seed=None)
    if p.init_checkpoint:
        backend.load(p.init_checkpoint)
    return backend


def episode_policy(backend: Any, *, seed: int | None = None, temperature: float | None = None) -> Any:
    """A fresh policy for one episode from `backend.policy()`, passing the seed and a temperature
    override where the backend takes them (a policy without a `temperature` parameter gets the
    attribute set: every HFPolicy-derived policy samples at `self.temperature`)."""
    params = inspect.signature(backend.policy).parameters
    kwargs: dict[str, Any] = {}
    if seed is not None and "seed" in params:
        kwargs["seed"] = seed
    if temperature is not None and "temperature" in params:
        kwargs["temperature"] = temperature
    policy = backend.policy(**kwargs)
    if temperature is not None and "temperature" not in params:
        policy.temperature = temperature
        if isinstance(getattr(policy, "settings", None), dict):
            policy.settings["temperature"] = temperature
    return policy
