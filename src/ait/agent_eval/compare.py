"""Two evals side by side: per task, B − A with its noise, so "B is better at dispatch" carries an
error bar. A difference is called only when it exceeds two standard errors of the difference."""

from __future__ import annotations

from pydantic import BaseModel

from ait.agent_eval.stats import difference
from ait.agent_eval.types import EvalResults

KEYS = ("reward", "validation", "job_quality", "uplift_term", "train_speed", "valid_rate")


class Difference(BaseModel):
    task: str
    """Task id, or "all tasks"."""
    key: str
    """The quantity compared."""
    a: float | None
    b: float | None
    delta: float | None
    """b − a."""
    noise: float | None
    """Two standard errors of the difference (None: too few episodes on a side)."""
    verdict: str
    """"b better", "a better", "within noise" or "too few episodes"."""


def compare(a: EvalResults, b: EvalResults) -> list[Difference]:
    out = []
    pairs = [(t, a.per_task[t], b.per_task[t]) for t in a.per_task if t in b.per_task]
    pairs.append(("all tasks", a.overall, b.overall))
    for task, sa, sb in pairs:
        for key in KEYS:
            xa, xb = getattr(sa, key), getattr(sb, key)
            delta, noise = difference(xa, xb)
            if delta is None or noise is None:
                verdict = "too few episodes"
            elif abs(delta) <= noise:
                verdict = "within noise"
            else:
                verdict = "b better" if delta > 0 else "a better"
            out.append(Difference(task=task, key=key, a=xa.mean, b=xb.mean, delta=delta, noise=noise,
                                  verdict=verdict))
    return out
