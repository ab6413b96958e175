"""Sampling the agent for many concurrent episodes from one in-memory model.

    SamplingEngine   (ait.train.decode_batch) one thread owns the sampling model and drives the
                     decoding engine (ait.train.decode: static KV cache, continuous batching, CUDA
                     graphs on a GPU); episodes' requests join the running batch at the next decode
                     step and leave when their reply ends; `refresh` swaps in new weights once the
                     running rows end
    EnginePolicy     an HFPolicy (render, fit, parse, TokenTrace) whose `sample` goes through
                     the engine, with its own seeded generator: an episode's replies depend on
                     its seed and the weights, not on which other episodes shared its batch
                     (a row draws from its generator only while it generates, so this holds
                     from turn to turn too)

The recorded logprobs are exactly those of the distribution sampled from: the model's logits at
the sampling temperature, no top-k / top-p. Greedy (temperature 0) records logprobs at
temperature 1, as HFPolicy does.
"""

from __future__ import annotations

from ait.policy.hf_policy import HFPolicy
from ait.train.decode import Request
from ait.train.decode_batch import SamplingEngine, eos_ids

__all__ = ["EnginePolicy", "Request", "SamplingEngine", "eos_ids"]


class EnginePolicy(HFPolicy):
    """An HFPolicy for one episode, sampling through a shared engine with its own seed."""

    def __init__(self, engine: SamplingEngine, model_name: str, *, temperature: float, max_new_tokens: int,
                 seed: int, max_context: int | None = None):
        super().__init__(model_name, temperature=temperature, max_new_tokens=max_new_tokens,
                         max_context=max_context, seed=seed, loaded=(engine.model, engine.tokenizer), engine=engine)
        self.settings["engine_version"] = engine.version
