"""The episode reward (docs/design.md, "Reward"): every component is returned beside the total.

    R = w_v·validation + w_q·job_quality + w_s·train_speed
    validation   = 1 − (k−1)/K for a job valid at attempt k of K; 0 if never valid
    job_quality  = 0.25·post + 0.75·uplift_term; for a job that died (its own doing, not an infra failure):
                   0 under dead_job = "zero" (the reference system's rule, the default), or as if it had not
                   trained under dead_job = "untrained" (post = its own pre, else its base model's frozen
                   baseline; 0 when neither is known)
    uplift_term  = clip((post − best_pre) / max(1 − best_pre, ε), −1, 1)
    best_pre     = max over the task's allowed base models of their frozen untrained scores on the
                   hidden set the job was scored on (ait.evals.best_pre), whichever model was trained
    train_speed  = clip(1 − train_seconds / time_budget_seconds, 0, 1), only if the job succeeded;
                   train_seconds is the worker's clock over the whole sandboxed training process
    R = −0.1 when the agent never produced a parseable submission
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from ait.contract import Strict
from ait.job.types import FailReason, JobResult

EPS = 1e-6


class RewardWeights(Strict):
    validation: float = Field(default=0.35, ge=0.0)
    """Weight of the validation term."""
    job_quality: float = Field(default=0.60, ge=0.0)
    """Weight of the job-quality term."""
    train_speed: float = Field(default=0.05, ge=0.0)
    """Weight of the training-speed term."""
    no_submission: float = Field(default=-0.1, le=0.0)
    """Reward when no parseable submission was ever made."""
    dead_job: Literal["zero", "untrained"] = "zero"
    """How a job that died (OOM, crash, timeout; not an infra failure) is scored. "zero": job_quality 0,
    the reference system's rule. "untrained": as if it had not trained (post = its own pre), so that
    crashing a weak job on purpose never pays more than finishing it (docs/outer.md)."""

    @model_validator(mode="after")
    def _positive(self) -> "RewardWeights":
        if self.validation + self.job_quality + self.train_speed <= 0:
            raise ValueError("reward weights must not all be zero")
        return self


class RewardBreakdown(BaseModel):
    total: float
    """The episode reward R."""
    validation: float = 0.0
    """1 − (k−1)/K for a valid job at attempt k of K, else 0."""
    job_quality: float = 0.0
    """0.25·post + 0.75·uplift_term; for a job that died, per dead_job_rule; 0 if it never ran."""
    train_speed: float = 0.0
    """clip(1 − train_s / budget, 0, 1) for a successful job, else 0."""
    uplift_term: float = 0.0
    """clip((post − best_pre) / max(1 − best_pre, ε), −1, 1)."""
    post: float | None = None
    """Hidden-eval score after training."""
    best_pre: float | None = None
    """The highest frozen untrained score among the task's allowed base models on this hidden set."""
    best_pre_models: list[str] = Field(default_factory=list)
    """The allowed base models whose frozen scores best_pre is the highest of."""
    best_pre_left_out: dict[str, str] = Field(default_factory=dict)
    """Allowed base models left out of best_pre here, and why (this install cannot load them, never
    measured): on an install that has them the same job may face a higher best_pre."""
    dead_job_rule: Literal["zero", "untrained"] | None = None
    """The rule that scored a job that died (None: no job died); "zero" too when "untrained" had no pre."""
    dead_job_post: float | None = None
    """The post a dead job was scored with under "untrained": its own pre, else its model's frozen baseline."""
    dead_job_note: str | None = None
    """Why "untrained" fell back to zero, when it did."""
    valid_attempt: int | None = None
    """k: the attempt at which the job was valid."""
    max_attempts: int
    """K."""
    parseable_submission: bool
    """Whether any submission had a parseable job.toml."""

    def metrics(self) -> dict[str, float]:
        """Flat slash-namespaced metrics for logs and reports."""
        out = {"reward/total": self.total, "reward/validation": self.validation,
               "reward/job_quality": self.job_quality, "reward/train_speed": self.train_speed,
               "reward/uplift_term": self.uplift_term}
        if self.post is not None:
            out["job/post"] = self.post
        if self.best_pre is not None:
            out["job/best_pre"] = self.best_pre
        if self.post is not None and self.best_pre is not None:
            out["job/uplift"] = self.post - self.best_pre
        return out


def clip(x: float, lo: float, hi: float) -> float:
    return max(lo, min(hi, x))


def job_quality(post: float, best_pre: float) -> tuple[float, float]:
    """(job_quality, uplift_term) of a job that finished with hidden score `post`."""
    uplift = clip((post - best_pre) / max(1.0 - best_pre, EPS), -1.0, 1.0)
    return 0.25 * post + 0.75 * uplift, uplift


def died(job: JobResult | None) -> bool:
    """The job failed by its own doing (an infra failure is not a verdict on the job)."""
    return job is not None and not job.ok and job.fail_reason is not FailReason.infra


def compute_reward(*, parseable_submission: bool, valid_attempt: int | None, max_attempts: int,
                   job: JobResult | None, best_pre: float | None, time_budget_s: float,
                   weights: RewardWeights | None = None, base_pre: float | None = None) -> RewardBreakdown:
    """`base_pre`: the frozen untrained score of the job's base model on this hidden set, which
    dead_job = "untrained" uses when a dead job never reported its own pre."""
    w = weights or RewardWeights()
    common = dict(max_attempts=max_attempts, valid_attempt=valid_attempt, parseable_submission=parseable_submission)
    if not parseable_submission:
        return RewardBreakdown(total=w.no_submission, **common)
    validation = 1.0 - (valid_attempt - 1) / max_attempts if valid_attempt else 0.0
    quality = speed = uplift = 0.0
    post = job.post if job and job.ok else None
    if job is not None and job.ok and post is not None and best_pre is not None:
        quality, uplift = job_quality(post, best_pre)
        if job.train_seconds is not None:  # no measured time, no speed credit
            speed = clip(1.0 - job.train_seconds / time_budget_s, 0.0, 1.0)
    dead: dict = {}
    if died(job):
        dead["dead_job_rule"] = "zero"
        if w.dead_job == "untrained":
            pre = job.pre if job.pre is not None else base_pre
            if pre is not None and best_pre is not None:
                quality, uplift = job_quality(pre, best_pre)  # no speed credit: it did not finish
                dead.update(dead_job_rule="untrained", dead_job_post=pre)
            else:
                dead["dead_job_note"] = ("dead_job = untrained, but " + ("best_pre" if best_pre is None else
                                         "neither the job's pre nor its base model's frozen baseline") +
                                         " is known: scored 0")
    total = w.validation * validation + w.job_quality * quality + w.train_speed * speed
    return RewardBreakdown(total=total, validation=validation, job_quality=quality, train_speed=speed,
                           uplift_term=uplift, post=post, best_pre=best_pre, **dead, **common)
