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

What becomes of a run that ended, and when the loop stops, are ait.compute.worker_rules'; `Slots`
applies them to the queue and the executor; `serve` adds the heartbeat thread and the signals.
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
from datetime import UTC, datetime
from typing import Literal, Protocol, Self

from pydantic import BaseModel

from ait.compute.local import LocalLauncher
from ait.compute.run_job import run_job
from ait.compute.worker_rules import Run, StopRules, WorkerOptions, verdict
from ait.job.types import Job, JobResult
from ait.queue import JobQueue, JobState, Lease, QueueError, StaleLeaseError

KILL_GRACE_S = 30.0  # how long a released job's slot may take to notice its processes died
TOUCH_EVERY_S = 5.0  # how often a serving worker marks itself alive in the queue


def worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


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


# ---------------------------------------------------------------- the slots and their leases


class Slots:
    """The executor's slots and the jobs running on them, each under a lease: claim, renew (heartbeat),
    settle (`verdict`) and release. The heartbeat thread calls `heartbeat` while the loop calls the rest:
    `running` is read by both under `lock`, and only the loop adds or removes runs."""

    def __init__(self, queue: JobQueue, launcher: Launcher, wid: str,
                 on_event: Callable[[WorkerEvent, WorkerStats], None] | None = None) -> None:
        self.queue, self.launcher, self.wid, self.on_event = queue, launcher, wid, on_event
        self.stats = WorkerStats(worker_id=wid, slots=len(launcher.slots))
        self.log = JobLog(queue, wid)
        self.free = list(range(len(launcher.slots)))
        self.running: dict[Future, Run] = {}
        self.lock = threading.Lock()

    def emit(self, kind: str, message: str, job_id: str | None = None) -> None:
        self.stats.busy = len(self.running)
        if self.on_event:
            self.on_event(WorkerEvent(kind=kind, job_id=job_id, message=message), self.stats)

    def touch(self) -> None:
        """Mark this worker alive in the queue (waiting episodes see a live worker)."""
        try:
            self.queue.touch_worker(self.wid)
        except (sqlite3.Error, QueueError):
            pass

    def claim(self) -> int:
        """Lease a job for every free slot while the queue has one, and start it; how many started."""
        claimed = 0
        while self.free:
            lease = self.queue.claim(self.wid)
            if lease is None:
                break
            claimed += 1
            slot = self.free.pop(0)
            env = self.launcher.slots[slot]
            self.stats.claimed += 1
            shown = " ".join(f"{k}={v!r}" for k, v in env.items())
            self.log.write(lease, f"start slot={slot} {shown}".rstrip())
            with self.lock:
                self.running[self.launcher.submit(lease.job, env)] = Run(lease, slot)
            self.emit("claimed", f"{lease.job_id} started (attempt {lease.attempt}, slot {slot})", lease.job_id)
        return claimed

    def heartbeat(self) -> None:
        """Renew every running job's lease once. A lease another worker owns (or will own) now stops its
        run: ours could only waste the slot, and its result would be refused."""
        with self.lock:
            live = [(fut, r) for fut, r in self.running.items() if not (r.lost or r.released)]
        for fut, r in live:
            try:
                held = self.queue.heartbeat(r.lease)
            except (sqlite3.Error, QueueError):
                continue  # the database is busy or briefly unreachable: try again next beat
            if not held:
                r.lost = True
                self.stats.lost += 1
                self.log.write(r.lease, "lease lost while running; stopping this run (it runs again elsewhere)")
                self.launcher.stop(r.lease.job, fut)

    def finish(self, fut: Future) -> None:
        """Free a done run's slot and act on its verdict."""
        with self.lock:
            run = self.running.pop(fut)
        self.free.append(run.slot)
        lease, seconds = run.lease, time.monotonic() - run.started
        v = verdict(run, fut, self.launcher.to_result, self.queue.max_attempts)
        if v.action == "drop":
            return
        if v.action == "reject":
            self._reject(lease, seconds, "the lease was lost while running")
            return
        if v.action == "release":
            released = self.queue.release(lease)
            self.stats.released += released
            self.log.write(lease, f"executor lost the job ({v.error}); released={released}")
            self.emit("released", f"{lease.job_id} lost by the executor; back in the queue", lease.job_id)
            return
        assert v.result is not None
        try:
            state = self.queue.complete(lease, v.result)
        except StaleLeaseError as e:
            self._reject(lease, seconds, str(e))
            return
        ok = state is JobState.done
        self.stats.done += ok
        self.stats.failed += not ok
        reason = "" if ok else f" reason={v.result.fail_reason.value if v.result.fail_reason else '-'}"
        self.log.write(lease, f"end state={state.value}{reason} seconds={seconds:.1f}")
        self.emit(state.value, f"{lease.job_id} {state.value}{reason} in {seconds:.1f}s", lease.job_id)

    def _reject(self, lease: Lease, seconds: float, why: str) -> None:
        self.stats.rejected += 1
        self.log.write(lease, f"result rejected after {seconds:.1f}s: {why}")
        self.emit("rejected", f"{lease.job_id} result discarded: lease lost", lease.job_id)

    def finish_done(self, timeout: float) -> None:
        """Wait up to `timeout` for a run to end, and finish every run that has."""
        done, _ = wait(list(self.running), timeout=timeout, return_when=FIRST_COMPLETED)
        for fut in done:
            self.finish(fut)

    def release_all(self, why: str) -> None:
        """Stop every running job and hand its lease back, then give the slots KILL_GRACE_S to notice."""
        with self.lock:
            items = list(self.running.items())
        for fut, r in items:
            r.released = True  # first, so finish() never completes it
            self.launcher.stop(r.lease.job, fut)
            released = self.queue.release(r.lease)
            self.stats.released += released
            self.log.write(r.lease, f"released back to the queue ({why}); released={released}")
            self.emit("released", f"{r.lease.job_id} released ({why})", r.lease.job_id)
        deadline = time.monotonic() + KILL_GRACE_S
        while self.running and time.monotonic() < deadline:
            done, _ = wait(list(self.running), timeout=0.2)
            for fut in done:
                self.finish(fut)
            for fut, r in list(self.running.items()):
                self.launcher.stop(r.lease.job, fut)  # a process may have started after the first kill


