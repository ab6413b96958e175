"""A durable job queue in one SQLite file, safe for several processes at once.

Each thread (and each forked process) keeps its own connection (WAL mode, busy timeout),
so queue objects can be shared by threads and created freely in workers and subprocesses.
Reusing connections matters: closing the last connection to a WAL database checkpoints
it, which made every call ~0.5 ms slower (`reuse_connections=False` keeps the old
behaviour for the throughput benchmark). State changes that read-then-write run under
`BEGIN IMMEDIATE`, which takes the write lock up front, so two workers can never claim
the same job or store two results for one job.
"""

from __future__ import annotations

import os
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import ValidationError

from ait.job.types import Job, JobResult, storable, unreadable_result
from ait.safe_io import describe_errors
from ait.queue.types import (
    FINAL_STATES,
    JobState,
    Lease,
    QueueEntry,
    QueueError,
    StaleLeaseError,
)

APPLICATION_ID = 0x61697471  # "aitq", stamped in the file header to recognise our databases
BUSY_TIMEOUT_MS = 30_000

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,  -- enqueue order, for FIFO claims
    job_id           TEXT NOT NULL UNIQUE,
    state            TEXT NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    worker_id        TEXT,
    token            TEXT,
    lease_expires_at REAL,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    error            TEXT,
    job              TEXT NOT NULL,
    result           TEXT
);
CREATE INDEX IF NOT EXISTS jobs_state_seq ON jobs (state, seq);
CREATE TABLE IF NOT EXISTS workers (
    worker_id        TEXT PRIMARY KEY,
    last_seen        REAL NOT NULL                       -- a serving worker touches this every few seconds
);
"""

# The oldest claimable job. Two index seeks, one per state, instead of `state = a OR state = b
# ORDER BY seq`, which sorted every queued row on each claim (slow with a long queue).
CLAIMABLE = """
SELECT * FROM (SELECT seq, job_id, attempts, job FROM jobs WHERE state = ?1 ORDER BY seq LIMIT 1)
UNION ALL
SELECT * FROM (SELECT seq, job_id, attempts, job FROM jobs WHERE state = ?2 AND lease_expires_at <= ?3
               ORDER BY seq LIMIT 1)
