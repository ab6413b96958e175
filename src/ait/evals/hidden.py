"""The hidden eval set: generated from a secret seed, never written into a workspace."""

from __future__ import annotations

import hashlib
import json
import random

from ait.families import Example, get_family
from ait.home import hidden_secret
from ait.spec import TaskSpec


def _digest(spec: TaskSpec, n: int) -> str:
    key = json.dumps([hidden_secret(), spec.family, spec.difficulty, n], sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()


def eval_fingerprint(spec: TaskSpec, n: int | None = None) -> str:
    """Names one hidden eval set (secret, family, difficulty, n) without revealing its seed;
    frozen baselines are keyed by it so a changed secret or difficulty never mixes sets."""
    n = n or spec.hidden_eval_size
    return hashlib.sha256(("fingerprint:" + _digest(spec, n)).encode()).hexdigest()[:16]


def hidden_examples(spec: TaskSpec, n: int | None = None) -> list[Example]:
    """n distinct examples from the secret seed, none equal to a dev example's prompt."""
    n = n or spec.hidden_eval_size
    family = get_family(spec.family)
    difficulty = family.difficulty(spec.difficulty)
    rng = random.Random(int(_digest(spec, n)[:16], 16))
    excluded = {d.prompt for d in spec.dev_examples}
    out: list[Example] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 50 * n:
            raise RuntimeError(f"{spec.family}: cannot draw {n} distinct hidden examples at this difficulty")
        ex = family.example(rng, difficulty)
        if ex.prompt not in excluded:
            excluded.add(ex.prompt)
            out.append(ex)
    return out
