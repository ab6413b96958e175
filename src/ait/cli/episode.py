"""`ait episode`: one episode end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ait.cli.common import console, err, fail, load_task


def episode(task: str = typer.Option("calc_chain", "--task", help="TaskSpec path or name."),
            policy: str = typer.Option("reference", help="Agent policy: reference."),
            executor: Optional[str] = typer.Option(None, help="inline (default), queue (needs `ait worker`), local or ray."),
            ray_address: Optional[str] = typer.Option(None, help="Ray cluster address (with --executor ray)."),
            config: Optional[Path] = typer.Option(None, help="EpisodeConfig TOML."),
            eval_size: Optional[int] = typer.Option(None, help="Hidden examples to score (default: the spec's)."),
            runs_dir: Optional[Path] = typer.Option(None, help="Where runs/<id>/ goes (default ./runs or AIT_RUNS)."),
            as_json: bool = typer.Option(False, "--json", help="Print the EpisodeResult as JSON.")) -> None:
    """Run one episode end to end: the agent writes a job, it is probed, trained, evaluated, rewarded."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ait.configs import ConfigError, load_config
    from ait.harness.episode import run_episode
    from ait.harness.types import EpisodeConfig
    from ait.policy.base import make_policy

    spec, path = load_task(task)
    try:
        cfg = load_config(config, EpisodeConfig) if config else EpisodeConfig()
        overrides = {k: v for k, v in {"executor": executor, "eval_size": eval_size,
                                       "ray_address": ray_address}.items() if v is not None}
        cfg = EpisodeConfig.model_validate({**cfg.model_dump(), **overrides})
        agent = make_policy(policy)
    except (ConfigError, ValueError) as e:
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
        status = "ok" if job.ok else f"failed: {job.fail_reason.value}"
        table.add_row("job", f"{status}, base model {job.base_model}, train {job.train_seconds or 0:.1f}s, "
                      f"total {job.total_seconds or 0:.1f}s")
    table.add_row("stop reason", f"{result.stop_reason.value} after {result.turns} turns")
    table.add_row("wall time", f"{result.wall_seconds:.1f}s")
    table.add_row("run dir", result.run_dir)
    console.print(table)
