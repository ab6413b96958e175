"""The episode's models: messages between harness and policy, its config, its result."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, Field

from ait.chat.types import ToolCall
from ait.contract import Strict
from ait.evals.best_pre import BestPre
from ait.job.types import JobResult
from ait.metering import CostSummary, JobCost, Usage
from ait.probe.types import ProbeReport
from ait.reward import RewardBreakdown, RewardWeights


ToolCallRequest = ToolCall
"""The older name of ait.chat.types.ToolCall (one tool-call type for harness, policies and rollouts)."""


class TokenTrace(BaseModel):
    """What a trainable (local) policy sampled: enough to recompute the turn's log-likelihood."""

    prompt_ids: list[int]
    """The rendered prompt the reply was sampled from (chat template, tools, history)."""
    completion_ids: list[int]
    """Every sampled token, the end-of-turn token included."""
    logprobs: list[float]
    """Log-probability of each sampled token under the sampling distribution (temperature applied)."""
    temperature: float
    """The sampling temperature (0 = greedy; logprobs then at temperature 1)."""
    truncated_tool_results: int = 0
    """Older tool results shortened so the prompt fit the model's context."""


class Message(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    """Who speaks."""
    content: str = ""
    """Text."""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    """Tool calls (assistant messages only)."""
    tool_call_id: str | None = None
    """Which call this answers (tool messages only)."""
    name: str | None = None
    """Tool name (tool messages only)."""
    usage: Usage | None = None
    """Tokens, USD and latency of the LLM call that produced it (assistant messages from an LLM)."""
    tokens: TokenTrace | None = None
    """Token ids and logprobs (assistant messages from a trainable policy)."""


class StopReason(str, Enum):
    """Why an episode ended."""

    job_done = "job_done"                        # a valid job was submitted and ran (ok or failed)
    attempts_exhausted = "attempts_exhausted"    # every submission attempt was invalid
    no_submission = "no_submission"              # the agent stopped without ever submitting
    agent_stopped = "agent_stopped"              # the agent stopped after invalid submissions
    turn_cap = "turn_cap"                        # max_turns reached
    stuck = "stuck"                              # the same failing tool call, max_repeated_errors times in a row
    policy_error = "policy_error"                # the policy raised (API down, parse failure)
    budget = "budget"                            # the next step would pass (or the last passed) a USD budget
    context_full = "context_full"                # the conversation no longer fits the policy's context
    timeout = "timeout"                          # the episode's wall-clock limit (EpisodeConfig.timeout_s) passed
    interrupted = "interrupted"                  # Ctrl-C: recorded as it stood, its job stopped
    infra_error = "infra_error"                  # the scored job's eval or worker failed, or best_pre could not be
                                                 # measured: not the agent's doing, left out of the outer loop


class Stop(BaseModel):
    """How an episode ended: decided in one place (ait.harness.episode.Episode.decide)."""

    reason: StopReason
    """Why it ended."""
    turns: int
    """Policy turns taken."""
    error: str | None = None
    """What went wrong, or which budget or limit stopped it."""


class PolicyStop(Exception):
    """Raised by a policy that cannot go on for a known reason (e.g. its context is full): the
    episode ends with `reason` instead of policy_error."""

    def __init__(self, reason: StopReason, message: str):
        super().__init__(message)
        self.reason = reason


class EpisodeConfig(Strict):
    """Config of `ait episode` (TOML-loadable; written into the run's manifest)."""

    max_turns: int = Field(default=40, ge=1, le=1000)
    """Policy turns before the episode is cut off."""
    max_nudges: int = Field(default=2, ge=0, le=10)
    """Reminders to submit when the agent stops without submitting."""
    max_repeated_errors: int = Field(default=4, ge=0, le=1000)
    """The episode stops as `stuck` when the agent makes one call (same tool, same arguments) that gets one
    error this many times in a row; it is scored as it stood. A looping agent otherwise burns every turn left
    (and an outer step waits for its slowest episode). 0 = never."""
    probe_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    """Wall-clock limit of one probe."""
    job_gpu_memory_gib: float | None = Field(default=None, gt=0, le=100_000)
    """The most GPU memory a job may need on this run's machine (the outer loop sets it where its agent
    shares the GPU with the jobs). The agent is told it; the probe rejects a job whose estimated peak is
    above it (an invalid submission, with what to change), rather than the job being refused as infra.
    None: no limit is stated."""
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
    trainer: Literal["fast", "trl"] = "fast"
    """Inner GRPO implementation: ait's fast trainer or TRL's GRPOTrainer (the reference)."""
    kill_factor: float = Field(default=2.0, ge=1.0, le=10.0)
    """The job is killed at this multiple of the task's time budget."""
    reward: RewardWeights = Field(default_factory=RewardWeights)
    """Reward weights."""
    timeout_s: float | None = Field(default=None, gt=0)
    """Wall-clock limit of the whole episode; when it passes the episode stops as `timeout` (a running job is
    killed) and is scored as it stood. None = no limit."""
    slot_wait_s: float = Field(default=600.0, ge=0, le=24 * 3600)
    """Seconds a job may wait for a slot (a GPU another episode's job holds) without it counting against
    timeout_s: the deadline moves by the wait, so a job that other work held up is not killed as the
    agent's timeout once it runs. A longer wait counts; a job still waiting when the deadline passes
    never runs and the episode is infra_error. 0 = every second of the wait counts."""
    keep_checkpoints: bool = True
    """False: delete each job's trained weights once they are scored (the outer loop's default: every
    episode of a long run would otherwise keep a full model, ~1 GB for a 0.5B full fine-tune)."""
    max_jobs: int = Field(default=1, ge=1, le=20)
    """Valid jobs the agent may run; after each it sees the dev-set score (never the hidden one) and may
    refine. The episode is scored on its best job by hidden post."""
    budget_usd: float | None = Field(default=None, ge=0)
    """Cap on this episode's LLM + job USD; None = no cap."""
    run_budget_usd: float | None = Field(default=None, ge=0)
    """Cap on the ledger's USD over `run_group` (every line when run_group is None); None = no cap."""
    run_group: str | None = None
    """Names the larger run this episode belongs to (a sweep, an outer-loop run); tags ledger lines."""
    ledger_path: str | None = None
    """The spend ledger; None = <runs dir>/costs.jsonl."""
    prices_path: str | None = None
    """Extra price TOML (see ait.metering); AIT_HOME/prices.toml and AIT_PRICES are read too."""
    job_gpus: float | None = Field(default=None, ge=0)
    """GPUs a job is charged for when its result does not say; None = 1 on a CUDA machine, else 0."""
    gpu_type: str | None = None
    """GPU name for the $/GPU-hour lookup; None = this machine's device name."""


class Submission(BaseModel):
    attempt: int
    """1-based attempt number."""
    parseable: bool
    """job.toml parsed as TOML."""
    report: ProbeReport
    """The probe's verdict."""


class JobRecord(BaseModel):
    """One job an episode ran (several when max_jobs > 1)."""

    attempt: int
    """The submission attempt that produced it."""
    job_id: str
    """Job id."""
    result: JobResult
    """What the job reported (hidden pre/post included: never shown to the agent)."""
    dev: float | None = None
    """Score on the spec's public dev examples: the only score the agent sees."""
    cost: JobCost
    """GPU-seconds and estimated USD."""


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
    """The scored job's result: the one the agent chose, else the best by dev score (never by hidden score)."""
    jobs: list[JobRecord] = Field(default_factory=list)
    """Every job that ran, in order."""
    scored_job: int | None = None
    """Index into `jobs` of the scored job."""
    chosen_job: int | None = None
    """Index into `jobs` of the job the agent chose with select_job (None: it chose none)."""
    baseline: BestPre | None = None
    """How best_pre was made: every allowed model's frozen untrained score, and the models left out."""
    reward: RewardBreakdown
    """The reward and its components."""
    wall_seconds: float
    """Episode wall time."""
    error: str | None = None
    """What went wrong (policy_error, context_full, infra_error) or which budget stopped the episode (budget)."""
    cost: CostSummary = Field(default_factory=CostSummary)
    """Tokens, USD and GPU-seconds of the episode."""
    malformed_tool_calls: int = 0
    """Tool calls with an unknown name, arguments that are not a JSON object, or wrong arguments."""
