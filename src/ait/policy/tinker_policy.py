"""Tinker's sampler as a policy, recording what the outer loop needs to train it.

The same turn as the local HF policy (`HFPolicy`, whose rendering, context fitting and
tool-call parsing it reuses): render the conversation with the base model's chat template,
sample one reply, parse tool calls. Only the sampling differs: the tokens and their logprobs
come from a `tinker.SamplingClient` bound to one published version of the weights, so an
episode started with version v samples every turn from v. The sampler applies no top-k /
top-p (the recorded logprobs are those of the distribution sampled from).

Usage carries no USD: the meter prices the call from the price table under the base model's
name (add it to AIT_HOME/prices.toml to meter Tinker's per-token price), else counts it as
unpriced, rather than calling a billed service free.
"""

from __future__ import annotations

import threading
from typing import Any

from ait.harness.types import Message
from ait.policy.hf_policy import HFPolicy
from ait.spec import TaskSpec

DEFAULT_CONTEXT = 32768
"""Context assumed when the tokenizer declares none smaller (Tinker serves at least this)."""


class TinkerPolicy(HFPolicy):
    """A policy sampling through a Tinker SamplingClient (one weights version per instance)."""

    def __init__(self, sampling_client: Any, tokenizer: Any, *, base_model: str, version: int = 0,
                 temperature: float = 1.0, max_new_tokens: int = 1024, max_context: int | None = None,
                 seed: int | None = None, tokenizer_lock: Any = None):
        """`tokenizer` must have been through ait.chat.renderers.prepare_tokenizer; `tokenizer_lock` is
        shared by the policies of one tokenizer (a fast tokenizer is not safe across threads)."""
        self.client = sampling_client
        self.tokenizer = tokenizer
        self.tokenizer_lock = tokenizer_lock or threading.Lock()
        self.base_model = base_model
        self.version = version
        """Optimizer steps the weights it samples from had taken (the episode's policy_version)."""
        self.name = f"tinker:{base_model}"
        self.temperature, self.max_new_tokens, self.seed = temperature, max_new_tokens, seed
        declared = getattr(tokenizer, "model_max_length", None)
        sane = declared if isinstance(declared, int) and 0 < declared < DEFAULT_CONTEXT else DEFAULT_CONTEXT
        self.max_context = max_context or sane
        eos = getattr(tokenizer, "eos_token_id", None)
        self.stop = [int(eos)] if isinstance(eos, int) else None  # None: the server's own end-of-sequence
        self.settings = {"model": base_model, "backend": "tinker", "version": version, "temperature": temperature,
                         "max_new_tokens": max_new_tokens, "max_context": self.max_context, "seed": seed}
        self.turn = 0
        self.calls = 0

    def reset(self, spec: TaskSpec) -> None:
        self.turn = self.calls = 0  # the same seed samples the same episode

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        reply = HFPolicy.act(self, messages, tools)
        usage = reply.usage.model_copy(update={"model": self.base_model, "usd": None, "usd_source": None})
        return reply.model_copy(update={"usage": usage})

    def render(self, messages: list[Message], tools: list[dict[str, Any]]) -> list[int]:
        with self.tokenizer_lock:
            return HFPolicy.render(self, messages, tools)

    def parse(self, prompt_ids: list[int], ids: list[int], tools: list[dict[str, Any]]):
        with self.tokenizer_lock:
            return HFPolicy.parse(self, prompt_ids, ids, tools)

    def sample(self, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
        import tinker

        self.calls += 1
        params = tinker.SamplingParams(max_tokens=self.max_new_tokens, temperature=self.temperature, stop=self.stop,
                                       seed=None if self.seed is None else (self.seed * 1_000_003 + self.calls) % 2**31)
        response = self.client.sample(prompt=tinker.ModelInput.from_ints(prompt_ids), num_samples=1,
                                      sampling_params=params).result()
        sequence = response.sequences[0]
        if sequence.logprobs is None:
            raise RuntimeError(f"{self.name}: the sampler returned no logprobs; they are needed to train on the reply")
        return [int(t) for t in sequence.tokens], [float(x) for x in sequence.logprobs]
