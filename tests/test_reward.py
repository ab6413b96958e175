"""The episode reward against docs/design.md's formula, recomputed independently here.

    R = 0.35·validation + 0.60·job_quality + 0.05·train_speed     (weights configurable)
    validation   = 1 − (k−1)/K for a job valid at attempt k of K; 0 if never valid
    job_quality  = 0.25·post + 0.75·uplift_term; 0 if the job died
    uplift_term  = clip((post − best_pre) / max(1 − best_pre, ε), −1, 1)
    train_speed  = clip(1 − train_seconds / time_budget_seconds, 0, 1), only if the job succeeded
    R = −0.1 when the agent never produced a parseable submission
"""

from __future__ import annotations

import itertools

import pytest
from pydantic import ValidationError

from ait.job.types import FailReason, JobResult
from ait.reward import RewardBreakdown, RewardWeights, compute_reward

TOL = 1e-9
BUDGET = 600.0
SCORES = (0.0, 0.2, 0.5, 0.99, 1.0)
TRAIN_SECONDS = (BUDGET * 0.25, BUDGET, BUDGET * 1.5)  # below / at / above the budget
MY_EPS = 1e-6  # DESIGN leaves ε open; any ε <= 0.01 gives the same values on this grid


def expected(*, parseable: bool, k: int | None, K: int, job: JobResult | None, best_pre: float | None,
             budget: float = BUDGET, w=(0.35, 0.60, 0.05, -0.1)) -> dict[str, float]:
    """docs/design.md's reward, written from the formula (not from ait.reward)."""
    wv, wq, ws, w_none = w
    if not parseable:
        return {"total": w_none, "validation": 0.0, "job_quality": 0.0, "train_speed": 0.0, "uplift_term": 0.0}
    validation = 1.0 - (k - 1) / K if k is not None else 0.0
    quality = speed = uplift = 0.0
    if job is not None and job.ok:
        denom = 1.0 - best_pre if 1.0 - best_pre > MY_EPS else MY_EPS
        raw = (job.post - best_pre) / denom
        uplift = -1.0 if raw < -1.0 else (1.0 if raw > 1.0 else raw)
        quality = 0.25 * job.post + 0.75 * uplift
        s = 1.0 - job.train_seconds / budget
        speed = 0.0 if s < 0.0 else (1.0 if s > 1.0 else s)
    return {"total": wv * validation + wq * quality + ws * speed, "validation": validation,
            "job_quality": quality, "train_speed": speed, "uplift_term": uplift}


def ok_job(post: float, train_seconds: float = 100.0, pre: float = 0.3) -> JobResult:
    return JobResult(job_id="j", ok=True, base_model="tiny", pre=pre, post=post, eval_n=200,
                     train_seconds=train_seconds)


def failed_job(train_seconds: float = 100.0) -> JobResult:
    return JobResult(job_id="j", ok=False, fail_reason=FailReason.crash, error="boom", base_model="tiny",
                     train_seconds=train_seconds)


def assert_matches(got: RewardBreakdown, want: dict[str, float], where: str) -> None:
    for key, value in want.items():
        assert getattr(got, key) == pytest.approx(value, abs=TOL), f"{key} differs for {where}"


