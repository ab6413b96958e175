"""The one tool-call type: what a model asked a tool to do, wherever the call was read."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ToolCall(BaseModel):
    id: str | None = None
    """Call id, echoed in the tool result message (the agent's calls; the inner rollouts need none)."""
    name: str
    """Tool name."""
    arguments: dict[str, Any] | str
    """Keyword arguments, or the raw string when an agent sent malformed JSON: the harness answers it with
    an error (and counts it) and the model sees what it really sent. The trainer's and the eval's parser
    only ever give a dict."""
