"""The SQLite job queue: idempotency, FIFO claims, leases, stale results, admin calls."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import time

import pytest

from ait.job.types import FailReason, Job, JobConfig, JobResult
from ait.queue import JobQueue, JobState, QueueError, StaleLeaseError


def make_job(i: int) -> Job:
    cfg = JobConfig.model_validate(
        {
            "job": {"base_model": "tiny"},
            "train": {"max_steps": 1, "learning_rate": 1e-4, "num_generations": 2, "max_completion_length": 16},
        }
    )
    return Job(job_id=f"j{i}", run_dir="/tmp/r", workspace="/tmp/w", task_path="/tmp/t.json", config=cfg, time_budget_s=60)


def ok(job_id: str, post: float = 0.5) -> JobResult:
    return JobResult(job_id=job_id, ok=True, pre=0.1, post=post)


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def q(tmp_path, clock) -> JobQueue:
    return JobQueue(tmp_path / "sub" / "queue.db", lease_s=10, max_attempts=3, clock=clock)


def test_enqueue_is_idempotent_across_instances(q, tmp_path):
    assert q.enqueue(make_job(0)) is True
    assert q.enqueue(make_job(0)) is False
    other = JobQueue(q.path)  # a second process would open the same file like this
    assert other.enqueue(make_job(0)) is False
    assert [e.job_id for e in other.list()] == ["j0"]
    assert other.counts() == {"queued": 1, "running": 0, "done": 0, "failed": 0, "dead": 0}
    assert other.get("j0").job == make_job(0)
    assert other.get("nope") is None


def test_claim_is_fifo_even_with_equal_timestamps(q):
    for i in [2, 0, 1]:
        q.enqueue(make_job(i))
    leases = [q.claim("w") for _ in range(3)]
    assert [lease.job_id for lease in leases] == ["j2", "j0", "j1"]
    assert all(lease.attempt == 1 and lease.expires_at == 1010.0 for lease in leases)
    assert leases[0].job == make_job(2)
    assert q.claim("w") is None
    entry = q.get("j2")
    assert (entry.state, entry.attempts, entry.worker_id) == (JobState.running, 1, "w")


def _claim_all(path: str, worker_id: str, start, out) -> None:
    q = JobQueue(path)
    start.wait()
    claimed = []
    while (lease := q.claim(worker_id)) is not None:
        claimed.append(lease.job_id)
        q.complete(lease, ok(lease.job_id))
    out.put(claimed)


def test_concurrent_processes_claim_each_job_exactly_once(tmp_path):
    path = tmp_path / "queue.db"
    q = JobQueue(path)
    n = 200
    for i in range(n):
        q.enqueue(make_job(i))
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_claim_all, args=(str(path), f"w{k}", start, out)) for k in range(4)]
    for p in procs:
        p.start()
    start.set()
    claimed = [out.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    flat = [job_id for per_worker in claimed for job_id in per_worker]
    assert sorted(flat) == sorted(f"j{i}" for i in range(n))  # every job, none twice
    assert q.counts()["done"] == n
    assert all(e.attempts == 1 for e in q.list())


def test_heartbeat_extends_lease(q, clock):
    q.enqueue(make_job(0))
    lease = q.claim("w1")
    clock.t += 8
    assert q.heartbeat(lease) is True
    assert lease.expires_at == clock.t + 10
    clock.t += 8  # past the original expiry, within the extended one
    assert q.claim("w2") is None
    assert q.complete(lease, ok("j0")) is JobState.done
    assert q.heartbeat(lease) is False  # the job is no longer running


def test_expired_lease_is_reclaimed_and_old_worker_result_rejected(q, clock):
    q.enqueue(make_job(0))
    old = q.claim("w1")
    clock.t += 11
    new = q.claim("w2")
    assert (new.job_id, new.attempt, new.worker_id) == ("j0", 2, "w2")
    assert new.token != old.token
    assert q.heartbeat(old) is False
    with pytest.raises(StaleLeaseError, match="re-claimed by worker 'w2'"):
        q.complete(old, ok("j0", post=0.1))
    assert q.complete(new, ok("j0", post=0.9)) is JobState.done
    with pytest.raises(StaleLeaseError, match="now done"):
        q.complete(old, ok("j0", post=0.1))
    assert q.result("j0").post == 0.9
    assert q.get("j0").attempts == 2


def test_complete_after_expiry_is_rejected_even_if_not_reclaimed(q, clock):
    q.enqueue(make_job(0))
    lease = q.claim("w1")
    clock.t += 10
    with pytest.raises(StaleLeaseError, match="expired"):
        q.complete(lease, ok("j0"))
    assert q.result("j0") is None
    assert q.claim("w2").attempt == 2


def test_lease_expiring_max_attempts_times_marks_dead(q, clock):
    q.enqueue(make_job(0))
    q.enqueue(make_job(1))
    for attempt in (1, 2, 3):
        lease = q.claim("w")
        assert (lease.job_id, lease.attempt) == ("j0", attempt)
        clock.t += 11
    lease = q.claim("w")  # j0 is dead now; the next job is handed out instead
    assert lease.job_id == "j1"
    entry = q.get("j0")
    assert entry.state is JobState.dead
    assert entry.error == "lease expired 3 times; workers died"
    assert entry.lease_expires_at is None


def test_failed_result_is_final_not_retried(q):
    q.enqueue(make_job(0))
    lease = q.claim("w")
    bad = JobResult(job_id="j0", ok=False, fail_reason=FailReason.oom, error="CUDA out of memory")
    assert q.complete(lease, bad) is JobState.failed
    assert q.claim("w") is None
    entry = q.get("j0")
    assert (entry.state, entry.error, entry.result) == (JobState.failed, "CUDA out of memory", bad)


def test_complete_rejects_result_for_another_job(q):
    q.enqueue(make_job(0))
    lease = q.claim("w")
    with pytest.raises(ValueError, match="j1"):
        q.complete(lease, ok("j1"))


def test_release_requeues_keeping_the_spent_attempt(q):
    q.enqueue(make_job(0))
    lease = q.claim("w1")
    assert q.release(lease) is True
    entry = q.get("j0")
    assert (entry.state, entry.attempts, entry.lease_expires_at) == (JobState.queued, 1, None)
    assert q.release(lease) is False
    again = q.claim("w2")
    assert again.attempt == 2
    with pytest.raises(StaleLeaseError):
        q.complete(lease, ok("j0"))


def test_retry_resets_failed_and_dead_jobs_only(q):
    for i in range(2):
        q.enqueue(make_job(i))
    q.complete(q.claim("w"), JobResult(job_id="j0", ok=False, fail_reason=FailReason.crash, error="boom"))
    q.complete(q.claim("w"), ok("j1"))
    assert q.retry("j1") is False  # done stays done
    assert q.retry("missing") is False
    assert q.retry("j0") is True
    entry = q.get("j0")
    assert (entry.state, entry.attempts, entry.error, entry.result) == (JobState.queued, 0, None, None)
    assert q.claim("w").attempt == 1


def test_purge_deletes_only_given_states(q):
    for i in range(4):
        q.enqueue(make_job(i))
    q.complete(q.claim("w"), ok("j0"))
    q.complete(q.claim("w"), JobResult(job_id="j1", ok=False, fail_reason=FailReason.timeout))
    q.claim("w")  # j2 running, j3 queued
    assert q.purge([JobState.done, "failed"]) == 2
    assert q.purge([]) == 0
    assert [(e.job_id, e.state) for e in q.list()] == [("j2", JobState.running), ("j3", JobState.queued)]
    assert [e.job_id for e in q.list(JobState.queued)] == ["j3"]


def test_wait_returns_final_entry_or_times_out(q):
    q.enqueue(make_job(0))
    with pytest.raises(TimeoutError, match="'j0' still queued after 0.1s"):
        q.wait("j0", timeout_s=0.1, poll_s=0.01)
    with pytest.raises(QueueError, match="not in the queue"):
        q.wait("missing", timeout_s=0.1)
    q.complete(q.claim("w"), ok("j0"))
    assert q.wait("j0", timeout_s=1).state is JobState.done


def test_corrupt_or_foreign_file_gives_clear_error(tmp_path):
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(QueueError, match="garbage.db is not an ait queue database"):
        JobQueue(garbage)
    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE users (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(QueueError, match="foreign.db is not an ait queue database"):
        JobQueue(foreign)


def test_enqueue_many_is_one_batch_and_idempotent(q):
    assert q.enqueue(make_job(1)) is True
    assert q.enqueue_many([make_job(i) for i in range(4)]) == 3  # j1 was already known
    assert q.enqueue_many([]) == 0
    assert [e.job_id for e in q.list()] == ["j1", "j0", "j2", "j3"]  # enqueue order, not id order
    assert q.counts()["queued"] == 4


def test_claim_takes_the_oldest_of_queued_and_expired_jobs(q, clock):
    q.enqueue_many([make_job(i) for i in range(3)])
    first = q.claim("w1")  # j0 running
    clock.t += 11  # j0's lease expired; it is older than the queued j1 and j2
    assert [q.claim("w2").job_id for _ in range(3)] == ["j0", "j1", "j2"]
    assert q.get("j0").attempts == 2 and first.job_id == "j0"


def test_idle_claim_does_not_wait_for_the_write_lock(q):
    """An empty queue answers a poll with one read: a writer holding the lock (here for the
    whole test) must not stall idle workers for the busy timeout."""
    holder = sqlite3.connect(q.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        start = time.monotonic()
        assert q.claim("w") is None
        assert time.monotonic() - start < 10.0  # a stalled poll waits the 30 s busy timeout
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def _use_inherited_queue(q: JobQueue, out) -> None:
    lease = q.claim("child")
    out.put(None if lease is None else lease.job_id)


def test_connections_are_per_thread_and_never_cross_fork(q):
    import threading

    q.enqueue_many([make_job(i) for i in range(3)])
    assert q.list()  # the parent opens (and caches) its connection first
    seen = []
    thread = threading.Thread(target=lambda: seen.append(q.claim("thread").job_id))
    thread.start()
    thread.join()
    if "fork" in mp.get_all_start_methods():
        ctx = mp.get_context("fork")
        out = ctx.Queue()
        child = ctx.Process(target=_use_inherited_queue, args=(q, out))
        child.start()
        seen.append(out.get(timeout=30))
        child.join(timeout=30)
        assert child.exitcode == 0
    seen.append(q.claim("parent").job_id)
    assert sorted(seen) == [f"j{i}" for i in range(len(seen))]  # every claim got its own job


def test_log_path_is_under_the_queue_dir_and_safe(q):
    assert q.log_path("job-1") == q.path.parent / "logs" / "job-1.log"
    assert q.log_path("../../etc/passwd").parent == q.path.parent / "logs"