@pytest.mark.parametrize("K", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("job_kind", ["ok", "failed", "none"])
def test_grid_matches_design_formula(K: int, job_kind: str) -> None:
    checked = 0
    for k in [None, *range(1, K + 1)]:
        for post, best_pre, ts in itertools.product(SCORES, SCORES, TRAIN_SECONDS):
            job = {"ok": lambda: ok_job(post, ts), "failed": lambda: failed_job(ts), "none": lambda: None}[job_kind]()
            got = compute_reward(parseable_submission=True, valid_attempt=k, max_attempts=K, job=job,
                                 best_pre=best_pre, time_budget_s=BUDGET)
            want = expected(parseable=True, k=k, K=K, job=job, best_pre=best_pre)
            assert_matches(got, want, f"k={k} K={K} post={post} best_pre={best_pre} ts={ts} job={job_kind}")
            assert got.max_attempts == K and got.valid_attempt == k and got.parseable_submission
            checked += 1
    assert checked == (K + 1) * len(SCORES) ** 2 * len(TRAIN_SECONDS)


def test_validation_term_per_attempt() -> None:
    # Spelled out for K = 4 so the grid's formula is not the only witness.
    for k, v in [(1, 1.0), (2, 0.75), (3, 0.5), (4, 0.25)]:
        r = compute_reward(parseable_submission=True, valid_attempt=k, max_attempts=4, job=None,
                           best_pre=None, time_budget_s=BUDGET)
        assert r.validation == pytest.approx(v, abs=TOL)
        assert r.total == pytest.approx(0.35 * v, abs=TOL)


def test_hand_computed_example() -> None:
    # k=2 of K=3, post 0.6, best_pre 0.2, 150 s of a 600 s budget.
    r = compute_reward(parseable_submission=True, valid_attempt=2, max_attempts=3, job=ok_job(0.6, 150.0),
                       best_pre=0.2, time_budget_s=600.0)
    validation, uplift = 2 / 3, 0.4 / 0.8
    quality, speed = 0.25 * 0.6 + 0.75 * uplift, 0.75
    assert r.validation == pytest.approx(validation, abs=TOL)
    assert r.uplift_term == pytest.approx(0.5, abs=TOL)
    assert r.job_quality == pytest.approx(quality, abs=TOL)
    assert r.train_speed == pytest.approx(speed, abs=TOL)
    assert r.total == pytest.approx(0.35 * validation + 0.60 * quality + 0.05 * speed, abs=TOL)


@pytest.mark.parametrize("job", [None, "ok", "failed"])
def test_never_parseable_is_exactly_minus_point_one(job) -> None:
    job = {None: None, "ok": ok_job(0.9), "failed": failed_job()}[job]
    r = compute_reward(parseable_submission=False, valid_attempt=None, max_attempts=3, job=job,
                       best_pre=0.2, time_budget_s=BUDGET)
    assert r.total == -0.1
    assert (r.validation, r.job_quality, r.train_speed, r.uplift_term) == (0.0, 0.0, 0.0, 0.0)
    assert r.parseable_submission is False


def test_parseable_but_never_valid_is_zero() -> None:
    r = compute_reward(parseable_submission=True, valid_attempt=None, max_attempts=3, job=None,
                       best_pre=None, time_budget_s=BUDGET)
    assert r.total == 0.0
    assert (r.validation, r.job_quality, r.train_speed) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("reason", list(FailReason))
def test_died_job_keeps_validation_only(reason: FailReason) -> None:
    # Even with a post score and a fast clock on the result, a dead job earns no quality or speed.
    job = JobResult(job_id="j", ok=False, fail_reason=reason, base_model="tiny", pre=0.1, post=0.9, eval_n=200,
                    train_seconds=1.0)
    r = compute_reward(parseable_submission=True, valid_attempt=2, max_attempts=4, job=job, best_pre=0.1,
                       time_budget_s=BUDGET)
    assert r.job_quality == 0.0 and r.train_speed == 0.0 and r.uplift_term == 0.0
    assert r.validation == pytest.approx(0.75, abs=TOL)
    assert r.total == pytest.approx(0.35 * 0.75, abs=TOL)
    assert "job/post" not in r.metrics() and "job/uplift" not in r.metrics()


@pytest.mark.parametrize("post,best_pre,want", [
    (1.0, 0.0, 1.0), (0.0, 0.99, -1.0), (0.0, 0.5, -1.0), (0.9, 0.5, 0.8), (0.1, 0.5, -0.8),
    (0.2, 0.99, -1.0),
])
def test_uplift_clipped(post: float, best_pre: float, want: float) -> None:
    r = compute_reward(parseable_submission=True, valid_attempt=1, max_attempts=3, job=ok_job(post),
                       best_pre=best_pre, time_budget_s=BUDGET)
    assert r.uplift_term == pytest.approx(want, abs=TOL)
    assert -1.0 <= r.uplift_term <= 1.0
    assert r.job_quality == pytest.approx(0.25 * post + 0.75 * want, abs=TOL)


@pytest.mark.parametrize("post,want", [(1.0, 0.0), (0.99, -1.0), (0.0, -1.0)])
def test_best_pre_of_one_does_not_divide_by_zero(post: float, want: float) -> None:
    r = compute_reward(parseable_submission=True, valid_attempt=1, max_attempts=3, job=ok_job(post),
                       best_pre=1.0, time_budget_s=BUDGET)
    assert r.uplift_term == pytest.approx(want, abs=TOL)
    assert r.job_quality == pytest.approx(0.25 * post + 0.75 * want, abs=TOL)


def test_train_speed_clipped_both_ways() -> None:
    def speed(ts: float) -> float:
        return compute_reward(parseable_submission=True, valid_attempt=1, max_attempts=1, job=ok_job(0.5, ts),
                              best_pre=0.5, time_budget_s=BUDGET).train_speed
    assert speed(0.0) == 1.0
    assert speed(BUDGET / 2) == pytest.approx(0.5, abs=TOL)
    assert speed(BUDGET) == 0.0
    assert speed(BUDGET * 3) == 0.0


def test_custom_weights_are_honoured() -> None:
    w = RewardWeights(validation=1.0, job_quality=2.0, train_speed=3.0, no_submission=-0.5)
    job = ok_job(0.6, 150.0)
    r = compute_reward(parseable_submission=True, valid_attempt=2, max_attempts=3, job=job, best_pre=0.2,
                       time_budget_s=BUDGET, weights=w)
    want = expected(parseable=True, k=2, K=3, job=job, best_pre=0.2, w=(1.0, 2.0, 3.0, -0.5))
    assert_matches(r, want, "custom weights")
    default = compute_reward(parseable_submission=True, valid_attempt=2, max_attempts=3, job=job, best_pre=0.2,
                             time_budget_s=BUDGET)
    assert r.total != pytest.approx(default.total)
    # Components do not depend on the weights, only the total does.
    assert (r.validation, r.job_quality, r.train_speed) == (default.validation, default.job_quality,
                                                            default.train_speed)
    none = compute_reward(parseable_submission=False, valid_attempt=None, max_attempts=3, job=None,
                          best_pre=None, time_budget_s=BUDGET, weights=w)
    assert none.total == -0.5


def test_zero_weight_drops_a_term() -> None:
    w = RewardWeights(validation=0.0, job_quality=1.0, train_speed=0.0)
    r = compute_reward(parseable_submission=True, valid_attempt=1, max_attempts=3, job=ok_job(0.6, 0.0),
                       best_pre=0.2, time_budget_s=BUDGET, weights=w)
    assert r.total == pytest.approx(r.job_quality, abs=TOL)


def test_default_weights_match_design() -> None:
    w = RewardWeights()
    assert (w.validation, w.job_quality, w.train_speed, w.no_submission) == (0.35, 0.60, 0.05, -0.1)


def test_weights_reject_all_zero() -> None:
    with pytest.raises(ValidationError, match="must not all be zero"):
        RewardWeights(validation=0.0, job_quality=0.0, train_speed=0.0)


def test_weights_reject_unknown_keys() -> None:
    with pytest.raises(ValidationError):
        RewardWeights(validation=0.35, speed=0.05)
    with pytest.raises(ValidationError):
        RewardWeights.model_validate({"job_quality": 0.6, "uplift": 1.0})


@pytest.mark.parametrize("field,value", [("validation", -0.1), ("job_quality", -1.0), ("train_speed", -0.01),
                                         ("no_submission", 0.5)])
def test_weights_reject_out_of_range(field: str, value: float) -> None:
    with pytest.raises(ValidationError):
        RewardWeights(**{field: value})


def test_metrics_slash_namespaced_with_job_scores() -> None:
    r = compute_reward(parseable_submission=True, valid_attempt=1, max_attempts=3, job=ok_job(0.7, 300.0),
                       best_pre=0.4, time_budget_s=BUDGET)
    m = r.metrics()
    assert all("/" in key and key.split("/")[0] and key.split("/")[1] for key in m)
    for key in ("reward/total", "reward/validation", "reward/job_quality", "reward/train_speed",
                "job/post", "job/uplift"):
        assert key in m, key
    assert all(isinstance(v, float) for v in m.values())
    assert m["reward/total"] == r.total
    assert m["reward/validation"] == r.validation
    assert m["reward/job_quality"] == r.job_quality
    assert m["reward/train_speed"] == r.train_speed
    assert m["job/post"] == 0.7
    assert m["job/uplift"] == pytest.approx(0.7 - 0.4, abs=TOL)


def test_metrics_without_a_job_omit_job_keys() -> None:
    r = compute_reward(parseable_submission=False, valid_attempt=None, max_attempts=3, job=None, best_pre=None,
                       time_budget_s=BUDGET)
    m = r.metrics()
    assert m["reward/total"] == -0.1
    assert {"reward/total", "reward/validation", "reward/job_quality", "reward/train_speed"} <= set(m)
    assert not any(k.startswith("job/") for k in m)
