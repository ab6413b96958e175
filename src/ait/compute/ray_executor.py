"""The Ray executor: the same job function, run on a local Ray or any Ray cluster.

The SQLite queue stays the source of truth: a Ray-backed worker claims leases, runs each job
on one of its job slots and completes the lease with the result; Ray keeps no durable state
and never retries a job behind the queue's back, so every attempt is counted by the queue.

A job slot is a Ray actor holding `1/K` of a GPU (K jobs packed per GPU) and its CPUs; the job
runs in the actor's process with CUDA_VISIBLE_DEVICES set to the GPU Ray assigned it. All the
slots are placed at once, so every GPU of the cluster gets K of them: Ray's own placement of
fractional requests fills the first GPU first (four jobs at K=2 on four GPUs would land on
two), and a pool of placed slots lets the launcher spread jobs over the least busy GPUs and
retry a job whose process was killed (a GPU fault, a preemption) on another GPU. The outer
loop's agent, when it trains on a GPU of the same Ray, holds its own share of a GPU
(`agent_gpus`) that no job slot can take.

Ray is imported lazily: the rest of ait works without it installed.
"""

from __future__ import annotations

import importlib.util
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from ait.compute.local import JobFn, run_job_in_slot
from ait.job.types import FailReason, Job, JobResult
from ait.train.request import LOGIT_BUDGET_ENV, PACKED_LOGIT_BUDGET

_init_lock = threading.Lock()


RAY_MISSING = "the ray executor needs Ray, which is not installed: pip install 'ait[ray]'"
RAY_UNITS = 10_000
"""Ray counts a GPU in 1/10000ths: a share is rounded down to that grid so K shares always fit one GPU."""
RETRY_ELSEWHERE = (FailReason.gpu_fault, FailReason.killed, FailReason.oom)
"""A job whose process died of these (a CUDA fault, a signal from outside, the kernel's OOM killer)
runs once more, on another GPU when there is one: the fault may be the GPU's, not the job's."""
PLACE_TIMEOUT_S = 120.0


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


def gpu_share(jobs_per_gpu: int) -> float:
    """1/K of a GPU on Ray's grid, rounded down (Ray rounds 1/6 up: six would not fit one GPU)."""
    return math.floor(RAY_UNITS / jobs_per_gpu) / RAY_UNITS


def agent_share(jobs_per_gpu: int, agent_gib: float = 0.0, gpu_gib: float | None = None) -> float:
    """The outer loop's agent's share of its GPU, in job slots (1/K each): one slot's by default,
    as many as `agent_gib` of the GPU's `gpu_gib` memory needs when both are known; at most one GPU."""
    slots = 1
    if agent_gib > 0 and gpu_gib:
        slots = max(1, math.ceil(agent_gib / gpu_gib * jobs_per_gpu - 1e-9))
    return min(1.0, slots * gpu_share(jobs_per_gpu))


def task_options(use_gpus: bool, jobs_per_gpu: int = 1, cpus_per_job: float = 1.0) -> dict[str, Any]:
    if jobs_per_gpu < 1 or cpus_per_job < 0:
        raise ValueError(f"need jobs_per_gpu >= 1 and cpus_per_job >= 0, got {jobs_per_gpu=} {cpus_per_job=}")
    # max_retries=0: the queue decides about another attempt, never Ray behind its back.
    return {"num_gpus": gpu_share(jobs_per_gpu) if use_gpus else 0, "num_cpus": cpus_per_job, "max_retries": 0}


def _ray_task(job_fn: JobFn, job: Job, use_gpus: bool) -> JobResult:
    """Runs on a Ray worker: give the job exactly the GPUs Ray assigned to this task."""
    import ray

    gpus = ",".join(str(g) for g in ray.get_gpu_ids()) if use_gpus else ""
    return job_fn(job, {"CUDA_VISIBLE_DEVICES": gpus})


