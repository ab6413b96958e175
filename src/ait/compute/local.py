"""The local slot pool: several jobs at once on this machine, each pinned to a GPU slot.

A slot is an environment for the job's processes: `CUDA_VISIBLE_DEVICES` naming its
GPU (K slots share one GPU when jobs are packed), or "" for a CPU slot, so a job never
grabs a device it was not given. Each running job is a thread waiting on `run_job`,
whose train and eval processes run in their own process groups (killed on the job's
time budget by the sandbox).
"""

from __future__ import annotations

import os
import queue as queue_mod
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ait.compute import processes
from ait.compute.packing import Packing, packed_slowdown
from ait.compute.run_job import run_job, usable_cores
from ait.job.types import FailReason, Job, JobResult
from ait.train.request import LOGIT_BUDGET, LOGIT_BUDGET_ENV, PACKED_LOGIT_BUDGET

JobFn = Callable[[Job, dict[str, str]], JobResult]
"""A job function: run the job with this extra environment, return its result."""


def run_job_in_slot(job: Job, env: dict[str, str]) -> JobResult:
    """The default job function: train and evaluate with the slot's environment."""
    return run_job(job, extra_env=env)


def parse_gpus(text: str | None) -> list[str]:
    """'0,1' -> ['0', '1']; None or '' -> [] (CPU only)."""
    gpus = [g.strip() for g in (text or "").split(",") if g.strip()]
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"GPU list {text!r} names a GPU twice; use --jobs-per-gpu to pack jobs on one GPU")
    return gpus


