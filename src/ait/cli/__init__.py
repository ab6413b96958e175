"""The `ait` command: one module per command group under ait/cli/."""

from __future__ import annotations

import typer

from ait.cli import baselines, episode, job, tasks, worker

app = typer.Typer(help="ait — AI Trains AI: an agent writes an RL job; it is scored by the trained model's uplift.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
app.add_typer(tasks.app, name="tasks")
app.add_typer(job.app, name="job")
app.add_typer(baselines.app, name="baselines")
app.command()(episode.episode)
app.command()(worker.worker)


def main() -> None:
    app()
