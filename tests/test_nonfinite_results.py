"""One NaN must not poison a job's result (issue 31, item 9).

train_output.json is written inside the sandbox, where the agent's code runs: its NaN and ±Infinity
numbers are dropped (and named) on reading. Pydantic writes such a number as null, which fails
validation on the way back: a result that still cannot be read back, in the queue or the run
directory, is a failed job, billed, never "no job" (which let the agent submit again for free).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from fakes import Canned
from typer.testing import CliRunner

import ait.compute.run_job as run_job_mod
from ait.agent_eval.runner import finished
from ait.cli import app
from ait.evals.baselines import BaselineStore
from ait.evals.hidden_eval import EvalReport
from ait.harness.episode import run_episode
from ait.harness.types import EpisodeConfig, EpisodeResult
from ait.job.types import FailReason, Job, JobConfig, JobResult
from ait.policy.reference import ReferencePolicy
from ait.queue import JobQueue
from ait.sandbox.process import RunOutcome
from ait.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "examples" / "tasks" / "calc_chain.json"
CFG = JobConfig.model_validate({"job": {"base_model": "tiny"}, "train": {
    "max_steps": 1, "learning_rate": 1e-4, "num_generations": 2, "max_completion_length": 16}})
# What a NaN metric became in the queue before the fix: pydantic's JSON writes it as null.
POISONED = {"ok": True, "pre": 0.2, "post": 0.5, "eval_n": 8, "train_seconds": 40.0, "total_seconds": 50.0,
            "base_model": "tiny", "metrics": {"train/reward": 0.5, "train/loss": None}}


def strict_round_trip(result: JobResult) -> JobResult:
    """The result as a queue or a run directory stores it and reads it back; no NaN token allowed."""
    json.dumps(result.model_dump(mode="json"), allow_nan=False)
    back = JobResult.model_validate_json(result.model_dump_json())
    assert back == result
    return back


def make_job(tmp_path: Path, job_id: str = "j0") -> Job:
    return Job(job_id=job_id, run_dir=str(tmp_path / job_id), workspace=str(tmp_path),
               task_path=str(TASK), config=CFG, time_budget_s=60)


def score(tmp_path: Path, monkeypatch, train_output: str) -> JobResult:
    """run_job's scoring of a training run that exited 0 after writing `train_output`, the hidden
    eval faked (it runs no agent code and is not what is under test)."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "train_output.json").write_text(train_output)
    report = EvalReport(pre=0.2, post=0.5, pre_scores=[0.2], post_scores=[0.5], n=1, fingerprint="f",
                        seconds={"eval/post_s": 1.5})
    monkeypatch.setattr(run_job_mod, "finish_eval", lambda *a, **k: report)
    outcome = RunOutcome(returncode=0, timed_out=False, seconds=3.0, log_tail="")
    return run_job_mod._score(make_job(tmp_path), job_dir, outcome, None, None, tmp_path / "eval",
                              time.monotonic(), {"job_id": "j0", "base_model": "tiny"})


def test_nan_and_infinite_metrics_are_dropped_and_named(tmp_path, monkeypatch):
    result = score(tmp_path, monkeypatch, '{"checkpoint": "c", "train_seconds": 2.0, "steps": 1, "metrics": '
                   '{"train/reward": 0.5, "train/loss": NaN, "train/kl": Infinity, "train/x": -Infinity, '
                   '"train/big": 1e999}}')
    assert result.ok and result.post == 0.5
    assert result.metrics == {"train/reward": 0.5, "eval/post_s": 1.5}
    assert result.dropped_nonfinite == ["metrics.train/loss", "metrics.train/kl", "metrics.train/x",
                                        "metrics.train/big"]
    strict_round_trip(result)


def test_nested_non_finite_numbers_are_dropped_and_named(tmp_path, monkeypatch):
    result = score(tmp_path, monkeypatch, '{"checkpoint": "c", "train_seconds": 2.0, "steps": 1, '
                   '"metrics": {"train/reward": 0.5}, "extra": [1.0, NaN], "more": {"deep": [{"x": Infinity}]}}')
    assert result.ok and result.dropped_nonfinite == ["extra[1]", "more.deep[0].x"]
    strict_round_trip(result)


def test_a_metric_that_is_not_a_number_once_its_nan_is_dropped_fails_the_job_clearly(tmp_path, monkeypatch):
    result = score(tmp_path, monkeypatch, '{"checkpoint": "c", "train_seconds": 2.0, "steps": 1, '
                   '"metrics": {"train/reward": 0.5, "train/per_step": {"a": NaN}}}')
    assert not result.ok and result.fail_reason is FailReason.crash
    assert "not a valid TrainOutput" in result.error and "1 NaN or infinite number(s) were dropped" in result.error
    assert result.train_seconds == 3.0  # billed by the worker's clock
    strict_round_trip(result)


def test_many_dropped_numbers_are_counted_not_listed(tmp_path, monkeypatch):
    metrics = ", ".join(f'"m{i}": NaN' for i in range(1000))
    result = score(tmp_path, monkeypatch, f'{{"checkpoint": "c", "train_seconds": 2.0, "steps": 1, "metrics": {{{metrics}}}}}')
    assert result.ok and len(result.dropped_nonfinite) == 21 and result.dropped_nonfinite[-1] == "... and 980 more"


# ---- the queue ------------------------------------------------------------------------------


