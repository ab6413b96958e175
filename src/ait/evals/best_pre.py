"""best_pre: the untrained score a job has to beat.

    best_pre = max over the task's allowed base models of their frozen untrained scores on
               the hidden set the job was scored on

whichever model the agent picked: training a weaker model must beat the stronger model's
untrained score to earn uplift, so the strong model is never the risky choice. Each score is
frozen per (family, weights hash, hidden set, scoring setup) in the baselines store. A model
without one yet is measured on first use (the sandboxed eval, base weights only) and frozen; the
job's own model is frozen from the job's pre score (same weights, same set). A job whose own pre
disagrees with its model's frozen score beyond noise means the eval changed under the store
(something the setup's key missed: the device, a library built differently): the result is then
incomplete, an infrastructure error, never a reward against a stale score. A model this install cannot
resolve is excluded and named (it cannot be trained here either: the probe refuses it), and a
baseline eval that fails leaves the result incomplete, which the episode reports as an
infrastructure error rather than score against a best_pre that may be too low.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from pydantic import BaseModel, Field

from ait.evals.baselines import Baseline, BaselineStore, scoring_setup
from ait.evals.hidden import eval_fingerprint
from ait.job.types import JobResult
from ait.spec import TaskSpec


class BestPre(BaseModel):
    value: float | None
    """The highest frozen untrained score among the allowed models (None: none could be scored)."""
    scores: dict[str, float] = Field(default_factory=dict)
    """Allowed model -> its frozen untrained score on this hidden set."""
    excluded: dict[str, str] = Field(default_factory=dict)
    """Allowed model -> why it has no score here (not available on this install, never measured)."""
    failed: dict[str, str] = Field(default_factory=dict)
    """Allowed model -> why measuring its baseline failed (an infrastructure error, not the agent's)."""
    fingerprint: str
    """The hidden set the scores are on."""
    n: int
    """Its size."""
    setups: dict[str, str] = Field(default_factory=dict)
    """Allowed model -> the scoring setup its score is frozen under (ait.evals.baselines.scoring_setup)."""

    @property
    def complete(self) -> bool:
        """Every model that could have a score has one: `value` is the true maximum."""
        return not self.failed


def best_pre(spec: TaskSpec, n: int, store: BaselineStore, own: JobResult | None = None,
             measure: bool = True) -> BestPre:
    """The rule above. `own`: the scored job (its pre freezes its model's baseline); `measure`: seed
    missing baselines now (False for the agent's get_baseline_scores, which only reads)."""
    from ait.train.models import ModelResolutionError, model_availability, resolve_base_model

    from ait.evals.hidden_eval import scoring_code_digest

    fingerprint = eval_fingerprint(spec, n)
    code = scoring_code_digest()  # once: it reads every scoring module
    out = BestPre(value=None, fingerprint=fingerprint, n=n)
    for name in spec.constraints.allowed_base_models:
        if why := model_availability(name):
            out.excluded[name] = f"not available on this install: {why}"
            continue
        try:
            model = resolve_base_model(name)
            setup = out.setups[name] = scoring_setup(spec, model.path, code)
            own_pre = own.pre if own is not None and own.ok and own.base_model == name and \
                own.base_model_sha256 == model.sha256 and own.pre is not None and own.eval_n == n else None
            entry = store.get(spec.family, model.sha256, fingerprint, setup)
            if entry is not None and own_pre is not None and not agrees(own_pre, entry.best_pre, n):
                out.failed[name] = (f"this job's untrained score {own_pre:.4f} disagrees with the frozen baseline "
                                    f"{entry.best_pre:.4f} of the same weights on the same set beyond noise "
                                    f"(n={n}): the eval changed since it was frozen; check the device and "
                                    "libraries, then `ait baselines seed --force`")
                continue

            def frozen(score: float) -> Baseline:
                return store.freeze(Baseline(family=spec.family, base_model=name, weights_sha256=model.sha256,
                                             fingerprint=fingerprint, setup=setup, best_pre=score, n=n))

            if entry is None and own_pre is not None:
                entry = frozen(own_pre)
            elif entry is None and measure:
                entry = measured(spec, model, n, store,
                                 lambda: store.get(spec.family, model.sha256, fingerprint, setup), frozen)
        except ModelResolutionError as e:
            out.excluded[name] = f"not available on this install: {e}"
            continue
        except BaselineUnmeasured as e:
            out.failed[name] = str(e)
            continue
        if entry is None:
            out.excluded[name] = "not measured yet (it is measured when an episode is scored)"
            continue
        out.scores[name] = entry.best_pre
    out.value = max(out.scores.values()) if out.scores else None
    return out


def agrees(a: float, b: float, n: int) -> bool:
    """Two mean scores of n examples each agree within 2 SE of their difference. The variance is
    the binomial one at their mean (an upper bound for scores in [0, 1]), floored at p = 1/(2n) so
    that two scores of 0.0 and 0.02 still agree at n = 50."""
    p, floor = (a + b) / 2, 1 / (2 * n)
    variance = max(p * (1 - p), floor * (1 - floor))
    return abs(a - b) <= 2 * math.sqrt(2 * variance / n) + 1e-12


class BaselineUnmeasured(RuntimeError):
    """The eval of a base model's untrained score failed."""


RETRY_WAITS_S = (20.0, 60.0)
"""Waits before a baseline eval's second and third try after it ran out of GPU memory or a CUDA fault
ended it: beside packed jobs those are the neighbours' doing, and their memory comes free as they end."""


class RetryableEval(RuntimeError):
    """A baseline eval ran out of GPU memory or met a CUDA fault: beside packed jobs, the neighbours' doing."""


def measured(spec: TaskSpec, model, n: int, store: BaselineStore, stored: Callable[[], Baseline | None],
             freeze: Callable[[float], Baseline]) -> Baseline:
    """A missing baseline measured and frozen. One eval at a time per store: the eight episodes of a group
    finish together and would each measure the same missing models beside the packed jobs (on 2026-12-07,
    14 of an H100 arc's 51 episodes were lost to such evals running out of GPU memory). Each try re-reads
    the store under the lock (whoever waited finds the score its predecessor froze), and the waits between
    tries are outside it: a retried eval never holds up the other baselines (an H100 arc's episodes waited
    up to 362 s for theirs on 2026-12-07, when the waits were inside)."""
    for tries, wait_s in enumerate((*RETRY_WAITS_S, None), start=1):
        with store.measuring():
            if (entry := stored()) is not None:
                return entry
            try:
                return freeze(measure_baseline(spec, model, n))
            except RetryableEval as e:
                if wait_s is None:
                    raise BaselineUnmeasured(f"its baseline eval failed (try {tries} of {len(RETRY_WAITS_S) + 1}): "
                                             f"{e}") from None
        time.sleep(wait_s)
    raise AssertionError("unreachable")  # the last try returns or raises


def measure_baseline(spec: TaskSpec, model, n: int) -> float:
    """One try at a base model's untrained score on the hidden set (the sandboxed eval, base weights only).
    RetryableEval when it ran out of GPU memory or met a CUDA fault; BaselineUnmeasured for any other failure."""
    from ait.evals.runner import EvalFailed, scratch_eval
    from ait.sandbox import SandboxUnavailable

    try:
        report = scratch_eval(spec, model, n=n)
    except EvalFailed as e:
        first = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
        if e.oom or e.gpu_fault:
            raise RetryableEval(first) from None
        raise BaselineUnmeasured(f"its baseline eval failed: {first}") from None
    except SandboxUnavailable as e:
        raise BaselineUnmeasured(f"its baseline eval failed: {str(e).splitlines()[0][:300]}") from None
    if report.pre is None:
        raise BaselineUnmeasured("its baseline eval reported no score")
    return report.pre
