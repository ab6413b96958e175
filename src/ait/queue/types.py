"""The job queue's models: a job's state, a worker's lease on it, and a queue row."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel

from ait.job.types import Job, JobResult


class JobState(str, Enum):
    """Where a job is: queued -> running -> done | failed | dead."""

    queued = "queued"
    """Waiting for a worker."""
    running = "running"
    """Leased to a worker."""
    done = "done"
    """Ran; its JobResult has ok=True."""
    failed = "failed"
    """Ran and failed (crash, OOM, timeout): a completed outcome, not retried."""
    dead = "dead"
    """Its lease expired on the last allowed attempt: workers kept dying."""


FINAL_STATES = (JobState.done, JobState.failed, JobState.dead)


class QueueError(Exception):
    """The queue cannot be opened or used as asked."""


class StaleLeaseError(QueueError):
    """A worker reported on a lease it no longer holds; its result is discarded."""


class Lease(BaseModel):
    """A worker's time-limited claim on one job; only its holder may complete it."""

    job_id: str
    """The leased job."""
    worker_id: str
    """Who holds the lease."""
    token: str
    """Random secret for this attempt; a re-claim issues a new one."""
    attempt: int
    """1 for the first run of the job, 2 after one expired lease, ..."""
    expires_at: float
    """Epoch seconds after which another worker may take the job (heartbeat extends it)."""
    job: Job
    """The job to run."""


class QueueEntry(BaseModel):
    """One job's row in the queue, as read back."""

    job_id: str
    """The job's id (unique in the queue)."""
    state: JobState
    """Where the job is."""
    attempts: int
    """How many times it has been claimed."""
    worker_id: str | None
    """The last worker to claim it."""
    created_at: float
    """Epoch seconds when it was enqueued."""
    updated_at: float
    """Epoch seconds of the last change."""
    lease_expires_at: float | None
    """When the current lease runs out (None unless running)."""
    error: str | None
    """Why it failed or died (None otherwise)."""
    job: Job
    """The job as enqueued."""
    result: JobResult | None
    """The accepted result (None until done or failed)."""