class _JobSlot:
    """A Ray actor: one job at a time on the GPU share Ray placed it on. Its second thread
    (max_concurrency=2) serves `stop` beside a running job."""

    def __init__(self, job_fn: JobFn, use_gpus: bool, extra_env: dict[str, str]) -> None:
        self.job_fn, self.use_gpus, self.extra_env = job_fn, use_gpus, extra_env

    def gpu(self) -> str:
        import ray

        return ",".join(str(g) for g in ray.get_gpu_ids()) if self.use_gpus else ""

    def pid(self) -> int:
        return os.getpid()

    def run(self, job: Job) -> tuple[str, JobResult]:
        gpu = self.gpu()
        return gpu, self.job_fn(job, {**self.extra_env, "CUDA_VISIBLE_DEVICES": gpu})

    def stop(self, job_id: str) -> int:
        """Kill the job's process groups (its training and eval), here where run_job tracked them."""
        from ait.compute import processes

        return processes.kill(job_id)


class _AgentShare:
    """A Ray actor that only holds the agent's GPU share, so no job slot is placed on it."""

    def gpu(self) -> str:
        import ray

        return ",".join(str(g) for g in ray.get_gpu_ids())


_remote: dict[str, Any] = {}


def _remote_class(name: str) -> Any:
    if name not in _remote:
        ray = import_ray()
        _remote["task"] = ray.remote(_ray_task)
        _remote["slot"] = ray.remote(_JobSlot)
        _remote["agent"] = ray.remote(_AgentShare)
    return _remote[name]


def _remote_task() -> Any:
    return _remote_class("task")


def failure_result(job: Job, error: BaseException) -> JobResult | None:
    """A failed result for a task's error, or None when Ray lost the job (a node, a worker or a
    job slot's process died, the task was cancelled): not the job's fault, so the worker hands
    it back."""
    ray = import_ray()
    exc = ray.exceptions
    if isinstance(error, exc.OutOfMemoryError):  # Ray's memory monitor killed the task
        return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.oom, error=str(error)[-2000:])
    lost = (exc.WorkerCrashedError, exc.NodeDiedError, exc.TaskCancelledError, exc.ObjectLostError,
            exc.OwnerDiedError, exc.RaySystemError, exc.RayActorError)
    if isinstance(error, lost):
        return None
    return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.infra,  # run_job never raises: Ray did
                     error=f"Ray task failed: {type(error).__name__}: {str(error)[-2000:]}")


def _as_float(gpu: str) -> float:
    return float(gpu) if gpu.isdigit() else -1.0


