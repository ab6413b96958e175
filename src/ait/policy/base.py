"""The Policy interface: one assistant message per turn, with tool calls.

Implementations: `reference` (scripted, no model), and later OpenAI-compatible chat,
local Hugging Face and Tinker samplers; `make_policy` picks one from a spec string.
"""

from __future__ import annotations

from typing import Any, Protocol

from ait.harness.types import Message
from ait.spec import TaskSpec


class Policy(Protocol):
    name: str

    def reset(self, spec: TaskSpec) -> None:
        """Start a new episode (the policy may not read the spec's hidden parts: there are none)."""

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        """Return the next assistant message given the conversation and the tool schemas."""


def make_policy(spec: str | None) -> Policy:
    """`reference` (the default with no API key) or, as they are added, `openai:MODEL` and others."""
    from ait.policy.reference import ReferencePolicy

    if spec in (None, "", "reference"):
        return ReferencePolicy()
    raise ValueError(f"unknown policy {spec!r}; available: reference")
