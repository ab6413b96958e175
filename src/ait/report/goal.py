"""Did the arc's jobs get better? Job quality of its last steps against its first, beyond noise or not.

The arc's goal (issue 34) is "job_quality of the last three steps above the first three beyond noise".
Families differ far more than steps do (on an H100, multi_hop's jobs score above 0 and string_pipeline's
below), and round robin puts different families in the two windows, so a plain difference of means
would mostly measure the family mix. The comparison is therefore family-matched: for each family with
episodes in both windows, its late mean less its early mean; the families weighed equally; the noise the
episodes' spread within each (family, window), read from each step's per-family rows (episodes, mean,
population std). The pooled difference is given beside it for reference. Episodes of one group share a
task and a policy, so 2 SE over episodes is the noise of the episodes, not of the policy's drift.

Which episodes: those whose job finished, where the rows carry them (`job_quality_finished_*`, since
2026-12-07). An episode without a finished job scores job quality 0, so where every job stays below the
best untrained score (an H100's families but two) a rising valid rate alone lowers the mean over all
episodes: the first arc's steps 1-3 against 6-8 read -0.066 that way, with its valid rate up 0.40. Older
rows have only the mean over all episodes, which is then used and named.
"""

from __future__ import annotations

import math
from typing import Any

WINDOW = 3


ALL = ("episodes", "job_quality_mean", "job_quality_std")
FINISHED = ("finished", "job_quality_finished_mean", "job_quality_finished_std")


def _moments(rows: list[dict[str, Any]], keys: tuple[str, str, str]) -> dict[str, list[float]]:
    """family -> [n, sum of job_quality, sum of its squares] over the rows' per-family figures."""
    out: dict[str, list[float]] = {}
    for row in rows:
        for family, f in (row.get("families") or {}).items():
            n, mu, sd = (f.get(k) for k in keys)
            if not n or mu is None or sd is None:
                continue
            _add(out.setdefault(family, [0.0, 0.0, 0.0]), n, mu, sd)
    return out


def _add(m: list[float], n: float, mu: float, sd: float) -> None:
    """Adds n values of mean mu and population std sd to [n, sum, sum of squares]."""
    m[0] += n
    m[1] += n * mu
    m[2] += n * (sd * sd + mu * mu)


def _mean_var(m: list[float]) -> tuple[float, float]:
    """Mean and sample variance (n - 1) from [n, sum, sum of squares]; variance 0 for one episode."""
    n, s, ss = m
    mean = s / n
    var = max(ss - n * mean * mean, 0.0) / (n - 1) if n > 1 else 0.0
    return mean, var


def _verdict(diff: float, se2: float) -> str:
    if diff - se2 > 0:
        return "above, beyond noise"
    if diff + se2 < 0:
        return "below, beyond noise"
    return "within noise"


def arc_goal(rows: list[dict[str, Any]], window: int = WINDOW) -> dict[str, Any] | None:
    """The last `window` steps against the first `window`; None while the run has fewer than 2 x window
    steps with per-family figures (the windows would overlap) or no family is in both windows."""
    rows = [r for r in rows if r.get("families")]
    if len(rows) < 2 * window:
        return None
    picked = rows[:window] + rows[-window:]
    keys = FINISHED if all(FINISHED[0] in f for r in picked for f in r["families"].values()) else ALL
    early, late = _moments(rows[:window], keys), _moments(rows[-window:], keys)
    families: dict[str, dict[str, float]] = {}
    for family in sorted(set(early) & set(late)):
        (me, ve), (ml, vl) = _mean_var(early[family]), _mean_var(late[family])
        ne, nl = early[family][0], late[family][0]
        families[family] = {"early_n": ne, "early_mean": me, "late_n": nl, "late_mean": ml, "diff": ml - me,
                            "se2": 2 * math.sqrt(ve / ne + vl / nl)}
    if not families:
        return None
    k = len(families)
    diff = sum(f["diff"] for f in families.values()) / k
    se2 = math.sqrt(sum(f["se2"] ** 2 for f in families.values())) / k  # 2 SE of the mean of k independent differences

    def pooled(moments: dict[str, list[float]]) -> tuple[float, float, float]:
        total = [sum(m[i] for m in moments.values()) for i in range(3)]
        return (total[0], *_mean_var(total))

    (ne, me, ve), (nl, ml, vl) = pooled(early), pooled(late)
    pooled_se2 = 2 * math.sqrt(ve / ne + vl / nl)
    return {"window": window, "episodes": "finished jobs" if keys == FINISHED else "all episodes",
            "early_steps": [r["step"] for r in rows[:window]],
            "late_steps": [r["step"] for r in rows[-window:]], "families": families,
            "matched_diff": diff, "matched_se2": se2, "verdict": _verdict(diff, se2),
            "early_n": ne, "early_mean": me, "late_n": nl, "late_mean": ml,
            "pooled_diff": ml - me, "pooled_se2": pooled_se2, "pooled_verdict": _verdict(ml - me, pooled_se2),
            "components": {"reward": _step_change(rows[:window], rows[-window:], "reward_mean", "reward_std"),
                           "valid_rate": _step_change(rows[:window], rows[-window:], "valid_rate", None)}}


def _step_change(early: list[dict[str, Any]], late: list[dict[str, Any]], key: str, std_key: str | None) -> dict | None:
    """A step-level figure's change between the windows, pooled over episodes: its std from `std_key`
    (population, per step), or binomial for a rate (std_key None). Which part of the reward moved."""
    def moments(rows: list[dict[str, Any]]) -> list[float] | None:
        m = [0.0, 0.0, 0.0]
        for r in rows:
            n, mu = r.get("episodes"), r.get(key)
            sd = r.get(std_key) if std_key else (math.sqrt(max(mu * (1 - mu), 0.0)) if mu is not None else None)
            if not n or mu is None or sd is None:
                return None
            _add(m, n, mu, sd)
        return m
    a, b = moments(early), moments(late)
    if a is None or b is None:
        return None
    (me, ve), (ml, vl) = _mean_var(a), _mean_var(b)
    se2 = 2 * math.sqrt(ve / a[0] + vl / b[0])
    return {"early": me, "late": ml, "diff": ml - me, "se2": se2, "verdict": _verdict(ml - me, se2)}


def goal_line(goal: dict[str, Any] | None) -> str | None:
    """One line for a reader: the family-matched difference with its noise and verdict."""
    if goal is None:
        return None
    w = goal["window"]
    return (f"job quality, last {w} steps vs first {w} (family-matched, {len(goal['families'])} families, "
            f"{goal['episodes']}, n={goal['late_n']:.0f} vs {goal['early_n']:.0f}): {goal['matched_diff']:+.3f} ± "
            f"{goal['matched_se2']:.3f} (2 SE): {goal['verdict']}; pooled {goal['early_mean']:+.3f} → "
            f"{goal['late_mean']:+.3f} ({goal['pooled_diff']:+.3f} ± {goal['pooled_se2']:.3f})"
            + "".join(f"; {name} {c['early']:.3f} → {c['late']:.3f} ({c['diff']:+.3f} ± {c['se2']:.3f}: {c['verdict']})"
                      for name, c in goal["components"].items() if c))
