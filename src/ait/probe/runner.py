"""Validate a workspace: trusted config checks here, agent code in a separate process.

The child (`ait.probe.child`) runs env.py through `ait.sandbox.run_untrusted` (the one
seam where isolation layers are added) and reports observations; the verdict is
computed here by `ait.probe.checks`, so agent code cannot write its own verdict.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

from ait.job.config import JobConfigError, load_job_config
from ait.job.types import JobConfig
from ait.probe.checks import verdict
from ait.probe.types import Observations, ProbeCheck, ProbeError, ProbeReport, ProbeRequest, RewardChoice
from ait.safe_io import read_regular_file
from ait.sandbox import Limits, SandboxPolicy, run_untrusted, scrubbed_env
from ait.sandbox.watch import size
from ait.sandbox.zygote import Zygote
from ait.spec import TaskSpec
from ait.train.models import model_availability
from ait.train.tiny import tiny_model_path

DEFAULT_TIMEOUT_S = 60.0
MAX_OBSERVATIONS_BYTES = 2_000_000
PROBE_PRELOAD = ["ait.probe.child", "ait.probe.dry_run", "ait.evals.rollout", "transformers.utils",
                 "transformers.models.qwen3.modeling_qwen3", "trl.chat_template_utils"]
PROBE_LIMITS = Limits(cpu_s=300, file_bytes=256 * 2**20, processes=64, address_space_bytes=8 * 2**30,
                      memory_bytes=4 * 2**30, disk_bytes=2**30, disk_files=10_000)


@functools.cache
def probe_zygote() -> Zygote | None:
    """One warm interpreter per process with the probe's heavy imports and the tiny model's
    code paths loaded; AIT_PROBE_ZYGOTE=0 turns it off (every probe starts cold)."""
    if os.environ.get("AIT_PROBE_ZYGOTE", "1") == "0":
        return None
    home = Path(tempfile.mkdtemp(prefix="ait-zygote-"))
    return Zygote(PROBE_PRELOAD, env=scrubbed_env(home, {"AIT_ZYGOTE_TINY": str(tiny_model_path())}))


def static_errors(workspace: str | Path, spec: TaskSpec) -> list[ProbeError]:
    """What can be found without running anything, in well under a second: job.toml (TOML, keys,
    bounds, an available base model), env.py present, UTF-8 and valid Python. `ait job validate`
    reports these at once instead of after the probe's start-up."""
    import ast

    workspace = Path(workspace)
    errors: list[ProbeError] = []
    try:
        config = load_job_config(workspace / "job.toml", spec.constraints)
        if why := model_availability(config.job.base_model):
            errors.append(ProbeError(check=ProbeCheck.config, message=(
                f"base model {config.job.base_model!r} is not available on this install ({why})")))
    except JobConfigError as e:
        errors.append(ProbeError(check=ProbeCheck.config, message=str(e)))
    env = workspace / "env.py"
    if not env.is_file():
        what = ("env.py is a directory: it must be a Python file" if env.is_dir() and not env.is_symlink()
                else "env.py not found in the workspace")
        errors.append(ProbeError(check=ProbeCheck.env_import, message=what))
        return errors
    try:
        ast.parse(read_regular_file(env, 5_000_000).decode("utf-8"), filename="env.py")
    except UnicodeDecodeError as e:
        errors.append(ProbeError(check=ProbeCheck.env_import, message=f"env.py is not UTF-8 text (byte {e.start})"))
    except SyntaxError as e:
        errors.append(ProbeError(check=ProbeCheck.env_import,
                                 message=f"SyntaxError: {e.msg} (env.py line {e.lineno})"))
    except (OSError, ValueError) as e:
        errors.append(ProbeError(check=ProbeCheck.env_import, message=f"env.py cannot be read: {e}"))
    return errors


def probe_workspace(workspace: str | Path, spec: TaskSpec, timeout_s: float = DEFAULT_TIMEOUT_S,
                    dry_run: bool = True, gpu_memory_gib: float | None = None) -> ProbeReport:
    """Check a submission: job.toml, its base model, and (with `gpu_memory_gib`, the most a job may need
    here) its estimated peak GPU memory, statically; then env.py run in the sandbox."""
    workspace = Path(workspace).resolve()
    start = time.monotonic()
    errors: list[ProbeError] = []
    config = None
    try:
        config = load_job_config(workspace / "job.toml", spec.constraints)
    except JobConfigError as e:
        errors.append(ProbeError(check=ProbeCheck.config, message=str(e)))
    if config is not None and (why := model_availability(config.job.base_model)):
        # Caught here, not after the job started: a model the task allows but this install lacks.
        errors.append(ProbeError(check=ProbeCheck.config, message=(
            f"base model {config.job.base_model!r} is not available on this install ({why}); pick another of "
            "the task's allowed_base_models (get_baseline_scores lists which are available)")))
    if config is not None and gpu_memory_gib is not None and not errors and (why := over_memory(config, gpu_memory_gib)):
        errors.append(ProbeError(check=ProbeCheck.config, message=why))
    # With a broken job.toml, still exercise env.py so the agent sees every problem at once.
    size = config.train.dataset_size if config else max(spec.constraints.min_dataset_rows, 64)
    seed = config.train.seed if config else 0
    request = ProbeRequest(tools=spec.eval_format.tools, dataset_size=size, seed=seed,
                           dry_run_model=str(tiny_model_path()) if dry_run else None)
    obs_or_error = run_child(workspace, request, timeout_s)
    if isinstance(obs_or_error, ProbeError):
        errors.append(obs_or_error)
        obs = None
    else:
        obs = obs_or_error
        errors += verdict(obs, spec, size)
    return ProbeReport(valid=not errors, errors=errors, seconds=time.monotonic() - start,
                       config=config if not errors else None,
                       dataset_rows=obs.dataset_count if obs else None,
                       rewards=reward_choices(obs) if obs and not errors else [])


