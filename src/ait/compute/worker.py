"""The worker: lease jobs from the queue and run them on an executor's slots.

One loop serves every executor: `local` (a thread per slot waiting on run_job, GPU
pinned through CUDA_VISIBLE_DEVICES) and `ray` (Ray tasks). It claims a job whenever
a slot is free; one heartbeat thread keeps every running job's lease alive; each result
goes back through `complete`. If the worker dies, its leases expire and other workers
run the jobs again; the queue rejects the dead worker's late results, so a job gets
exactly one result.

Signals: the first SIGTERM (or Ctrl-C) stops claiming and lets running jobs finish; a
second one, or `drain_timeout_s` after the first, kills them and releases them back to
the queue. Each job gets a worker-side log, <queue dir>/logs/<job_id>.log.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal, Protocol, Self

from pydantic import BaseModel

from ait.compute.local import LocalLauncher
from ait.compute.run_job import run_job
from ait.job.types import FailReason, Job, JobResult
from ait.queue import JobQueue, JobState, Lease, QueueError, StaleLeaseError

KILL_GRACE_S = 30.0  # how long a released job's slot may take to notice its processes died
TOUCH_EVERY_S = 5.0  # how often a serving worker marks itself alive in the queue


def worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class WorkerOptions(BaseModel):
    once: bool = False
    """Exit as soon as nothing is queued and nothing runs."""
    once_grace_s: float = 0.0
    """With `once`: before the first job, wait this long for one to be queued (a worker started just
    before its episode enqueues would otherwise exit at once and leave the episode waiting)."""
    idle_exit_s: float | None = None
    """Exit after this long with nothing to run."""
    poll_s: float = 0.05
    """How often an idle slot asks the queue for work (an idle poll is one cheap read)."""
    drain_timeout_s: float | None = None
    """After the first SIGTERM, release still-running jobs after this many seconds."""


class WorkerStats(BaseModel):
    worker_id: str
    """This worker's id in the queue."""
    slots: int
    """Jobs it runs at once."""
    busy: int = 0
    """Jobs running now."""
    claimed: int = 0
    """Leases taken."""
    done: int = 0
    """Results stored as done."""
    failed: int = 0
    """Results stored as failed (crash, OOM, timeout, killed)."""
    rejected: int = 0
    """Results discarded because the lease was lost (the job ran again elsewhere)."""
    released: int = 0
    """Jobs handed back to the queue unfinished (shutdown, or the executor lost them)."""
    lost: int = 0
    """Leases found lost by a heartbeat while the job still ran."""
    stopping: bool = False
    """No longer claiming (a SIGTERM arrived)."""


class WorkerEvent(BaseModel):
    kind: Literal["claimed", "done", "failed", "rejected", "released", "stopping"]
    """What happened."""
    job_id: str | None = None
    """The job it happened to."""
    message: str
    """One line for humans."""


class Launcher(Protocol):
    """An executor as the worker loop sees it (LocalLauncher, RayLauncher)."""

    slots: list[dict[str, str]]

    def describe(self) -> str: ...
    def submit(self, job: Job, env: dict[str, str]) -> Future: ...
    def stop(self, job: Job, future: Future) -> None: ...
    def to_result(self, job: Job, error: BaseException) -> JobResult | None: ...
    def close(self) -> None: ...


class JobLog:
    """Worker-side log per job (`JobQueue.log_path`): claims, results, rejections, releases,
    one line each. Lines are appended with O_APPEND, so workers on one queue can share files."""

    def __init__(self, queue: JobQueue, wid: str) -> None:
        self.queue = queue
        self.wid = wid

    def write(self, lease: Lease, text: str) -> None:
        stamp = datetime.now(UTC).isoformat(timespec="milliseconds")
        line = f"{stamp} worker={self.wid} attempt={lease.attempt} {text}\n"
        path = self.queue.log_path(lease.job_id)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write(line)
        except OSError:
            pass  # a full disk must not stop the worker; the queue still records the outcome


@dataclass
class _Running:
    lease: Lease
    slot: int
    started: float = field(default_factory=time.monotonic)
    lost: bool = False
    released: bool = False