class RaySlots:
    """A pool of job slots placed on a Ray cluster: `jobs_per_gpu` on every GPU (minus the agent's
    share), or CPU slots. `run` takes the free slot on the least busy GPU, and re-runs a job whose
    process was killed on another GPU (recorded as ray/gpu_try1, ray/gpu_try2 in its metrics)."""

    def __init__(self, ray: Any, *, use_gpus: bool, jobs_per_gpu: int = 1, cpus_per_job: float = 1.0,
                 slots: int | None = None, agent_gpus: float = 0.0, job_fn: JobFn = run_job_in_slot,
                 place_timeout_s: float = PLACE_TIMEOUT_S) -> None:
        opts = task_options(use_gpus, jobs_per_gpu, cpus_per_job)
        if agent_gpus and not use_gpus:
            raise ValueError("an agent GPU share needs GPU jobs")
        self.ray, self.use_gpus, self.jobs_per_gpu = ray, use_gpus, jobs_per_gpu
        self.share = opts["num_gpus"]
        self.agent, self.agent_gpu, self.agent_gpus = None, None, agent_gpus
        self.actors: list[Any] = []
        try:
            if agent_gpus > 0:  # placed first: the job slots fill the rest of its GPU and the others
                self.agent = _remote_class("agent").options(num_gpus=agent_gpus, num_cpus=0).remote()
                self.agent_gpu = ray.get(self.agent.gpu.remote(), timeout=place_timeout_s)
            if slots is None:
                slots = self.capacity(ray.cluster_resources(), cpus_per_job)
            if slots < 1:
                raise ValueError("the Ray cluster has no room for a job (no GPUs, the agent's share takes the only "
                                 "one, or --slots < 1)")
            env = {LOGIT_BUDGET_ENV: str(PACKED_LOGIT_BUDGET)} if use_gpus and jobs_per_gpu > 1 else {}
            slot_cls = _remote_class("slot").options(num_gpus=opts["num_gpus"], num_cpus=cpus_per_job,
                                                     max_restarts=-1, max_task_retries=0, max_concurrency=2)
            self.actors = [slot_cls.remote(job_fn, use_gpus, env) for _ in range(slots)]
            try:
                self.gpus: list[str] = ray.get([a.gpu.remote() for a in self.actors], timeout=place_timeout_s)
            except ray.exceptions.GetTimeoutError:
                res = ray.cluster_resources()
                raise ValueError(f"Ray could not place {slots} job slot(s) of {opts['num_gpus']:g} GPU and "
                                 f"{cpus_per_job:g} CPU within {place_timeout_s:g}s (cluster: {res.get('GPU', 0):g} "
                                 f"GPU, {res.get('CPU', 0):g} CPU, agent share {agent_gpus:g})") from None
        except BaseException:
            self.close()
            raise
        self._cond = threading.Condition()
        self._busy: set[int] = set()
        self._avoiding: list[frozenset[str]] = []  # GPUs each waiting retry must not land on
        self._running: dict[str, int] = {}  # job id -> slot
        self._started: set[str] = set()  # job ids that got a slot
        self._stopped: set[str] = set()
        self._restarting: set[int] = set()  # slots whose process was killed (by stop() or under a job): Ray restarts them

    def capacity(self, resources: dict[str, float], cpus_per_job: float) -> int:
        """Slots the cluster fits: K per GPU, fewer on the agent's GPU; CPU jobs by CPUs."""
        if not self.use_gpus:
            return int(resources.get("CPU", 1) / max(cpus_per_job, 0.01))
        per = round(self.share * RAY_UNITS)
        gpus = int(resources.get("GPU", 0) + 1e-9)
        if not self.agent:
            return gpus * (RAY_UNITS // per)
        return (gpus - 1) * (RAY_UNITS // per) + (RAY_UNITS - round(self.agent_gpus * RAY_UNITS)) // per

    def describe(self) -> str:
        if not self.use_gpus:
            return f"{len(self.actors)} CPU job slot(s)"
        per_gpu = {g: self.gpus.count(g) for g in sorted(set(self.gpus), key=_as_float)}
        where = ", ".join(f"GPU {g}: {n}" for g, n in per_gpu.items())
        agent = f"; the agent holds {self.agent_gpus:g} of GPU {self.agent_gpu}" if self.agent else ""
        return f"{len(self.actors)} job slot(s) of {self.share:g} GPU ({where}){agent}"

    def _acquire(self, avoid: frozenset[str], wait_s: float | None) -> int:
        """A free slot, on the GPU with the fewest busy slots. With `avoid` (a retry): on another GPU
        when the pool has one, waiting up to `wait_s` for it before taking any. A fresh job leaves
        slots that a waiting retry could take to it while another slot is free."""
        deadline = None if wait_s is None else time.monotonic() + wait_s
        with self._cond:
            if avoid:
                self._avoiding.append(avoid)
            try:
                while True:
                    free = [i for i in range(len(self.actors)) if i not in self._busy]
                    allowed = free
                    if avoid and set(self.gpus) - avoid and (deadline is None or time.monotonic() < deadline):
                        allowed = [i for i in free if self.gpus[i] not in avoid]
                    if allowed:
                        busy_on = {g: 0 for g in self.gpus}
                        for i in self._busy:
                            busy_on[self.gpus[i]] += 1

                        def wanted(i: int) -> bool:  # by a retry waiting for another GPU
                            return not avoid and any(self.gpus[i] not in a for a in self._avoiding)

                        pick = min(allowed, key=lambda i: (wanted(i), busy_on[self.gpus[i]], i))
                        self._busy.add(pick)
                        return pick
                    self._cond.wait(timeout=None if deadline is None else max(0.01, deadline - time.monotonic()))
            finally:
                if avoid:
                    self._avoiding.remove(avoid)

    def _release(self, i: int) -> None:
        with self._cond:
            self._busy.discard(i)
            self._cond.notify_all()

    def _run_once(self, job: Job, avoid: frozenset[str], wait_s: float | None) -> tuple[str, JobResult]:
        i = self._acquire(avoid, wait_s)
        try:
            self._running[job.job_id] = i
            if job.job_id in self._stopped:  # stopped while waiting for a slot
                raise import_ray().exceptions.TaskCancelledError()
            self._started.add(job.job_id)
            if i in self._restarting:
                self._wait_restarted(i)
            try:
                gpu, result = self.ray.get(self.actors[i].run.remote(job))
            except import_ray().exceptions.RayActorError:
                # The slot's process died under the job (killed, OOM, segfault): Ray restarts it,
                # and the next job must wait for that, or it too is lost to a restarting actor.
                self._restarting.add(i)
                raise
            self.gpus[i] = gpu  # a restarted slot may have been placed on another GPU
            return gpu, result
        finally:
            self._running.pop(job.job_id, None)
            self._release(i)

    def _wait_restarted(self, i: int, timeout_s: float = 120.0) -> None:
        """Block until slot i, killed by stop() or dead under a job, answers again: a job sent to an actor that is still
        restarting fails with ActorUnavailableError, and may or may not have run, so none is sent
        before a harmless call (its pid) goes through."""
        unavailable = import_ray().exceptions.ActorUnavailableError
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.ray.get(self.actors[i].pid.remote(), timeout=max(1.0, deadline - time.monotonic()))
                self._restarting.discard(i)
                return
            except unavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def run(self, job: Job, retry_wait_s: float = 600.0) -> JobResult:
        """Run `job` on a free slot; Ray's errors (a slot's process died) propagate to the caller."""
        try:
            gpu, result = self._run_once(job, frozenset(), None)
            tried = [gpu]
            if self.use_gpus and result.fail_reason in RETRY_ELSEWHERE and job.job_id not in self._stopped:
                first = result
                gpu, result = self._run_once(job, frozenset(tried), retry_wait_s)
                tried.append(gpu)
                # Only the attempt that counted is timed (a neighbour's fault is not the job's doing):
                # the second runs on a slot like the first, packed as it was, so a faked fault buys
                # nothing faster. What the first took is kept as a metric.
                result.metrics["ray/first_attempt_s"] = first.train_seconds or 0.0
                result.metrics[f"ray/first_{first.fail_reason.value}"] = 1.0
                result.metrics["ray/retried_elsewhere"] = float(tried[0] != tried[1])
        finally:
            self._stopped.discard(job.job_id)
        if self.use_gpus:
            for n, g in enumerate(tried, 1):
                result.metrics[f"ray/gpu_try{n}"] = _as_float(g)
        return result

    def started(self, job: Job) -> bool:
        return job.job_id in self._started

    def stop(self, job: Job) -> None:
        """Kill `job` where it runs: its processes, then its slot's process (Ray restarts the slot)."""
        self._stopped.add(job.job_id)
        i = self._running.get(job.job_id)
        if i is None:
            return
        actor = self.actors[i]
        try:
            self.ray.get(actor.stop.remote(job.job_id), timeout=10)
        except Exception:  # noqa: BLE001 - the slot is dead or stuck: killing it below is enough
            pass
        self._restarting.add(i)
        self.ray.kill(actor, no_restart=False)

    def close(self) -> None:
        for actor in [*self.actors, *([self.agent] if self.agent else [])]:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors, self.agent = [], None


class RayLauncher:
    """The worker loop's view of Ray: each claimed job runs on one job slot of a RaySlots pool."""

    def __init__(self, slots: int | None = None, *, use_gpus: bool = False, jobs_per_gpu: int = 1,
                 cpus_per_job: float = 1.0, job_fn: JobFn = run_job_in_slot, address: str | None = None,
                 agent_gpus: float = 0.0) -> None:
        """`agent_gpus`: a share of one GPU held for a process outside this worker (the outer loop's
        agent training on the same host), which no job slot may take."""
        self.ray = init_ray(address)
        self.pool = RaySlots(self.ray, use_gpus=use_gpus, jobs_per_gpu=jobs_per_gpu, cpus_per_job=cpus_per_job,
                             slots=slots, agent_gpus=agent_gpus, job_fn=job_fn)
        self.use_gpus = use_gpus
        self.slots: list[dict[str, str]] = [{} for _ in self.pool.actors]  # Ray assigns the devices
        self._threads = ThreadPoolExecutor(max_workers=len(self.slots), thread_name_prefix="ait-ray-slot")

    def describe(self) -> str:
        res = self.ray.cluster_resources()
        return f"ray, {self.pool.describe()} on a cluster of {res.get('CPU', 0):g} CPU / {res.get('GPU', 0):g} GPU"

    def submit(self, job: Job, env: dict[str, str]) -> Future:
        return self._threads.submit(self.pool.run, job)

    def stop(self, job: Job, future: Future) -> None:
        self.pool.stop(job)

    def to_result(self, job: Job, error: BaseException) -> JobResult | None:
        return failure_result(job, error)

    def close(self) -> None:
        self.pool.close()  # kills running jobs' slots too: their futures end with Ray's error
        self._threads.shutdown(wait=False, cancel_futures=True)


def place_slots(address: str | None, *, jobs_per_gpu: int = 1, agent_gpus: float = 0.0,
                cpus_per_job: float = 1.0, job_fn: JobFn = run_job_in_slot) -> RaySlots:
    """One pool of job slots on the Ray at `address` for every episode of one owner (the outer loop):
    given to a RayExecutor, each episode's job runs on it instead of as a task of its own."""
    ray = init_ray(address)
    use_gpus = ray.cluster_resources().get("GPU", 0) >= 1
    return RaySlots(ray, use_gpus=use_gpus, jobs_per_gpu=jobs_per_gpu, cpus_per_job=cpus_per_job,
                    agent_gpus=agent_gpus if use_gpus else 0.0, job_fn=job_fn)


class RayExecutor:
    """`ait episode --executor ray`: one job as one Ray task (a whole GPU when the cluster has one),
    or on a job slot of `pool` (the outer loop's: place_slots); wait for it. The executor owns the
    pool it is given: `close` kills its slots."""

    def __init__(self, address: str | None, wait_s: float, job_fn: JobFn = run_job_in_slot,
                 pool: RaySlots | None = None) -> None:
        self.address = address
        self.wait_s = wait_s
        self.job_fn = job_fn
        self.pool = pool
        self._refs: dict[str, object] = {}

    def cancel(self, job: Job) -> None:
        """The episode gave up on the job (Ctrl-C): cancel its task, killing its processes."""
        if self.pool is not None:
            self.pool.stop(job)
            return
        ref = self._refs.pop(job.job_id, None)
        if ref is not None:
            import_ray().cancel(ref, force=True)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def started(self, job: Job) -> bool:
        # On the pool, once it has a slot. A lone Ray task's start is not observed from here: it
        # counts as started from its submission, so the deadline charges its wait to the job.
        return self.pool.started(job) if self.pool is not None else job.job_id in self._refs

    def run(self, job: Job, on_event: Callable[[str], None] | None = None) -> JobResult:
        ray = init_ray(self.address)
        if self.pool is not None:
            return self._run_on_pool(ray, job)
        use_gpus = ray.cluster_resources().get("GPU", 0) >= 1  # a whole GPU when the cluster has one
        ref = _remote_task().options(**task_options(use_gpus)).remote(self.job_fn, job, use_gpus)
        self._refs[job.job_id] = ref
        try:
            return ray.get(ref, timeout=self.wait_s)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            return self._late(job)
        except Exception as e:  # noqa: BLE001 - any Ray failure is this job's failed result
            return self._lost(job, e)

    def _run_on_pool(self, ray: Any, job: Job) -> JobResult:
        pool = self.pool
        assert pool is not None
        fut: Future = Future()  # the pool's call blocks: it runs on a thread so the wait can time out

        def go() -> None:
            try:
                fut.set_result(pool.run(job))
            except BaseException as e:  # noqa: BLE001 - handed to the waiting episode
                fut.set_exception(e)

        threading.Thread(target=go, name=f"ait-ray-{job.job_id}", daemon=True).start()
        try:
            return fut.result(timeout=self.wait_s)
        except FutureTimeout:
            pool.stop(job)
            return self._late(job)
        except Exception as e:  # noqa: BLE001
            return self._lost(job, e)

    def _late(self, job: Job) -> JobResult:
        return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.infra,
                         error=f"no result from the Ray task after {self.wait_s:g}s; cancelled it")

    def _lost(self, job: Job, e: BaseException) -> JobResult:
        result = failure_result(job, e)
        return result or JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.infra,
                                   error=f"Ray lost the job: {type(e).__name__}: {e}")