def over_memory(config: JobConfig, limit_gib: float) -> str:
    """Why the job cannot run within `limit_gib` of GPU memory, or ''. The estimate is the one the
    executor admits jobs by (ait.compute.gpu_memory), at the logit budget of jobs that share a GPU (a
    limit is stated only where they do), so a job that passes here is not refused there."""
    from ait.compute.gpu_memory import estimate_config_gib
    from ait.train.models import resolve_base_model
    from ait.train.request import PACKED_LOGIT_BUDGET

    try:
        need = estimate_config_gib(config, resolve_base_model(config.job.base_model).path, PACKED_LOGIT_BUDGET)
    except Exception:  # noqa: BLE001 - the model did not resolve after all: the job meets the real reason
        return ""
    if need <= limit_gib:
        return ""
    lora = "" if config.train.lora else "train a LoRA adapter instead of every weight ([train.lora]), "
    return (f"this job's estimated peak GPU memory is {need:.1f} GiB, more than the {limit_gib:.1f} GiB a job may use "
            f"on this machine (its GPU is shared with other work); {lora}pick a smaller base model, or lower "
            "prompts_per_step x num_generations or max_completion_length")


def reward_choices(obs: Observations) -> list[RewardChoice]:
    """The job's reward functions and weights as the child saw them (untrusted: reported, never scored)."""
    return [RewardChoice(name=r.name[:200], weight=r.weight) for r in obs.rewards if math.isfinite(r.weight)]


def run_child(workspace: Path, req: ProbeRequest, timeout_s: float) -> Observations | ProbeError:
    scratch = Path(tempfile.mkdtemp(prefix="ait-probe-"))
    try:
        req_path, obs_path = scratch / "request.json", scratch / "observations.json"
        req_path.write_text(req.model_dump_json())
        # The child may read the workspace and write only its scratch directory.
        read = [str(workspace), str(req_path)] + ([req.dry_run_model] if req.dry_run_model else [])
        # What it writes goes to a tmpfs of its disk limit where the host has one (only the report is
        # copied out when it ends); elsewhere the watchdog bounds it.
        obs_path = scratch / "run" / "observations.json"
        policy = SandboxPolicy(read=read, write=[str(scratch / "run")], limits=PROBE_LIMITS, disk_fs="tmpfs",
                               keep=[obs_path.name])
        (scratch / "run").mkdir()
        outcome = run_untrusted(["-m", "ait.probe.child", str(workspace), str(req_path), str(obs_path)],
                                cwd=scratch / "run", timeout_s=timeout_s, log_path=scratch / "probe.log",
                                policy=policy, zygote=probe_zygote())
        if outcome.disk_full or outcome.watchdog_rule == "disk":
            # Before the report: env.py that filled the disk may have left the probe unable to write it.
            return ProbeError(check=ProbeCheck.disk, message=(
                f"the probe ran out of disk: what env.py and the code it calls wrote reached the probe's limit of "
                f"{size(PROBE_LIMITS.disk_bytes)} (writes past it failed: No space left on device), counting files "
                "it deleted but kept open; write less, or write nothing at import and in build_dataset"
                if not outcome.watchdog else f"the probe was killed: {outcome.watchdog}"))
        if outcome.timed_out:
            return ProbeError(check=ProbeCheck.timeout, message=f"the probe did not finish within {timeout_s:.0f}s: "
                              "env.py's import, build_dataset, tools or rewards are too slow or never return")
        try:
            return Observations.model_validate_json(read_regular_file(obs_path, MAX_OBSERVATIONS_BYTES))
        except (OSError, ValueError):
            if outcome.watchdog:
                return ProbeError(check=ProbeCheck.crash, message=f"the probe was killed: {outcome.watchdog}")
            last = (outcome.log_tail.strip().splitlines() or ["no output"])[-1][:300]
            return ProbeError(check=ProbeCheck.crash, message=f"the probe's report is missing or unreadable (exit "
                              f"status {outcome.returncode}): env.py crashed the process, exited early, forked, or "
                              f"wrote over the report; last output: {last}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
