"""bench/matrix_table.py reads a bench/gpu.sh matrix run: checked on the committed H200 run, and
the packing rows the worker admits by are the ones it derives from that run (no hand-edited figures)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "docs" / "measurements" / "matrix-h200-s10"


def table_module():
    spec = importlib.util.spec_from_file_location("matrix_table", ROOT / "bench" / "matrix_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_follow_the_raw_figures():
    rows = table_module().rows_for(RUN, usd_per_hour=3.5)
    by = {(r["model"], r["k"], str(r["run"])): r for r in rows}
    pack = json.loads((RUN / "matrix-qwen2.5-coder-1.5b-k2.json").read_text())["pack"]
    (key, raw), = pack.items()
    row = by[("qwen2.5-coder-1.5b", 2, key)]
    alone = json.loads((RUN / "matrix-qwen2.5-coder-1.5b-k1.json").read_text())["side_by_side"]
    (first,) = alone.values()
    assert row["jobs_per_hour"] == raw["jobs_per_hour"]
    assert abs(row["vs_alone"] - raw["jobs_per_hour"] * first["total_s"] / 3600) < 1e-9
    assert abs(row["usd_per_job"] - 3.5 / raw["jobs_per_hour"]) < 1e-12
    assert row["slowest_vs_alone"] == max(j["total_s"] for j in raw["per_job"]) / first["total_s"]
    # SmolLM2 ran alone twice: both rows, each against the first (which paid the zygote's start)
    assert by[("smollm2-135m", 1, "1")]["vs_alone"] == 1.0 and by[("smollm2-135m", 1, "2")]["vs_alone"] > 1.0


def test_the_shipped_packing_rows_are_the_scripts_output(tmp_path):
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "matrix_table.py"), str(RUN), "--rows-out", str(out),
                           "--source", "docs/measurements/matrix-h200-s10"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "| qwen2.5-coder-0.5b | 4 | 50 | 4/4 |" in done.stdout
    derived = json.loads(out.read_text())
    shipped = json.loads((ROOT / "src" / "ait" / "compute" / "pack_measurements.json").read_text())["runs"]
    assert derived and all(row in shipped for row in derived)
    assert {r["model"] for r in derived} == {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}


def test_an_empty_folder_is_an_error(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "matrix_table.py"), str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "no matrix-*.json" in done.stderr