# ---------------------------------------------------------------- threads and signals


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


def _heartbeats(slots: Slots, stop: threading.Event) -> None:
    interval = max(slots.queue.lease_s / 3, 0.05)  # three beats per lease: one failed write is no loss
    while not stop.wait(interval):
        slots.heartbeat()


def serve(queue: JobQueue, launcher: Launcher, options: WorkerOptions | None = None, *,
          wid: str | None = None, on_event: Callable[[WorkerEvent, WorkerStats], None] | None = None) -> WorkerStats:
    """Serve jobs until stopped (signals, `once`, `idle_exit_s`); returns the counts."""
    opts = options or WorkerOptions()
    slots = Slots(queue, launcher, wid or worker_id(), on_event)
    stop_beats = threading.Event()
    beats = threading.Thread(target=_heartbeats, args=(slots, stop_beats), name="ait-heartbeat", daemon=True)
    beats.start()
    rules = StopRules(opts, started=time.monotonic(), idle_since=time.monotonic())
    last_touch = 0.0
    try:
        with _Signals() as signals:
            while True:
                if time.monotonic() - last_touch >= TOUCH_EVERY_S:
                    last_touch = time.monotonic()
                    slots.touch()
                if rules.start_stopping(signals.count, time.monotonic()):
                    slots.stats.stopping = True
                    slots.emit("stopping", f"stopping: no new jobs; waiting for {len(slots.running)} running "
                                           f"(signal again to release them)")
                if rules.release_now(signals.count, len(slots.running), time.monotonic()):
                    slots.release_all("second signal" if signals.count >= 2 else "drain timeout")
                    break
                claimed = 0 if rules.stopping else slots.claim()
                if rules.exit_now(len(slots.running), claimed > 0, slots.stats.claimed, time.monotonic()):
                    break
                if slots.running:
                    slots.finish_done(opts.poll_s)
                else:
                    signals.event.wait(opts.poll_s)
    finally:
        stop_beats.set()
        beats.join()
        launcher.close()
    slots.stats.busy = len(slots.running)
    return slots.stats


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
