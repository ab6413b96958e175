"""The `ait` command: one module per command group under ait/cli/."""

from __future__ import annotations

import os

import typer

from ait.sandbox import UNSAFE_ENV

from ait.cli import baselines, doctor, episode, job, queue, report, tasks, train, worker

app = typer.Typer(help="ait — AI Trains AI: an agent writes an RL job; it is scored by the trained model's uplift.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)


@app.callback()
def main_options(unsafe_no_sandbox: bool = typer.Option(
        False, "--unsafe-no-sandbox",
        help="Run agent code even where no isolating sandbox layer works (recorded in each run's manifest).")) -> None:
    """ait — AI Trains AI."""
    if unsafe_no_sandbox:
        os.environ[UNSAFE_ENV] = "1"


app.add_typer(tasks.app, name="tasks")
app.add_typer(job.app, name="job")
app.add_typer(baselines.app, name="baselines")
app.add_typer(queue.app, name="queue")
app.command()(episode.episode)
app.command()(worker.worker)
app.command()(doctor.doctor)
app.command()(train.train)
app.command()(report.report)


def main() -> None:
    app()
