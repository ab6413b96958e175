"""The contract's leaf models: `Strict`, the base of every contract model, and the eval format
(`ToolParam`, `ToolSpec`, `EvalFormat`): how the hidden eval talks to the model.

A task family (ait.families) produces an EvalFormat; a TaskSpec (ait.spec) carries one, and
ait.spec builds and checks TaskSpecs through the families. These models live here, importing
nothing of ait, so the families need not import ait.spec: the two would otherwise form an import
cycle (ait.spec -> ait.families -> ait.spec).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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
