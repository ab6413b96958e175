"""`ait episode`: one episode end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from ait.cli.common import console, err, fail, load_task


def episode(task: str = typer.Option("calc_chain", "--task", help="TaskSpec path or name."),
            policy: str = typer.Option("reference", help="Agent policy: reference[:N], openai:MODEL or "
                                       "hf:PATH_OR_NAME (hf:tiny for the built-in tiny model)."),
            base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible endpoint (OpenRouter, vLLM, ...)."),
            temperature: Optional[float] = typer.Option(None, help="Sampling temperature of an LLM policy."),
            max_jobs: Optional[int] = typer.Option(None, help="Jobs the agent may run, seeing dev scores between."),
            budget_usd: Optional[float] = typer.Option(None, help="Stop the episode before it spends more (USD)."),
            run_budget_usd: Optional[float] = typer.Option(None, help="Cap on the ledger's spend for --run-group."),
            run_group: Optional[str] = typer.Option(None, help="Tag for ledger lines; scopes --run-budget-usd."),
            executor: Optional[str] = typer.Option(None, help="inline (default), queue (needs `ait worker`), local or ray."),
            ray_address: Optional[str] = typer.Option(None, help="Ray cluster address (with --executor ray)."),
            config: Optional[Path] = typer.Option(None, help="EpisodeConfig TOML."),
            eval_size: Optional[int] = typer.Option(None, help="Hidden examples to score (default: the spec's)."),
            base_model: Optional[str] = typer.Option(None, help="Base model the reference policy trains (one the "
                                                     "task allows, e.g. smollm2-135m)."),
            runs_dir: Optional[Path] = typer.Option(None, help="Where runs/<id>/ goes (default ./runs or AIT_RUNS)."),
            as_json: bool = typer.Option(False, "--json", help="Print the EpisodeResult as JSON.")) -> None:
    """Run one episode end to end: the agent writes a job, it is probed, trained, evaluated, rewarded."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ait.configs import ConfigError, load_config
    from ait.compute.executors import make_executor
    from ait.harness.episode import run_episode
    from ait.sandbox import SandboxUnavailable, require_isolation
    from ait.harness.types import EpisodeConfig
    from ait.metering import load_prices
    from ait.policy.base import make_policy

    spec, path = load_task(task)
    try:
        cfg = load_config(config, EpisodeConfig) if config else EpisodeConfig()
        overrides = {k: v for k, v in {"executor": executor, "eval_size": eval_size, "ray_address": ray_address,
                                       "max_jobs": max_jobs, "budget_usd": budget_usd, "run_group": run_group,
                                       "run_budget_usd": run_budget_usd}.items() if v is not None}
        cfg = EpisodeConfig.model_validate({**cfg.model_dump(), **overrides})
        load_prices(cfg.prices_path)  # a broken price file fails here, not mid-episode
        agent = make_policy(policy, base_url=base_url, temperature=temperature)
        if base_model is not None:
            from ait.policy.reference import ReferencePolicy

            if not isinstance(agent, ReferencePolicy):
                raise ValueError("--base-model picks the reference policy's model; an LLM policy chooses its own")
            if base_model not in spec.constraints.allowed_base_models:
                raise ValueError(f"--base-model {base_model!r} is not allowed by {spec.id}; choose one of "
                                 f"{spec.constraints.allowed_base_models}")
            agent.base_model = agent.settings["base_model"] = base_model
        make_executor(cfg)  # fail now, not mid-episode, if the executor cannot start (e.g. Ray missing)
    except (ConfigError, ValueError, RuntimeError) as e:
        fail(str(e))
    try:
        require_isolation()
    except SandboxUnavailable as e:
        fail(str(e))
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                  transient=True, disable=as_json) as progress:
        bar = progress.add_task(f"episode on {spec.id}", total=None)
        result = run_episode(spec, path, agent, cfg, runs_dir=runs_dir,
                             on_event=lambda msg: progress.update(bar, description=msg))
    if as_json:
        print(result.model_dump_json(indent=2))
        return
    print_episode(result)


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
        if result.baseline is not None:
            scores = ", ".join(f"{escape(m)} {v:.4f}" for m, v in result.baseline.scores.items()) or "none"
            left_out = f"; left out: {', '.join(escape(m) for m in result.baseline.excluded)}" \
                if result.baseline.excluded else ""
            table.add_row("best_pre from", f"{scores}{left_out}")
        status = "ok" if job.ok else f"failed: {job.fail_reason.value}"
        table.add_row("job", f"{status}, base model {job.base_model}, train {job.train_seconds or 0:.1f}s, "
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
    table.add_row("stop reason", stop + (f": {result.error}" if result.error else ""))
    table.add_row("wall time", f"{result.wall_seconds:.1f}s")
    table.add_row("run dir", result.run_dir)
    console.print(table)