ORDER BY seq LIMIT 1
"""

COLUMNS = "job_id, state, attempts, worker_id, created_at, updated_at, lease_expires_at, error, job, result"


class JobQueue:
    """Queue of Jobs with leases, heartbeats, attempt counts and stale-result rejection."""

    def __init__(
        self,
        path: str | Path,
        lease_s: float = 60.0,
        max_attempts: int = 3,
        clock: Callable[[], float] = time.time,
        reuse_connections: bool = True,
        must_exist: bool = False,
    ) -> None:
        """`must_exist`: refuse a path with no queue yet (a consumer given a typo'd path would
        otherwise serve a new, empty queue forever)."""
        if lease_s <= 0 or max_attempts < 1:
            raise ValueError(f"need lease_s > 0 and max_attempts >= 1, got {lease_s=} {max_attempts=}")
        self.path = Path(path)
        if must_exist and not self.path.is_file():
            raise QueueError(f"no queue at {self.path}: check the path, or create it by enqueuing "
                             "(ait episode --executor queue --queue PATH) or with ait worker --create")
        self.lease_s = lease_s
        self.max_attempts = max_attempts
        self.clock = clock
        self.reuse_connections = reuse_connections
        self._local = threading.local()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._init_schema()

    # -- connections ---------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: we issue BEGIN/COMMIT ourselves.
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                               check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA synchronous = NORMAL")  # durable across process crashes in WAL mode
        return conn

    @contextmanager
    def _conn(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection. Keyed by pid too: a forked child must never use its
        parent's connection (SQLite connections do not survive fork)."""
        if not self.reuse_connections:
            conn = self._connect()
            try:
                yield conn
            finally:
                conn.close()
            return
        cached = getattr(self._local, "conn", None)
        if cached is None or cached[0] != os.getpid():
            cached = (os.getpid(), self._connect())
            self._local.conn = cached
        yield cached[1]

    def close(self) -> None:
        """Close this thread's connection (others close when their threads end)."""
        cached = getattr(self._local, "conn", None)
        self._local.conn = None
        if cached is not None and cached[0] == os.getpid():
            cached[1].close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction holding the write lock from its start."""
        with self._conn() as conn:
            if conn.in_transaction:  # a failed ROLLBACK left it open; never nest into it
                conn.execute("ROLLBACK")
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _read(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._conn() as conn:
            return conn.execute(sql, params).fetchall()

    def _init_schema(self) -> None:
        try:
            conn = self._connect()
            try:
                conn.execute("PRAGMA journal_mode = WAL")  # persists in the file; readers never block writers
                conn.execute("BEGIN IMMEDIATE")
                app_id = conn.execute("PRAGMA application_id").fetchone()[0]
                tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                if app_id not in (0, APPLICATION_ID) or (app_id == 0 and tables - {"sqlite_sequence"}):
                    raise QueueError(f"{self.path} is not an ait queue database: it holds other tables {sorted(tables)}")
                for stmt in SCHEMA.split(";"):
                    if stmt.strip():
                        conn.execute(stmt)
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute("COMMIT")
            finally:
                conn.close()
        except sqlite3.DatabaseError as e:
            raise QueueError(f"{self.path} is not an ait queue database: {e}") from e

    # -- producer side -------------------------------------------------------

    def enqueue(self, job: Job) -> bool:
        """Add a job; False (and nothing changes) when its job_id is already queued or known."""
        now = self.clock()
        with self._tx() as conn:
            cur = conn.execute(
                "INSERT INTO jobs (job_id, state, created_at, updated_at, job) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (job_id) DO NOTHING",
                (job.job_id, JobState.queued.value, now, now, job.model_dump_json()),
            )
            return cur.rowcount == 1

    def enqueue_many(self, jobs: Iterable[Job]) -> int:
        """Add many jobs in one transaction (an outer step's whole batch at once); returns how
        many were new. Same idempotency as `enqueue`: known job_ids are left untouched."""
        now = self.clock()
        rows = [(job.job_id, JobState.queued.value, now, now, job.model_dump_json()) for job in jobs]
        with self._tx() as conn:
            before = conn.total_changes
            conn.executemany(
                "INSERT INTO jobs (job_id, state, created_at, updated_at, job) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (job_id) DO NOTHING",
                rows,
            )
            return conn.total_changes - before

    # -- worker side ---------------------------------------------------------

    def claim(self, worker_id: str) -> Lease | None:
        """Lease the oldest queued job, or a running one whose lease expired (a new attempt)."""
        now = self.clock()
        params = (JobState.queued.value, JobState.running.value, now)
        # An idle poll is one read: no write lock, so many polling workers never queue up
        # behind each other (or behind enqueues) when there is nothing to hand out.
        if not self._read(CLAIMABLE, params):
            return None
        with self._tx() as conn:
            # Jobs whose last allowed attempt's lease ran out are dead, not handed out again.
            conn.execute(
                "UPDATE jobs SET state = ?, token = NULL, lease_expires_at = NULL, updated_at = ?,"
                " error = 'lease expired ' || attempts || ' times; workers died'"
                " WHERE state = ? AND lease_expires_at <= ? AND attempts >= ?",
                (JobState.dead.value, now, JobState.running.value, now, self.max_attempts),
            )
            row = conn.execute(CLAIMABLE, params).fetchone()
            if row is None:
                return None
            _, job_id, attempts, job_json = row
            token, expires_at = secrets.token_hex(16), now + self.lease_s
            conn.execute(
                "UPDATE jobs SET state = ?, attempts = ?, worker_id = ?, token = ?, lease_expires_at = ?,"
                " updated_at = ? WHERE job_id = ?",
                (JobState.running.value, attempts + 1, worker_id, token, expires_at, now, job_id),
            )
        return Lease(
            job_id=job_id,
            worker_id=worker_id,
            token=token,
            attempt=attempts + 1,
            expires_at=expires_at,
            job=Job.model_validate_json(job_json),
        )

    def heartbeat(self, lease: Lease) -> bool:
        """Extend the lease (and `lease.expires_at`); False when the worker no longer holds it."""
        now = self.clock()
        expires_at = now + self.lease_s
        with self._tx() as conn:
            cur = conn.execute(
                "UPDATE jobs SET lease_expires_at = ?, updated_at = ? WHERE job_id = ? AND token = ? AND state = ?",
                (expires_at, now, lease.job_id, lease.token, JobState.running.value),
            )
        if cur.rowcount != 1:
            return False
        lease.expires_at = expires_at
        return True

    def complete(self, lease: Lease, result: JobResult) -> JobState:
        """Store the job's result: done if ok, failed otherwise. Raises StaleLeaseError when
        the lease was lost (expired, re-claimed, released), so a job never gets two results."""
        if result.job_id != lease.job_id:
            raise ValueError(f"result is for job {result.job_id!r} but the lease is on {lease.job_id!r}")
        now = self.clock()
        result = storable(result)  # a result that would not read back is stored as the failed job it is
        state = JobState.done if result.ok else JobState.failed
        with self._tx() as conn:
            row = conn.execute(
                "SELECT state, token, lease_expires_at, worker_id, attempts FROM jobs WHERE job_id = ?",
                (lease.job_id,),
            ).fetchone()
            problem = _stale_reason(lease, row, now)
            if problem:
                raise StaleLeaseError(f"result for job {lease.job_id!r} from worker {lease.worker_id!r} "
                                      f"(attempt {lease.attempt}) discarded: {problem}")
            conn.execute(
                "UPDATE jobs SET state = ?, result = ?, error = ?, token = NULL, lease_expires_at = NULL,"
                " updated_at = ? WHERE job_id = ?",
                (state.value, result.model_dump_json(), None if result.ok else result.error, now, lease.job_id),
            )
        return state

    def release(self, lease: Lease) -> bool:
        """Hand a running job back to the queue (e.g. on SIGTERM); the attempt stays spent.
        False when the worker no longer held the lease."""
        with self._tx() as conn:
            cur = conn.execute(
                "UPDATE jobs SET state = ?, token = NULL, lease_expires_at = NULL, updated_at = ?"
                " WHERE job_id = ? AND token = ? AND state = ?",
                (JobState.queued.value, self.clock(), lease.job_id, lease.token, JobState.running.value),
            )
            return cur.rowcount == 1

    def cancel(self, job_id: str, reason: str) -> bool:
        """End a queued or running job as dead with `reason` (its episode gave up on it): no worker
        claims it again, and a worker still running it loses its lease (its result is refused).
        False when the job is unknown or already finished."""
        with self._tx() as conn:
            cur = conn.execute(
                "UPDATE jobs SET state = ?, token = NULL, lease_expires_at = NULL, error = ?, updated_at = ?"
                " WHERE job_id = ? AND state IN (?, ?)",
                (JobState.dead.value, reason, self.clock(), job_id, JobState.queued.value, JobState.running.value),
            )
            return cur.rowcount == 1

    def touch_worker(self, worker_id: str) -> None:
        """A serving worker says it is alive (episodes waiting on the queue read this)."""
        with self._tx() as conn:
            conn.execute("INSERT INTO workers (worker_id, last_seen) VALUES (?, ?)"
                         " ON CONFLICT (worker_id) DO UPDATE SET last_seen = excluded.last_seen",
                         (worker_id, self.clock()))

    def live_workers(self, within_s: float = 30.0) -> list[str]:
        """Workers seen in the last `within_s` seconds."""
        rows = self._read("SELECT worker_id FROM workers WHERE last_seen >= ? ORDER BY worker_id",
                          (self.clock() - within_s,))
        return [r[0] for r in rows]

    # -- inspection and admin ------------------------------------------------

    def log_path(self, job_id: str) -> Path:
        """Where workers log this job's claims and outcomes: <queue dir>/logs/<job_id>.log."""
        return self.path.parent / "logs" / f"{re.sub(r'[^A-Za-z0-9._-]', '_', job_id)}.log"

    def get(self, job_id: str) -> QueueEntry | None:
        rows = self._read(f"SELECT {COLUMNS} FROM jobs WHERE job_id = ?", (job_id,))
        return _entry(rows[0]) if rows else None

    def list(self, state: JobState | None = None) -> list[QueueEntry]:
        """All entries in enqueue order, optionally only those in one state."""
        if state is None:
            rows = self._read(f"SELECT {COLUMNS} FROM jobs ORDER BY seq")
        else:
            rows = self._read(f"SELECT {COLUMNS} FROM jobs WHERE state = ? ORDER BY seq", (JobState(state).value,))
        return [_entry(r) for r in rows]

    def result(self, job_id: str) -> JobResult | None:
        entry = self.get(job_id)
        return entry.result if entry else None

    def counts(self) -> dict[str, int]:
        """Number of jobs per state, every state present (zeros included)."""
        counts = {s.value: 0 for s in JobState}
        counts.update(dict(self._read("SELECT state, COUNT(*) FROM jobs GROUP BY state")))
        return counts

    def retry(self, job_id: str) -> bool:
        """Put a failed or dead job back in the queue with its attempts reset.
        False when the job is unknown or not failed/dead."""
        with self._tx() as conn:
            cur = conn.execute(
                "UPDATE jobs SET state = ?, attempts = 0, worker_id = NULL, token = NULL, lease_expires_at = NULL,"
                " error = NULL, result = NULL, updated_at = ? WHERE job_id = ? AND state IN (?, ?)",
                (JobState.queued.value, self.clock(), job_id, JobState.failed.value, JobState.dead.value),
            )
            return cur.rowcount == 1

    def purge(self, states: Iterable[JobState | str]) -> int:
        """Delete every job in these states; returns how many were deleted."""
        values = [JobState(s).value for s in states]
        if not values:
            return 0
        with self._tx() as conn:
            marks = ", ".join("?" * len(values))
            return conn.execute(f"DELETE FROM jobs WHERE state IN ({marks})", values).rowcount

    def wait(self, job_id: str, timeout_s: float, poll_s: float = 0.05,
             on_poll: Callable[[QueueEntry], None] | None = None) -> QueueEntry:
        """Poll until the job is done, failed or dead, and return its entry (`on_poll` sees each
        unfinished state, about once a second)."""
        deadline = time.monotonic() + timeout_s  # real time: the injected clock may stand still
        last_report = 0.0
        while True:
            entry = self.get(job_id)
            if entry is None:
                raise QueueError(f"job {job_id!r} is not in the queue at {self.path}")
            if entry.state in FINAL_STATES:
                return entry
            if on_poll is not None and time.monotonic() - last_report >= 1.0:
                last_report = time.monotonic()
                on_poll(entry)
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"job {job_id!r} still {entry.state.value} after {timeout_s:g}s "
                    f"(attempts={entry.attempts}, worker={entry.worker_id})"
                )
            time.sleep(poll_s)


