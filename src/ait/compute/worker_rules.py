"""The worker's rules, apart from its threads and signals (ait.compute.worker runs them): what becomes
of a run that ended (`verdict`: drop, reject, release or complete it) and when the loop stops claiming,
releases its running jobs, or exits (`StopRules`). No rule starts a thread, installs a handler or reads
a clock: the caller passes the time and the signal count, so each rule is a plain call in a test.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel

from ait.job.types import FailReason, Job, JobResult
from ait.queue import Lease


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


@dataclass
class Run:
    """A job running in one of the worker's slots, under its lease."""

    lease: Lease
    slot: int
    started: float = field(default_factory=time.monotonic)
    lost: bool = False
    """A heartbeat found the lease gone: another worker runs the job now."""
    released: bool = False
    """Handed back to the queue on shutdown."""


@dataclass
class Verdict:
    """What becomes of a run that ended (`verdict`)."""

    action: Literal["drop", "reject", "release", "complete"]
    result: JobResult | None = None
    """With "complete": the result to store."""
    error: str = ""
    """With "release": what the executor raised."""


def verdict(run: Run, fut: Future, to_result: Callable[[Job, BaseException], JobResult | None],
            max_attempts: int) -> Verdict:
    """The rule for a run whose future is done, from its lease's state and what the run returned or raised:
    drop      it was handed back already (shutdown): the next attempt reports;
    reject    a heartbeat found its lease lost: complete() would refuse whatever it returned;
    release   the executor lost the job (`to_result` has no result for the error: a Ray node died) and
              attempts are left: not the job's fault, it runs again;
    complete  store `result`; an executor error with no attempt left, or an answer that is not this job's
              JobResult, is an infrastructure failure (run_job never raises: our code failed, not the job)."""
    if run.released:
        return Verdict("drop")
    if run.lost:
        return Verdict("reject")
    lease = run.lease
    try:
        result = fut.result()
    except BaseException as e:  # noqa: BLE001 - any failure of the executor is the job's outcome
        result = to_result(lease.job, e)
        if result is None and lease.attempt < max_attempts:
            return Verdict("release", error=f"{type(e).__name__}: {e}")
        if result is None:
            result = JobResult(job_id=lease.job_id, ok=False, fail_reason=FailReason.infra,
                               error=f"the executor lost the job on attempt {lease.attempt} "
                                     f"({type(e).__name__}: {e})")
    if not isinstance(result, JobResult) or result.job_id != lease.job_id:
        result = JobResult(job_id=lease.job_id, ok=False, fail_reason=FailReason.infra,
                           error=f"job function returned {type(result).__name__} for another job, not this one's JobResult")
    return Verdict("complete", result=result)


@dataclass
class StopRules:
    """When the loop stops claiming, releases its running jobs, or exits. The caller passes the time and
    the count of signals received, so the rules hold no clock and install no handler."""

    options: WorkerOptions
    started: float
    """When serving began (`once_grace_s` counts from it)."""
    idle_since: float
    """When a job last ran or was claimed (`idle_exit_s` counts from it)."""
    stopping: bool = False
    """A signal came: claim nothing more."""
    drain_deadline: float | None = None
    """With `drain_timeout_s`: when still-running jobs are released."""

    def start_stopping(self, signals: int, now: float) -> bool:
        """Whether the drain starts now: True once, at the first signal."""
        if not signals or self.stopping:
            return False
        self.stopping = True
        if self.options.drain_timeout_s is not None:
            self.drain_deadline = now + self.options.drain_timeout_s
        return True

    def release_now(self, signals: int, running: int, now: float) -> bool:
        """Whether to kill the running jobs and hand them back: a second signal, or the drain timed out."""
        timed_out = self.drain_deadline is not None and now >= self.drain_deadline
        return bool(running) and (signals >= 2 or timed_out)

    def exit_now(self, running: int, claimed_now: bool, claimed_ever: int, now: float) -> bool:
        """Whether the loop ends: with nothing running or just claimed, once stopping, under `once` (after a
        first job, or once the grace for one passed), or idle for `idle_exit_s`."""
        if running or claimed_now:
            self.idle_since = now
            return False
        opts = self.options
        return (self.stopping or (opts.once and (bool(claimed_ever) or now - self.started >= opts.once_grace_s))
                or (opts.idle_exit_s is not None and now - self.idle_since >= opts.idle_exit_s))
