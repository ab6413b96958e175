"""ait.report.goal: the arc's last steps against its first, family-matched, from the per-family rows."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from ait.report.goal import arc_goal, goal_line
from ait.report.metrics import summarize


def row(step: int, episodes: dict[str, list[float]], valid: float = 0.5,
        unfinished: dict[str, int] | None = None) -> dict:
    """A metrics row whose per-family figures are those of the given episodes' job quality (finished jobs),
    plus `unfinished` episodes per family (no job finished: job quality 0)."""
    every = {f: v + [0.0] * (unfinished or {}).get(f, 0) for f, v in episodes.items()}
    flat = [q for v in every.values() for q in v]
    return {"step": step, "episodes": len(flat), "valid_rate": valid, "reward_mean": statistics.fmean(flat),
            "reward_std": statistics.pstdev(flat),
            "families": {f: {"episodes": len(every[f]), "job_quality_mean": statistics.fmean(every[f]),
                             "job_quality_std": statistics.pstdev(every[f]), "finished": len(v),
                             "job_quality_finished_mean": statistics.fmean(v),
                             "job_quality_finished_std": statistics.pstdev(v)} for f, v in episodes.items()}}


def test_more_valid_jobs_below_best_pre_are_not_worse_jobs() -> None:
    """Every finished job scores -0.3 (below best_pre) throughout; the valid rate rises. Over all episodes
    (the unfinished at 0) the mean falls beyond noise; over the finished jobs, which the goal reads, nothing
    changed. Rows without the finished figures fall back to all episodes and say so."""
    jobs = [-0.3, -0.32, -0.28, -0.3]
    rows = [row(s, {"a": jobs}, unfinished={"a": 8 if s <= 3 else 0}) for s in range(1, 7)]
    goal = arc_goal(rows)
    assert goal["episodes"] == "finished jobs" and goal["verdict"] == "within noise"
    assert goal["matched_diff"] == pytest.approx(0.0, abs=1e-9) and goal["early_n"] == goal["late_n"] == 12
    old = [{**r, "families": {f: {k: v for k, v in x.items() if "finished" not in k} for f, x in r["families"].items()}}
           for r in rows]
    fallback = arc_goal(old)
    assert fallback["episodes"] == "all episodes" and fallback["verdict"] == "below, beyond noise"
    assert "all episodes" in goal_line(fallback)


def test_the_matched_difference_is_what_the_episodes_give() -> None:
    rng = random.Random(0)
    raw = {s: {f: [rng.gauss(mu + (0.2 if s > 3 else 0.0), 0.1) for _ in range(8)]
               for f, mu in (("a", 0.5), ("b", -0.5)) if (s + (f == "b")) % 2 == 0 or s in (1, 6)}
           for s in range(1, 7)}
    goal = arc_goal([row(s, raw[s]) for s in range(1, 7)])
    assert goal["early_steps"] == [1, 2, 3] and goal["late_steps"] == [4, 5, 6]
    for f in ("a", "b"):
        early = [q for s in (1, 2, 3) for q in raw[s].get(f, [])]
        late = [q for s in (4, 5, 6) for q in raw[s].get(f, [])]
        got = goal["families"][f]
        assert got["early_n"] == len(early) and got["late_n"] == len(late)
        assert got["diff"] == pytest.approx(statistics.fmean(late) - statistics.fmean(early))
        assert got["se2"] == pytest.approx(2 * math.sqrt(statistics.variance(early) / len(early)
                                                         + statistics.variance(late) / len(late)))
    assert goal["matched_diff"] == pytest.approx((goal["families"]["a"]["diff"] + goal["families"]["b"]["diff"]) / 2)
    assert goal["matched_diff"] == pytest.approx(0.2, abs=0.06) and goal["verdict"] == "above, beyond noise"


def test_a_change_of_family_mix_alone_is_not_an_improvement() -> None:
    """Same per-family quality throughout; the last steps drew the weak family more often. The pooled
    mean falls beyond noise; the matched difference sees no change."""
    a, b = [0.5, 0.52, 0.48, 0.5], [-0.5, -0.52, -0.48, -0.5]
    rows = [row(1, {"a": a * 2, "b": b}), row(2, {"a": a * 2, "b": b}), row(3, {"a": a, "b": b}),
            row(4, {"a": a, "b": b * 2}), row(5, {"a": a, "b": b * 2}), row(6, {"a": a, "b": b * 2})]
    goal = arc_goal(rows)
    assert goal["pooled_verdict"] == "below, beyond noise" and goal["pooled_diff"] < -0.25
    assert goal["matched_diff"] == pytest.approx(0.0, abs=1e-9) and goal["verdict"] == "within noise"


def test_which_part_of_the_reward_moved_and_when_there_is_nothing_to_compare() -> None:
    flat = {"a": [0.1, -0.1, 0.0, 0.05]}
    rows = [row(s, flat, valid=0.25 if s <= 3 else 0.9) for s in range(1, 9)]
    goal = arc_goal(rows)
    assert goal["late_steps"] == [6, 7, 8] and goal["verdict"] == "within noise"
    assert goal["components"]["valid_rate"]["verdict"] == "above, beyond noise"
    assert goal["components"]["valid_rate"]["diff"] == pytest.approx(0.65)
    assert "valid_rate 0.250 → 0.900" in goal_line(goal)
    assert summarize(rows)["goal"]["matched_diff"] == goal["matched_diff"]
    # Under two windows of steps (they would overlap), or rows from before per-family figures: none.
    assert arc_goal(rows[:5]) is None and goal_line(None) is None
    assert arc_goal([{k: v for k, v in r.items() if k != "families"} for r in rows]) is None
    # No family in both windows: nothing to match.
    assert arc_goal([row(s, {"a" if s <= 3 else "b": [0.1, 0.2]}) for s in range(1, 7)]) is None
