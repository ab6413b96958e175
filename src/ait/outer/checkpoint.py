"""Outer-loop checkpoints: RUN_DIR/checkpoints/step_N/.

    step_N/backend/     the backend's own checkpoint (local: adapter + optimizer + step; tinker: its
                        service path)
    step_N/state.json   the loop's state: step, config digest, task-sampling rng, seed counters, spend

A checkpoint is written under step_N.tmp and renamed into place, so a directory named step_N
is always complete; `latest` returns the highest complete one.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint that is missing or was trained from another base model."""


def read_backend_record(path: Path, filename: str, backend: str, model: str) -> dict[str, Any]:
    """The JSON record a backend wrote beside its checkpoint, checked to be this backend's and
    trained from `model` (a checkpoint of another base model would load wrong or not at all)."""
    file = path / filename
    if not file.is_file():
        raise CheckpointError(f"{file} not found: not a checkpoint written by the {backend} backend")
    record = json.loads(file.read_text())
    if record.get("model") != model:
        raise CheckpointError(f"{path} was trained from {record.get('model')!r}, not the configured {model!r}")
    return record


class LoopState(BaseModel):
    """What the loop needs besides the weights to continue exactly where it stopped."""

    step: int
    """Outer steps completed."""
    config_digest: str
    """OuterConfig.digest() of the run that wrote it."""
    rng_state: list[Any]
    """random.Random.getstate() of the task sampler, as JSON."""
    groups_launched: int = 0
    """Groups started so far (numbers episode directories and seeds)."""
    usd_total: float = 0.0
    """Spend of the run so far."""
    saved_at: float = 0.0
    """Unix time."""


def rng_to_json(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def rng_from_json(state: list[Any]) -> random.Random:
    rng = random.Random()
    rng.setstate((state[0], tuple(state[1]), state[2]))
    return rng


def checkpoints_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def save_checkpoint(run_dir: Path, backend: Any, state: LoopState) -> Path:
    dest = checkpoints_dir(run_dir) / f"step_{state.step}"
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    backend.save(str(tmp / "backend"))
    state = state.model_copy(update={"saved_at": time.time()})
    (tmp / "state.json").write_text(state.model_dump_json(indent=2) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def latest(run_dir: Path) -> Path | None:
    """The highest-step complete checkpoint under RUN_DIR/checkpoints, or None."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := STEP_DIR.match(p.name)) and (p / "state.json").is_file()]
    return max(found)[1] if found else None


def load_state(checkpoint: Path) -> LoopState:
    return LoopState.model_validate_json((checkpoint / "state.json").read_text())

