"""Means with two standard errors, per task and overall, from episode rows."""

from __future__ import annotations

import math
from collections import Counter

from ait.agent_eval.types import EpisodeRow, Stat, Summary


def se_floor(n: int) -> float:
    """The least standard error n episodes can claim: the binomial SE at p = 1/(2n). A sample with no
    spread (every episode scored alike, or every paired difference the same) has a sample SE of 0,
    which would make any difference at all "beyond noise". n alike draws only show the other outcome
    is rarer than about 1/n, not that it never happens; taking its rate at 1/(2n) (half an
    observation, the usual continuity correction) gives the smallest noise n episodes can rule out."""
    p = 1 / (2 * n)
    return math.sqrt(p * (1 - p) / n)


def stat(values: list[float], floor: bool = True) -> Stat:
    """Mean and 2 standard errors (sample standard deviation / sqrt(n), never below se_floor(n) unless
    `floor` is False; the sample's own figure stays in se2_raw); no error bar below n = 2."""
    n = len(values)
    if n == 0:
        return Stat(mean=None, se2=None, n=0)
    mean = sum(values) / n
    if n < 2:
        return Stat(mean=mean, se2=None, n=1)
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
    return Stat(mean=mean, se2=2 * (max(se, se_floor(n)) if floor else se), n=n, se2_raw=2 * se)


def summarize(rows: list[EpisodeRow]) -> Summary:
    scored = [r for r in rows if not r.infra_error]
    ran = [r for r in scored if r.job_ran]
    models = [r.base_model for r in ran if r.base_model]
    return Summary(
        episodes=len(rows), infra_errors=len(rows) - len(scored),
        reward=stat([r.reward for r in scored]), validation=stat([r.validation for r in scored]),
        job_quality=stat([r.job_quality for r in scored]), uplift_term=stat([r.uplift_term for r in scored]),
        train_speed=stat([r.train_speed for r in scored]), valid_rate=stat([float(r.valid) for r in scored]),
        job_failure_rate=stat([float(r.job_failed) for r in ran]),
        base_models={m: c / len(models) for m, c in sorted(Counter(models).items())},
        stop_reasons=dict(sorted(Counter(r.stop_reason for r in rows).items())),
        prompt_tokens=sum(r.prompt_tokens for r in rows), completion_tokens=sum(r.completion_tokens for r in rows),
        usd=sum(r.usd for r in rows), wall_s=stat([r.wall_s for r in rows]),
        best_pre_left_out={m: why for r in rows for m, why in sorted(r.best_pre_left_out.items())})


def difference(a: Stat, b: Stat) -> tuple[float | None, float | None]:
    """(b − a, its two standard errors), treating the two samples as independent (Welch: each side's
    own SE, as its Stat gives it, floored there)."""
    if a.mean is None or b.mean is None:
        return None, None
    noise = math.sqrt(a.se2 ** 2 + b.se2 ** 2) if a.se2 is not None and b.se2 is not None else None
    return b.mean - a.mean, noise


def pairs(a: list[EpisodeRow], b: list[EpisodeRow]) -> list[tuple[EpisodeRow, EpisodeRow]]:
    """The episodes both played with the same task and run id (the run id is the episode's place in
    the plan, `<task>-<i>`, so the same seed where the caller seeds by it), infra errors on either
    side left out; in B's order."""
    before = {(r.task_id, r.run_id): r for r in a if not r.infra_error}
    return [(before[(r.task_id, r.run_id)], r) for r in b if not r.infra_error and (r.task_id, r.run_id) in before]


def paired_difference(a: list[EpisodeRow], b: list[EpisodeRow], key: str = "reward") -> Stat:
    """B − A over pairs(a, b): the mean difference and two standard errors of the paired
    differences, which cancel what the episode itself contributes. Not floored: the outer loop
    reports this as the differences' own 2 SE (heldout_vs_start_se2); `ait eval compare` floors its."""
    return stat([getattr(rb, key) - getattr(ra, key) for ra, rb in pairs(a, b)], floor=False)
