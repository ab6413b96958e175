"""What every task family provides (see docs/design.md, "Task families").

A family is deterministic given an RNG: `example(rng, difficulty)` yields the prompt,
the world its tools read, and the gold answer. Its tools and scorer are the ones the
hidden eval uses, so an agent's own reward cannot inflate the score that matters.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import Any, Callable

from pydantic import BaseModel, Field, model_serializer

from ait.chat.types import ToolCall
from ait.contract import EvalFormat


class Example(BaseModel):
    prompt: str
    """The user message the model sees."""
    world: dict[str, Any] = Field(default_factory=dict)
    """The state the tools read (JSON-serialisable)."""
    answer: str
    """The gold answer, in the family's normalised form."""


class InlineDifficulty(BaseModel):
    """Base of a Difficulty model with an `inline` knob (declared by the family, with its own
    meaning): a false `inline` is left out of the dump, so specs and hidden-set seeds written
    before the knob existed stay byte for byte the same."""

    @model_serializer(mode="wrap")
    def _omit_false_inline(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        if isinstance(data, dict) and not getattr(self, "inline", False):
            data.pop("inline", None)
        return data


class Family(ABC):
    """One task family. Subclasses are stateless; all state lives in `Example.world`."""

    name: str
    held_out: bool = False
    calibrated: dict[str, Any] = {}
    """Knobs of the shipped task spec (scripts/make_task_specs.py): the rung at which the stronger
    base model in scope scored about 0.2-0.7 untrained on a GPU (bench/calibrate.py;
    docs/measurements/calibration-h200.json). {} = the Difficulty model's defaults, the family at
    full strength."""
    description: str
    Difficulty: type[BaseModel]

    def describe(self, difficulty: BaseModel) -> str:
        """The task's description at this difficulty (a rung that removes a tool says so here)."""
        return self.description

    @abstractmethod
    def example(self, rng: random.Random, difficulty: BaseModel) -> Example:
        """One seeded example; the same rng state always gives the same example."""

    @abstractmethod
    def tools(self, world: dict[str, Any]) -> list[Callable[..., str]]:
        """The tools bound to one example's world, as typed functions with docstrings."""

    @abstractmethod
    def score(self, response: str, answer: str) -> float:
        """Deterministic score in [0, 1] of a final response against the gold answer."""

    @abstractmethod
    def eval_format(self, difficulty: BaseModel) -> EvalFormat:
        """System prompt, tool interface and answer format of the hidden eval."""

    @abstractmethod
    def gold_trace(self, example: Example) -> list[ToolCall]:
        """A sequence of tool calls that reaches the gold answer using only the tools."""

    def difficulty(self, knobs: dict[str, Any] | None = None) -> BaseModel:
        """Validated difficulty knobs (unknown knobs are an error)."""
        return self.Difficulty.model_validate(knobs or {})

    def bind_tools(self, world: dict[str, Any]) -> dict[str, Callable[..., str]]:
        """One conversation's tools by name: build once per rollout so tools may keep state."""
        return {fn.__name__: fn for fn in self.tools(world)}

    def call_tool(self, world: dict[str, Any], call: ToolCall) -> str:
        """Run one tool call against a fresh binding of a world (stateless convenience)."""
        return call_bound(self.bind_tools(world), call)


def call_bound(by_name: dict[str, Callable[..., str]], call: ToolCall) -> str:
    """Run one tool call on bound tools, returning the tool's text (errors as text, never raising)."""
    fn = by_name.get(call.name)
    if fn is None:
        return f"error: unknown tool {call.name!r}; available: {', '.join(sorted(by_name))}"
    try:
        return str(fn(**call.arguments))  # raw-string arguments (a malformed agent call) are a TypeError
    except TypeError as e:
        return f"error: bad arguments for {call.name}: {e}"
    except Exception as e:  # a model's odd call must never crash an eval
        return f"error: {call.name} failed: {type(e).__name__}: {e}"