def _stale_reason(lease: Lease, row: tuple | None, now: float) -> str | None:
    """Why this lease may no longer report a result, or None if it still may."""
    if row is None:
        return "the job is no longer in the queue"
    state, token, expires_at, worker_id, attempts = row
    if token != lease.token:
        if state == JobState.running.value:
            return f"the job was re-claimed by worker {worker_id!r} (attempt {attempts})"
        return f"the lease was given up or taken over; the job is now {state}"
    if state != JobState.running.value:
        return f"the job is {state}, not running"
    if expires_at is not None and expires_at <= now:
        return f"the lease expired {now - expires_at:.1f}s ago; the job will run again"
    return None


def _read_result(job_id: str, text: str) -> JobResult | None:
    """The stored result, or a failed one saying why it cannot be read (an older version's row, a
    NaN stored as null before `storable`): one bad row never breaks `list`, `ait queue ls` or the
    episode waiting on it, and its job is never taken for one that did not run."""
    try:
        return JobResult.model_validate_json(text)
    except ValidationError as e:  # bad JSON too
        return unreadable_result(job_id, text, describe_errors(e))


def _entry(row: tuple) -> QueueEntry:
    job_id, state, attempts, worker_id, created_at, updated_at, expires_at, error, job, result = row
    parsed = _read_result(job_id, result) if result else None
    if parsed is not None and not parsed.ok and state == JobState.done.value:  # stored ok, read back failed
        state, error = JobState.failed.value, parsed.error
    return QueueEntry(
        job_id=job_id,
        state=JobState(state),
        attempts=attempts,
        worker_id=worker_id,
        created_at=created_at,
        updated_at=updated_at,
        lease_expires_at=expires_at,
        error=error,
        job=Job.model_validate_json(job),
        result=parsed,
    )
