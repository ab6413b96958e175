"""Executors: how a validated Job gets run. All of them call the same `run_job`.

    inline  run_job in this process's control (subprocesses for train and eval)
    queue   enqueue into the SQLite queue and wait; `ait worker` processes run it
    local   run_job in a slot of the executor's pool (one slot per visible GPU, or a CPU slot)
    ray     run_job as a Ray task on EpisodeConfig.ray_address (or a private local Ray), or on a
            pool of Ray job slots it was given (ait.compute.ray_executor.place_slots)

Whoever owns a run (`ait episode`, `ait eval`, the outer loop's open_run) builds one executor,
hands it to every episode it starts (run_episode's `executor`) and closes it at the end: episodes
that run at once must share one pool, or two of them would take the same GPU slot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ait.compute.run_job import run_job
from ait.harness.types import EpisodeConfig
from ait.job.types import FailReason, Job, JobResult
from ait.queue import JobQueue


OnEvent = Callable[[str], None]
"""Progress lines for the episode that waits on a job (the queue says what it waits on)."""


class Executor(Protocol):
    def run(self, job: Job, on_event: OnEvent | None = None) -> JobResult:
        """Run a job to completion and return its result (failures are results, not exceptions).
        `on_event` is the calling episode's: one executor serves many episodes at once."""

    def started(self, job: Job) -> bool:
        """Whether `job` was given its slot (a worker, a GPU) and began to run: a job an episode's
        deadline finds still waiting for one was held up by other work, not by anything it did."""

    def cancel(self, job: Job) -> None:
        """The episode gave up on `job` (Ctrl-C, its deadline): a job still waiting never starts,
        a queued one is cancelled, a Ray task or slot is stopped."""

    def close(self) -> None:
        """Release what the executor holds (a pool of Ray job slots); called once by its owner."""


def cancel_job(executor: Executor, job: Job) -> None:
    """Stop a job its episode gave up on (Ctrl-C): the processes this process started for it are
    killed, and the executor cancels it where it waits or runs."""
    from ait.compute import processes

    processes.kill(job.job_id)
    executor.cancel(job)


class InlineExecutor:
    def run(self, job: Job, on_event: OnEvent | None = None) -> JobResult:
        return run_job(job)

    def started(self, job: Job) -> bool:
        return True  # it runs in this process's control from the call on: nothing to wait for

    def cancel(self, job: Job) -> None:
        pass  # its processes are this process's children: cancel_job has killed them

    def close(self) -> None:
        pass


class QueueExecutor:
    """Enqueue and wait for an `ait worker` to run it, saying what it waits on (a queue nobody
    serves is named at once, not discovered after job_wait_s)."""

    def __init__(self, queue_path: str, wait_s: float):
        self.queue = JobQueue(queue_path)
        self.wait_s = wait_s

    def run(self, job: Job, on_event: OnEvent | None = None) -> JobResult:
        say = on_event or (lambda _msg: None)
        self.queue.enqueue(job)
        path = self.queue.path

        def waiting(entry) -> None:
            if entry.state.value == "running":
                say(f"training and evaluating on worker {entry.worker_id}")
            elif self.queue.live_workers():
                say(f"queued on {path}; waiting for a free worker")
            else:
                say(f"queued on {path}; no worker is serving it: start `ait worker --queue {path}`")

        try:
            entry = self.queue.wait(job.job_id, timeout_s=self.wait_s, on_poll=waiting)
        except TimeoutError as e:  # no worker took it in time: nothing the job did
            self.queue.cancel(job.job_id, f"not run within the episode's {self.wait_s:g}s wait; cancelled")
            return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.infra,
                             error=f"{e}; is an `ait worker` running on this queue?")
        if entry.result is not None:
            return entry.result
        # Dead: its leases kept expiring (workers lost), or it was cancelled; no result at all.
        return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.infra, error=entry.error)

    def started(self, job: Job) -> bool:
        entry = self.queue.get(job.job_id)
        return entry is not None and entry.attempts > 0  # a worker claimed it at least once

    def cancel(self, job: Job) -> None:
        """The episode gave up (Ctrl-C, its deadline): no worker may train it into an abandoned run directory."""
        self.queue.cancel(job.job_id, "cancelled: its episode was interrupted or ran out of time")

    def close(self) -> None:
        self.queue.close()


def make_executor(config: EpisodeConfig) -> Executor:
    """A new executor of the kind `config.executor` names, for one owner to share among its episodes:
    local, a pool of one slot per visible GPU (or one CPU slot); ray, a Ray task per job (the outer
    loop builds its own, on a pool of job slots: ait.outer.executors.job_executor)."""
    if config.executor == "queue":
        return QueueExecutor(config.queue_path, config.job_wait_s)
    if config.executor == "local":
        from ait.compute.local import LocalExecutor, detect_gpus, slot_envs

        return LocalExecutor(slot_envs(None, detect_gpus()))
    if config.executor == "ray":
        from ait.compute.ray_executor import RayExecutor, require_ray

        require_ray()  # fail now, with the install hint, not halfway through the episode
        return RayExecutor(config.ray_address, config.job_wait_s)
    return InlineExecutor()
