"""The Ray executor: the same job function, run as Ray tasks on a local Ray or any cluster.

The SQLite queue stays the source of truth: a Ray-backed worker claims leases, submits
each job as a task and completes the lease with the task's result; Ray keeps no durable
state, and its own retries are off (`max_retries=0`) so every attempt is counted by the
queue. Jobs packed K per GPU ask Ray for `num_gpus=1/K`; Ray picks the GPU and the task
hands it to the job's processes as CUDA_VISIBLE_DEVICES.

Ray is imported lazily: the rest of ait works without it installed.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from concurrent.futures import Future
from typing import Any

from ait.compute.local import JobFn, run_job_in_slot
from ait.job.types import FailReason, Job, JobResult

_init_lock = threading.Lock()


RAY_MISSING = "the ray executor needs Ray, which is not installed: pip install 'ait[ray]'"


def require_ray() -> None:
    """Fail early, with the install hint, without importing Ray (importing it fixes its network
    settings, which init_ray must choose first)."""
    if importlib.util.find_spec("ray") is None:
        raise RuntimeError(RAY_MISSING)


def import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise RuntimeError(RAY_MISSING) from e
    return ray


def init_ray(address: str | None = None, **local_options: Any) -> Any:
    """Connect this process to Ray once: join `address` (a cluster, 'auto', ray://...) or,
    with no address, start a private local Ray: loopback only, dashboard and usage stats off."""
    with _init_lock:
        if address:
            ray = import_ray()
            if not ray.is_initialized():
                ray.init(address=address, log_to_driver=False)
            return ray
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # Ray advertises and binds every interface on Linux unless this is off (read when ray
        # is first imported): a private single-machine Ray has no reason to be reachable.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        ray = import_ray()
        if not ray.is_initialized():
            # address="local": always a new private instance, never a cluster some other process left running
            ray.init(address="local", log_to_driver=False,
                     **{"include_dashboard": False, "_node_ip_address": "127.0.0.1", **local_options})
        return ray


def _ray_task(job_fn: JobFn, job: Job, use_gpus: bool) -> JobResult:
    """Runs on a Ray worker: give the job exactly the GPUs Ray assigned to this task."""
    import ray

    gpus = ",".join(str(g) for g in ray.get_gpu_ids()) if use_gpus else ""
    return job_fn(job, {"CUDA_VISIBLE_DEVICES": gpus})


_remote: Any = None


def _remote_task() -> Any:
    global _remote
    if _remote is None:
        _remote = import_ray().remote(_ray_task)
    return _remote


def task_options(use_gpus: bool, jobs_per_gpu: int = 1, cpus_per_job: float = 1.0) -> dict[str, Any]:
    if jobs_per_gpu < 1 or cpus_per_job < 0:
        raise ValueError(f"need jobs_per_gpu >= 1 and cpus_per_job >= 0, got {jobs_per_gpu=} {cpus_per_job=}")
    # max_retries=0: the queue decides about another attempt, never Ray behind its back.
    return {"num_gpus": 1 / jobs_per_gpu if use_gpus else 0, "num_cpus": cpus_per_job, "max_retries": 0}


def failure_result(job: Job, error: BaseException) -> JobResult | None:
    """A failed result for a task's error, or None when Ray lost the job (a node or worker
    died, the task was cancelled): not the job's fault, so the worker hands it back."""
    ray = import_ray()
    exc = ray.exceptions
    if isinstance(error, exc.OutOfMemoryError):  # Ray's memory monitor killed the task
        return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.oom, error=str(error)[-2000:])
    lost = (exc.WorkerCrashedError, exc.NodeDiedError, exc.TaskCancelledError, exc.ObjectLostError,
            exc.OwnerDiedError, exc.RaySystemError)
    if isinstance(error, lost):
        return None
    return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.infra,  # run_job never raises: Ray did
                     error=f"Ray task failed: {type(error).__name__}: {str(error)[-2000:]}")


class RayLauncher:
    """The worker loop's view of Ray: each claimed job becomes one task."""

    def __init__(self, slots: int | None = None, *, use_gpus: bool = False, jobs_per_gpu: int = 1,
                 cpus_per_job: float = 1.0, job_fn: JobFn = run_job_in_slot, address: str | None = None) -> None:
        self.ray = init_ray(address)
        self.options = task_options(use_gpus, jobs_per_gpu, cpus_per_job)
        self.use_gpus = use_gpus
        self.job_fn = job_fn
        if slots is None:  # as many in flight as the cluster can run at once
            res = self.ray.cluster_resources()
            slots = int(res.get("GPU", 0) * jobs_per_gpu) if use_gpus else int(res.get("CPU", 1) / max(cpus_per_job, 0.01))
        if slots < 1:
            raise ValueError("the Ray cluster has no room for a job (no GPUs, or --slots < 1)")
        self.slots: list[dict[str, str]] = [{} for _ in range(slots)]  # Ray assigns the devices
        self._refs: dict[Future, Any] = {}

    def describe(self) -> str:
        res = self.ray.cluster_resources()
        packing = f", {self.options['num_gpus']:g} GPU per job" if self.use_gpus else ", CPU jobs"
        return (f"ray, up to {len(self.slots)} task(s) in flight on a cluster of "
                f"{res.get('CPU', 0):g} CPU / {res.get('GPU', 0):g} GPU{packing}")

    def submit(self, job: Job, env: dict[str, str]) -> Future:
        ref = _remote_task().options(**self.options).remote(self.job_fn, job, self.use_gpus)
        fut = ref.future()
        self._refs[fut] = ref
        fut.add_done_callback(lambda f: self._refs.pop(f, None))
        return fut

    def stop(self, job: Job, future: Future) -> None:
        ref = self._refs.get(future)
        if ref is not None:
            self.ray.cancel(ref, force=True)  # kills the task's worker process

    def to_result(self, job: Job, error: BaseException) -> JobResult | None:
        return failure_result(job, error)

    def close(self) -> None:
        for ref in list(self._refs.values()):
            self.ray.cancel(ref, force=True)


class RayExecutor:
    """`ait episode --executor ray`: one job as one Ray task; wait for it."""

    def __init__(self, address: str | None, wait_s: float, job_fn: JobFn = run_job_in_slot) -> None:
        self.address = address
        self.wait_s = wait_s
        self.job_fn = job_fn
        self._refs: dict[str, object] = {}

    def cancel(self, job: Job) -> None:
        """The episode gave up on the job (Ctrl-C): cancel its task, killing its processes."""
        ref = self._refs.pop(job.job_id, None)
        if ref is not None:
            import_ray().cancel(ref, force=True)

    def run(self, job: Job) -> JobResult:
        ray = init_ray(self.address)
        use_gpus = ray.cluster_resources().get("GPU", 0) >= 1  # a whole GPU when the cluster has one
        ref = _remote_task().options(**task_options(use_gpus)).remote(self.job_fn, job, use_gpus)
        self._refs[job.job_id] = ref
        try:
            return ray.get(ref, timeout=self.wait_s)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.infra,
                             error=f"no result from the Ray task after {self.wait_s:g}s; cancelled it")
        except Exception as e:  # noqa: BLE001 - any Ray failure is this job's failed result
            result = failure_result(job, e)
            return result or JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.infra,
                                       error=f"Ray lost the job: {type(e).__name__}: {e}")
