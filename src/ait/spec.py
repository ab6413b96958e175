"""TaskSpec: everything the agent is told for one episode, and nothing hidden.

A TaskSpec is plain data (JSON under `examples/tasks/`). It never carries the hidden
eval seed, hidden examples or their gold answers: those are derived at eval time by
`ait.evals.hidden` from a secret that never enters a workspace.

This module sits above the task families: `build_spec` makes a family's TaskSpec and
`load_spec` checks a file against the family registry (`check_spec`). The families never import
this module: the eval-format models they build (EvalFormat, ToolSpec, ...) live in ait.contract.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from ait.contract import EvalFormat, Strict


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


MAX_SPEC_BYTES = 16 << 20  # the shipped specs are a few KB


def load_spec(path: str | Path) -> TaskSpec:
    """A TaskSpec file, checked for structure and for meaning (its family, knobs and tools exist)."""
    path = Path(path)
    if path.is_dir():
        raise SpecError(f"task spec {path} is a directory: pass the TaskSpec JSON file itself")
    if not path.is_file():
        raise SpecError(f"task spec {path} does not exist; see `ait tasks list` for the shipped ones")
    size = path.stat().st_size
    if size > MAX_SPEC_BYTES:  # read whole, a 3 GB file took 6 GB of memory before failing
        raise SpecError(f"task spec {path} is {size / 2**20:.0f} MiB, over the {MAX_SPEC_BYTES // 2**20} MiB a "
                        "TaskSpec may be: it holds a few dev examples, never a dataset")
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


NO_TOOLS_NOTE = (" At this difficulty no tool is offered: the model works the answer out in its reply, and that"
                 " reply is final.")
INLINE_NOTE = (" At this difficulty (inline) the question itself also states the data the tools would return,"
               " so the tools are optional: the model may answer from the question alone.")


def build_spec(name: str, *, task_id: str | None = None, difficulty: dict[str, Any] | None = None,
               constraints: Constraints, n_dev: int = 5, dev_seed: int = 1000, **fields: Any) -> TaskSpec:
    """A TaskSpec for a family: eval format and dev examples come from the family itself.
    Dev examples use a public seed; the hidden set excludes their prompts."""
    from ait.families import get_family  # here, not at import: importing ait.spec stays light

    family = get_family(name)
    d = family.difficulty(difficulty)
    rng = random.Random(dev_seed)
    dev = [family.example(rng, d) for _ in range(n_dev)]
    fmt = family.eval_format(d)
    note = INLINE_NOTE if getattr(d, "inline", False) else NO_TOOLS_NOTE if not fmt.tools else ""
    return TaskSpec(
        id=task_id or name,
        family=name,
        description=family.describe(d) + note,
        difficulty=d.model_dump(),
        eval_format=fmt,
        constraints=constraints,
        dev_examples=[DevExample(prompt=e.prompt, answer=e.answer, world=e.world) for e in dev],
        **fields,
    )


def check_spec(spec: TaskSpec) -> list[str]:
    """What makes a structurally valid TaskSpec unusable, one line each (empty: usable): an unknown
    family, difficulty knobs the family does not have or of the wrong type, tools other than the
    family's (the hidden eval runs the family's own tools and scorer)."""
    from ait.families import FAMILIES  # here, not at import: importing ait.spec stays light

    if spec.family not in FAMILIES:
        return [f"family: unknown task family {spec.family!r}; known: {', '.join(sorted(FAMILIES))}"]
    family = FAMILIES[spec.family]
    try:
        knobs = family.Difficulty.model_validate(spec.difficulty, strict=True)
    except ValidationError as e:
        return [f"difficulty: {format_validation_error(e)} (the knobs of {spec.family}: "
                f"{', '.join(family.Difficulty.model_fields)})"]
    wanted = sorted(t.name for t in family.eval_format(knobs).tools)
    given = sorted(t.name for t in spec.eval_format.tools)
    if given != wanted:
        return [f"eval_format.tools: {given} are not {spec.family}'s tools {wanted} (the hidden eval runs the "
                "family's own tools)"]
    return []
