"""The job function every executor runs: train (agent code) then hidden eval (family code), both sandboxed.

    train process   python -m ait.train.main req.json         agent code; writes RUN_DIR/job/ only
    eval process    python -m ait.evals.hidden_eval req.json  family code; reads job/checkpoint (safetensors,
                                                              no links), writes RUN_DIR/eval/ only; started
                                                              beside training, scores once told "go"
    logs            RUN_DIR/logs/{train,eval}.log             written by this process alone

A job that dies (OOM, crash, timeout, killed) yields a failed JobResult with a reason, never an
exception: the episode still completes and scores job_quality 0. The reason comes from what
this process observes (exit status, signal, the memory cgroup's OOM events, its clock), never
from text the job printed; what it reads from the job's directory it reads without following
links and never quotes.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

from ait.compute import processes
from ait.evals.runner import EvalFailed, eval_request, finish_eval, model_read_paths, start_eval
from ait.job.types import MAX_DROPPED_NAMES, FailReason, Job, JobResult
from ait.safe_io import UnsafeFile, read_finite_json_model, write_new_file
from ait.compute.warm import train_zygote
from ait.sandbox import (
    Limits,
    RunOutcome,
    SandboxPolicy,
    SandboxUnavailable,
    gpu_settings,
    run_untrusted,
    start_untrusted,
)
from ait.sandbox.watch import size
from ait.spec import load_spec
from ait.train.models import ModelResolutionError, resolve_base_model
from ait.train.request import EXIT_GPU_FAULT, EXIT_NO_GPU, EXIT_OOM, TrainOutput, TrainRequest

EVAL_TIMEOUT_S = 3600.0
MAX_TRAIN_OUTPUT_BYTES = 1_000_000


def classify_failure(outcome: RunOutcome) -> FailReason:
    """From observations only: the clock, the memory cgroup's OOM kills, the exit status (the trainer
    exits EXIT_OOM on torch's OutOfMemoryError / MemoryError and EXIT_GPU_FAULT on a CUDA fault),
    the signal. A job can fake an exit status, but never into more than a re-run alone that is timed
    as if it had run packed (ait.compute.local.run_admitted), so faking gains it nothing."""
    if outcome.timed_out:
        return FailReason.timeout
    if outcome.oom_killed or outcome.returncode == EXIT_OOM:
        return FailReason.oom
    if outcome.disk_full or outcome.watchdog_rule == "disk":
        # Its own file system filled (a write past its disk limit failed with ENOSPC), or the watchdog
        # counted more than the limit: the job's own doing, whatever it did with the error.
        return FailReason.disk
    if outcome.watchdog:  # killed for its tasks (a fork bomb): the job's own doing
        return FailReason.crash
    if outcome.returncode in (EXIT_GPU_FAULT, EXIT_NO_GPU):
        # EXIT_NO_GPU: CUDA unusable at start, which under MPS is also what a neighbour's fault leaves
        # behind ("MPS server is not ready") until the faulting clients exit: re-run alone, not a crash.
        return FailReason.gpu_fault
    if outcome.returncode is not None and outcome.returncode < 0:
        # SIGKILL with no memory cgroup watching: most likely the kernel's OOM killer.
        if outcome.returncode == -signal.SIGKILL and not outcome.memory_observed:
            return FailReason.oom
        return FailReason.killed
    return FailReason.crash


TRAIN_KEEP = ("checkpoint", "train_output.json")
"""What training writes on purpose; the rest of what it wrote (HOME, TMPDIR, caches, TRL's output
directory) goes when it ends."""


def train_policy(job: Job, model_path: str, job_dir: Path, extra_env: dict[str, str] | None) -> SandboxPolicy:
    """The training process reads the workspace snapshot and the base weights, writes only the job dir:
    into an ext4 image of its disk limit where this host can loop-mount one (else the watchdog bounds
    it), of which only TRAIN_KEEP is copied back."""
    gpu, mps = gpu_settings(extra_env)
    return SandboxPolicy(read=[job.workspace, *model_read_paths(model_path)], write=[str(job_dir)], gpu=gpu,
                         mps_pipe_dir=mps, limits=Limits(cpu_s=int(job.time_budget_s * job.kill_factor * 64) + 600),
                         disk_fs="image", keep=list(TRAIN_KEEP))


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def split_threads(extra_env: dict[str, str] | None) -> tuple[dict[str, str], int | None]:
    """(extra_env with OMP_NUM_THREADS halved for each of the job's two processes, the whole share).

    The share is the slot's OMP_NUM_THREADS, else every usable core; training and the eval waiting
    beside it get half each (the eval takes the whole share back once training ends). Two torch
    processes that each spin one OpenMP thread per core on the same cores slow each other several
    times over: a CPU job's sampling ran at 3 tokens/s that way. An operator's own
    OMP_NUM_THREADS is kept as it is (None for the share)."""
    env = dict(extra_env or {})
    if "OMP_NUM_THREADS" in os.environ:
        return env, None
    share = env.get("OMP_NUM_THREADS", "")
    cores = int(share) if share.isdigit() and int(share) > 0 else usable_cores()
    env["OMP_NUM_THREADS"] = str(max(1, cores // 2))
    return env, cores


def fresh_dirs(run_dir: Path) -> tuple[Path, Path, Path]:
    """RUN_DIR/job (training writes), RUN_DIR/eval (the eval writes), RUN_DIR/logs (only we write):
    a retried job starts clean, never on a dead attempt's files."""
    dirs = run_dir / "job", run_dir / "eval", run_dir / "logs"
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    return dirs


def run_job(job: Job, extra_env: dict[str, str] | None = None) -> JobResult:
    """Train then evaluate one job. `extra_env` reaches both processes (e.g. CUDA_VISIBLE_DEVICES
    for the GPU slot an executor assigned).

    The eval process starts beside the training process and waits (EvalRequest.wait_for_checkpoint):
    its imports, model load and base score overlap training instead of following it. Training can
    neither read the eval's directory (the hidden examples are in its request) nor write it."""
    extra_env, threads = split_threads(extra_env)
    job_dir, eval_dir, logs = fresh_dirs(Path(job.run_dir))
    start = time.monotonic()
    try:
        model = resolve_base_model(job.config.job.base_model)  # trusted: downloads happen here, not inside
    except ModelResolutionError as e:  # the probe checked it resolves: it stopped resolving since
        return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.infra, error=str(e),
                         base_model=job.config.job.base_model)
    request_path = job_dir / "train_request.json"
    write_new_file(request_path, TrainRequest(job=job, base_model_path=model.path, trainer=job.trainer)
                   .model_dump_json(indent=2))
    req = eval_request(load_spec(job.task_path), model, eval_dir, n=job.eval_size,
                       checkpoint=str(job_dir / "checkpoint"), wait_for_checkpoint=True, threads_after_go=threads)
    base = dict(job_id=job.job_id, base_model=job.config.job.base_model, base_model_source=model.source,
                base_model_sha256=model.sha256)
    try:
        evaluator = start_eval(req, eval_dir, logs / "eval.log", readable=[str(job_dir)], extra_env=extra_env)
    except SandboxUnavailable as e:
        return JobResult(ok=False, fail_reason=FailReason.infra, error=f"not run: {e}", **base)
    processes.track(job.job_id, evaluator.pid)
    try:
        args, policy = ["-m", "ait.train.main", str(request_path)], train_policy(job, model.path, job_dir, extra_env)
        timeout_s = job.time_budget_s * job.kill_factor
        zygote = train_zygote()
        if zygote is not None:  # forked from this slot's warm interpreter (ait.compute.warm)
            processes.track(job.job_id, zygote.start())
            outcome = run_untrusted(args, cwd=job_dir, timeout_s=timeout_s, log_path=logs / "train.log",
                                    policy=policy, env=extra_env, zygote=zygote)
        else:
            trainer = start_untrusted(args, cwd=job_dir, log_path=logs / "train.log", policy=policy, env=extra_env)
            processes.track(job.job_id, trainer.pid)
            outcome = trainer.finish(timeout_s)
        return _score(job, job_dir, outcome, evaluator, req, eval_dir, start, base, policy.limits.disk_bytes)
    except SandboxUnavailable as e:
        return JobResult(ok=False, fail_reason=FailReason.infra, error=f"not run: {e}", **base)
    finally:
        evaluator.kill()  # stops a waiting eval when training failed (a no-op once it finished)
        processes.forget(job.job_id)


