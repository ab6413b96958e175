"""Which tasks the outer loop may train on. Held-out families (triage) are never picked:
they exist only to measure generalisation."""

from __future__ import annotations

import random
from pathlib import Path

from ait.families import FAMILIES
from ait.spec import TaskSpec, load_spec


class HeldOutError(ValueError):
    """A held-out task was offered to the training sampler."""


def training_tasks(paths: list[Path]) -> list[tuple[TaskSpec, Path]]:
    """Load specs, dropping any whose family is held out."""
    out = []
    for p in paths:
        spec = load_spec(p)
        if not FAMILIES[spec.family].held_out:
            out.append((spec, p))
    return out


def sample_training_tasks(paths: list[Path], n: int, rng: random.Random) -> list[tuple[TaskSpec, Path]]:
    """n tasks drawn uniformly (with replacement) from the non-held-out ones."""
    pool = training_tasks(paths)
    if not pool:
        raise HeldOutError("no training tasks: every task given is held out or none were given")
    picks = [rng.choice(pool) for _ in range(n)]
    assert not any(FAMILIES[s.family].held_out for s, _ in picks)  # the invariant, checked where it matters
    return picks
