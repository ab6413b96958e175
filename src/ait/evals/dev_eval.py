"""The dev eval: a trained checkpoint scored on the spec's public dev examples.

Between jobs of an iterative episode this is the only score the agent is shown; the
hidden post score decides the reward but never reaches it. It is the same sandboxed eval
process as the hidden eval (family tools and scorer, safetensors only, no links followed),
given no hidden examples at all. Its files live in RUN_DIR/dev_eval/, which training
never could write, its log in RUN_DIR/logs/.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pydantic import BaseModel

from ait.evals.runner import EvalFailed, eval_request, run_eval
from ait.job.types import Job, JobResult
from ait.sandbox import SandboxUnavailable
from ait.spec import load_spec

DEV_EVAL_TIMEOUT_S = 1800.0


class DevScore(BaseModel):
    score: float
    """Mean family score on the dev examples."""
    n: int
    """Dev examples scored."""
    seconds: float
    """Wall time of the dev eval."""


def run_dev_eval(job: Job, result: JobResult, timeout_s: float = DEV_EVAL_TIMEOUT_S) -> DevScore | str:
    """Score the job's checkpoint on the dev examples in the sandboxed eval process; a reason text
    when it cannot (no checkpoint here, the base weights changed, the process failed)."""
    import time

    from ait.train.models import ModelResolutionError, resolve_base_model

    run_dir = Path(job.run_dir)
    job_dir = run_dir / "job"
    checkpoint = job_dir / "checkpoint"  # the fixed place run_job scored, never a path the job chose
    if not result.ok or not checkpoint.is_dir() or checkpoint.is_symlink():
        return "no trained checkpoint on this machine"
    spec = load_spec(job.task_path)
    if not spec.dev_examples:
        return "the task has no dev examples"
    try:
        model = resolve_base_model(job.config.job.base_model)
    except ModelResolutionError as e:
        return f"the base model no longer resolves: {e}"
    if result.base_model_sha256 and model.sha256 != result.base_model_sha256:
        return (f"base model {model.name!r} now resolves to weights {model.sha256[:12]}, not the "
                f"{result.base_model_sha256[:12]} the job trained from")
    dev_dir = run_dir / "dev_eval"
    shutil.rmtree(dev_dir, ignore_errors=True)
    dev_dir.mkdir(parents=True)
    req = eval_request(spec, model, dev_dir, hidden=False, checkpoint=str(checkpoint), run_pre=False, dev=True)
    t0 = time.monotonic()
    try:
        report = run_eval(req, dev_dir, run_dir / "logs" / "dev_eval.log", readable=[str(job_dir)],
                          timeout_s=timeout_s)
    except (EvalFailed, SandboxUnavailable) as e:
        return f"dev eval failed: {str(e).splitlines()[0]}"
    if report.dev is None:
        return "the task has no dev examples"
    return DevScore(score=report.dev, n=report.dev_n or 0, seconds=time.monotonic() - t0)
