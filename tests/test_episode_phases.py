"""bench/episode_phases.py: an episode's wall time split into sampling, probes, jobs, their queue, the rest."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("episode_phases", ROOT / "bench" / "episode_phases.py")
phases = importlib.util.module_from_spec(spec)
spec.loader.exec_module(phases)


def write(path: Path, events: list[dict]) -> Path:
    path.mkdir(parents=True)
    (path / "trajectory.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return path / "trajectory.jsonl"


def test_phases_add_up_to_the_wall_time(tmp_path: Path) -> None:
    t = write(tmp_path / "g00000-0-ledger-aaaa", [
        {"t": 100.0, "kind": "message", "role": "system"},
        {"t": 130.0, "kind": "message", "role": "assistant"},
        {"t": 140.0, "kind": "probe", "attempt": 1, "seconds": 9.0},
        {"t": 200.0, "kind": "job", "attempt": 1, "cost": {"wall_s": 45.0}},  # 15 s waiting for a slot
        {"t": 207.0, "kind": "baseline", "seconds": 4.5},  # best_pre: the baseline evals, or the wait for them
        {"t": 210.0, "kind": "episode_end", "stop_reason": "job_done", "time/llm_s": 35.0},
    ])
    row = phases.episode_phases(t)
    assert row["wall_s"] == 110.0 and row["job_wait_s"] == 15.0 and row["probe_s"] == 9.0 and row["job_s"] == 45.0
    assert row["baseline_s"] == 4.5
    assert row["other_s"] == 110.0 - 35.0 - 9.0 - 45.0 - 15.0 - 4.5 == 1.5
    assert sum(row[k] for k in phases.PHASES) == row["wall_s"]


def test_an_unfinished_episode_is_left_out_and_the_script_reads_a_run(tmp_path: Path) -> None:
    write(tmp_path / "run" / "episodes" / "g1", [{"t": 1.0, "kind": "message"}, {"t": 2.0, "kind": "probe", "attempt": 1}])
    write(tmp_path / "run" / "episodes" / "g2", [{"t": 1.0, "kind": "message"},
                                                 {"t": 5.0, "kind": "episode_end", "time/llm_s": 3.0}])
    (tmp_path / "run" / "metrics.jsonl").write_text(json.dumps(
        {"step": 1, "seconds": 9.0, "seconds_by_phase": {"wait_groups": 6.0, "train_step": 2.5}}) + "\n")
    out = tmp_path / "p.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "episode_phases.py"), str(tmp_path / "run"), "--json", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert [e["episode"] for e in data["episodes"]] == ["g2"] and data["summary"]["mean"]["llm_s"] == 3.0
    assert data["steps"] == [{"step": 1, "seconds": 9.0, "wait_groups": 6.0, "train_step": 2.5}]
    assert "wait_groups 6.0" in r.stdout
