"""Trainer backends of the outer loop (ait.outer.types.TrainerBackend): local and tinker."""

from __future__ import annotations

import inspect
from typing import Any

from ait.outer.config import OuterConfig
from ait.outer.types import TrainerBackend


def make_backend(config: OuterConfig) -> TrainerBackend:
    """The backend `[trainer] backend` names, warm-started from `[policy] init_checkpoint` if set."""
    if config.trainer.backend == "local":
        from ait.outer.backends.local import LocalBackend

        return LocalBackend(config)  # loads init_checkpoint itself
    from ait.outer.backends.tinker import TinkerBackend

    # Configured from the whole OuterConfig ([policy] model / temperature / max_new_tokens /
    # max_context / init_checkpoint, [trainer] lora_r / learning_rate / ...); it warm-starts itself
    # from init_checkpoint. Sampling seeds come per episode (GroupSampler), never one fixed seed.
    return TinkerBackend(config)


def episode_policy(backend: TrainerBackend, *, seed: int | None = None, temperature: float | None = None) -> Any:
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
