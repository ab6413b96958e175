"""bench/multi_gpu.py --smoke: the multi-GPU run's code path on this CPU machine, with GPUs declared to
a private local Ray and each job a short CPU process (the figures themselves need a multi-GPU host)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "multi_gpu.py"


@pytest.mark.slow  # eight episodes through Ray (~25 s); tests/test_ray_gpus.py covers the placement by default
def test_smoke_spreads_jobs_over_declared_gpus_and_writes_the_figures(tmp_path):
    # ~25 s on 2 CPU cores: four private Ray instances, one after another
    pytest.importorskip("ray")
    out = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path / "work"),
                          "--json", str(tmp_path / "multi.json")], capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "multi.json").read_text())
    one, two = report["throughput"]["1"], report["throughput"]["2"]
    assert (one["ok"], one["jobs"], one["slots_per_gpu"]) == (2, 2, {"0": 2})  # K=2 on the one GPU
    assert (two["ok"], two["jobs"], two["slots_per_gpu"]) == (4, 4, {"0": 2, "1": 2})
    assert two["jobs_by_gpu"] == {"0": 2, "1": 2}
    # The ratio is the benchmark's figure, not a threshold to hold on a busy 2-core runner (it read 1.17 on
    # 2026-12-07 beside other tests, ~2 alone): here it must be the one the throughput rows give.
    ratio = two["jobs_per_hour"] / one["jobs_per_hour"]
    assert report["ratio_to_1_gpu"]["1"] == 1.0 and report["ratio_to_1_gpu"]["2"] == pytest.approx(ratio) and ratio > 0
    spread, packed = report["outer_step"]["spread"], report["outer_step"]["packed"]
    # Two GPUs at K=2 less the agent's half of one: three jobs, on both GPUs; packed: all three on GPU 0.
    assert (spread["ok"], spread["agent_share"], spread["jobs_by_gpu"]) == (3, 0.5, {"0": 1, "1": 2})
    assert (packed["ok"], packed["agent_share"], packed["jobs_by_gpu"]) == (3, 0.25, {"0": 3})
    assert report["packed_over_spread_wall"] > 0 and report["mode"].startswith("smoke")


def test_json_of_several_calls_merges_into_one_file(tmp_path):
    spec = importlib.util.spec_from_file_location("multi_gpu", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    path = tmp_path / "m.json"
    row = {"jobs_per_gpu": 4, "jobs_per_hour": 10.0}
    bench.merge_json(path, {"mode": "a", "throughput": {"1": row}})
    bench.merge_json(path, {"mode": "b", "throughput": {"2": {**row, "jobs_per_hour": 18.0}}})
    merged = bench.merge_json(path, {"outer_step": {"spread": {"wall_s": 100.0}, "packed": {"wall_s": 250.0}}})
    assert merged == json.loads(path.read_text())
    assert merged["ratio_to_1_gpu"] == {"1": 1.0, "2": 1.8} and merged["mode"] == "b"
    assert merged["packed_over_spread_wall"] == 2.5
