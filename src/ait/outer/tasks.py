"""Which tasks the outer loop trains on, and in what order. Held-out families (triage) are never
picked: they exist only to measure generalisation.

    training_tasks(paths)              the specs whose family is not held out
    family_cycle(paths, seed)          the training families in the order one run cycles through them
    round_robin_task(cycle, slot)      the task of group `slot` (step · groups_per_step + group)
    sample_training_tasks(paths, n, rng)   the old uniform draw (task_sampling = "uniform")

Round robin exists because a uniform draw is lumpy at the sizes a run has: an H200 arc of ten
groups drew ledger five times and string_pipeline never, and a family with two task files was
drawn twice as often as one with one. The task of a slot is a pure function of (slot, seed, task
list), so a run resumed from a checkpoint at step t continues the sequence at slot t · groups_per_step
without any sampler state in the checkpoint.
"""

from __future__ import annotations

import random
from pathlib import Path

from ait.families import FAMILIES
from ait.spec import TaskSpec, load_spec


class HeldOutError(ValueError):
    """A held-out task was offered to the training sampler."""


Cycle = list[list[tuple[TaskSpec, Path]]]
"""Training families in cycle order, each with its tasks (in the order given)."""


def training_tasks(paths: list[Path]) -> list[tuple[TaskSpec, Path]]:
    """Load specs, dropping any whose family is held out."""
    out = []
    for p in paths:
        spec = load_spec(p)
        if not FAMILIES[spec.family].held_out:
            out.append((spec, p))
    return out


def _pool(paths: list[Path]) -> list[tuple[TaskSpec, Path]]:
    pool = training_tasks(paths)
    if not pool:
        raise HeldOutError("no training tasks: every task given is held out or none were given")
    return pool


def family_cycle(paths: list[Path], seed: int) -> Cycle:
    """The training families of `paths`, shuffled once by `seed` (sorted first, so the order given
    does not matter), each with its tasks in the order given."""
    by_family: dict[str, list[tuple[TaskSpec, Path]]] = {}
    for spec, path in _pool(paths):
        by_family.setdefault(spec.family, []).append((spec, path))
    names = sorted(by_family)
    random.Random(seed).shuffle(names)
    return [by_family[name] for name in names]


def round_robin_task(cycle: Cycle, slot: int) -> tuple[TaskSpec, Path]:
    """The task of slot `slot`: family slot mod F, and within it the family's (slot // F)-th turn,
    cycling through its tasks. Any F consecutive slots cover every family once, so the groups of one
    step (consecutive slots) have distinct families while groups_per_step <= F."""
    if slot < 0:
        raise ValueError(f"slot must be >= 0, got {slot}")
    family = cycle[slot % len(cycle)]
    spec, path = family[(slot // len(cycle)) % len(family)]
    assert not FAMILIES[spec.family].held_out  # the invariant, checked where it matters
    return spec, path


def sample_training_tasks(paths: list[Path], n: int, rng: random.Random) -> list[tuple[TaskSpec, Path]]:
    """n tasks drawn uniformly (with replacement) from the non-held-out ones."""
    pool = _pool(paths)
    picks = [rng.choice(pool) for _ in range(n)]
    assert not any(FAMILIES[s.family].held_out for s, _ in picks)  # the invariant, checked where it matters
    return picks
