"""The null job: learning_rate 0 or max_steps 0 through the whole path (the sandboxed trainer, its
checkpoint, the hidden eval) must score post == pre, example by example, and decode the same
conversations: whatever differs between a job's pre and post then comes from its training alone.
bench/job_surface.py keeps it as the control cell of every surface measurement (on a GPU)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ait.compute.run_job import run_job
from ait.evals.paired import paired
from ait.job.config import load_job_config
from ait.job.types import Job
from ait.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "examples" / "tasks" / "calc_chain_fast.json"
REFERENCE = ROOT / "src" / "ait" / "policy" / "reference_jobs" / "calc_chain"


def job(tmp_path: Path, line: str) -> Job:
    ws = tmp_path / "ws"
    shutil.copytree(REFERENCE, ws)
    text = (ws / "job.toml").read_text()
    key = line.split(" = ")[0]
    (ws / "job.toml").write_text("\n".join(line if ln.startswith(key + " ") else ln for ln in text.splitlines()))
    spec = load_spec(TASK)
    return Job(job_id="null-1", run_dir=str(tmp_path / "run"), workspace=str(ws), task_path=str(TASK),
               config=load_job_config(ws / "job.toml", spec.constraints), time_budget_s=300.0, eval_size=12)


@pytest.mark.parametrize("line", ["learning_rate = 0.0", "max_steps = 0"])
def test_a_null_job_scores_its_pre_example_by_example(tmp_path: Path, line: str) -> None:
    j = job(tmp_path, line)
    assert getattr(j.config.train, line.split(" = ")[0]) == 0
    r = run_job(j)
    assert r.ok, r.error
    assert r.weights_changed is False
    assert len(r.pre_scores) == len(r.post_scores) == 12
    assert r.post_scores == r.pre_scores and r.post == r.pre
    assert r.outputs_changed == 0  # the same conversations, not only the same scores
    p = paired(r.pre_scores, r.post_scores)
    assert p.diff == 0.0 and p.se == 0.0 and not p.beyond_noise
    if line.startswith("max_steps"):
        assert "train/reward_first" not in r.metrics  # nothing sampled, nothing trained
    else:
        assert r.metrics["train/reward_first"] is not None  # it sampled and scored rollouts, and moved nothing


def test_a_job_that_trains_changes_the_outputs_it_is_scored_on(tmp_path: Path) -> None:
    """The check above can fail: the tiny model's greedy conversations change once its weights do."""
    r = run_job(job(tmp_path, "learning_rate = 0.01"))  # at 1e-3 for 4 steps its argmax holds
    assert r.ok, r.error
    assert r.weights_changed is True and r.outputs_changed > 0
