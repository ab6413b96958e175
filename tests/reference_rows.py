"""Shared by the family tests: a reference env's training rows at a given difficulty."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ait.families import get_family
from ait.job.env_loader import import_env

REPO = Path(__file__).resolve().parents[1]


def reference_rows_at(tmp_path: Path, family: str, knobs: dict | None, n: int = 200, seed: int = 0) -> list[dict]:
    """build_dataset of a copy of the family's reference job with task.json (at `knobs`, validated by
    the family) beside env.py, as in an episode's workspace; knobs=None: no task.json (an older workspace)."""
    ws = tmp_path / f"ws-{family}"
    if not ws.exists():
        shutil.copytree(REPO / "src" / "ait" / "policy" / "reference_jobs" / family, ws,
                        ignore=shutil.ignore_patterns("__pycache__"))
    (ws / "task.json").unlink(missing_ok=True)
    if knobs is not None:
        task = json.loads((REPO / "examples" / "tasks" / f"{family}.json").read_text())
        task["difficulty"] = get_family(family).difficulty(knobs).model_dump()
        (ws / "task.json").write_text(json.dumps(task))
    return import_env(ws / "env.py").build_dataset(n, seed)
