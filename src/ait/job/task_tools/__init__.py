"""Each family's tool interface, shipped read-only into every workspace as `task_tools.py`.

A job's env.py imports it (`import task_tools as tt`) instead of re-implementing the task's tools,
so env.py holds what the agent decides (the training data's knobs, the rewards, the system prompt)
and stays short enough to write in one turn. Every module here has the same surface:

    SYSTEM_PROMPT           the task's system prompt at the task's difficulty (task.json beside it)
    Environment             the task's tools (names, parameters, docstrings of task.json's tool
                            interface), acting on a row's info["world"]; env.py may use it as is,
                            subclass it or write its own
    make_tools(world)       the task's tools as plain functions over one world: the hidden eval's
                            own (ait.families.<family> returns them): one source for the eval and the job
    task_difficulty()       task.json's difficulty knobs ({} without task.json)
    make_row(rng, d)        one training row {prompt, answer, info: {"world": ...}} drawn from the
                            caller's rng at knobs d: the reference job's own generator, not the
                            family's (no hidden-set seed, no hidden example, no shortcut filters)
    distinct_rows(n, draw)  up to n rows with distinct prompts from draw()
    parse_answer(text)      the last 'Answer:' value of a reply in the task's answer format, or None
    gold(answer)            a row's answer in the form parse_answer returns

The modules are standard-library Python that never import ait (an exported job carries its copy, and
the family imports the module itself). Helpers keep a leading underscore: the probe's hints list a
module's public names, which stay the surface above.
They are trusted: the harness writes them, refuses the agent's writes to them, and restores the
trusted copy in every submission's snapshot, so a job always trains against the real interface.
"""

from __future__ import annotations

import os
import shutil
from importlib.resources import files
from pathlib import Path

MODULE = "task_tools.py"
"""The module's file name in a workspace (env.py imports it as `task_tools`)."""


def source(family: str) -> str | None:
    """The trusted module's text for a family, or None when the family ships none."""
    path = files("ait.job.task_tools") / f"{family}.py"
    return path.read_text() if path.is_file() else None


def install(workspace: str | Path, family: str) -> bool:
    """Write (or restore) the trusted module into a workspace, read-only; whatever stood at its
    path (an edited copy, a link, a directory) is replaced. False when the family ships none."""
    text = source(family)
    if text is None:
        return False
    target = Path(workspace) / MODULE
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return True
