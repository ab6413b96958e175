"""bench/choices_vs_surface.py: the arc's job choices (by the surface's names) read against the surface."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("choices_vs_surface", ROOT / "bench" / "choices_vs_surface.py")
cvs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cvs)


def surface(path: Path, cells: dict[str, dict[str, float]]) -> Path:
    summary = {}
    for key, jq in cells.items():
        family, variant = key.split("/")
        summary.setdefault(family, {"cells": []})["cells"].append({"variant": variant, "job_quality": jq, "uplift": jq / 2})
    path.write_text(json.dumps({"summary": summary}))
    return path


def metrics(path: Path, steps: list[dict[str, dict[str, int]]]) -> Path:
    path.write_text("".join(json.dumps({"step": i + 1, "families": {f: {"variants": v} for f, v in fams.items()}}) + "\n"
                            for i, fams in enumerate(steps)))
    return path


def test_choices_are_valued_by_the_newest_cell_and_the_ends_compared(tmp_path, capsys):
    old = surface(tmp_path / "old.json", {"ledger/reference": 0.5, "ledger/model_qwen15": 0.1})
    new = surface(tmp_path / "new.json", {"ledger/reference": 0.0, "dispatch/reference": 0.2,
                                          "dispatch/model_qwen15": 0.6})  # ledger recalibrated: its reference 0
    rows = metrics(tmp_path / "m.jsonl", [
        {"ledger": {"reference": 4}, "dispatch": {"reference": 3, "lr=2e-06": 1}},
        {"ledger": {"reference": 2, "model_qwen15": 2}, "dispatch": {"reference": 2, "model_qwen15": 2}},
        {"ledger": {"model_qwen15": 4}, "dispatch": {"model_qwen15": 4}},
    ])
    out = tmp_path / "reading.json"
    assert cvs.main(["--metrics", str(rows), "--surface", str(old), "--surface", str(new), "--window", "1",
                     "--json", str(out)]) == 0
    reading = json.loads(out.read_text())
    first, _, last = reading["readings"]
    assert first["families"]["ledger"]["surface_job_quality"] == 0.0  # the newer file's cell
    assert first["families"]["dispatch"]["measured_jobs"] == 3 and first["families"]["dispatch"]["jobs"] == 4
    assert first["surface_job_quality"] == pytest.approx((0.0 * 4 + 0.2 * 3) / 7)
    assert last["surface_job_quality"] == pytest.approx((0.1 * 4 + 0.6 * 4) / 8)
    assert last["families"]["dispatch"]["best_variant"] == "model_qwen15"
    summary = reading["summary"]
    assert summary["first"][0] == pytest.approx(0.6 / 7) and summary["last"][0] == pytest.approx(0.35)
    assert summary["first"][1] is not None  # a noise estimate over the jobs
    assert "difference +0.264" in capsys.readouterr().out


def test_it_reads_the_committed_surface_files(tmp_path):
    files = [ROOT / "docs/measurements/surface-h200-s12/surface.json", ROOT / "docs/measurements/lease-h100-s17/surface-b.json"]
    cells = cvs.surface_cells(files)
    assert ("dispatch", "model_qwen15") in cells and ("calc_chain", "reference") in cells
    assert all(-1.0 <= c["job_quality"] <= 1.5 for c in cells.values())


def test_a_missing_file_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cvs.main(["--metrics", str(tmp_path / "none.jsonl"), "--surface", str(tmp_path / "none.json")])
    assert "no such file" in capsys.readouterr().err
