"""Harness messages <-> the chat formats models speak (OpenAI wire format, HF chat templates).

A tool call whose arguments were not valid JSON keeps its raw string end to end: the
harness answers it with an error (and counts it), and the model sees what it really sent.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ait.harness.types import Message, ToolCallRequest


def parse_arguments(raw: Any) -> dict[str, Any] | str:
    """A JSON object's dict, or the raw text when it is not one (the harness reports the error)."""
    if isinstance(raw, dict):
        return raw
    if raw is None or raw == "":
        return {}  # a call with no arguments: some servers send "" rather than "{}"
    try:
        value = json.loads(raw)
    except (TypeError, json.JSONDecodeError):
        return str(raw)
    return value if isinstance(value, dict) else str(raw)


def arguments_text(arguments: dict[str, Any] | str) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def to_openai(messages: list[Message]) -> list[dict[str, Any]]:
    """Messages in the chat-completions wire format (arguments as JSON strings)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content})
        elif m.role == "assistant" and m.tool_calls:
            out.append({"role": "assistant", "content": m.content or None, "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": arguments_text(c.arguments)}}
                for c in m.tool_calls]})
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def to_template(messages: list[Message]) -> list[dict[str, Any]]:
    """Messages as HF chat templates take them (arguments as dicts, tool results with their name)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            out.append({"role": "tool", "name": m.name or "", "content": m.content})
        elif m.role == "assistant" and m.tool_calls:
            out.append({"role": "assistant", "content": m.content, "tool_calls": [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in m.tool_calls]})
        else:
            out.append({"role": m.role, "content": m.content})
    return out


TOOL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
NAME = re.compile(r'"name"\s*:\s*"([^"]*)"')


def salvage_tool_calls(text: str, prefix: str) -> tuple[str, list[ToolCallRequest]]:
    """Tool-call blocks a template parser rejected (bad JSON, truncated): each becomes a call with its
    name if one can be read and the raw block as arguments, so the harness answers it with an error."""
    calls = []
    for i, block in enumerate(TOOL_BLOCK.findall(text)):
        body = block.strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            calls.append(ToolCallRequest(id=f"{prefix}_{i}", name=obj["name"],
                                         arguments=parse_arguments(obj.get("arguments", {}))))
        else:
            name = NAME.search(body)
            calls.append(ToolCallRequest(id=f"{prefix}_{i}", name=name.group(1) if name else "", arguments=body))
    return TOOL_BLOCK.sub("", text).strip(), calls
