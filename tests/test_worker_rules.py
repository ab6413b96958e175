"""The worker's rules without its threads and signals: what becomes of a run that ended (`verdict`),
when the loop stops, releases or exits (`StopRules`), and `Slots` applying them to a real queue with a
launcher whose runs end when the test says. (tests/test_worker_pool.py runs them through `serve`.)"""

from __future__ import annotations

import sqlite3
from concurrent.futures import Future
from pathlib import Path

from ait.compute.worker import Slots
from ait.compute.worker_rules import Run, StopRules, WorkerOptions, verdict
from ait.job.types import FailReason, Job, JobConfig, JobResult
from ait.queue import JobQueue, JobState

TASK = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "calc_chain.json"
CFG = JobConfig.model_validate({"job": {"base_model": "tiny"}, "train": {
    "max_steps": 1, "learning_rate": 1e-4, "num_generations": 2, "max_completion_length": 16}})


def fake_job(tmp_path: Path, i: int) -> Job:
    return Job(job_id=f"j{i}", run_dir=str(tmp_path / "runs" / f"j{i}"), workspace=str(tmp_path),
               task_path=str(TASK), config=CFG, time_budget_s=60)


def leased(tmp_path: Path, n: int = 1, **queue_args) -> tuple[JobQueue, list]:
    queue = JobQueue(tmp_path / "q.sqlite", **queue_args)
    queue.enqueue_many([fake_job(tmp_path, i) for i in range(n)])
    return queue, [queue.claim("w") for _ in range(n)]


def ended(value: object = None, error: BaseException | None = None) -> Future:
    fut: Future = Future()
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)
    return fut


def no_result(job: Job, error: BaseException) -> None:
    return None  # the executor lost the job (a Ray node died): no result of the job's own


# ---------------------------------------------------------------- verdict


def test_a_released_run_is_dropped_and_a_lost_one_rejected_whatever_it_returned(tmp_path):
    _, (lease,) = leased(tmp_path)
    ok = ended(JobResult(job_id="j0", ok=True))
    assert verdict(Run(lease, 0, released=True), ok, no_result, 3).action == "drop"
    assert verdict(Run(lease, 0, released=True, lost=True), ok, no_result, 3).action == "drop"
    assert verdict(Run(lease, 0, lost=True), ok, no_result, 3).action == "reject"


def test_a_result_is_completed_and_a_foreign_one_is_an_infra_failure(tmp_path):
    _, (lease,) = leased(tmp_path)
    mine = JobResult(job_id="j0", ok=True, metrics={"x": 1.0})
    assert verdict(Run(lease, 0), ended(mine), no_result, 3).result == mine
    for returned in (JobResult(job_id="someone-else", ok=True), "not a result", None):
        v = verdict(Run(lease, 0), ended(returned), no_result, 3)
        assert v.action == "complete" and v.result.fail_reason is FailReason.infra and "another job" in v.result.error


def test_an_executor_error_is_its_result_released_while_attempts_remain_then_infra(tmp_path):
    _, (lease,) = leased(tmp_path)
    boom = ended(error=RuntimeError("node died"))
    as_result = JobResult(job_id="j0", ok=False, fail_reason=FailReason.crash, error="converted")
    assert verdict(Run(lease, 0), boom, lambda job, e: as_result, 3).result == as_result
    v = verdict(Run(lease, 0), boom, no_result, 3)  # attempt 1 of 3
    assert (v.action, v.error) == ("release", "RuntimeError: node died")
    last = lease.model_copy(update={"attempt": 3})
    v = verdict(Run(last, 0), boom, no_result, 3)
    assert v.action == "complete" and v.result.fail_reason is FailReason.infra
    assert v.result.error == "the executor lost the job on attempt 3 (RuntimeError: node died)"


# ---------------------------------------------------------------- StopRules


def test_the_first_signal_stops_claiming_once_and_starts_the_drain_clock():
    rules = StopRules(WorkerOptions(drain_timeout_s=5.0), started=0.0, idle_since=0.0)
    assert not rules.start_stopping(0, 1.0) and not rules.stopping
    assert rules.start_stopping(1, 2.0) and rules.stopping and rules.drain_deadline == 7.0
    assert not rules.start_stopping(2, 3.0) and rules.drain_deadline == 7.0  # once
    # released on a second signal, or when the drain times out, and only with jobs running
    assert not rules.release_now(1, 1, 6.9) and rules.release_now(1, 1, 7.0) and rules.release_now(2, 1, 3.0)
    assert not rules.release_now(2, 0, 8.0)
    # without drain_timeout_s a first signal waits for the running jobs however long they take
    patient = StopRules(WorkerOptions(), started=0.0, idle_since=0.0)
    assert patient.start_stopping(1, 0.0) and not patient.release_now(1, 1, 1e9) and patient.release_now(2, 1, 0.0)


def test_the_loop_exits_only_with_nothing_running_or_just_claimed():
    rules = StopRules(WorkerOptions(idle_exit_s=10.0), started=0.0, idle_since=0.0)
    assert not rules.exit_now(running=1, claimed_now=False, claimed_ever=1, now=100.0)
    assert rules.idle_since == 100.0  # busy: the idle clock restarts
    assert not rules.exit_now(0, True, 2, 105.0) and not rules.exit_now(0, False, 2, 114.9)
    assert rules.exit_now(0, False, 2, 115.0)  # idle_exit_s after the last job
    stopping = StopRules(WorkerOptions(), started=0.0, idle_since=0.0, stopping=True)
    assert stopping.exit_now(0, False, 0, 0.0) and not stopping.exit_now(1, False, 0, 0.0)
    never = StopRules(WorkerOptions(), started=0.0, idle_since=0.0)
    assert not never.exit_now(0, False, 0, 1e9)  # neither once nor idle_exit_s: serve until signalled


