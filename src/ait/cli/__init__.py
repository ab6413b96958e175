"""The `ait` command: one module per command group under ait/cli/."""

from __future__ import annotations

import os

import typer

from ait.sandbox import UNSAFE_ENV

from ait.cli import baselines, doctor, episode, eval as eval_cli, job, queue, report, tasks, train, worker

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
app.command("eval", help=eval_cli.HELP, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    eval_cli.eval_command)
app.command()(worker.worker)
app.command()(doctor.doctor)
app.command()(train.train)
app.command()(report.report)


def main() -> None:
    """The console script. Every failure ends as one line on stderr and a non-zero exit, never a
    traceback or a boxed panel (AIT_DEBUG=1 shows the traceback): a bad flag, a file-system error,
    Ctrl-C (exit 130, said in words), a bug."""
    import sys

    from typer import _click as click  # typer's own copy of click raises these

    from ait.cli import common
    from ait.cli.common import err, fail_line
    from ait.home import HomeError

    try:
        code = app(standalone_mode=False, prog_name="ait")
    except click.exceptions.UsageError as e:
        where = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
        fail_line(e.format_message() + where)
        sys.exit(e.exit_code)
    except click.exceptions.ClickException as e:
        fail_line(e.format_message())
        sys.exit(e.exit_code)
    except typer.Abort:
        err.print("[yellow]aborted[/]")
        sys.exit(1)
    except KeyboardInterrupt:
        code = 130
    except HomeError as e:  # says what to do already
        fail_line(e.strerror)
        sys.exit(2)
    except Exception as e:  # noqa: BLE001 - the last line of defence for the user's terminal
        if os.environ.get("AIT_DEBUG") == "1":
            raise
        fail_line(describe(e) + " (AIT_DEBUG=1 shows the traceback)")
        sys.exit(1)
    if code == 130 and not common.interrupt_reported:  # typer turns Ctrl-C into a silent exit 130
        err.print("[yellow]interrupted[/] (Ctrl-C)")
    sys.exit(code if isinstance(code, int) else 0)


def describe(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        where = f": {e.filename}" if e.filename else ""
        return f"{e.strerror}{where}"
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")
