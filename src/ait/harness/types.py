"""The episode's models: messages between harness and policy, its config, its result."""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, Field

from ait.job.types import JobResult
from ait.probe.types import ProbeReport
from ait.reward import RewardBreakdown, RewardWeights
from ait.spec import Strict


class ToolCallRequest(BaseModel):
    id: str
    """Call id, echoed in the tool result message."""
    name: str
    """Harness tool name."""
    arguments: dict[str, Any] | str
    """Parsed arguments, or the raw string when the policy sent malformed JSON."""


class Message(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    """Who speaks."""
    content: str = ""
    """Text."""
    tool_calls: list[ToolCallRequest] = Field(default_factory=list)
    """Tool calls (assistant messages only)."""
    tool_call_id: str | None = None
    """Which call this answers (tool messages only)."""
    name: str | None = None
    """Tool name (tool messages only)."""


class StopReason(str, Enum):
    """Why an episode ended."""

    job_done = "job_done"                        # a valid job was submitted and ran (ok or failed)
    attempts_exhausted = "attempts_exhausted"    # every submission attempt was invalid
    no_submission = "no_submission"              # the agent stopped without ever submitting
    agent_stopped = "agent_stopped"              # the agent stopped after invalid submissions
    turn_cap = "turn_cap"                        # max_turns reached
    policy_error = "policy_error"                # the policy raised (API down, parse failure)


class EpisodeConfig(Strict):
    """Config of `ait episode` (TOML-loadable; written into the run's manifest)."""

    max_turns: int = Field(default=40, ge=1, le=1000)
    """Policy turns before the episode is cut off."""
    max_nudges: int = Field(default=2, ge=0, le=10)
    """Reminders to submit when the agent stops without submitting."""
    probe_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    """Wall-clock limit of one probe."""
    executor: Literal["inline", "queue", "local", "ray"] = "inline"
    """inline: run here; queue: enqueue for `ait worker`; local: a local slot pool; ray: Ray tasks."""
    ray_address: str | None = None
    """Ray cluster to join (executor = ray); None starts or joins a local Ray."""
    queue_path: str = "runs/queue.sqlite"
    """SQLite queue file (executor = queue)."""
    job_wait_s: float = Field(default=7200.0, gt=0)
    """How long to wait for a queued job's result."""
    eval_size: int | None = Field(default=None, ge=1)
    """Override the hidden eval size (smoke runs); None = the spec's."""
    kill_factor: float = Field(default=2.0, ge=1.0, le=10.0)
    """The job is killed at this multiple of the task's time budget."""
    reward: RewardWeights = Field(default_factory=RewardWeights)
    """Reward weights."""


class Submission(BaseModel):
    attempt: int
    """1-based attempt number."""
    parseable: bool
    """job.toml parsed as TOML."""
    report: ProbeReport
    """The probe's verdict."""


class EpisodeResult(BaseModel):
    run_id: str
    """The run directory name."""
    run_dir: str
    """Where the artifacts are."""
    task_id: str
    """TaskSpec id."""
    policy: str
    """Policy name."""
    stop_reason: StopReason
    """Why the episode ended."""
    turns: int
    """Policy turns taken."""
    submissions: list[Submission]
    """Every submit_job call's verdict."""
    job: JobResult | None
    """The job's result, if a valid job ran."""
    reward: RewardBreakdown
    """The reward and its components."""
    wall_seconds: float
    """Episode wall time."""
    error: str | None = None
    """What went wrong when stop_reason is policy_error."""
