"""`ait queue ls | show | retry | purge`: output, JSON, and one-line errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ait.cli import app
from ait.job.types import FailReason, Job, JobConfig, JobResult
from ait.queue import JobQueue

CFG = JobConfig.model_validate({"job": {"base_model": "tiny"}, "train": {
    "max_steps": 1, "learning_rate": 1e-4, "num_generations": 2, "max_completion_length": 16}})


@pytest.fixture
def queue(tmp_path) -> JobQueue:
    """j0 done, j1 failed (oom), j2 running, j3 queued."""
    q = JobQueue(tmp_path / "q.sqlite")
    q.enqueue_many([Job(job_id=f"j{i}", run_dir=str(tmp_path / f"r{i}"), workspace=str(tmp_path),
                        task_path=str(tmp_path / "t.json"), config=CFG, time_budget_s=60) for i in range(4)])
    q.complete(q.claim("w1"), JobResult(job_id="j0", ok=True, pre=0.2, post=0.6, eval_n=8))
    q.complete(q.claim("w1"), JobResult(job_id="j1", ok=False, fail_reason=FailReason.oom, error="CUDA out of memory"))
    q.claim("w2")
    return q


def run(*args: str):
    return CliRunner().invoke(app, ["queue", *args])


def one_line(output: str) -> str:
    """The message with rich's wrapping at the test console's width undone."""
    return " ".join(output.split())


def test_ls_table_json_and_state_filter(queue):
    out = run("ls", "--queue", str(queue.path))
    assert out.exit_code == 0, out.output
    for text in ("j0", "j3", "done", "failed", "running", "queued", "CUDA out of memory", "done 1"):
        assert text in out.output
    rows = json.loads(run("ls", "--json", "--queue", str(queue.path)).stdout)
    assert [(r["job_id"], r["state"], r["attempts"]) for r in rows] == [
        ("j0", "done", 1), ("j1", "failed", 1), ("j2", "running", 1), ("j3", "queued", 0)]
    failed = json.loads(run("ls", "--state", "failed", "--json", "--queue", str(queue.path)).stdout)
    assert [r["job_id"] for r in failed] == ["j1"] and failed[0]["result"]["fail_reason"] == "oom"
    last = json.loads(run("ls", "--limit", "1", "--json", "--queue", str(queue.path)).stdout)
    assert [r["job_id"] for r in last] == ["j3"]


def test_show_prints_result_and_worker_log(queue):
    queue.log_path("j0").parent.mkdir(parents=True, exist_ok=True)
    queue.log_path("j0").write_text("2026-01-01 worker=w1 attempt=1 end state=done seconds=1.0\n")
    out = run("show", "j0", "--queue", str(queue.path))
    assert out.exit_code == 0, out.output
    assert "done" in out.output and "post 0.6" in out.output and "end state=done" in out.output
    entry = json.loads(run("show", "j1", "--json", "--queue", str(queue.path)).stdout)
    assert entry["state"] == "failed" and entry["error"] == "CUDA out of memory"


def test_retry_requeues_failed_and_refuses_others(queue):
    out = run("retry", "j1", "--queue", str(queue.path))
    assert out.exit_code == 0, out.output
    entry = queue.get("j1")
    assert (entry.state.value, entry.attempts, entry.result) == ("queued", 0, None)
    refused = run("retry", "j0", "--queue", str(queue.path))
    assert refused.exit_code == 2
    assert one_line(refused.output) == "error: job 'j0' is done; only failed or dead jobs can be retried"
    assert queue.get("j0").state.value == "done"


def test_purge_default_is_finished_jobs_and_states_can_be_chosen(queue):
    out = run("purge", "--queue", str(queue.path))
    assert out.exit_code == 0 and "purged 2 job(s)" in out.output
    assert [e.job_id for e in queue.list()] == ["j2", "j3"]
    out = run("purge", "--state", "queued", "--queue", str(queue.path))
    assert "purged 1 job(s)" in out.output and [e.job_id for e in queue.list()] == ["j2"]
    bad = run("purge", "--state", "finished", "--queue", str(queue.path))
    assert bad.exit_code == 2 and "unknown state" in bad.output
    assert [e.job_id for e in queue.list()] == ["j2"]


@pytest.mark.parametrize("argv", [["show", "nope"], ["retry", "nope"]])
def test_unknown_job_is_a_one_line_error(queue, argv):
    out = run(*argv, "--queue", str(queue.path))
    assert out.exit_code == 2
    assert one_line(out.output) == f"error: no job 'nope' in {queue.path} (see `ait queue ls`)"


def test_missing_or_corrupt_queue_file_is_a_one_line_error(tmp_path):
    missing = tmp_path / "nothing.sqlite"
    out = run("ls", "--queue", str(missing))
    assert out.exit_code == 2 and one_line(out.output).startswith(f"error: no queue at {missing}: pass --queue PATH")
    assert not missing.exists()  # a typo never creates an empty queue
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(b"not a database, just bytes" * 200)
    out = run("ls", "--queue", str(corrupt))
    assert out.exit_code == 2 and one_line(out.output).startswith(f"error: {corrupt} is not an ait queue database")
    assert "Traceback" not in out.output
