"""How much the jobs of a set of episodes differ: what an outer GRPO step can learn from.

Advantages are rewards minus their group's mean, so a group whose agent wrote the same job every
time differs only in whether the job was valid: nothing about making better models. Two numbers
say whether the agent's choices spread:

    distinct_triples   distinct (base model, learning rate, max steps) among the job.toml texts
                       that parse (ait.policy.job_variants.triple)
    within_group_std   the mean, over groups of two or more, of the population std of job_quality
    job_spread         both, with how many jobs were given and how many parsed
"""

from __future__ import annotations

import statistics
import tomllib
from collections.abc import Iterable, Mapping
from typing import Any

from ait.policy.job_variants import triple


def triples(job_tomls: Iterable[str]) -> list[tuple[str, float, int]]:
    """The triple of each text that is TOML with [job] base_model and [train] learning_rate, max_steps
    (an agent's job.toml may be anything: the rest are skipped)."""
    out = []
    for text in job_tomls:
        try:
            out.append(triple(text))
        except (tomllib.TOMLDecodeError, KeyError, TypeError, ValueError):
            continue
    return out


def distinct_triples(job_tomls: Iterable[str]) -> int:
    return len(set(triples(job_tomls)))


def within_group_std(groups: Mapping[Any, Iterable[float]] | Iterable[Iterable[float]]) -> float | None:
    """Mean population std of the values of each group with two or more (None: no such group)."""
    values = groups.values() if isinstance(groups, Mapping) else groups
    stds = [statistics.pstdev(g) for g in map(list, values) if len(g) >= 2]
    return sum(stds) / len(stds) if stds else None


def job_spread(job_tomls: Iterable[str], quality_by_group: Mapping[Any, Iterable[float]] | None = None) -> dict:
    """{"jobs", "parsed", "distinct_triples", "triples", "within_group_std"} of a set of jobs; the
    std is of the job_quality values given per group (None without them)."""
    texts = list(job_tomls)
    found = triples(texts)
    return {"jobs": len(texts), "parsed": len(found), "distinct_triples": len(set(found)),
            "triples": sorted({f"{m} lr={lr:g} steps={s}" for m, lr, s in found}),
            "within_group_std": within_group_std(quality_by_group) if quality_by_group is not None else None}
