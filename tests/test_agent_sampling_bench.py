"""bench/agent_sampling.py: an arc's agent calls read back from its trajectories and replayed through the
sampling engine with the same prompt and reply lengths."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("agent_sampling", ROOT / "bench" / "agent_sampling.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def assistant(t: float, latency: float, prompt: int, completion: int) -> dict:
    return {"t": t, "kind": "message", "role": "assistant",
            "usage": {"latency_s": latency, "prompt_tokens": prompt, "completion_tokens": completion}}


def test_the_calls_come_back_per_episode_in_start_order_with_their_lengths(tmp_path):
    for name, events in (("g00001-0-dispatch-b", [assistant(110.0, 4.0, 900, 20), assistant(130.0, 2.0, 1500, 60),
                                                   {"t": 131.0, "kind": "message", "role": "tool"}]),
                         ("g00000-0-ledger-a", [assistant(105.0, 3.0, 800, 10)])):
        d = tmp_path / "episodes" / name
        d.mkdir(parents=True)
        (d / "trajectory.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    data = bench.extract(tmp_path)
    assert [e["episode"] for e in data["episodes"]] == ["g00000-0-ledger-a", "g00001-0-dispatch-b"]
    # Each call starts when its reply was asked for (its message time less its latency), from the first.
    assert [c["t"] for c in data["episodes"][1]["calls"]] == [4.0, 26.0]
    s = bench.summary(data["episodes"])
    assert s["calls"] == 3 and s["median_latency_s"] == 3.0 and s["completion_tokens"] == 90
    assert s["span_s"] == pytest.approx(28.0) and s["tokens_per_s"] == pytest.approx(90 / 28.0)


def test_the_replay_runs_every_reply_to_its_recorded_length(tmp_path):
    out = tmp_path / "figures.json"
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "agent_sampling.py"), "--smoke", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    figures = json.loads(out.read_text())
    # 4 episodes x 3 calls of 5, 6 and 7 tokens: the replay asserts each reply's length, and the totals agree.
    alone = figures["replayed"]["alone"]
    assert alone["calls"] == 12 and alone["completion_tokens"] == 4 * (5 + 6 + 7)
    assert alone["completion_tokens"] == figures["recorded"]["completion_tokens"]
    assert "median latency" in run.stdout and figures["latency_ratio"] > 0


def test_the_load_processes_join_the_jobs_mps_daemon_as_jobs_do_and_are_stopped(monkeypatch):
    """--beside-processes: each load process is its own process (its own CUDA context on a GPU), ready before
    the replay starts, under AIT_JOBS_MPS_PIPE_DIRECTORY's daemon as ait.compute.local starts packed jobs,
    and killed after. On CPU a stand-in body reports the environment it got."""
    monkeypatch.setattr(bench, "HOG_PROCESS", "import os, time\nprint('ready', flush=True)\n"
                        "print(os.environ.get('CUDA_MPS_PIPE_DIRECTORY'), flush=True)\ntime.sleep(60)\n")
    monkeypatch.setenv("AIT_JOBS_MPS_PIPE_DIRECTORY", "/tmp/ait-jobs-mps-test")
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    hogs = bench.hog_processes(2)
    try:
        assert len({h.pid for h in hogs}) == 2 and all(h.poll() is None for h in hogs)
        assert [h.stdout.readline().strip() for h in hogs] == ["/tmp/ait-jobs-mps-test"] * 2
    finally:
        bench.stop_processes(hogs)
    assert all(h.returncode is not None for h in hogs)
    monkeypatch.setattr(bench, "HOG_PROCESS", "raise SystemExit(1)")
    with pytest.raises(RuntimeError, match="failed to start"):
        bench.hog_processes(1)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="on a GPU the processes can run")
def test_the_load_processes_need_a_gpu():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "agent_sampling.py"), "--smoke", "--beside-processes", "2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--beside-processes needs a GPU" in r.stderr


def test_a_replayed_turn_extends_the_episodes_conversation_where_its_length_allows():
    """Each replayed prompt is the episode's previous prompt and reply, then new tokens (what prefix reuse
    serves), unless the recorded prompt is shorter than that (history re-rendered): then a fresh one."""
    import torch

    seen = []

    class Engine:
        model = type("M", (), {"device": torch.device("cpu")})()

        def sample(self, prompt, temperature, n, generator):
            seen.append(list(prompt))
            return list(range(1000, 1000 + n)), [0.0] * n

    calls = [{"t": 0.0, "latency_s": 1.0, "prompt_tokens": p, "completion_tokens": c}
             for p, c in ((10, 3), (16, 2), (12, 4), (20, 1))]
    out = bench.replay(Engine(), [{"episode": "e", "calls": calls}], vocab=50, gaps=False)
    assert [len(p) for p in seen] == [10, 16, 12, 20]
    assert seen[1][:13] == seen[0] + [1000, 1001, 1002]      # 10 + 3 reply tokens, then 3 new
    assert all(t < 50 for t in seen[2])  # 12 < 16 + 2: a fresh prompt, no earlier reply in it
    assert seen[3][:16] == seen[2] + [1000, 1001, 1002, 1003]
    assert len(out[0]["calls"]) == 4 and all(c["replayed_s"] >= 0 for c in out[0]["calls"])
