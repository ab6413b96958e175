"""The sampling engine: batched requests from concurrent episodes, each reply depending on its own seed
(not on its batch-mates), logprobs that a forward pass of the training model reproduces."""

from __future__ import annotations

import threading

import pytest
import torch

from ait.harness.tools import TOOL_SCHEMAS
from ait.harness.types import Message
from ait.outer.backends.local import LocalBackend
from ait.outer.backends.loss import completion_logprobs
from ait.outer.config import OuterConfig


@pytest.fixture(scope="module")
def backend() -> LocalBackend:
    b = LocalBackend(OuterConfig(policy={"model": "tiny", "max_new_tokens": 24, "sample_batch_size": 8},
                                 trainer={"device": "cpu", "lora_r": 4, "lora_alpha": 8}))
    yield b
    b.close()


def reply(backend: LocalBackend, seed: int, text: str, temperature: float | None = None) -> Message:
    policy = backend.policy(seed=seed, temperature=temperature)
    policy.reset(None)
    return policy.act([Message(role="user", content=text)], TOOL_SCHEMAS)


def test_concurrent_episodes_are_batched_and_seeded(backend: LocalBackend) -> None:
    prompts = ["hello", "a much longer message " * 5, "read INSTRUCTIONS.md", "x"]
    alone = [reply(backend, seed, text) for seed, text in enumerate(prompts)]
    batches = backend.engine.batches
    together: list[Message | None] = [None] * len(prompts)

    def run(i: int) -> None:
        together[i] = reply(backend, i, prompts[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert backend.engine.batches - batches < len(prompts)  # some requests shared a batch
    for a, b in zip(alone, together):
        assert a.tokens.completion_ids == b.tokens.completion_ids  # the seed decides, not the batch-mates
        assert a.tokens.logprobs == pytest.approx(b.tokens.logprobs, abs=1e-4)
    assert len({tuple(m.tokens.completion_ids) for m in alone}) > 1  # different seeds, different replies
    for m in together:
        t = m.tokens
        assert 1 <= len(t.completion_ids) <= 24 and m.usage.completion_tokens == len(t.completion_ids)
        with torch.no_grad():
            replay = completion_logprobs(backend.model, t.prompt_ids, t.completion_ids, t.temperature)
        assert replay.tolist() == pytest.approx(t.logprobs, abs=2e-3)


def test_greedy_and_temperature(backend: LocalBackend) -> None:
    a, b = reply(backend, 1, "hi", temperature=0.0), reply(backend, 2, "hi", temperature=0.0)
    assert a.tokens.completion_ids == b.tokens.completion_ids and a.tokens.temperature == 0.0
    hot = reply(backend, 3, "hi", temperature=1.7).tokens
    with torch.no_grad():
        replay = completion_logprobs(backend.model, hot.prompt_ids, hot.completion_ids, 1.7)
    assert replay.tolist() == pytest.approx(hot.logprobs, abs=2e-3)
