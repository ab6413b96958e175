"""Held-out transfer at an arc's end (ait.outer.transfer, bench/heldout_transfer.py): the warm start's
bundle (step_0, written by every run before its first step) and the final bundle play the held-out
tasks with the same seeds on one machine, as a paired difference; the secret is never written."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_outer_loop import ait_train, write_config

from ait.home import hidden_secret
from ait.outer import checkpoint as ckpt
from ait.outer.loop import OuterRunError
from ait.outer.transfer import compare_bundles

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def arc(tmp_path_factory) -> Path:
    """One outer step of the tiny agent, held-out evaluation off (as the GPU arc runs)."""
    tmp = tmp_path_factory.mktemp("arc")
    run = tmp / "run"
    ait_train("--config", str(write_config(tmp / "c.toml", max_steps=1, heldout_every=0)), "--run-dir", str(run))
    return run / "checkpoints"


def test_the_warm_start_and_the_final_adapter_are_paired_on_the_same_seeds(arc: Path, tmp_path: Path) -> None:
    out = tmp_path / "t"
    s = compare_bundles(arc / "step_0", arc / "step_1", out, episodes=2)
    assert (s["start"]["step"], s["final"]["step"]) == (0, 1)
    start = json.loads((out / "start" / "heldout" / "step-00000" / "results.json").read_text())
    final = json.loads((out / "final" / "heldout" / "step-00001" / "results.json").read_text())
    key = lambda e: (e["task_id"], e["run_id"])  # noqa: E731 - the plan's slot: the seed derives from it
    assert sorted(map(key, start["episodes"])) == sorted(map(key, final["episodes"]))
    assert len(start["episodes"]) == 2 and s["n_pairs"] == 2 and {p["task"] for p in s["pairs"]} == {"triage"}
    diffs = [p["final"] - p["start"] for p in s["pairs"]]
    assert s["final_minus_start"] == pytest.approx(sum(diffs) / len(diffs))
    written = (out / "transfer.json").read_text()
    assert json.loads(written) == s and hidden_secret() not in written
    assert s["hidden_secret_id"] == ckpt.hidden_secret_id()
    with pytest.raises(OuterRunError, match="already holds a comparison"):
        compare_bundles(arc / "step_0", arc / "step_1", out, episodes=2)


def test_bundles_of_runs_with_other_seeds_are_refused(arc: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(arc / "step_1", other)
    manifest = json.loads((other / "bundle.json").read_text())
    manifest["config"]["seed"] += 1
    (other / "bundle.json").write_text(json.dumps(manifest))
    with pytest.raises((OuterRunError, ckpt.BundleError)):
        compare_bundles(arc / "step_0", other, tmp_path / "t", episodes=2)
    assert not (tmp_path / "t").exists()


def test_the_bench_script_says_what_is_wrong_in_one_line(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "heldout_transfer.py"), "--start", str(tmp_path / "no"),
                        "--final", str(tmp_path / "no"), "--out", str(tmp_path / "t")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "error:" in r.stderr, r.stderr
