"""The job contract's models: the agent's job.toml, a submitted Job, and its JobResult.

Hyperparameter names follow TRL's GRPOConfig where TRL has one (num_generations,
max_completion_length, max_tool_calling_iterations, beta, loss_type, ...). docs/design.md's
names (group_size, max_completion_tokens, max_turns) are accepted as aliases; giving
both spellings of one key is an error.
"""

from __future__ import annotations

import json
import math
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ait.contract import Strict as _Strict
from ait.spec import Constraints


class Strict(_Strict):
    """job.toml models: also strict about types (TOML `true` or "10" is not an int)."""

    model_config = ConfigDict(extra="forbid", strict=True)

ALIASES = {  # docs/design.md's older name -> TRL name
    "group_size": "num_generations",
    "max_completion_tokens": "max_completion_length",
    "max_turns": "max_tool_calling_iterations",
}


class LoraConfig(Strict):
    r: int = Field(default=16, ge=1, le=256)
    """LoRA rank."""
    lora_alpha: int = Field(default=32, ge=1, le=1024)
    """LoRA scaling numerator."""
    lora_dropout: float = Field(default=0.0, ge=0.0, le=0.5)
    """Dropout on the LoRA path."""
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    """Which modules get adapters."""


class JobSection(Strict):
    base_model: str = Field(min_length=1)
    """A base model the task allows (see the spec's constraints)."""


