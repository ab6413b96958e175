"""The job function every executor runs: train (untrusted) then hidden eval (trusted).

    train process   python -m ait.train.main req.json         agent code, via the sandbox; writes job/
    eval process    python -m ait.evals.hidden_eval req.json  family code only, safetensors only; started
                                                              beside training, scores once told "go"; eval/

A job that dies (OOM, crash, timeout, killed) yields a failed JobResult with a reason,
never an exception: the episode still completes and scores job_quality 0.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

from ait.evals.hidden_eval import EvalReport, EvalRequest
from ait.job.types import FailReason, Job, JobResult
from ait.sandbox import Limits, RunOutcome, SandboxPolicy, StartedProcess, run_untrusted
from ait.train.request import EXIT_OOM, TrainOutput, TrainRequest
from ait.train.models import ModelResolutionError, resolve_base_model

EVAL_TIMEOUT_S = 3600.0


# What an out-of-memory death prints: torch's OutOfMemoryError, a plain MemoryError, and the driver's
# "CUDA error: out of memory" (torch.AcceleratorError, raised when even moving the weights to the GPU
# fails: seen on an H200 shared with another program's jobs).
OOM_MARKERS = ("OutOfMemoryError", "MemoryError", "CUDA error: out of memory", "CUDA out of memory")


def classify_failure(outcome: RunOutcome) -> FailReason:
    if outcome.timed_out:
        return FailReason.timeout
    if outcome.returncode == EXIT_OOM or any(m in outcome.log_tail for m in OOM_MARKERS):
        return FailReason.oom
    if outcome.returncode is not None and outcome.returncode < 0:
        # SIGKILL from outside is usually the kernel's OOM killer; other signals are kills.
        return FailReason.oom if outcome.returncode == -signal.SIGKILL else FailReason.killed
    return FailReason.crash


def train_policy(job: Job, model_path: str, job_dir: Path, extra_env: dict[str, str] | None) -> SandboxPolicy:
    """The training process reads the workspace snapshot and the base weights, writes only the job dir."""
    devices = (extra_env or {}).get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    gpu = devices != "" and Path("/dev/nvidiactl").exists()
    mps = {**os.environ, **(extra_env or {})}.get("CUDA_MPS_PIPE_DIRECTORY") or None
    return SandboxPolicy(read=[job.workspace, *model_read_paths(model_path)], write=[str(job_dir)], gpu=gpu,
                         mps_pipe_dir=mps if gpu and mps and Path(mps).is_dir() else None,
                         limits=Limits(cpu_s=int(job.time_budget_s * job.kill_factor * 64) + 600))


def model_read_paths(path: str) -> list[str]:
    """A Hugging Face snapshot's files are links into the repo's blobs/: grant the repo directory."""
    p = Path(path)
    return [str(p.parents[1])] if p.parent.name == "snapshots" else [str(p)]


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


def run_job(job: Job, extra_env: dict[str, str] | None = None) -> JobResult:
    """Train then evaluate one job. `extra_env` reaches both processes (e.g. CUDA_VISIBLE_DEVICES
    for the GPU slot an executor assigned).

    The eval process starts beside the training process and waits (EvalRequest.wait_for_checkpoint):
    its imports, model load and base score overlap training instead of following it. Its files
    live in RUN_DIR/eval/, which the training process cannot write: agent code that ran beside
    it can neither rewrite its request nor plant a link where it writes its report."""
    extra_env, threads = split_threads(extra_env)
    job_dir = Path(job.run_dir) / "job"
    eval_dir = Path(job.run_dir) / "eval"
    for d in (job_dir, eval_dir):
        shutil.rmtree(d, ignore_errors=True)  # a retried job starts clean, never on a dead attempt's files
        d.mkdir(parents=True)
    start = time.monotonic()

    try:
        base_model = resolve_base_model(job.config.job.base_model)  # trusted: downloads happen here, not inside
    except ModelResolutionError as e:
        return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.crash, error=str(e),
                         base_model=job.config.job.base_model)
    request = TrainRequest(job=job, base_model_path=base_model.path, trainer=job.trainer)
    request_path = job_dir / "train_request.json"
    request_path.write_text(request.model_dump_json(indent=2))
    checkpoint = job_dir / "checkpoint"  # fixed location: never a path the job chose
    req = EvalRequest(task_path=job.task_path, base_model=job.config.job.base_model,
                      base_model_sha256=base_model.sha256, checkpoint=str(checkpoint),
                      n=job.eval_size, out_path=str(eval_dir / "eval.json"), wait_for_checkpoint=True,
                      threads_after_go=threads)
    req_path = eval_dir / "eval_request.json"
    req_path.write_text(req.model_dump_json(indent=2))
    # Our own code: it keeps the full environment but still gets a process group and a timeout.
    evaluator = StartedProcess(["-m", "ait.evals.hidden_eval", str(req_path)], cwd=eval_dir,
                               log_path=eval_dir / "eval.log", env={**os.environ, **(extra_env or {})}, stdin=True)
    try:
        return _train_then_score(job, job_dir, base_model, request_path, extra_env, evaluator, Path(req.out_path),
                                 start)
    finally:
        evaluator.kill()  # stops a waiting eval when training failed (a no-op once it finished)


def _train_then_score(job: Job, job_dir: Path, base_model, request_path: Path, extra_env: dict[str, str] | None,
                      evaluator: StartedProcess, eval_out: Path, start: float) -> JobResult:
    outcome = run_untrusted(["-m", "ait.train.main", str(request_path)], cwd=job_dir,
                            timeout_s=job.time_budget_s * job.kill_factor, log_path=job_dir / "train.log",
                            policy=train_policy(job, base_model.path, job_dir, extra_env), env=extra_env)
    # The worker's clock, not the job's own report, is what the speed term uses.
    train_seconds = outcome.seconds
    base = dict(job_id=job.job_id, base_model=job.config.job.base_model, train_seconds=train_seconds,
                base_model_source=base_model.source, base_model_sha256=base_model.sha256)
    if outcome.timed_out or outcome.returncode != 0:
        reason = classify_failure(outcome)
        detail = f"training timed out after {outcome.seconds:.0f}s" if outcome.timed_out else \
            f"training exited with status {outcome.returncode}"
        return JobResult(ok=False, fail_reason=reason, error=f"{detail}\n{outcome.log_tail}",
                         total_seconds=time.monotonic() - start, **base)
    try:
        trained = TrainOutput.model_validate_json((job_dir / "train_output.json").read_text())
    except Exception as e:  # missing or forged output: the job did not finish honestly
        return JobResult(ok=False, fail_reason=FailReason.crash, error=f"train_output.json unreadable: {e}",
                         total_seconds=time.monotonic() - start, **base)

    evaluated = evaluator.finish(EVAL_TIMEOUT_S, stdin_line="go")
    if evaluated.returncode != 0:
        return JobResult(ok=False, fail_reason=FailReason.crash,
                         error=f"hidden eval failed (status {evaluated.returncode})\n{evaluated.log_tail}",
                         total_seconds=time.monotonic() - start, **base)
    report = EvalReport.model_validate_json(eval_out.read_text())
    metrics = {k: v for k, v in trained.metrics.items() if isinstance(v, float)}
    metrics.update(report.seconds)
    return JobResult(ok=True, pre=report.pre, post=report.post, eval_n=report.n,
                     weights_changed=report.weights_changed, checkpoint=str(job_dir / "checkpoint"),
                     total_seconds=time.monotonic() - start, metrics=metrics, **base)
