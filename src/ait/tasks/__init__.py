"""The shipped task specs (one JSON per family at its calibrated rung, written by
scripts/make_task_specs.py), installed with the package so `ait` finds them from any directory.
`examples/tasks` in a source checkout is a link to this folder."""

from __future__ import annotations

import os
from pathlib import Path

SHIPPED = Path(__file__).resolve().parent


def task_dirs() -> list[Path]:
    """Where a task name is looked up, in order: AIT_TASKS_DIR, ./examples/tasks, the shipped specs."""
    dirs = [Path(os.environ["AIT_TASKS_DIR"])] if os.environ.get("AIT_TASKS_DIR") else []
    dirs += [Path("examples/tasks"), SHIPPED]
    out: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [o.resolve() for o in out]:
            out.append(d)
    return out


def shipped_pattern(pattern: str) -> str | None:
    """`examples/tasks/...` (how configs and the README name shipped specs) as a pattern over the
    installed copy, for runs started outside a source checkout; None for other patterns."""
    prefix = "examples/tasks/"
    return str(SHIPPED / pattern[len(prefix):]) if pattern.startswith(prefix) else None
