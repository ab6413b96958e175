"""One episode against a real llama.cpp server this project did not write (opt-in).

Skipped unless AIT_LLAMA_SERVER_URL names the server's /v1 URL. The model name sent is
AIT_LLAMA_SERVER_MODEL (default `qwen`); AIT_LLAMA_SALVAGE=1 parses tool calls the model writes
as text (needed when the server uses the GGUF's own chat template, which returns none
structured); AIT_LLAMA_MAX_TURNS caps the turns (default 6). How to start a server and what
it did: docs/real-servers.md. The episode trains the task's tiny model on CPU (~20 s a job);
the agent's replies take as long as the server does (minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ait.harness.episode import run_episode
from ait.harness.types import EpisodeConfig, StopReason
from ait.policy.base import make_policy
from ait.spec import load_spec

URL = os.environ.get("AIT_LLAMA_SERVER_URL")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not URL, reason="set AIT_LLAMA_SERVER_URL to a llama.cpp server's /v1 URL")]


def test_an_episode_against_a_llama_cpp_server(tmp_path: Path) -> None:
    policy = make_policy(f"openai:{os.environ.get('AIT_LLAMA_SERVER_MODEL', 'qwen')}", base_url=URL,
                         temperature=0.2, max_tokens=1024, request_timeout_s=600,
                         salvage_tool_calls=os.environ.get("AIT_LLAMA_SALVAGE") == "1")
    assert (problem := policy.preflight()) is None, problem
    path = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "calc_chain_fast.json"
    spec = load_spec(path)
    config = EpisodeConfig(max_turns=int(os.environ.get("AIT_LLAMA_MAX_TURNS", "6")), max_nudges=1,
                           eval_size=50)
    result = run_episode(spec, path, policy, config, runs_dir=tmp_path / "runs")

    assert result.stop_reason is not StopReason.policy_error, result.error
    events = [json.loads(x) for x in (Path(result.run_dir) / "trajectory.jsonl").read_text().splitlines()]
    results = [e for e in events if e["kind"] == "tool_result"]
    diagnostics = policy.diagnostics()
    assert results, f"no tool call reached the harness: {diagnostics}"
    replies = [e for e in events if e["kind"] == "message" and e["role"] == "assistant"]
    assert all(e["usage"]["usd_source"] == "local" and e["usage"]["completion_tokens"] > 0 for e in replies)
    assert result.cost.llm_calls == len(replies) and result.cost.unpriced_calls == 0
