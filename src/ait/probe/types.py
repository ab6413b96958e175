"""The probe's verdict on a submitted workspace."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, Field

from ait.contract import ToolSpec
from ait.job.types import JobConfig


class ProbeCheck(str, Enum):
    """Which part of the contract a problem is in."""

    config = "config"          # job.toml: TOML, types, bounds, unknown keys
    env_import = "env_import"  # env.py raised or has a syntax error on import
    surface = "surface"        # SYSTEM_PROMPT / Environment / build_dataset / REWARD_FUNCS missing or malformed
    tools = "tools"            # tool names, parameters, docstrings vs the spec's interface
    tool_call = "tool_call"    # a tool raised or returned a non-text value on a valid call
    dataset = "dataset"        # rows malformed, too few, duplicated, or builder raised
    reward = "reward"          # reward raised, returned a non-float / out of [0, 1], or is constant
    dry_run = "dry_run"        # a rollout with the tiny model through the agent's env failed
    timeout = "timeout"        # the probe ran past its time limit
    crash = "crash"            # the probe process died (memory, signal, exit from agent code)
    disk = "disk"              # the probe's writes reached its disk limit


class ProbeError(BaseModel):
    check: ProbeCheck
    """Which contract area failed."""
    message: str
    """What is wrong and what to do, in one line."""


class RewardChoice(BaseModel):
    name: str = Field(max_length=200)
    weight: float = Field(allow_inf_nan=False)


class ProbeReport(BaseModel):
    valid: bool
    """True when every check passed."""
    errors: list[ProbeError] = Field(default_factory=list)
    """Specific problems, at most a handful, most fundamental first."""
    seconds: float = 0.0
    """Probe wall time."""
    config: JobConfig | None = None
    """The parsed job.toml when it was valid."""
    dataset_rows: int | None = None
    """Rows the builder returned."""
    rewards: list[RewardChoice] = Field(default_factory=list)
    """The valid job's reward functions and weights (its reward shaping, for the arc's reports)."""

    def summary(self) -> str:
        if self.valid:
            return "valid"
        return "\n".join(f"- [{e.check.value}] {e.message}" for e in self.errors)


class ProbeRequest(BaseModel):
    """What the trusted parent asks the child to exercise."""

    tools: list[ToolSpec]
    """The spec's tool interface (names, parameters, an example call each)."""
    dataset_size: int
    """n for build_dataset (job.toml's train.dataset_size)."""
    seed: int
    """seed for build_dataset (job.toml's train.seed)."""
    dry_run_model: str | None = None
    """Directory of the tiny model for the dry-run rollout (None skips it)."""


class ToolObservation(BaseModel):
    name: str
    """Spec tool name."""
    parameters: list[str] = Field(default_factory=list)
    """Parameter names of env.py's method (without self)."""
    schema_error: str | None = None
    """Why transformers could not build the tool's JSON schema (docstring/type hints)."""
    result_type: str | None = None
    """Type of the example call's return value."""
    result: str | None = None
    """The example call's return value, shortened."""
    error: str | None = None
    """The exception the example call raised."""


class RewardObservation(BaseModel):
    name: str
    """Reward function name."""
    weight: float = 1.0
    """Its REWARD_WEIGHTS entry (1.0 when env.py gives none)."""
    values: list[float] = Field(default_factory=list)
    """Valid values returned on the sample completions."""
    bad_values: list[str] = Field(default_factory=list)
    """Descriptions of invalid returns (non-float, NaN, out of range)."""
    errors: list[str] = Field(default_factory=list)
    """Exceptions raised."""


class Observations(BaseModel):
    """What the child saw running env.py; untrusted input to the verdict."""

    import_error: str | None = None
    surface_errors: list[str] = Field(default_factory=list)
    system_prompt: str | None = None
    tool_names: list[str] = Field(default_factory=list)
    tools: list[ToolObservation] = Field(default_factory=list)
    dataset_error: str | None = None
    dataset_count: int = 0
    dataset_wellformed: int = 0
    dataset_distinct: int = 0
    dataset_malformed: list[str] = Field(default_factory=list)
    dataset_samples: list[dict[str, str]] = Field(default_factory=list)
    rewards: list[RewardObservation] = Field(default_factory=list)
    dry_run_error: str | None = None
    """What failed in the dry-run rollout with the tiny model."""
    dry_run_sample: str | None = None
    """The tiny model's first reply in the dry run (shortened)."""
