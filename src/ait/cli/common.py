"""Shared helpers of the `ait` command: consoles, one-line errors, task lookup."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

console = Console()
err = Console(stderr=True)
interrupt_reported = False
"""A command that said what Ctrl-C left behind sets this (main() then adds nothing)."""


def fail_line(message: str) -> None:
    """One red line on stderr; the message is printed literally (no rich markup, no wrapping)."""
    message = ' '.join(message.replace('Value error, ', '').split())
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)


def fail(message: str, code: int = 2) -> None:
    """One red line and a non-zero exit."""
    fail_line(message)
    raise typer.Exit(code)


def tasks_dirs() -> list[Path]:
    from ait.tasks import task_dirs

    return task_dirs()


def find_task(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    if path.is_dir():
        hint = f" (it holds {path / 'task.json'})" if (path / "task.json").is_file() else ""
        fail(f"task {name_or_path!r} is a directory: pass a TaskSpec JSON file{hint} or a name from `ait tasks list`")
    for d in tasks_dirs():
        if (d / f"{name_or_path}.json").is_file():
            return d / f"{name_or_path}.json"
    fail(f"task {name_or_path!r} not found: pass a TaskSpec JSON path or a name from `ait tasks list`")


def load_task(name_or_path: str):
    from ait.spec import SpecError, load_spec

    path = find_task(name_or_path)
    try:
        return load_spec(path), path
    except SpecError as e:
        fail(str(e))