def slot_envs(slots: int | None, gpus: list[str], jobs_per_gpu: int = 1,
              mps_thread_percentage: int | None = None) -> list[dict[str, str]]:
    """One environment per slot. With GPUs, slots are spread over them round-robin (so
    fewer slots than capacity still use every GPU) and at most `jobs_per_gpu` share one.
    Each slot also gets its share of the CPU cores as OMP_NUM_THREADS (unless the operator set
    it): every torch process otherwise starts one spinning OpenMP thread per core, and K packed
    jobs would oversubscribe the host K times over. `mps_thread_percentage` caps the share of a
    GPU's SMs each job's kernels may occupy under CUDA MPS (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE):
    small jobs whose kernels each grab the whole GPU then run side by side instead of in turn.
    With AIT_JOBS_MPS_PIPE_DIRECTORY set, GPU slots join the CUDA MPS daemon of that pipe directory
    while this process stays out of it (see JOBS_MPS_ENV)."""
    if jobs_per_gpu < 1:
        raise ValueError(f"--jobs-per-gpu must be at least 1, got {jobs_per_gpu}")
    if not gpus:
        n = 1 if slots is None else slots
        if n < 1:
            raise ValueError(f"--slots must be at least 1, got {n}")
        return [{"CUDA_VISIBLE_DEVICES": "", **cpu_share(n)} for _ in range(n)]
    capacity = len(gpus) * jobs_per_gpu
    n = capacity if slots is None else slots
    if not 1 <= n <= capacity:
        raise ValueError(f"--slots {n} does not fit {len(gpus)} GPU(s) x {jobs_per_gpu} job(s) per GPU "
                         f"(at most {capacity}); raise --jobs-per-gpu to pack more jobs per GPU")
    # Jobs that share a GPU score in half-size micro-batches: their peak memory is mostly one
    # micro-batch's logits, and at the full size eight SmolLM2 standard jobs do not fit an H200.
    gpu_env = {LOGIT_BUDGET_ENV: str(PACKED_LOGIT_BUDGET)} if jobs_per_gpu > 1 else {}
    if mps_thread_percentage is not None:
        if not 1 <= mps_thread_percentage <= 100:
            raise ValueError(f"--mps-thread-percentage must be 1..100, got {mps_thread_percentage}")
        gpu_env[MPS_THREAD_PERCENTAGE_ENV] = str(mps_thread_percentage)
    if jobs_mps := os.environ.get(JOBS_MPS_ENV):
        gpu_env["CUDA_MPS_PIPE_DIRECTORY"] = jobs_mps
    return [{"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)], **cpu_share(n), **gpu_env} for i in range(n)]


MPS_THREAD_PERCENTAGE_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
JOBS_MPS_ENV = "AIT_JOBS_MPS_PIPE_DIRECTORY"
"""The pipe directory of the MPS daemon that jobs' processes join, when the process that launches them
uses the GPU itself and must stay out (the outer loop's agent: run the daemon at a directory other than
MPS's default /tmp/nvidia-mps and leave CUDA_MPS_PIPE_DIRECTORY unset). Under MPS a fatal CUDA fault of
one client ends every client of the daemon (seen on an H200: the agent died with an inner job's, or its
own, illegal memory access, and with it the run); outside it the agent's context is time-sliced with the
daemon's, and a packed job's fault costs only the jobs packed with it (re-run alone, RETRY_ALONE)."""


def cpu_share(slots: int) -> dict[str, str]:
    """{"OMP_NUM_THREADS": cores // slots (at least 1)}; {} when the operator already set it."""
    if "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, usable_cores() // max(1, slots)))}


def detect_gpus() -> list[str]:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else every GPU torch sees."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return parse_gpus(visible)
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - no torch or no driver: CPU slots
        return []


def _children(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc (Linux; elsewhere none are found)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name sits in parentheses and may hold spaces; the ppid follows it.
            ppid = int(entry.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            found.append(int(entry.parent.name))
    return found


def kill_job_processes(job: Job) -> int:
    """SIGKILL every process group `job` has started in this process (its training and its eval,
    tracked by run_job), and keep killing what it starts later. Also, for a job run by older code
    paths, the groups of this process's children working in the job's directories. Other slots'
    jobs and unrelated children stay alive."""
    killed = processes.kill(job.job_id)
    run_dir = Path(job.run_dir)
    dirs = {os.path.realpath(run_dir / "job"), os.path.realpath(run_dir / "eval")}
    for pid in _children(os.getpid()):
        try:
            if os.path.realpath(f"/proc/{pid}/cwd") not in dirs:
                continue
            os.killpg(pid, signal.SIGKILL)
            killed += 1
        except (OSError, ProcessLookupError):
            continue  # exited meanwhile
    return killed


class LocalLauncher:
    """Runs each job on a thread of its own slot; `stop` kills a job's processes. Jobs packed on
    one GPU are admitted by estimated memory and re-run alone after an OOM, as LocalExecutor's."""

    lost_errors: tuple[type[BaseException], ...] = ()

    def __init__(self, slots: list[dict[str, str]], job_fn: JobFn = run_job_in_slot,
                 capacity_gib: dict[str, float | None] | None = None,
                 model_packing: dict[str, Packing] | None = None) -> None:
        """`model_packing`: each base model's measured K and SM share (ait.compute.packing.per_model)."""
        self.slots = slots
        self.job_fn = job_fn
        self.ledger = ledger_for(slots, capacity_gib)
        self.model_packing = model_packing or {}
        self._pool = ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="ait-slot")

    def describe(self) -> str:
        gpus = sorted({s["CUDA_VISIBLE_DEVICES"] for s in self.slots} - {""})
        return f"local, {len(self.slots)} slot(s)" + (f" on GPU(s) {','.join(gpus)}" if gpus else " on CPU")

    def submit(self, job: Job, env: dict[str, str]) -> Future:
        return self._pool.submit(run_admitted, self.ledger, self.job_fn, job, env, self.model_packing)

    def stop(self, job: Job, future: Future) -> None:
        kill_job_processes(job)

    def to_result(self, job: Job, error: BaseException) -> JobResult | None:
        # The job function itself raised (run_job does not): our code failed, not the job.
        return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.infra,
                         error=f"job function raised {type(error).__name__}: {error}")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class LocalExecutor:
    """`ait episode --executor local`: run the job in a slot of this pool, which its owner shares among
    every episode it starts, so concurrent episodes never share a GPU they were not packed on.
    Jobs packed on one GPU are admitted by estimated memory (ait.compute.gpu_memory); a packed
    job that runs out of memory, or dies of a GPU fault, is re-run alone, so packing never fails a
    job that fits and runs alone: under CUDA MPS a fatal fault in any one client (an illegal memory
    access, say) tears down every client on that GPU, so a packed job can die of a neighbour's bug."""

    def __init__(self, slots: list[dict[str, str]], job_fn: JobFn = run_job_in_slot,
                 capacity_gib: dict[str, float | None] | None = None, reserved_gib: float = 0.0,
                 model_packing: dict[str, Packing] | None = None) -> None:
        """`reserved_gib` is held back on every GPU for a process that shares it outside this pool
        (the outer loop's agent, sampling and training beside its own inner jobs); `model_packing`: each
        base model's measured K and SM share (ait.compute.packing.per_model)."""
        self.job_fn = job_fn
        self.model_packing = model_packing or {}
        self._free: queue_mod.Queue[dict[str, str]] = queue_mod.Queue()
        for env in slots:
            self._free.put(env)
        self.ledger = ledger_for(slots, capacity_gib, reserved_gib)
        self._lock = threading.Lock()
        self._started: set[str] = set()  # job ids that got a slot and their GPU's admission
        self._cancelled: set[str] = set()  # job ids given up on before they started: never start them

    def job_memory_limit_gib(self) -> float | None:
        """With memory held back for a process beside the pool (the outer loop's agent), the most GPU
        memory one job may need and still run here: what its smallest GPU leaves (after the headroom).
        None when nothing is held back or no GPU's capacity is known: then no job is refused for its size."""
        known = [c for c in self.ledger.capacity.values() if c is not None]
        return min(known) if self.ledger.reserved_gib and known else None

    def run(self, job: Job, on_event: Callable[[str], None] | None = None) -> JobResult:
        env = self._free.get()  # blocks while every slot is busy
        try:
            return run_admitted(self.ledger, self.job_fn, job, env, self.model_packing,
                                on_start=lambda: self._start(job))
        except NotStarted:
            return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.killed,
                             error="cancelled before it got a slot: it never ran")
        finally:
            self._free.put(env)

    def _start(self, job: Job) -> None:
        with self._lock:
            if job.job_id in self._cancelled:
                raise NotStarted(job.job_id)
            self._started.add(job.job_id)

    def started(self, job: Job) -> bool:
        with self._lock:
            return job.job_id in self._started

    def cancel(self, job: Job) -> None:
        """The episode gave up on the job (Ctrl-C, its deadline): if it is still waiting, it never starts."""
        with self._lock:
            if job.job_id not in self._started:
                self._cancelled.add(job.job_id)

    def close(self) -> None:
        pass  # jobs run on their callers' threads: the pool holds nothing to release


class NotStarted(Exception):
    """A job cancelled while it waited for its slot or its GPU's admission."""


def ledger_for(slots: list[dict[str, str]], capacity_gib: dict[str, float | None] | None = None,
               reserved_gib: float = 0.0):
    """A memory ledger over the GPUs the slots use (their nvidia-smi totals unless given)."""
    from ait.compute.gpu_memory import GpuLedger, gpu_total_gib

    gpus = sorted({s.get("CUDA_VISIBLE_DEVICES", "") for s in slots} - {""})
    if capacity_gib is None:
        capacity_gib = {g: gpu_total_gib(g) for g in gpus}
    return GpuLedger({g: capacity_gib.get(g) for g in gpus}, reserved_gib=reserved_gib)


def run_admitted(ledger, job_fn: JobFn, job: Job, env: dict[str, str],
                 model_packing: dict[str, Packing] | None = None,
                 on_start: Callable[[], None] = lambda: None) -> JobResult:
    """Run `job` once its estimated memory fits its GPU beside the jobs running there (and, where its
    base model's packing was measured, once at most that K jobs share the GPU, itself at that row's SM
    share); a packed job that runs out of memory or dies of a GPU fault is run again alone. On a GPU part of
    which is held for another process, a job whose estimate exceeds what is left is not run (infra). `on_start`
    is called once the job is admitted, just before it first runs (it may raise to keep it from running)."""
    gpu = env.get("CUDA_VISIBLE_DEVICES", "")
    if not gpu or gpu not in ledger.used:
        on_start()
        return job_fn(job, env)
    measured = (model_packing or {}).get(job.config.job.base_model)
    if measured is not None and MPS_THREAD_PERCENTAGE_ENV in env:
        env = {k: v for k, v in env.items() if k != MPS_THREAD_PERCENTAGE_ENV}
        if measured.mps_thread_percentage is not None:
            env[MPS_THREAD_PERCENTAGE_ENV] = str(measured.mps_thread_percentage)
    # With no known capacity (nvidia-smi unreadable) there is nothing to admit against: skip the estimate.
    need = estimate_gib(job, int(env.get(LOGIT_BUDGET_ENV, LOGIT_BUDGET))) if ledger.capacity.get(gpu) else 0.0
    max_jobs = measured.jobs_per_gpu if measured is not None else None
    cap = ledger.capacity.get(gpu)
    if ledger.reserved_gib and cap is not None and need > cap:
        # Not even alone: it would run out of memory beside the process the GPU is shared with (the outer
        # loop's agent), or push that one out of memory. Its neighbour's doing, not the job's: on a card
        # with more memory, or without the agent, it runs.
        return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.infra, base_model=job.config.job.base_model,
                         error=f"not run: this GPU holds {ledger.reserved_gib:g} GiB for the agent's sampler and trainer, "
                               f"leaving {cap:.1f} GiB for jobs, and this job's estimated peak is {need:.1f} GiB "
                               "(a card with more memory runs it)")
    with ledger.reserve(gpu, need, max_jobs=max_jobs) as held:
        on_start()
        result = job_fn(job, env)
    if held.shared and result.fail_reason in RETRY_ALONE:
        first = result
        with ledger.reserve(gpu, need, exclusive=True):
            result = job_fn(job, env)
        # Only the attempt that counted is timed: a neighbour's fault is not the job's doing. It ran
        # alone, though, which is faster than the packing it was admitted to; and the failure class
        # comes from the job's exit status, which its code could fake to buy that. So its time is
        # charged at that packing (x the measured per-job slowdown of held.peak_jobs jobs together).
        factor = packed_slowdown(measured, held.peak_jobs)
        if result.train_seconds is not None:
            result.metrics["pack/alone_s"] = result.train_seconds
            result.train_seconds *= factor
        result.metrics["pack/retried_alone"] = 1.0
        result.metrics["pack/charged_factor"] = factor
        result.metrics["pack/first_attempt_s"] = first.train_seconds or 0.0
    result.metrics["pack/estimate_gib"] = need
    return result


RETRY_ALONE = (FailReason.oom, FailReason.gpu_fault)
"""Failures a packed job is re-run alone for: its memory or, under MPS, a neighbour's CUDA fault."""


def estimate_gib(job: Job, logit_budget: int = LOGIT_BUDGET) -> float:
    """The job's estimated peak GPU memory; 0 when its model cannot be resolved (run_job reports why)."""
    from ait.compute.gpu_memory import estimate_job_gib
    from ait.train.models import resolve_base_model

    try:
        return estimate_job_gib(job, resolve_base_model(job.config.job.base_model).path, logit_budget)
    except Exception:  # noqa: BLE001 - the job itself will fail with the real reason
        return 0.0
