"""The agent benchmark's models: what to run, one row per episode, and the summaries with noise."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ait.contract import Strict
from ait.harness.types import EpisodeConfig
from ait.policy.base import PolicySettings


class EvalPlan(PolicySettings):
    """What `ait eval` runs (written to OUT/plan.json; a resume must run the same plan): the policy
    settings `ait episode` takes too (PolicySettings), the tasks and how many episodes."""

    tasks: list[str] = Field(min_length=1)
    """TaskSpec names or paths, in order."""
    episodes: int = Field(ge=1, le=1000)
    """Episodes per task."""
    concurrency: int = Field(default=1, ge=1, le=64)
    """Episodes at once (agent calls overlap; jobs go through the executor)."""
    executor: Literal["inline", "queue", "local", "ray"] | None = None
    """How inner jobs run (default: the episode config's, inline)."""
    budget_usd: float | None = Field(default=None, ge=0)
    """Stop starting episodes once the eval's ledger reaches this (each episode also stops at it)."""
    eval_size: int | None = Field(default=None, ge=1)
    """Hidden examples per job (default: each spec's)."""
    max_turns: int | None = Field(default=None, ge=1, le=1000)
    """Policy turns per episode (default: the episode config's, 40)."""
    episode_timeout_s: float | None = Field(default=None, gt=0)
    """Wall-clock limit per episode (scored as it stood)."""
    episode: EpisodeConfig | None = None
    """The episode settings of `--config` (an EpisodeConfig TOML, as `ait episode --config` reads);
    the flags above override it."""

    def episode_config(self) -> EpisodeConfig:
        """Each episode's config: `episode`'s settings, this plan's flags over them, its own ledger group."""
        base = (self.episode or EpisodeConfig()).model_dump()
        flags = {"executor": self.executor, "eval_size": self.eval_size, "max_turns": self.max_turns,
                 "timeout_s": self.episode_timeout_s, "run_budget_usd": self.budget_usd}
        return EpisodeConfig.model_validate({**base, "run_group": "eval", "keep_checkpoints": False,
                                             **{k: v for k, v in flags.items() if v is not None}})


class EpisodeRow(BaseModel):
    """One finished episode as the summary reads it (from its episode.json)."""

    task_id: str
    """TaskSpec id."""
    run_id: str
    """Its run directory's name (OUT/runs/<run_id>)."""
    stop_reason: str
    """Why it ended."""
    infra_error: bool
    """Ended as infra_error: counted apart, left out of every mean."""
    reward: float
    """Episode reward."""
    validation: float
    """Reward's validation term."""
    job_quality: float
    """Reward's job-quality term."""
    uplift_term: float
    """Reward's uplift term."""
    train_speed: float
    """Reward's speed term."""
    valid: bool
    """A submission was valid."""
    job_ran: bool
    """A job ran."""
    job_failed: bool
    """The scored job failed (died, timed out, ...)."""
    base_model: str | None
    """Base model of the scored job."""
    best_pre_models: list[str] | None = None
    """The allowed base models best_pre was the highest of here (None: no best_pre, or results
    written before it was recorded)."""
    best_pre_left_out: dict[str, str] = Field(default_factory=dict)
    """Allowed base models left out of best_pre on this install, and why."""
    prompt_tokens: int = 0
    """LLM prompt tokens."""
    completion_tokens: int = 0
    """LLM completion tokens."""
    usd: float = 0.0
    """USD of the episode (LLM + jobs)."""
    wall_s: float = 0.0
    """Episode wall time."""


class Stat(BaseModel):
    mean: float | None
    """Mean over the episodes (None: none)."""
    se2: float | None
    """Two standard errors of the mean (None: fewer than two episodes), never below the floor of
    ait.agent_eval.stats.se_floor (a sample with no spread still has noise)."""
    n: int
    """Episodes it is over."""
    se2_raw: float | None = None
    """Two standard errors as the sample's spread alone gives them, before the floor (None: fewer than
    two episodes, or results written before the floor)."""


class Summary(BaseModel):
    """Per task, or over all tasks: means with two standard errors (infra errors left out)."""

    episodes: int
    """Episodes finished (infra errors included)."""
    infra_errors: int
    """Of them, ended as infra_error (in no mean below)."""
    reward: Stat
    validation: Stat
    job_quality: Stat
    uplift_term: Stat
    train_speed: Stat
    valid_rate: Stat
    """Fraction with a valid submission."""
    job_failure_rate: Stat
    """Of the episodes whose job ran, the fraction whose scored job failed."""
    base_models: dict[str, float] = Field(default_factory=dict)
    """Base model -> fraction of scored jobs."""
    stop_reasons: dict[str, int] = Field(default_factory=dict)
    """Stop reason -> episodes."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usd: float = 0.0
    wall_s: Stat = Field(default_factory=lambda: Stat(mean=None, se2=None, n=0))
    """Episode wall time."""
    best_pre_left_out: dict[str, str] = Field(default_factory=dict)
    """Allowed base models some episode's best_pre left out on this install, and why: rewards are
    against a best_pre without them (`ait eval compare` refuses results whose best_pre sets differ)."""


class EvalResults(BaseModel):
    """OUT/results.json."""

    plan: EvalPlan
    """What was run."""
    per_task: dict[str, Summary]
    """Task id -> summary."""
    overall: Summary
    """All tasks pooled."""
    episodes: list[EpisodeRow]
    """Every finished episode."""
    planned: int
    """Episodes the plan asks for."""
    stopped: str | None = None
    """Why the eval stopped before the plan was done (budget, interrupted); None when complete."""