class _Signals:
    """Counts SIGTERM/SIGINT while installed (main thread only); restores the old handlers."""

    def __init__(self) -> None:
        self.count = 0
        self.event = threading.Event()
        self._old: dict[int, object] = {}

    def _handle(self, *_: object) -> None:
        self.count += 1
        self.event.set()

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *_: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _heartbeats(queue: JobQueue, launcher: Launcher, running: dict[Future, _Running], lock: threading.Lock,
                stop: threading.Event, log: JobLog, stats: WorkerStats) -> None:
    interval = max(queue.lease_s / 3, 0.05)
    while not stop.wait(interval):
        with lock:
            live = [(fut, r) for fut, r in running.items() if not (r.lost or r.released)]
        for fut, r in live:
            try:
                held = queue.heartbeat(r.lease)
            except (sqlite3.Error, QueueError):
                continue  # the database is busy or briefly unreachable: try again next beat
            if not held:
                # Another worker owns (or will own) the job now; ours can only waste the slot.
                r.lost = True
                stats.lost += 1
                log.write(r.lease, "lease lost while running; stopping this run (it runs again elsewhere)")
                launcher.stop(r.lease.job, fut)


def serve(queue: JobQueue, launcher: Launcher, options: WorkerOptions | None = None, *,
          wid: str | None = None, on_event: Callable[[WorkerEvent, WorkerStats], None] | None = None) -> WorkerStats:
    """Serve jobs until stopped (signals, `once`, `idle_exit_s`); returns the counts."""
    opts = options or WorkerOptions()
    wid = wid or worker_id()
    stats = WorkerStats(worker_id=wid, slots=len(launcher.slots))
    log = JobLog(queue, wid)
    free = list(range(len(launcher.slots)))
    running: dict[Future, _Running] = {}
    lock = threading.Lock()

    def emit(kind: str, message: str, job_id: str | None = None) -> None:
        stats.busy = len(running)
        if on_event:
            on_event(WorkerEvent(kind=kind, job_id=job_id, message=message), stats)

    def finish(fut: Future) -> None:
        with lock:
            r = running.pop(fut)
        free.append(r.slot)
        if r.released:
            return  # handed back on shutdown; the next attempt reports
        lease, seconds = r.lease, time.monotonic() - r.started
        if r.lost:  # a heartbeat found the lease gone: whatever the run returned, complete() would refuse it
            stats.rejected += 1
            log.write(lease, f"result rejected after {seconds:.1f}s: the lease was lost while running")
            emit("rejected", f"{lease.job_id} result discarded: lease lost", lease.job_id)
            return
        try:
            result = fut.result()
        except BaseException as e:  # noqa: BLE001 - any failure of the executor is the job's outcome
            result = launcher.to_result(lease.job, e)
            if result is None and lease.attempt < queue.max_attempts:
                # The executor lost the job (a Ray node died): not the job's fault, run it again.
                released = queue.release(lease)
                stats.released += released
                log.write(lease, f"executor lost the job ({type(e).__name__}: {e}); released={released}")
                emit("released", f"{lease.job_id} lost by the executor; back in the queue", lease.job_id)
                return
            if result is None:
                result = JobResult(job_id=lease.job_id, ok=False, fail_reason=FailReason.infra,
                                   error=f"the executor lost the job on attempt {lease.attempt} "
                                         f"({type(e).__name__}: {e})")
        if not isinstance(result, JobResult) or result.job_id != lease.job_id:
            result = JobResult(job_id=lease.job_id, ok=False, fail_reason=FailReason.infra,
                               error=f"job function returned {type(result).__name__} for another job, not this one's JobResult")
        try:
            state = queue.complete(lease, result)
        except StaleLeaseError as e:
            stats.rejected += 1
            log.write(lease, f"result rejected after {seconds:.1f}s: {e}")
            emit("rejected", f"{lease.job_id} result discarded: lease lost", lease.job_id)
            return
        ok = state is JobState.done
        stats.done += ok
        stats.failed += not ok
        reason = "" if ok else f" reason={result.fail_reason.value if result.fail_reason else '-'}"
        log.write(lease, f"end state={state.value}{reason} seconds={seconds:.1f}")
        emit(state.value, f"{lease.job_id} {state.value}{reason} in {seconds:.1f}s", lease.job_id)

    def release_all(why: str) -> None:
        with lock:
            items = list(running.items())
        for fut, r in items:
            r.released = True  # first, so finish() never completes it
            launcher.stop(r.lease.job, fut)
            released = queue.release(r.lease)
            stats.released += released
            log.write(r.lease, f"released back to the queue ({why}); released={released}")
            emit("released", f"{r.lease.job_id} released ({why})", r.lease.job_id)
        deadline = time.monotonic() + KILL_GRACE_S
        while running and time.monotonic() < deadline:
            done, _ = wait(list(running), timeout=0.2)
            for fut in done:
                finish(fut)
            for fut, r in list(running.items()):
                launcher.stop(r.lease.job, fut)  # a process may have started after the first kill

    stop_beats = threading.Event()
    beats = threading.Thread(target=_heartbeats, args=(queue, launcher, running, lock, stop_beats, log, stats),
                             name="ait-heartbeat", daemon=True)
    beats.start()
    idle_since, drain_deadline = time.monotonic(), None
    started, last_touch = time.monotonic(), 0.0
    try:
        with _Signals() as signals:
            while True:
                if time.monotonic() - last_touch >= TOUCH_EVERY_S:  # waiting episodes see a live worker
                    last_touch = time.monotonic()
                    try:
                        queue.touch_worker(wid)
                    except (sqlite3.Error, QueueError):
                        pass
                if signals.count and not stats.stopping:
                    stats.stopping = True
                    if opts.drain_timeout_s is not None:
                        drain_deadline = time.monotonic() + opts.drain_timeout_s
                    emit("stopping", f"stopping: no new jobs; waiting for {len(running)} running "
                                     f"(signal again to release them)")
                if running and (signals.count >= 2 or (drain_deadline and time.monotonic() >= drain_deadline)):
                    release_all("second signal" if signals.count >= 2 else "drain timeout")
                    break
                claimed = False
                while not stats.stopping and free:
                    lease = queue.claim(wid)
                    if lease is None:
                        break
                    claimed = True
                    slot = free.pop(0)
                    env = launcher.slots[slot]
                    stats.claimed += 1
                    shown = " ".join(f"{k}={v!r}" for k, v in env.items())
                    log.write(lease, f"start slot={slot} {shown}".rstrip())
                    with lock:
                        running[launcher.submit(lease.job, env)] = _Running(lease, slot)
                    emit("claimed", f"{lease.job_id} started (attempt {lease.attempt}, slot {slot})", lease.job_id)
                if running or claimed:
                    idle_since = time.monotonic()
                elif stats.stopping or (opts.once and (stats.claimed or time.monotonic() - started >= opts.once_grace_s)) \
                        or (opts.idle_exit_s is not None and time.monotonic() - idle_since >= opts.idle_exit_s):
                    break
                if running:
                    done, _ = wait(list(running), timeout=opts.poll_s, return_when=FIRST_COMPLETED)
                    for fut in done:
                        finish(fut)
                else:
                    signals.event.wait(opts.poll_s)
    finally:
        stop_beats.set()
        beats.join()
        launcher.close()
    stats.busy = len(running)
    return stats


def run_worker(queue: JobQueue, *, once: bool = False, idle_exit_s: float | None = None, poll_s: float = 0.05,
               on_job: Callable[[str], None] | None = None,
               job_fn: Callable[[Job], JobResult] = run_job) -> int:
    """One slot, the job function called with the job alone (the process's own environment).
    Returns how many jobs ran to a result (stored or rejected)."""
    def on_event(event: WorkerEvent, _: WorkerStats) -> None:
        if on_job and event.kind in ("done", "failed", "rejected") and event.job_id:
            on_job(event.job_id)

    launcher = LocalLauncher([{}], job_fn=lambda job, env: job_fn(job))
    stats = serve(queue, launcher, WorkerOptions(once=once, idle_exit_s=idle_exit_s, poll_s=poll_s),
                  on_event=on_event)
    return stats.done + stats.failed + stats.rejected