def test_once_exits_after_a_first_job_or_the_grace_for_one():
    rules = StopRules(WorkerOptions(once=True, once_grace_s=3.0), started=10.0, idle_since=10.0)
    assert not rules.exit_now(0, False, 0, 12.9) and rules.exit_now(0, False, 0, 13.0)
    assert rules.exit_now(0, False, 1, 10.5)  # a job ran: nothing queued now means done


# ---------------------------------------------------------------- Slots, with no thread and no signal


class Launcher:
    """Runs that end when the test ends them (or when stopped: a killed run ends with an error)."""

    def __init__(self, n: int = 1, to_result=no_result) -> None:
        self.slots = [{"SLOT": str(i)} for i in range(n)]
        self.runs: dict[str, Future] = {}
        self.stopped: list[str] = []
        self._to_result = to_result

    def describe(self) -> str:
        return "test launcher"

    def submit(self, job: Job, env: dict[str, str]) -> Future:
        self.runs[job.job_id] = Future()
        return self.runs[job.job_id]

    def stop(self, job: Job, future: Future) -> None:
        self.stopped.append(job.job_id)
        if not future.done():
            future.set_exception(RuntimeError("killed"))

    def to_result(self, job: Job, error: BaseException) -> JobResult | None:
        return self._to_result(job, error)

    def close(self) -> None:
        pass


def test_slots_claim_one_job_per_free_slot_and_complete_results(tmp_path):
    queue = JobQueue(tmp_path / "q.sqlite")
    queue.enqueue_many([fake_job(tmp_path, i) for i in range(3)])
    launcher, events = Launcher(2), []
    slots = Slots(queue, launcher, "w", on_event=lambda e, s: events.append((e.kind, e.job_id, s.busy)))
    assert slots.claim() == 2 and slots.claim() == 0 and sorted(launcher.runs) == ["j0", "j1"]
    launcher.runs["j0"].set_result(JobResult(job_id="j0", ok=True))
    launcher.runs["j1"].set_result(JobResult(job_id="j1", ok=False, fail_reason=FailReason.timeout))
    slots.finish_done(timeout=1.0)  # both ended: both finished
    assert (slots.stats.done, slots.stats.failed, sorted(slots.free), slots.running) == (1, 1, [0, 1], {})
    assert queue.get("j0").state is JobState.done and queue.get("j1").state is JobState.failed
    assert slots.claim() == 1 and "j2" in launcher.runs  # a freed slot takes the next job
    kinds = [k for k, _, _ in events]
    assert kinds[:2] == ["claimed", "claimed"] and sorted(kinds[2:4]) == ["done", "failed"] and kinds[4:] == ["claimed"]
    assert [busy for _, _, busy in events] == [1, 2, 1, 0, 1]  # events report the slots in use
    assert "end state=failed reason=timeout" in queue.log_path("j1").read_text()


def test_a_heartbeat_that_finds_the_lease_gone_stops_the_run_and_its_result_is_rejected(tmp_path):
    queue = JobQueue(tmp_path / "q.sqlite")
    queue.enqueue(fake_job(tmp_path, 0))
    launcher = Launcher()
    slots = Slots(queue, launcher, "w")
    slots.claim()
    slots.heartbeat()
    assert launcher.stopped == [] and slots.stats.lost == 0  # still ours
    with sqlite3.connect(queue.path) as conn:  # another worker took the job
        conn.execute("UPDATE jobs SET token = 'stolen', worker_id = 'thief' WHERE job_id = 'j0'")
    slots.heartbeat()
    slots.heartbeat()  # a lost run is not beaten again
    assert launcher.stopped == ["j0"] and slots.stats.lost == 1
    slots.finish_done(timeout=1.0)
    assert (slots.stats.rejected, slots.stats.done, slots.stats.failed) == (1, 0, 0)
    assert queue.get("j0").worker_id == "thief"
    log = queue.log_path("j0").read_text()
    assert "lease lost while running" in log and "result rejected" in log


def test_a_job_the_executor_lost_goes_back_to_the_queue(tmp_path):
    queue = JobQueue(tmp_path / "q.sqlite", max_attempts=2)
    queue.enqueue(fake_job(tmp_path, 0))
    launcher = Launcher()
    slots = Slots(queue, launcher, "w")
    slots.claim()
    launcher.runs["j0"].set_exception(ConnectionError("node died"))
    slots.finish_done(timeout=1.0)
    assert slots.stats.released == 1 and queue.get("j0").state is JobState.queued
    slots.claim()  # attempt 2 of 2: lost again, the job fails as the infrastructure's fault
    launcher.runs["j0"].set_exception(ConnectionError("node died again"))
    slots.finish_done(timeout=1.0)
    entry = queue.get("j0")
    assert entry.state is JobState.failed and entry.result.fail_reason is FailReason.infra
    assert "the executor lost the job on attempt 2" in entry.error


def test_release_all_stops_every_run_and_hands_its_lease_back(tmp_path):
    queue = JobQueue(tmp_path / "q.sqlite")
    queue.enqueue_many([fake_job(tmp_path, i) for i in range(2)])
    launcher = Launcher(2)
    slots = Slots(queue, launcher, "w")
    slots.claim()
    slots.release_all("second signal")
    assert sorted(launcher.stopped) == ["j0", "j1"] and not slots.running and sorted(slots.free) == [0, 1]
    assert slots.stats.released == 2 and (slots.stats.done, slots.stats.failed, slots.stats.rejected) == (0, 0, 0)
    for job_id in ("j0", "j1"):
        entry = queue.get(job_id)
        assert (entry.state, entry.attempts, entry.result) == (JobState.queued, 1, None)
        assert "released back to the queue (second signal)" in queue.log_path(job_id).read_text()
