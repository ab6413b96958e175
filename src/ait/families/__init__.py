"""Task family registry. Held-out families are never picked for training."""

from __future__ import annotations

import random
from typing import Any

from pydantic import ValidationError

from ait.families.base import Example, Family, ToolCall
from ait.families.calc_chain import CalcChain
from ait.families.dispatch import Dispatch
from ait.families.ledger import Ledger
from ait.families.multi_hop import MultiHop
from ait.families.string_pipeline import StringPipeline
from ait.families.triage import Triage
from ait.spec import Constraints, DevExample, TaskSpec

FAMILIES: dict[str, Family] = {
    f.name: f for f in [CalcChain(), MultiHop(), StringPipeline(), Ledger(), Dispatch(), Triage()]
}


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown task family {name!r}; known: {', '.join(sorted(FAMILIES))}") from None


INLINE_NOTE = (" At this difficulty (inline) the question itself also states the data the tools would return,"
               " so the tools are optional: the model may answer from the question alone.")


def build_spec(name: str, *, task_id: str | None = None, difficulty: dict[str, Any] | None = None,
               constraints: Constraints, n_dev: int = 5, dev_seed: int = 1000, **fields: Any) -> TaskSpec:
    """A TaskSpec for a family: eval format and dev examples come from the family itself.
    Dev examples use a public seed; the hidden set excludes their prompts."""
    family = get_family(name)
    d = family.difficulty(difficulty)
    rng = random.Random(dev_seed)
    dev = [family.example(rng, d) for _ in range(n_dev)]
    return TaskSpec(
        id=task_id or name,
        family=name,
        description=family.description + (INLINE_NOTE if getattr(d, "inline", False) else ""),
        difficulty=d.model_dump(),
        eval_format=family.eval_format(d),
        constraints=constraints,
        dev_examples=[DevExample(prompt=e.prompt, answer=e.answer, world=e.world) for e in dev],
        **fields,
    )


def check_spec(spec: TaskSpec) -> list[str]:
    """What makes a structurally valid TaskSpec unusable, one line each (empty: usable): an unknown
    family, difficulty knobs the family does not have or of the wrong type, tools other than the
    family's (the hidden eval runs the family's own tools and scorer)."""
    if spec.family not in FAMILIES:
        return [f"family: unknown task family {spec.family!r}; known: {', '.join(sorted(FAMILIES))}"]
    family = FAMILIES[spec.family]
    try:
        knobs = family.Difficulty.model_validate(spec.difficulty, strict=True)
    except ValidationError as e:
        from ait.spec import format_validation_error

        return [f"difficulty: {format_validation_error(e)} (the knobs of {spec.family}: "
                f"{', '.join(family.Difficulty.model_fields)})"]
    wanted = sorted(t.name for t in family.eval_format(knobs).tools)
    given = sorted(t.name for t in spec.eval_format.tools)
    if given != wanted:
        return [f"eval_format.tools: {given} are not {spec.family}'s tools {wanted} (the hidden eval runs the "
                "family's own tools)"]
    return []


def training_families() -> list[str]:
    """Families the outer loop may train on (held-out ones excluded)."""
    return sorted(name for name, f in FAMILIES.items() if not f.held_out)


__all__ = ["Example", "FAMILIES", "Family", "ToolCall", "build_spec", "check_spec", "get_family", "training_families"]
