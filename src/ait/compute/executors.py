"""Executors: how a validated Job gets run. All of them call the same `run_job`.

    inline  run_job in this process's control (subprocesses for train and eval)
    queue   enqueue into the SQLite queue and wait; `ait worker` processes run it
    local   run_job in a slot of this process's pool (one slot per visible GPU, or a CPU slot)
    ray     run_job as a Ray task on EpisodeConfig.ray_address (or a private local Ray)
"""

from __future__ import annotations

from typing import Protocol

from ait.compute.run_job import run_job
from ait.harness.types import EpisodeConfig
from ait.job.types import FailReason, Job, JobResult
from ait.queue import JobQueue


class Executor(Protocol):
    def run(self, job: Job) -> JobResult:
        """Run a job to completion and return its result (failures are results, not exceptions)."""


class InlineExecutor:
    def run(self, job: Job) -> JobResult:
        return run_job(job)


class QueueExecutor:
    def __init__(self, queue_path: str, wait_s: float):
        self.queue = JobQueue(queue_path)
        self.wait_s = wait_s

    def run(self, job: Job) -> JobResult:
        self.queue.enqueue(job)
        try:
            entry = self.queue.wait(job.job_id, timeout_s=self.wait_s)
        except TimeoutError as e:  # no worker took it in time: nothing the job did
            return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.infra,
                             error=f"{e}; is an `ait worker` running on this queue?")
        if entry.result is not None:
            return entry.result
        # Dead: its leases kept expiring (workers lost); no result at all: the queue lost it.
        return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.infra, error=entry.error)


def make_executor(config: EpisodeConfig) -> Executor:
    if config.executor == "queue":
        return QueueExecutor(config.queue_path, config.job_wait_s)
    if config.executor == "local":
        from ait.compute.local import shared_local_executor

        return shared_local_executor()
    if config.executor == "ray":
        from ait.compute.ray_executor import RayExecutor, require_ray

        require_ray()  # fail now, with the install hint, not halfway through the episode
        return RayExecutor(config.ray_address, config.job_wait_s)
    return InlineExecutor()