def outputs_changed(report) -> int | None:
    if report.pre_digests is None or report.post_digests is None:
        return None
    return sum(a != b for a, b in zip(report.pre_digests, report.post_digests))


def _score(job: Job, job_dir: Path, outcome: RunOutcome, evaluator, req, eval_dir: Path, start: float,
           base: dict, disk_bytes: int | None = None) -> JobResult:
    # The worker's clock, not the job's own report, is what the speed term uses.
    base = {**base, "train_seconds": outcome.seconds}
    if outcome.timed_out or outcome.returncode != 0:
        reason = classify_failure(outcome)
        detail = f"training timed out after {outcome.seconds:.0f}s" if outcome.timed_out else \
            f"training exited with status {outcome.returncode} ({reason.value})"
        if outcome.watchdog:
            detail = f"training was killed: {outcome.watchdog}"
        elif reason is FailReason.disk:
            detail = (f"training ran out of disk: what it wrote reached its limit of {size(disk_bytes or 0)} "
                      f"(writes past it failed: No space left on device; exit status {outcome.returncode})")
        if reason is FailReason.disk:
            # What it wrote is worthless (no checkpoint comes from a killed run) and is what fills
            # the worker's disk: remove it now, not when the run directory is cleaned up.
            shutil.rmtree(job_dir, ignore_errors=True)
            job_dir.mkdir(exist_ok=True)
            detail += "; what it wrote was deleted"
        if outcome.returncode == EXIT_NO_GPU:
            detail = "the GPU this job's slot was given is not usable inside the sandbox (see `ait doctor`)"
        return JobResult(ok=False, fail_reason=reason, error=f"{detail}\n{outcome.log_tail}",
                         total_seconds=time.monotonic() - start, **base)
    try:
        # The job's code can write anything here: a diverged loss is NaN, and one NaN stored in the
        # result would make it unreadable. Dropped here, and named in the result.
        trained, dropped = read_finite_json_model(job_dir / "train_output.json", TrainOutput, MAX_TRAIN_OUTPUT_BYTES)
    except UnsafeFile as e:  # missing or forged output: the job did not finish honestly
        if outcome.disk_full:  # it could not write it: its disk was full
            return JobResult(ok=False, fail_reason=FailReason.disk, error=(
                f"training's output is unusable ({e}): what it wrote reached its disk limit of {size(disk_bytes or 0)} "
                "(writes past it failed: No space left on device)"), total_seconds=time.monotonic() - start, **base)
        return JobResult(ok=False, fail_reason=FailReason.crash, error=f"training's output is unusable: {e}",
                         total_seconds=time.monotonic() - start, **base)
    try:
        report = finish_eval(evaluator, req, eval_dir, EVAL_TIMEOUT_S, stdin_line="go")
    except EvalFailed as e:
        # The eval runs no agent code: its failure is the infrastructure's, unless the checkpoint the
        # job wrote was refused (the job's) or a CUDA fault or lack of memory ended it (re-run alone when
        # packed; alone, an eval that runs out of memory is the job's, as its training's would be).
        reason = (FailReason.crash if e.job_fault else FailReason.gpu_fault if e.gpu_fault
                  else FailReason.oom if e.oom else FailReason.infra)
        return JobResult(ok=False, fail_reason=reason, error=f"hidden eval: {e}",
                         total_seconds=time.monotonic() - start, **base)
    metrics = {k: v for k, v in trained.metrics.items() if isinstance(v, float)}
    metrics.update(report.seconds)
    return JobResult(ok=True, pre=report.pre, post=report.post, eval_n=report.n, pre_scores=report.pre_scores,
                     post_scores=report.post_scores, outputs_changed=outputs_changed(report),
                     weights_changed=report.weights_changed, checkpoint=str(job_dir / "checkpoint"),
                     total_seconds=time.monotonic() - start, metrics=metrics, dropped_nonfinite=named(dropped),
                     **base)


def named(dropped: list[str]) -> list[str]:
    """The first MAX_DROPPED_NAMES places (each cut to 200 characters), then how many more: a file
    of a million NaNs does not become a million-line result."""
    more = len(dropped) - MAX_DROPPED_NAMES
    return [d[:200] for d in dropped[:MAX_DROPPED_NAMES]] + ([f"... and {more} more"] if more > 0 else [])
