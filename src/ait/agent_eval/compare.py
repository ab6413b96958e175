"""Two evals side by side: per task, B − A with its noise, so "B is better at dispatch" carries an
error bar. A difference is called only when it exceeds two standard errors of the difference.

Where both evals played the same episode slots (task and run id `<task>-<i>`, the same seed where
the eval seeds by it) the difference is paired, episode by episode, over the slots both have: what
the slot itself contributes (an easy seed, a hard one) cancels. With fewer than two such pairs the
two samples are compared as independent (Welch). Either way the standard error is floored
(ait.agent_eval.stats.se_floor), so a side with no spread does not make every difference real."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from ait.agent_eval.stats import difference, pairs, stat
from ait.agent_eval.types import EpisodeRow, EvalResults

KEYS = ("reward", "validation", "job_quality", "uplift_term", "train_speed", "valid_rate")


class Difference(BaseModel):
    task: str
    """Task id, or "all tasks"."""
    key: str
    """The quantity compared."""
    a: float | None
    b: float | None
    """Means of each side (over the pairs when paired, so that delta = b − a)."""
    delta: float | None
    """b − a."""
    noise: float | None
    """Two standard errors of the difference (None: too few episodes on a side)."""
    verdict: str
    """"b better", "a better", "within noise" or "too few episodes"."""
    paired: bool = False
    """Paired by episode slot (task, run id); False: the samples were taken as independent."""
    pairs: int = 0
    """Episode slots both sides played (infra errors left out); what a paired difference is over."""
    left_out: int = 0
    """Scored episodes, A's and B's together, with no partner on the other side: not in a paired
    difference (0 when unpaired: every episode counts)."""


def value(row: EpisodeRow, key: str) -> float:
    return float(row.valid) if key == "valid_rate" else getattr(row, key)


def compare(a: EvalResults, b: EvalResults) -> list[Difference]:
    out = []
    groups = [(t, [r for r in a.episodes if r.task_id == t], [r for r in b.episodes if r.task_id == t])
              for t in a.per_task if t in b.per_task]
    groups.append(("all tasks", a.episodes, b.episodes))
    for task, rows_a, rows_b in groups:
        matched = pairs(rows_a, rows_b)
        scored_a, scored_b = [r for r in rows_a if not r.infra_error], [r for r in rows_b if not r.infra_error]
        paired = len(matched) >= 2  # one pair has no spread to measure
        left_out = len(scored_a) + len(scored_b) - 2 * len(matched) if paired else 0
        for key in KEYS:
            if paired:
                xa, xb = stat([value(ra, key) for ra, _ in matched]), stat([value(rb, key) for _, rb in matched])
                d = stat([value(rb, key) - value(ra, key) for ra, rb in matched])
                delta, noise = d.mean, d.se2
            else:
                xa, xb = stat([value(r, key) for r in scored_a]), stat([value(r, key) for r in scored_b])
                delta, noise = difference(xa, xb)
            if delta is None or noise is None:
                verdict = "too few episodes"
            elif abs(delta) <= noise:
                verdict = "within noise"
            else:
                verdict = "b better" if delta > 0 else "a better"
            out.append(Difference(task=task, key=key, a=xa.mean, b=xb.mean, delta=delta, noise=noise,
                                  verdict=verdict, paired=paired, pairs=len(matched), left_out=left_out))
    return out


def pairing(d: Difference) -> str:
    """How a row was compared, in words: `paired, 4 pairs (2 left out)` or `unpaired`."""
    if not d.paired:
        return "unpaired"
    return f"paired, {d.pairs} pairs" + (f" ({d.left_out} left out)" if d.left_out else "")


def same_evaluation(a: EvalResults, b: EvalResults, a_dir: Path, b_dir: Path) -> str | None:
    """Why A and B are one evaluation (the same directory, or identical episodes: a copy), or None.
    Compared with itself every difference is 0 by construction, which says nothing about a policy."""
    if a_dir.resolve() == b_dir.resolve():
        return f"A and B are the same evaluation ({a_dir}): every difference is 0 by construction"
    if a.episodes and a.episodes == b.episodes:
        return (f"A ({a_dir}) and B ({b_dir}) hold identical episodes, so they are one evaluation (a copy): "
                "every difference is 0 by construction")
    return None


def best_pre_sets(results: EvalResults) -> dict[str, set[frozenset[str]]]:
    """Task -> the sets of base models its episodes' best_pre was over (episodes without one skipped)."""
    out: dict[str, set[frozenset[str]]] = {}
    for row in results.episodes:
        if row.best_pre_models is not None and not row.infra_error:
            out.setdefault(row.task_id, set()).add(frozenset(row.best_pre_models))
    return out


def different_best_pre(a: EvalResults, b: EvalResults) -> str | None:
    """Why A's and B's rewards are not comparable: a task whose best_pre was over other base models
    on one side (an install that lacks a model scores every job against a best_pre without it)."""
    sa, sb = best_pre_sets(a), best_pre_sets(b)
    for task in sorted(set(sa) & set(sb)):
        if sa[task] != sb[task]:
            show = lambda sets: " | ".join(sorted(", ".join(sorted(s)) or "(none)" for s in sets))  # noqa: E731
            left = {m: why for r in a.episodes + b.episodes if r.task_id == task
                    for m, why in r.best_pre_left_out.items()}
            why = "; ".join(f"{m}: {w}" for m, w in sorted(left.items()))[:400]
            return (f"{task}: best_pre was over other base models in A ({show(sa[task])}) than in B "
                    f"({show(sb[task])}), so their rewards are on different scales"
                    + (f" (left out: {why})" if why else "")
                    + "; run both where the same models are available")
    return None
