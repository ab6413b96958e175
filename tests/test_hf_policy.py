"""The local Hugging Face policy with the tiny model: a full episode whose trajectory carries token
ids and logprobs that a forward pass reproduces, tool-call parsing, and a context that outgrows
the model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from fakes import TASK, fake_executor, ok_result

from ait.evals.baselines import BaselineStore
from ait.harness.episode import SYSTEM, run_episode
from ait.harness.tools import TOOL_SCHEMAS
from ait.harness.types import EpisodeConfig, Message, PolicyStop, StopReason, ToolCallRequest
from ait.metering import Ledger
from ait.policy.base import make_policy
from ait.policy.hf_policy import HFPolicy
from ait.spec import load_spec


@pytest.fixture(scope="module")
def tiny() -> HFPolicy:
    policy = make_policy("hf:tiny", temperature=1.0, max_tokens=40)
    assert isinstance(policy, HFPolicy) and policy.name == "hf:tiny"
    return policy


def replay_logprobs(policy: HFPolicy, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = policy.model(ids).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0].tolist()


def test_tiny_model_drives_a_full_episode(tiny: HFPolicy, tmp_path) -> None:
    executor = fake_executor(ok_result())  # should it ever submit a valid job, nothing trains
    result = run_episode(load_spec(TASK), TASK, tiny, EpisodeConfig(max_turns=3, max_nudges=1),
                         runs_dir=tmp_path / "runs", baselines=BaselineStore(tmp_path / "b.json"), executor=executor)
    assert result.stop_reason in (StopReason.no_submission, StopReason.turn_cap), result.error
    assert result.reward.total <= 0.0  # an untrained random model earns nothing, honestly
    events = [json.loads(x) for x in (Path(result.run_dir) / "trajectory.jsonl").read_text().splitlines()]
    replies = [e for e in events if e["kind"] == "message" and e["role"] == "assistant"]
    assert len(replies) == result.turns == result.cost.llm_calls >= 2
    for e in replies:
        t, u = e["tokens"], e["usage"]
        assert 1 <= len(t["completion_ids"]) <= 40 and len(t["logprobs"]) == len(t["completion_ids"])
        assert all(math.isfinite(x) and x <= 0 for x in t["logprobs"])
        assert u["prompt_tokens"] == len(t["prompt_ids"]) and u["completion_tokens"] == len(t["completion_ids"])
        assert u["usd"] == 0.0 and u["usd_source"] == "local" and t["temperature"] == 1.0
        assert SYSTEM in tiny.tokenizer.decode(t["prompt_ids"])
        # The recorded logprobs are the model's own, under the sampling temperature.
        again = replay_logprobs(tiny, t["prompt_ids"], t["completion_ids"], 1.0)
        assert again == pytest.approx(t["logprobs"], abs=2e-3)
    # Each later prompt holds the conversation so far (the nudge included).
    assert len(replies[1]["tokens"]["prompt_ids"]) > len(replies[0]["tokens"]["prompt_ids"])
    assert "You have not submitted" in tiny.tokenizer.decode(replies[1]["tokens"]["prompt_ids"])
    ledger = Ledger(tmp_path / "runs" / "costs.jsonl").entries()
    assert len(ledger) == result.turns and all(e["usd"] == 0.0 and e["policy"] == "hf:tiny" for e in ledger)


def test_tool_calls_are_parsed_and_malformed_ones_kept(tiny: HFPolicy) -> None:
    prompt = tiny.render([Message(role="user", content="go")], TOOL_SCHEMAS)

    def parse(text: str):
        return tiny.parse(prompt, tiny.tokenizer(text, add_special_tokens=False)["input_ids"], TOOL_SCHEMAS)

    content, calls = parse('<tool_call>\n{"name": "read_file", "arguments": {"path": "job.toml"}}\n</tool_call><|im_end|>')
    assert [(c.name, c.arguments) for c in calls] == [("read_file", {"path": "job.toml"})]
    content, calls = parse('Let me look. <tool_call>\n{"name": "read_file", "arguments": {"path": </tool_call><|im_end|>')
    assert len(calls) == 1 and calls[0].name == "read_file" and isinstance(calls[0].arguments, str)
    assert content == "Let me look."
    content, calls = parse("Just words.<|im_end|>")
    assert calls == [] and content == "Just words."


def long_conversation(chars: int) -> list[Message]:
    call = ToolCallRequest(id="c1", name="read_file", arguments={"path": "INSTRUCTIONS.md"})
    return [Message(role="system", content="sys"), Message(role="user", content="go"),
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", tool_call_id="c1", name="read_file", content="lorem ipsum " * (chars // 12)),
            Message(role="assistant", tool_calls=[call.model_copy(update={"id": "c2"})]),
            Message(role="tool", tool_call_id="c2", name="read_file", content="short")]


def test_old_tool_results_are_shortened_to_fit(tiny: HFPolicy, monkeypatch) -> None:
    messages = long_conversation(6000)
    full = len(tiny.render(messages, TOOL_SCHEMAS))
    shortened = tiny.render([*messages[:3], messages[3].model_copy(update={"content": "x"}), *messages[4:]],
                            TOOL_SCHEMAS)
    monkeypatch.setattr(tiny, "max_context", (full + len(shortened)) // 2 + tiny.max_new_tokens)
    reply = tiny.act(messages, TOOL_SCHEMAS)
    assert reply.tokens.truncated_tool_results == 1
    assert len(reply.tokens.prompt_ids) <= tiny.max_context - tiny.max_new_tokens < full
    text = tiny.tokenizer.decode(reply.tokens.prompt_ids)
    assert "shortened to fit" in text and "short" in text  # the newest result is intact


def test_context_that_cannot_fit_stops_the_episode(tiny: HFPolicy, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(tiny, "max_context", tiny.max_new_tokens + 50)
    with pytest.raises(PolicyStop) as stop:
        tiny.act(long_conversation(100), TOOL_SCHEMAS)
    assert stop.value.reason is StopReason.context_full
    result = run_episode(load_spec(TASK), TASK, tiny, EpisodeConfig(), runs_dir=tmp_path / "runs",
                         baselines=BaselineStore(tmp_path / "b.json"))
    assert result.stop_reason is StopReason.context_full and "context" in result.error
    assert result.reward.total == -0.1 and result.turns == 1
