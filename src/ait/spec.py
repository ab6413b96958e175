"""TaskSpec: everything the agent is told for one episode, and nothing hidden.

A TaskSpec is plain data (JSON under `examples/tasks/`). It never carries the hidden
eval seed, hidden examples or their gold answers: those are derived at eval time by
`ait.evals.hidden` from a secret that never enters a workspace.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

ParamType = Literal["integer", "number", "string", "boolean"]


class Strict(BaseModel):
    """Base for every contract model: unknown keys are an error, never ignored."""

    model_config = ConfigDict(extra="forbid")


class ToolParam(Strict):
    name: str
    """Parameter name, exactly as the tool function spells it."""
    type: ParamType
    """JSON-schema type of the argument."""
    description: str
    """What the argument means."""


class ToolSpec(Strict):
    name: str
    """Tool name; env.py must define a tool with this exact name."""
    description: str
    """What the tool does (its semantics, as the eval implements them)."""
    parameters: list[ToolParam]
    """Arguments in order; env.py's tool must take exactly these names."""
    returns: str
    """What the tool returns, as text."""
    example: dict[str, Any] = Field(default_factory=dict)
    """One valid call's arguments, used by the probe's dry run."""


class EvalFormat(Strict):
    system_prompt: str
    """The system prompt the hidden eval uses."""
    tools: list[ToolSpec]
    """The tools the hidden eval exposes to the model."""
    answer_format: str
    """How the final answer must be written for the scorer to read it."""
    max_turns: int = Field(ge=1, le=32)
    """Assistant turns per eval episode (tool rounds + the final answer)."""
    max_new_tokens: int = Field(ge=8, le=4096)
    """Generation budget per assistant turn at eval time."""


class Constraints(Strict):
    allowed_base_models: list[str] = Field(min_length=1)
    """Base models a job may train (names `ait.train.models` resolves)."""
    max_steps: int = Field(ge=1)
    """Upper bound on GRPO optimizer steps."""
    max_group_size: int = Field(ge=2)
    """Upper bound on completions per prompt (GRPO group, TRL's num_generations)."""
    max_prompts_per_step: int = Field(ge=1)
    """Upper bound on distinct prompts per optimizer step."""
    max_completion_tokens: int = Field(ge=8)
    """Upper bound on tokens generated per rollout (all turns together)."""
    max_turns: int = Field(ge=1)
    """Upper bound on tool-calling rounds per rollout."""
    time_budget_s: float = Field(gt=0)
    """Wall-clock budget for training; the job is killed past 2x and scored on speed within 1x."""
    min_dataset_rows: int = Field(ge=1)
    """The dataset builder must return at least this many distinct rows."""
    max_dataset_rows: int = Field(ge=1)
    """... and at most this many."""


class DevExample(Strict):
    prompt: str
    """The user message."""
    answer: str
    """The gold answer, as the scorer expects it."""
    world: dict[str, Any] = Field(default_factory=dict)
    """The state the tools read for this example (empty for stateless families)."""


class TaskSpec(Strict):
    id: str
    """Stable task id (also the file stem under examples/tasks/)."""
    family: str
    """Task family name (see `ait.families`)."""
    description: str
    """What the trained model must learn to do."""
    difficulty: dict[str, Any]
    """The family's difficulty knobs for this task (the hidden eval uses the same)."""
    eval_format: EvalFormat
    """How the hidden eval talks to the model."""
    constraints: Constraints
    """Hard bounds every job is validated against."""
    dev_examples: list[DevExample]
    """A handful of public examples (never in the hidden eval)."""
    max_submission_attempts: int = Field(default=3, ge=1, le=10)
    """How many times the agent may submit before the episode ends unvalidated."""
    hidden_eval_size: int = Field(default=200, ge=1, le=10_000)
    """Number of hidden eval examples (their seed is secret)."""


class SpecError(ValueError):
    """A TaskSpec file that cannot be used; the message says what and where."""


def load_spec(path: str | Path) -> TaskSpec:
    """A TaskSpec file, checked for structure and for meaning (its family, knobs and tools exist)."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"task spec {path} does not exist; see `ait tasks list` for the shipped ones")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise SpecError(f"task spec {path} is not UTF-8 text (byte {e.start}); save it as UTF-8 JSON") from None
    except json.JSONDecodeError as e:
        raise SpecError(f"task spec {path} is not valid JSON: {e}") from None
    except OSError as e:
        raise SpecError(f"task spec {path} cannot be read: {e.strerror}") from None
    try:
        spec = TaskSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(f"task spec {path} is invalid: {format_validation_error(e)}") from None
    from ait.families import check_spec  # families import this module: checked here, not at import

    if problems := check_spec(spec):
        raise SpecError(f"task spec {path} is invalid: {'; '.join(problems)}")
    return spec


def format_validation_error(e: ValidationError) -> str:
    """One line per problem, naming the key path, e.g. `train.num_generations: ...`."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = "unknown key (not allowed)" if err["type"] == "extra_forbidden" else err["msg"]
        msg = msg.removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)
