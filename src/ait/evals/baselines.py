"""Frozen best_pre per (family, base model, hidden set): what `get_baseline_scores` serves.

The store is a JSON file in AIT_HOME (outside every workspace). An entry, once frozen,
is not replaced unless asked (`ait baselines seed --force`), so every episode of a
family and model is scored against the same untrained reference.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, Field

from ait.home import baselines_path


class Baseline(BaseModel):
    family: str
    """Task family."""
    base_model: str
    """Base model name as job.toml spells it."""
    fingerprint: str
    """Which hidden set (secret, difficulty, n) the score is on."""
    best_pre: float
    """Best untrained hidden-eval score measured."""
    n: int
    """Hidden examples scored."""
    measured_at: float = Field(default_factory=time.time)
    """Unix time of the measurement."""


class BaselineStore:
    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else baselines_path()

    def all(self) -> list[Baseline]:
        if not self.path.exists():
            return []
        try:
            data = json.loads(self.path.read_text())
            return [Baseline.model_validate(b) for b in data.get("baselines", [])]
        except (ValueError, AttributeError) as e:
            raise ValueError(f"baselines store {self.path} is corrupt ({e}); fix or delete it and run "
                             "`ait baselines seed` again") from None

    def get(self, family: str, base_model: str, fingerprint: str) -> Baseline | None:
        for b in self.all():
            if (b.family, b.base_model, b.fingerprint) == (family, base_model, fingerprint):
                return b
        return None

    def freeze(self, entry: Baseline, force: bool = False) -> Baseline:
        """Store `entry` unless one is frozen for its key (then return that one)."""
        with self._locked():
            entries = self.all()
            key = (entry.family, entry.base_model, entry.fingerprint)
            for i, b in enumerate(entries):
                if (b.family, b.base_model, b.fingerprint) == key:
                    if not force:
                        return b
                    entries[i] = entry
                    break
            else:
                entries.append(entry)
            self._write(entries)
            return entry

    @contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _write(self, entries: list[Baseline]) -> None:
        data = {"baselines": [b.model_dump() for b in sorted(entries, key=lambda b: (b.family, b.base_model))]}
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".baselines-")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
        os.replace(tmp, self.path)


def measure_pre(task_path: str | Path, base_model: str, n: int | None = None):
    """Score the untrained model on the hidden set, in the sandboxed eval process."""
    from ait.evals.runner import scratch_eval
    from ait.spec import load_spec
    from ait.train.models import resolve_base_model

    return scratch_eval(load_spec(task_path), resolve_base_model(base_model), n=n)
