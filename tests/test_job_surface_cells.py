"""bench/job_surface.py's cell order: controls and references first, then the knobs' cells, then the null
job of each other base model, then repeats. Packed K at a time under a deadline, the order decides what runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("job_surface", ROOT / "bench" / "job_surface.py")
job_surface = importlib.util.module_from_spec(spec)
spec.loader.exec_module(job_surface)


def names(families, variants, repeats=None):
    return [(f, v.name, seed) for f, v, seed in job_surface.cells(families, variants, repeats or {})]


def test_the_other_base_models_null_runs_after_its_knob_cells():
    assert names(["ledger"], ["model_qwen15", "model_qwen15+steps_30"]) == [
        ("ledger", "model_qwen15", 0), ("ledger", "model_qwen15+steps_30", 0),
        ("ledger", "null_lr0@qwen2.5-coder-1.5b", 0)]


def test_controls_and_references_first_then_variants_then_nulls_then_repeats():
    order = names(["ledger", "dispatch"], ["steps_30", "model_qwen15", "null_lr0", "reference"], {"reference": 1})
    assert order[:4] == [("ledger", "null_lr0", 0), ("dispatch", "null_lr0", 0),
                         ("ledger", "reference", 0), ("dispatch", "reference", 0)]
    assert order[4:8] == [("ledger", "steps_30", 0), ("dispatch", "steps_30", 0),
                          ("ledger", "model_qwen15", 0), ("dispatch", "model_qwen15", 0)]
    assert order[8:10] == [("ledger", "null_lr0@qwen2.5-coder-1.5b", 0), ("dispatch", "null_lr0@qwen2.5-coder-1.5b", 0)]
    assert order[10:] == [("ledger", "reference", 1), ("dispatch", "reference", 1)]


def test_one_null_per_base_model_however_many_of_its_variants():
    order = names(["ledger"], ["model_qwen15", "model_qwen15+lr_3e-6", "model_qwen15+steps_30"])
    assert [n for _, n, _ in order].count("null_lr0@qwen2.5-coder-1.5b") == 1
    assert order[-1][1] == "null_lr0@qwen2.5-coder-1.5b"
    assert names(["ledger"], ["steps_30"]) == [("ledger", "steps_30", 0)]  # the reference model's null is asked for
