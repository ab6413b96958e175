"""`ait train`: the outer loop (RL on the agent that writes training jobs)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ait.cli.common import console, err, fail


def train(config: Path | None = typer.Option(None, "--config", help="Outer-loop config TOML "
                                                "(configs/outer/NAME.toml); with --resume, the run's own by default."),
          run_dir: Path | None = typer.Option(None, "--run-dir", help="Where the run goes (default "
                                                 "runs/outer-<time>-<id>)."),
          resume: Path | None = typer.Option(None, "--resume", help="Continue the run in this directory from "
                                                "its latest checkpoint (metrics.jsonl is appended to)."),
          resume_from: Path | None = typer.Option(None, "--resume-from", metavar="BUNDLE", help="Continue an "
                                                  "arc from a checkpoint bundle (RUN_DIR/checkpoints/step_N, copied "
                                                  "from another machine) in a new --run-dir: same step count, "
                                                  "rng, seeds, spend and metrics so far. --config is optional (the "
                                                  "bundle's own by default) and must train the same weights."),
          as_json: bool = typer.Option(False, "--json", help="Print the final summary as JSON.")) -> None:
    """Train the agent with RL on the uplift its jobs achieve: groups of episodes per task, advantage =
    reward − group mean, an importance-sampling policy-gradient step, asynchronously."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from ait.configs import ConfigError, load_config
    from ait.outer.backends.local import CheckpointError
    from ait.outer.backends.tinker import TinkerUnavailable
    from ait.outer.config import OuterConfig
    from ait.outer.loop import OuterRunError, load_run_config
    from ait.outer.loop import train as run_train
    from ait.outer.tasks import HeldOutError
    from ait.sandbox import SandboxUnavailable, require_isolation
    from ait.train.models import ModelResolutionError

    if config is None and resume is None and resume_from is None:
        fail("pass --config configs/outer/NAME.toml (or --resume RUN_DIR, or --resume-from BUNDLE)")
    if resume is not None and resume_from is not None:
        fail("--resume continues a run in place, --resume-from starts a new one from a bundle: pass one")
    if resume is not None and run_dir is not None and run_dir.resolve() != resume.resolve():
        fail("--run-dir and --resume name different directories; --resume RUN_DIR alone continues that run")
    try:
        if config is not None:
            cfg = load_config(config, OuterConfig)
        elif resume is not None:
            cfg = load_run_config(resume)
        else:
            cfg = None  # the bundle's own
    except (ConfigError, OuterRunError) as e:
        fail(str(e))
    try:
        require_isolation()
    except SandboxUnavailable as e:
        fail(str(e))
    target = resume or run_dir
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[last]}"), console=err, transient=True, disable=as_json) as progress:
        bar = progress.add_task("outer loop", total=cfg.max_steps if cfg else None, last="")

        def on_step(row: dict) -> None:
            held = f"  held-out {row['heldout_reward']:+.3f}" if row.get("heldout_reward") is not None else ""
            progress.update(bar, completed=row["step"], last=f"reward {row['reward_mean']:+.3f}  valid "
                            f"{row['valid_rate'] or 0:.0%}  loss {row['loss']:+.4f}{held}")

        try:
            summary = run_train(cfg, target, resume=resume is not None, resume_from=resume_from, on_step=on_step,
                                on_event=lambda msg: progress.update(bar, description=msg))
        except (ConfigError, OuterRunError, HeldOutError, ModelResolutionError, CheckpointError,
                TinkerUnavailable) as e:
            fail(str(e))
    if as_json:
        print(json.dumps(summary, indent=2, default=str))
        return
    console.print(f"[bold]outer run[/] {summary['run_dir']}: {summary['step']}/{summary['max_steps']} steps "
                  f"(stopped: {summary['stopped']}), policy version {summary['policy_version']}")
    first, last = summary["reward_first"], summary["reward_last"]
    if first is not None:
        console.print(f"reward {first:+.4f} (step 1) -> {last:+.4f} (last); spent ${summary['usd_total']:.4f}")
    console.print(f"metrics: {summary['metrics']}\ncheckpoint: {summary['checkpoint']}")