def poison(q: JobQueue, job_id: str, text: str) -> None:
    """Store `text` as the job's result, as an older version (or a damaged file) left it."""
    with q._tx() as conn:
        conn.execute("UPDATE jobs SET state = 'done', result = ?, token = NULL, lease_expires_at = NULL"
                     " WHERE job_id = ?", (text, job_id))


@pytest.fixture
def bad_queue(tmp_path) -> JobQueue:
    """j0 stored with a null metric, j1 with text that is not JSON, j2 done and readable."""
    q = JobQueue(tmp_path / "q.sqlite")
    q.enqueue_many([make_job(tmp_path, f"j{i}") for i in range(3)])
    leases = [q.claim("w1") for _ in range(3)]
    poison(q, "j0", json.dumps({"job_id": "j0", **POISONED}))
    poison(q, "j1", "{not json")
    q.complete(leases[2], JobResult(job_id="j2", ok=True, post=0.4))
    return q


def test_queue_ls_lists_unreadable_results_as_failed_with_the_reason(bad_queue):
    out = CliRunner().invoke(app, ["queue", "ls", "--queue", str(bad_queue.path)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    # (a console that fixed its width before COLUMNS was set, as under pytest-xdist, wraps the error column
    # at 80: the words before the wrap are what is checked)
    assert out.output.count("failed │") == 2 and out.output.count("the job's result cannot be read") == 2
    rows = json.loads(CliRunner().invoke(app, ["queue", "ls", "--json", "--queue", str(bad_queue.path)]).stdout)
    assert [(r["job_id"], r["state"]) for r in rows] == [("j0", "failed"), ("j1", "failed"), ("j2", "done")]
    assert "metrics.train/loss" in rows[0]["error"] and "Invalid JSON" in rows[1]["error"]
    assert rows[0]["result"]["fail_reason"] == "crash" and rows[0]["result"]["total_seconds"] == 50.0
    show = CliRunner().invoke(app, ["queue", "show", "j0", "--queue", str(bad_queue.path)])
    assert show.exit_code == 0, show.output
    assert bad_queue.result("j1").fail_reason is FailReason.crash


def test_a_result_holding_nan_is_stored_as_a_failed_job_that_reads_back(tmp_path):
    q = JobQueue(tmp_path / "q.sqlite")
    q.enqueue(make_job(tmp_path))
    result = JobResult(job_id="j0", ok=True, post=0.5, total_seconds=50.0, metrics={"train/loss": float("nan")})
    assert q.complete(q.claim("w1"), result).value == "failed"
    back = q.get("j0").result
    assert back.fail_reason is FailReason.crash and "NaN" in back.error and back.total_seconds == 50.0
    strict_round_trip(back)


# ---- the episode ----------------------------------------------------------------------------


def test_an_unreadable_queue_result_is_a_failed_billed_job_in_the_episode(tmp_path, monkeypatch):
    """The issue's case: before, the episode recorded no job, billed nothing, and the agent could
    submit again (three jobs trained under max_jobs = 1, no ledger line)."""
    monkeypatch.setenv("AIT_HOME", str(tmp_path / "home"))
    q, stop, served = JobQueue(tmp_path / "q.sqlite"), threading.Event(), []

    def worker() -> None:  # claims each job and leaves the poisoned result an older worker stored
        while not stop.is_set():
            lease = q.claim("w1")
            if lease is None:
                time.sleep(0.02)
                continue
            served.append(lease.job_id)
            poison(q, lease.job_id, json.dumps({"job_id": lease.job_id, **POISONED}))

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    try:
        config = EpisodeConfig(executor="queue", queue_path=str(q.path), job_wait_s=60, max_jobs=1)
        result = run_episode(load_spec(TASK), TASK, ReferencePolicy(), config, runs_dir=tmp_path / "runs",
                             baselines=BaselineStore(tmp_path / "b.json"))
    finally:
        stop.set()
        thread.join(5)
    assert len(served) == 1
    assert result.job is not None and not result.job.ok and result.job.fail_reason is FailReason.crash
    assert "cannot be read back" in result.job.error
    ledger = [json.loads(line) for line in (tmp_path / "runs" / "costs.jsonl").read_text().splitlines()]
    jobs = [line for line in ledger if line.get("kind") == "job"]
    assert len(jobs) == 1 and jobs[0]["job_id"] == served[0] and jobs[0]["wall_s"] == 50.0
    assert result.stop_reason.value != "infra_error"


def test_an_inline_result_holding_nan_leaves_a_run_directory_that_resumes(tmp_path, monkeypatch):
    """job_result.json and episode.json must parse again, or `ait eval --resume` re-runs the episode."""
    monkeypatch.setenv("AIT_HOME", str(tmp_path / "home"))

    def nan_result(job: Job) -> JobResult:
        return JobResult(job_id=job.job_id, ok=True, base_model="tiny", pre=0.2, post=0.5, eval_n=8,
                         train_seconds=40.0, total_seconds=50.0, metrics={"train/loss": float("nan")})

    result = run_episode(load_spec(TASK), TASK, ReferencePolicy(), EpisodeConfig(), runs_dir=tmp_path / "runs",
                         baselines=BaselineStore(tmp_path / "b.json"), executor=Canned(nan_result))
    run_dir = Path(result.run_dir)
    stored = JobResult.model_validate_json((run_dir / "job_result.json").read_text())
    assert not stored.ok and stored.fail_reason is FailReason.crash and stored.total_seconds == 50.0
    EpisodeResult.model_validate_json((run_dir / "episode.json").read_text())
    row = finished(run_dir)
    assert row is not None and row.job_failed and row.usd == result.cost.total_usd
