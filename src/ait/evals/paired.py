"""Paired statistics over one hidden set: two score lists on the same examples, in the same order.

Two models scored on the same n examples differ by the mean of the per-example differences; its
standard error is that of the differences (std / sqrt n), far smaller than the unpaired one when
the two agree on most examples (a null job: identical scores, SE 0). A difference "beyond noise"
is one whose magnitude exceeds 2 SE.
"""

from __future__ import annotations

import math

from pydantic import BaseModel


class Paired(BaseModel):
    diff: float
    """mean(b) − mean(a)."""
    se: float
    """Standard error of that mean difference (sample std of the differences / sqrt n)."""
    n: int
    """Examples paired."""
    changed: int
    """Examples whose score differs."""

    @property
    def beyond_noise(self) -> bool:
        return abs(self.diff) > 2 * self.se

    def __str__(self) -> str:
        return f"{self.diff:+.3f} ± {2 * self.se:.3f} (2 SE, n={self.n})"


def paired(a: list[float], b: list[float]) -> Paired:
    """b − a, example by example."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired scores need two lists of one non-zero length, got {len(a)} and {len(b)}")
    d = [y - x for x, y in zip(a, b)]
    n = len(d)
    mean = sum(d) / n
    var = sum((v - mean) ** 2 for v in d) / (n - 1) if n > 1 else 0.0
    return Paired(diff=mean, se=math.sqrt(var / n), n=n, changed=sum(v != 0 for v in d))


def quality_slope(best_pre: float) -> float:
    """d job_quality / d post away from the clip (ait.reward.job_quality): a paired difference in post
    scales by this."""
    return 0.25 + 0.75 / max(1.0 - best_pre, 1e-6)
