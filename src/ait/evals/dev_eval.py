"""The dev eval: a trained checkpoint scored on the spec's public dev examples.

Between jobs of an iterative episode this is the only score the agent is shown; the
hidden post score decides the reward but never reaches it. It runs the same trusted
eval process as the hidden eval (family tools and scorer, safetensors only) in dev-only
mode, so no hidden example is generated, scored or written.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel

from ait.evals.hidden_eval import EvalReport, EvalRequest
from ait.families import Example
from ait.job.types import Job, JobResult
from ait.spec import TaskSpec

DEV_EVAL_TIMEOUT_S = 1800.0


class DevScore(BaseModel):
    score: float
    """Mean family score on the dev examples."""
    n: int
    """Dev examples scored."""
    seconds: float
    """Wall time of the dev eval process."""


def dev_examples(spec: TaskSpec) -> list[Example]:
    """The spec's public dev examples as family examples (same prompt, world and gold answer)."""
    return [Example(prompt=d.prompt, world=d.world, answer=d.answer) for d in spec.dev_examples]


def run_dev_eval(job: Job, result: JobResult, timeout_s: float = DEV_EVAL_TIMEOUT_S) -> DevScore | str:
    """Score `result`'s checkpoint on the dev examples in a separate process; a reason text when
    it cannot (no checkpoint here, the process failed)."""
    from ait.sandbox import run_process

    if not result.ok or not result.checkpoint or not Path(result.checkpoint).is_dir():
        return "no trained checkpoint on this machine"
    job_dir = Path(result.checkpoint).parent
    req = EvalRequest(task_path=job.task_path, base_model=job.config.job.base_model, checkpoint=result.checkpoint,
                      run_pre=False, hidden=False, dev=True, out_path=str(job_dir / "dev_eval.json"))
    req_path = job_dir / "dev_eval_request.json"
    req_path.write_text(req.model_dump_json(indent=2))
    outcome = run_process(["-m", "ait.evals.hidden_eval", str(req_path)], cwd=job_dir, timeout_s=timeout_s,
                          log_path=job_dir / "dev_eval.log", env=dict(os.environ))
    if outcome.returncode != 0:
        why = "timed out" if outcome.timed_out else f"exited with status {outcome.returncode}"
        return f"dev eval {why}"
    report = EvalReport.model_validate_json(Path(req.out_path).read_text())
    if report.dev is None:
        return "the task has no dev examples"
    return DevScore(score=report.dev, n=report.dev_n or 0, seconds=outcome.seconds)
