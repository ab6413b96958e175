"""The local worker: lease jobs from the queue, run them, report results.

A heartbeat thread keeps the lease alive while the job runs; if the worker dies, the
lease expires and another worker runs the job again (the queue rejects the dead
worker's late result). SIGTERM stops taking new jobs; the running one finishes.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Callable

from ait.compute.run_job import run_job
from ait.job.types import Job, JobResult
from ait.queue import JobQueue, Lease, StaleLeaseError


def worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _heartbeat(queue: JobQueue, lease: Lease, stop: threading.Event) -> None:
    interval = max(queue.lease_s / 3, 0.05)
    while not stop.wait(interval):
        if not queue.heartbeat(lease):
            return  # lease lost: our result will be rejected; nothing else to do


def process_one(queue: JobQueue, wid: str, job_fn: Callable[[Job], JobResult] = run_job) -> str | None:
    """Claim and run one job; return its id, or None if the queue had nothing to run."""
    lease = queue.claim(wid)
    if lease is None:
        return None
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(queue, lease, stop), daemon=True)
    beat.start()
    try:
        result = job_fn(lease.job)
    finally:
        stop.set()
        beat.join()
    try:
        queue.complete(lease, result)
    except StaleLeaseError:
        pass  # another worker owns the job now; dropping our result keeps it exactly-once
    return lease.job_id


def run_worker(queue: JobQueue, *, once: bool = False, idle_exit_s: float | None = None, poll_s: float = 0.5,
               on_job: Callable[[str], None] | None = None,
               job_fn: Callable[[Job], JobResult] = run_job) -> int:
    """Serve jobs until stopped. once: drain what is queued now, then exit. Returns jobs run."""
    stopping = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    wid, done, idle_since = worker_id(), 0, time.monotonic()
    while not stopping.is_set():
        job_id = process_one(queue, wid, job_fn)
        if job_id is not None:
            done += 1
            idle_since = time.monotonic()
            if on_job:
                on_job(job_id)
            continue
        if once or (idle_exit_s is not None and time.monotonic() - idle_since >= idle_exit_s):
            break
        stopping.wait(poll_s)
    return done