class TrainConfig(Strict):
    max_steps: int = Field(ge=0, le=10_000)
    """GRPO optimizer steps (0: the null job, which saves the base weights untrained)."""
    learning_rate: float = Field(ge=0.0, le=1e-2)
    """Peak learning rate (0: a null job that samples and scores rollouts but never moves a weight)."""
    num_generations: int = Field(ge=2, le=256, validation_alias=AliasChoices("num_generations", "group_size"))
    """Completions per prompt (the GRPO group size)."""
    prompts_per_step: int = Field(default=4, ge=1, le=1024)
    """Distinct prompts per optimizer step."""
    temperature: float = Field(default=1.0, gt=0.0, le=2.0)
    """Sampling temperature for rollouts."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling for rollouts."""
    max_completion_length: int = Field(
        ge=8, le=8192, validation_alias=AliasChoices("max_completion_length", "max_completion_tokens")
    )
    """Tokens generated per rollout, all turns together."""
    max_tool_calling_iterations: int = Field(
        default=4, ge=0, le=64, validation_alias=AliasChoices("max_tool_calling_iterations", "max_turns")
    )
    """Tool-calling rounds per rollout."""
    beta: float = Field(default=0.0, ge=0.0, le=1.0)
    """KL coefficient against the reference model (0 = no reference model)."""
    epsilon: float = Field(default=0.2, gt=0.0, le=1.0)
    """PPO-style clipping range."""
    loss_type: Literal["grpo", "dapo", "dr_grpo", "bnpo"] = "dapo"
    """How per-token losses are aggregated (TRL's loss_type)."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """How advantages are normalised (TRL's scale_rewards)."""
    num_iterations: int = Field(default=1, ge=1, le=8)
    """Optimisation passes over each generated batch."""
    lr_scheduler_type: Literal["constant", "linear", "cosine", "constant_with_warmup"] = "constant"
    """Learning-rate schedule."""
    warmup_steps: float = Field(default=0.0, ge=0.0, le=10_000)
    """Linear warmup: whole steps, or a fraction of max_steps when below 1 (transformers' meaning)."""
    optim: Literal["adamw_torch", "adamw_torch_fused", "sgd", "adafactor"] = "adamw_torch"
    """Optimizer."""
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0)
    """AdamW weight decay."""
    max_grad_norm: float = Field(default=1.0, gt=0.0, le=100.0)
    """Gradient clipping."""
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    """Training seed (sampling and data order)."""
    dataset_size: int = Field(default=256, ge=1, le=100_000)
    """Rows asked of env.py's build_dataset."""
    lora: LoraConfig | None = None
    """Train LoRA adapters (merged into the saved checkpoint) instead of all weights."""

    @model_validator(mode="before")
    @classmethod
    def _no_double_spelling(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for alias, name in ALIASES.items():
                if alias in data and name in data:
                    raise ValueError(f"both {alias!r} and {name!r} given; they are the same key, keep one")
        return data


class JobConfig(Strict):
    """The whole job.toml. Bounds that depend on the task come from its Constraints
    (pass `context={"constraints": ...}` to model_validate)."""

    job: JobSection
    train: TrainConfig

    @model_validator(mode="after")
    def _within_task_bounds(self, info: ValidationInfo) -> "JobConfig":
        c: Constraints | None = (info.context or {}).get("constraints")
        if c is None:
            return self
        t = self.train
        problems = []
        if self.job.base_model not in c.allowed_base_models:
            problems.append(f"job.base_model {self.job.base_model!r} is not allowed; choose one of {c.allowed_base_models}")
        for key, value, bound in [
            ("train.max_steps", t.max_steps, c.max_steps),
            ("train.num_generations", t.num_generations, c.max_group_size),
            ("train.prompts_per_step", t.prompts_per_step, c.max_prompts_per_step),
            ("train.max_completion_length", t.max_completion_length, c.max_completion_tokens),
            ("train.max_tool_calling_iterations", t.max_tool_calling_iterations, c.max_turns),
            ("train.dataset_size", t.dataset_size, c.max_dataset_rows),
        ]:
            if value > bound:
                problems.append(f"{key} = {value} exceeds the task's bound of {bound}")
        if t.dataset_size < c.min_dataset_rows:
            problems.append(f"train.dataset_size = {t.dataset_size} is below the task's minimum of {c.min_dataset_rows}")
        if problems:
            raise ValueError("; ".join(problems))
        return self


class Job(BaseModel):
    """A validated submission, as it travels through the queue to a worker."""

    model_config = ConfigDict(extra="forbid")

    job_id: str
    """Unique id (idempotency key in the queue)."""
    run_dir: str
    """The episode's run directory; the job writes under `<run_dir>/job/`."""
    workspace: str
    """Snapshot of the agent's workspace the job trains from (read by the job only)."""
    task_path: str
    """Path to the TaskSpec JSON."""
    config: JobConfig
    """The parsed job.toml."""
    time_budget_s: float
    """Training budget; the job process is killed at `kill_factor` times this."""
    kill_factor: float = 2.0
    """Multiple of the budget after which the job is killed (reason: timeout)."""
    eval_size: int | None = None
    """Override the hidden eval size (tests); None = the spec's hidden_eval_size."""
    trainer: Literal["fast", "trl"] = "fast"
    """Inner GRPO implementation: ait's fast trainer (default) or TRL's GRPOTrainer (the reference)."""

    @field_validator("run_dir", "workspace", "task_path")
    @classmethod
    def _absolute(cls, v: str) -> str:
        # Jobs cross processes and working directories: store absolute paths only.
        return str(Path(v).expanduser().absolute())


class FailReason(str, Enum):
    """Why a job failed, as the worker observed it (exit status, signal, the memory cgroup's OOM
    events, its own clock), never as text the job printed."""

    invalid = "invalid"
    oom = "oom"
    crash = "crash"
    timeout = "timeout"
    killed = "killed"
    gpu_fault = "gpu_fault"
    disk = "disk"  # its writes reached its disk limit (ENOSPC on its own file system, or the watchdog's count)
    infra = "infra"  # not the job's doing: the eval or the worker failed, the base model stopped resolving


class JobResult(BaseModel):
    """What a finished job reports back: the hidden-eval scores and how it ran."""

    model_config = ConfigDict(extra="forbid")

    job_id: str
    """The job this result belongs to."""
    ok: bool
    """True when training and both evals completed."""
    fail_reason: FailReason | None = None
    """Why the job failed (None when ok)."""
    error: str | None = None
    """Last lines of the failure, for the agent's and the user's eyes."""
    base_model: str | None = None
    """The base model trained."""
    base_model_source: str | None = None
    """Where its weights came from: tiny | local | huggingface | gguf | package (ait.train.models)."""
    base_model_sha256: str | None = None
    """Content hash of the base weights (a GGUF file's sha256, else over the *.safetensors files)."""
    pre: float | None = None
    """Hidden-eval score before training."""
    post: float | None = None
    """Hidden-eval score after training."""
    eval_n: int | None = None
    """Number of hidden examples scored."""
    pre_scores: list[float] | None = None
    """The base weights' score on each hidden example, in the set's order (for paired statistics)."""
    post_scores: list[float] | None = None
    """The trained weights' score on each hidden example, in the same order."""
    outputs_changed: int | None = None
    """Hidden examples on which the trained model's conversation differs from the base model's
    (0 for a null job: identical weights decode identically)."""
    dev: float | None = None
    """Score of the trained weights on the spec's public dev examples (the only score an agent sees)."""
    gpus: float | None = None
    """GPUs the job held (fractional when packed, 0 on CPU); None = not reported."""
    train_seconds: float | None = None
    """Wall time of the whole sandboxed training process (start-up, model load, GRPO, save), by the
    worker's clock; a packed job re-run alone is timed on that run only, at the packing it was admitted
    to (ait.compute.local.run_admitted). The speed term reads this."""
    total_seconds: float | None = None
    """Wall time of the whole job (load, evals, train)."""
    weights_changed: bool | None = None
    """Whether the trained checkpoint differs from the base weights."""
    checkpoint: str | None = None
    """Directory of the trained safetensors checkpoint."""
    metrics: dict[str, float] = Field(default_factory=dict)
    """Flat slash-namespaced training metrics (train/reward, train/loss, ...)."""
    dropped_nonfinite: list[str] = Field(default_factory=list)
    """Where train_output.json held NaN or ±Infinity (e.g. "metrics.train/loss"): dropped on reading,
    never stored (the first MAX_DROPPED_NAMES, then a count)."""


MAX_DROPPED_NAMES = 20


def unreadable_result(job_id: str, text: Any, why: str) -> JobResult:
    """A failed job in place of a result that cannot be read back (a crash unless it says it failed
    otherwise), billed for the time the text still reports. Never "no job": that would let the
    agent submit again for free."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError, RecursionError):
        data = None
    kept: dict[str, Any] = {"fail_reason": FailReason.crash}
    if isinstance(data, dict):
        for key in ("train_seconds", "total_seconds", "gpus"):
            v = data.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0:
                kept[key] = float(v)
        if isinstance(data.get("base_model"), str):
            kept["base_model"] = data["base_model"]
        if data.get("fail_reason") in [r.value for r in FailReason]:  # a list: the value may be unhashable
            kept["fail_reason"] = FailReason(data["fail_reason"])
    return JobResult(job_id=job_id, ok=False, error=f"the job's result cannot be read back: {why}", **kept)


def storable(result: JobResult) -> JobResult:
    """`result` when its JSON reads back as it is; else a failed job (`unreadable_result`). Pydantic
    writes a NaN or infinite number as null, which fails validation (or reads back as None)."""
    try:
        json.dumps(result.model_dump(mode="json"), allow_nan=False)
    except ValueError:
        return unreadable_result(result.job_id, result.model_dump_json(), "it holds a NaN or infinite number")
    return result
