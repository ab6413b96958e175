"""A fixed CPU episode's outcome, pinned: refactors must not change what an episode does.

The reference agent on calc_chain with the tiny model (the README's smoke episode, seeded) is run end
to end; what decides its reward is compared with tests/data/pinned_episode.json: the agent's tool
calls, the reward's components (all but train_speed, which is wall time), the hidden eval's
per-example scores, the training metrics the trainer logs, and a checksum of the trained weights.
A deliberate behaviour change re-pins with `AIT_REPIN=1 pytest tests/test_pinned_episode.py` and says
why in its commit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from safetensors.torch import load_file

from ait.evals.baselines import BaselineStore
from ait.harness.episode import run_episode
from ait.harness.types import EpisodeConfig
from ait.policy.reference import ReferencePolicy
from ait.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "examples" / "tasks" / "calc_chain.json"
PINNED = Path(__file__).resolve().parent / "data" / "pinned_episode.json"
TRAIN_KEYS = ("train/reward_first", "train/reward_last", "train/grad_norm", "train/loss", "train/completion_length",
              "train/generated_tokens_total", "train/rewards/reward_close", "train/tool_calls")


def sig(x: float) -> float:
    """Six significant digits: CPU float sums differ in the last bits between thread counts."""
    return float(f"{x:.6g}")


def outcome(result) -> dict:
    run = Path(result.run_dir)
    events = [json.loads(line) for line in (run / "trajectory.jsonl").read_text().splitlines()]
    calls = [c["name"] for e in events if e["kind"] == "message" for c in e.get("tool_calls") or []]
    job = result.job
    weights = load_file(str(Path(job.checkpoint) / "model.safetensors"))
    reward = result.reward
    return {
        "stop_reason": result.stop_reason.value, "turns": result.turns, "tool_calls": calls,
        "reward": {k: getattr(reward, k) for k in ("validation", "job_quality", "uplift_term", "post", "best_pre")},
        "pre": job.pre, "post": job.post, "eval_n": job.eval_n, "outputs_changed": job.outputs_changed,
        "pre_scores": job.pre_scores, "post_scores": job.post_scores,
        "train": {k: sig(job.metrics[k]) for k in TRAIN_KEYS},
        "weights": {name: sig(float(t.double().abs().sum())) for name, t in sorted(weights.items())},
    }


def test_fixed_cpu_episode_is_pinned(tmp_path, monkeypatch):
    monkeypatch.setenv("AIT_HOME", str(tmp_path / "home"))
    result = run_episode(load_spec(TASK), TASK, ReferencePolicy(), EpisodeConfig(eval_size=32),
                         runs_dir=tmp_path / "runs", baselines=BaselineStore(tmp_path / "baselines.json"))
    got = outcome(result)
    if os.environ.get("AIT_REPIN"):
        PINNED.write_text(json.dumps(got, indent=1) + "\n")
        pytest.skip("re-pinned")
    want = json.loads(PINNED.read_text())
    for key in want:
        if key == "weights":
            diffs = {n: (got["weights"].get(n), v) for n, v in want["weights"].items()
                     if got["weights"].get(n) is None or abs(got["weights"][n] - v) > 1e-4 * max(1.0, abs(v))}
            assert not diffs, f"trained weights moved: {list(diffs.items())[:5]}"
        else:
            assert got[key] == want[key], key
