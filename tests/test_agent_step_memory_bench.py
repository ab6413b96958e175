"""bench/agent_step_memory.py: the targets it spreads over a sequence, and its CPU smoke run (both variants,
their seconds, no memory figures off a GPU)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("agent_step_memory", ROOT / "bench" / "agent_step_memory.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_targets_are_turns_inside_the_sequence():
    targets = bench.targets_for(24_000, 5_000, 250)
    assert len(targets) == 5_000 and targets == sorted(set(targets))
    assert 0 < targets[0] and targets[-1] < 24_000
    runs = sum(1 for a, b in zip(targets, targets[1:]) if b != a + 1) + 1
    assert runs == 20  # 5,000 targets in turns of 250, with observation tokens between them
    assert len(bench.targets_for(10, 50, 4)) <= 9  # never more targets than positions with context


def test_smoke_run_reports_both_variants(tmp_path):
    out = tmp_path / "m.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "agent_step_memory.py"), "--smoke", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result["variants"]) == {"chunked", "all_at_once"} and result["device"] == "cpu"
    assert all(v["seconds_median"] > 0 for v in result["variants"].values()) and "peak_ratio" not in result
    assert "chunked / all at once" in proc.stdout
