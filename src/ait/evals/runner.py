"""The trusted side of every eval: build the request, run the eval process in the sandbox, read
its report back safely, remember new base-weight scores.

The hidden examples are generated here, from the secret, and handed to the eval in its
request: the eval process reads a checkpoint that agent code wrote, so it runs sandboxed and
can never read the secret itself. Its files live in a directory only it and this side write
(`eval_dir`), its log in one only this side writes.

    request = eval_request(spec, model, n=200, checkpoint=..., out_dir=eval_dir)
    report_or_reason = run_eval(request, eval_dir, log_path, timeout_s)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ait.evals.hidden import eval_fingerprint, hidden_examples
from ait.evals.hidden_eval import EvalReport, EvalRequest, valid_digests, valid_scores
from ait.home import ait_home
from ait.safe_io import UnsafeFile, read_json_model, write_new_file
from ait.sandbox import Limits, SandboxPolicy, StartedProcess, gpu_settings, start_untrusted
from ait.spec import TaskSpec
from ait.train.models import ResolvedModel

EVAL_TIMEOUT_S = 3600.0
REQUEST_NAME, REPORT_NAME = "eval_request.json", "eval.json"
MAX_REPORT_BYTES = 20_000_000
EXIT_NO_CHECKPOINT, EXIT_BAD_CHECKPOINT, EXIT_GPU_FAULT, EXIT_EVAL_OOM = 3, 4, 5, 7


class EvalFailed(RuntimeError):
    """The eval process did not produce a report. `job_fault`: the job's checkpoint was to blame;
    `gpu_fault`: a CUDA fault ended it (under MPS possibly a neighbour's); `oom`: it ran out of memory
    (beside packed jobs most likely their doing: the job is re-run alone)."""

    def __init__(self, message: str, job_fault: bool = False, gpu_fault: bool = False, oom: bool = False):
        super().__init__(message)
        self.job_fault, self.gpu_fault, self.oom = job_fault, gpu_fault, oom


def pre_cache_dir() -> Path:
    d = ait_home() / "pre_scores"
    d.mkdir(parents=True, exist_ok=True)
    return d


def eval_request(spec: TaskSpec, model: ResolvedModel, out_dir: Path, *, n: int | None = None,
                 hidden: bool = True, checkpoint: str | None = None, run_pre: bool = True, dev: bool = False,
                 wait_for_checkpoint: bool = False, threads_after_go: int | None = None) -> EvalRequest:
    """Everything the eval needs, hidden examples included (None for n: the spec's hidden_eval_size)."""
    n = n or spec.hidden_eval_size
    return EvalRequest(spec=spec, base_model=model.name, base_model_path=model.path, base_model_sha256=model.sha256,
                       examples=hidden_examples(spec, n) if hidden else [],
                       fingerprint=eval_fingerprint(spec, n) if hidden else "", checkpoint=checkpoint,
                       run_pre=run_pre, dev=dev, out_path=str(Path(out_dir) / REPORT_NAME),
                       pre_cache_dir=str(pre_cache_dir()), wait_for_checkpoint=wait_for_checkpoint,
                       threads_after_go=threads_after_go)


def model_read_paths(path: str) -> list[str]:
    """A Hugging Face snapshot's files are links into the repo's blobs/: grant the repo directory."""
    p = Path(path)
    return [str(p.parents[1])] if p.parent.name == "snapshots" else [str(p)]


def eval_policy(req: EvalRequest, eval_dir: Path, extra_env: dict[str, str] | None, readable: list[str],
                timeout_s: float) -> SandboxPolicy:
    """Reads the base weights, the directory holding the checkpoint and the cached scores; writes its
    own directory only."""
    gpu, mps = gpu_settings(extra_env)
    read = [*model_read_paths(req.base_model_path), *readable]
    if req.pre_cache_dir:
        read.append(req.pre_cache_dir)
    cores = os.cpu_count() or 1
    return SandboxPolicy(read=read, write=[str(eval_dir)], gpu=gpu, mps_pipe_dir=mps,
                         limits=Limits(cpu_s=int(timeout_s * cores) + 600, processes=512))


def start_eval(req: EvalRequest, eval_dir: Path, log_path: Path, *, readable: list[str],
               extra_env: dict[str, str] | None = None, timeout_s: float = EVAL_TIMEOUT_S) -> StartedProcess:
    """Write the request and start the sandboxed eval process (waiting on stdin when the request says so).
    `readable`: what it may read beyond the base weights (the directory the checkpoint will appear in)."""
    eval_dir.mkdir(parents=True, exist_ok=True)
    request_path = eval_dir / REQUEST_NAME
    write_new_file(request_path, req.model_dump_json())
    return start_untrusted(["-m", "ait.evals.hidden_eval", str(request_path)], cwd=eval_dir, log_path=log_path,
                           policy=eval_policy(req, eval_dir, extra_env, readable, timeout_s), env=extra_env,
                           stdin=req.wait_for_checkpoint)


def finish_eval(process: StartedProcess, req: EvalRequest, eval_dir: Path, timeout_s: float = EVAL_TIMEOUT_S,
                stdin_line: str | None = None) -> EvalReport:
    """Wait for the eval, then read its report (raises EvalFailed with the reason)."""
    outcome = process.finish(timeout_s, stdin_line=stdin_line)
    forget_examples(eval_dir)
    on_checkpoint = reached_checkpoint(eval_dir)
    if outcome.returncode == EXIT_GPU_FAULT:
        raise EvalFailed(f"a CUDA fault ended the eval: {last_line(outcome.log_tail)}", gpu_fault=True)
    if outcome.returncode == EXIT_EVAL_OOM or outcome.oom_killed:
        # Seen on 2026-12-07: an 80 GB card with the agent and four packed jobs; a 2 GB eval's allocation failed.
        raise EvalFailed(f"the eval ran out of memory: {last_line(outcome.log_tail)}", oom=True)
    if outcome.returncode == EXIT_BAD_CHECKPOINT:
        raise EvalFailed(f"the trained checkpoint was refused: {last_line(outcome.log_tail)}", job_fault=True)
    # Past the point where it turned to the trained checkpoint, the eval ran only on what the job
    # wrote: its failure then is the job's (memory, time), not the infrastructure's.
    where = " on the trained checkpoint" if on_checkpoint else ""
    if outcome.timed_out:
        raise EvalFailed(f"the eval timed out after {outcome.seconds:.0f}s{where}", job_fault=on_checkpoint)
    if outcome.returncode != 0:
        raise EvalFailed(f"the eval exited with status {outcome.returncode}{where}\n{outcome.log_tail}",
                         job_fault=on_checkpoint)
    return read_report(req)


def reached_checkpoint(eval_dir: Path) -> bool:
    """The eval had turned to the trained checkpoint (its phase marker, which only the eval writes)."""
    from ait.evals.hidden_eval import PHASE_NAME
    from ait.safe_io import read_regular_file

    try:
        return read_regular_file(eval_dir / PHASE_NAME, 64).strip() == b"post"
    except (UnsafeFile, OSError):
        return False


def run_eval(req: EvalRequest, eval_dir: Path, log_path: Path, *, readable: list[str],
             extra_env: dict[str, str] | None = None, timeout_s: float = EVAL_TIMEOUT_S) -> EvalReport:
    """Start and finish one eval (no waiting for a checkpoint)."""
    process = start_eval(req, eval_dir, log_path, readable=readable, extra_env=extra_env, timeout_s=timeout_s)
    return finish_eval(process, req, eval_dir, timeout_s)


def read_report(req: EvalRequest) -> EvalReport:
    """The eval's report, read without following links; a new base-weight score is remembered."""
    try:
        report = read_json_model(Path(req.out_path), EvalReport, MAX_REPORT_BYTES)
    except UnsafeFile as e:
        raise EvalFailed(f"the eval's report is unreadable: {e}") from None
    for name in ("pre", "post"):
        scores = getattr(report, f"{name}_scores")
        if scores is not None and not valid_scores(scores, len(req.examples)):
            raise EvalFailed(f"the eval's report holds {name}_scores that are not {len(req.examples)} scores in [0, 1]")
        digests = getattr(report, f"{name}_digests")
        if digests is not None and not valid_digests(digests, len(req.examples)):
            raise EvalFailed(f"the eval's report holds {name}_digests that are not {len(req.examples)} digests")
    if report.pre_scores is not None and report.pre_digests is not None and report.pre_cache_key \
            and req.pre_cache_dir:
        remember_pre(Path(req.pre_cache_dir), report.pre_cache_key, report.pre_scores, report.pre_digests)
    return report


def remember_pre(cache_dir: Path, key: str, scores: list[float], digests: list[str]) -> None:
    """Remember the base weights' per-example scores and conversation digests under `key` (the eval
    computed them; checked here)."""
    if not (len(key) == 32 and all(c in "0123456789abcdef" for c in key)) or not valid_scores(scores, len(scores)) \
            or not valid_digests(digests, len(scores)):
        return  # not a key this code makes (never a path the eval chose), or not scores
    import json

    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".pre-")
    with os.fdopen(fd, "w") as f:
        json.dump({"pre": sum(scores) / max(len(scores), 1), "scores": scores, "digests": digests}, f)
    os.replace(tmp, cache_dir / f"{key}.json")  # atomic: concurrent evals of the same base write the same value


def forget_examples(eval_dir: Path) -> None:
    """The request holds the hidden examples and their answers: it does not outlive the eval."""
    try:
        os.unlink(eval_dir / REQUEST_NAME)
    except OSError:
        pass


def evaluate_here(req: EvalRequest) -> EvalReport:
    """Run the eval in this process (tests, benchmarks: trusted inputs only) and remember its pre score."""
    from ait.evals.hidden_eval import evaluate

    report = evaluate(req)
    if report.pre_scores is not None and report.pre_digests is not None and report.pre_cache_key \
            and req.pre_cache_dir:
        remember_pre(Path(req.pre_cache_dir), report.pre_cache_key, report.pre_scores, report.pre_digests)
    return report


def scratch_eval(spec: TaskSpec, model: ResolvedModel, *, n: int | None = None,
                 timeout_s: float = EVAL_TIMEOUT_S) -> EvalReport:
    """Score base weights alone on the hidden set in a throwaway directory (`ait baselines seed`)."""
    tmp = Path(tempfile.mkdtemp(prefix="ait-eval-"))
    try:
        req = eval_request(spec, model, tmp / "eval", n=n)
        return run_eval(req, tmp / "eval", tmp / "eval.log", readable=[], timeout_s=timeout_s)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def last_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[-1][:300]
