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
    except (TypeError, json.JSONDecodeError, RecursionError):
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
            # "" rather than null: llama-cpp-python's server answers a null content with HTTP 500 (it wants a
            # string) and the OpenAI API, vLLM and `transformers serve` accept either.
            out.append({"role": "assistant", "content": m.content or "", "tool_calls": [
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
FENCE = re.compile(r"```[a-zA-Z]*[ \t]*\n?(.*?)```", re.DOTALL)
FUNCTIONS_PREFIX = re.compile(r"(?:^|\n)\s*functions\.([A-Za-z_][\w-]*):")
CALL_START = re.compile(r'\{\s*"name"\s*:\s*"([A-Za-z_][\w.-]*)"\s*,\s*"(?:arguments|parameters)"\s*:')
OPENERS = re.compile(r"[\[{\s]+")
MAX_FAILED_STARTS = 2000
"""Brackets that start no JSON value before the scan for calls gives up: each failed start costs a pass
over the text before it (the decoder's error counts lines), so a reply of brackets would cost n^2."""



def salvage_tool_calls(text: str, prefix: str, *, bare_json: bool = False,
                       tool_names: set[str] | None = None) -> tuple[str, list[ToolCallRequest]]:
    """Tool calls written as text: `(content left over, calls)`.

    `<tool_call>` blocks (Qwen / Hermes templates) first: each becomes a call with its name if one can
    be read and the raw block as arguments when it is not a JSON object, so the harness answers it with
    an error. With `bare_json`, a reply without such blocks is also searched for JSON objects shaped like
    a call (`{"name": ..., "arguments": {...}}`, `parameters` for `arguments`, or nested under
    `function`), bare or in a code fence, and llama-cpp-python's `functions.NAME:` form; with
    `tool_names`, an object without arguments counts only when it names one of them (one with
    arguments and an unknown name is passed on, for the harness to answer "unknown tool"). Used
    by the HF policy on what its template parser rejected, and by the OpenAI policy when a server returns
    no structured calls (opt-in there, and to count replies that look like calls)."""
    calls: list[ToolCallRequest] = []
    for i, block in enumerate(TOOL_BLOCK.findall(text)):
        body = strip_fence(block.strip())
        try:
            obj = json.loads(body, strict=False)  # raw newlines inside strings: small models write file contents so
        except (json.JSONDecodeError, RecursionError):  # RecursionError: nested past the parser's depth
            obj = None
        call = call_from_json(obj, f"{prefix}_{i}", tool_names=None, strict=False)
        if call is not None:
            calls.append(call)
        else:
            name = NAME.search(body)
            calls.append(ToolCallRequest(id=f"{prefix}_{i}", name=name.group(1) if name else "", arguments=body))
    if calls or not bare_json:
        return TOOL_BLOCK.sub("", text).strip(), calls
    return json_tool_calls(text, prefix, tool_names)


def strip_fence(body: str) -> str:
    m = FENCE.fullmatch(body.strip())
    return m.group(1).strip() if m else body


def call_from_json(obj: Any, call_id: str, tool_names: set[str] | None, strict: bool = True) -> ToolCallRequest | None:
    """A call from `{"name", "arguments" | "parameters"}` (or that under "function"), else None. `strict`
    (bare JSON in prose): no other keys, so that any object that merely has a "name" is not taken."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict) and "name" not in obj:
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    has_arguments = "arguments" in obj or "parameters" in obj
    if tool_names is not None and name not in tool_names and not has_arguments:
        return None  # {"name": "x"} alone is a call only when x is a tool; with arguments it is one anyway
    if strict and not set(obj) - {"name", "type", "id"} <= {"arguments", "parameters"}:
        return None
    raw = obj.get("arguments", obj.get("parameters", {}))
    return ToolCallRequest(id=call_id, name=name, arguments=parse_arguments(raw))


def json_tool_calls(text: str, prefix: str, tool_names: set[str] | None) -> tuple[str, list[ToolCallRequest]]:
    """Every top-level JSON object (or list of objects) in `text` that reads as a tool call; the
    text around them (code fences that held only calls removed) is the content."""
    decoder = json.JSONDecoder(strict=False)
    calls: list[ToolCallRequest] = []
    spans: list[tuple[int, int]] = []
    i, failed = 0, 0
    while i < len(text) and failed < MAX_FAILED_STARTS:
        if text[i] not in "{[":
            i += 1
            continue
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i, failed = i + 1, failed + 1
            continue
        except RecursionError:  # nested past the parser's depth: so is every start inside this run of
            i = OPENERS.match(text, i).end()  # openers; skipping them keeps a long run from costing n^2
            continue
        found = [call_from_json(o, f"{prefix}_{len(calls) + k}", tool_names)
                 for k, o in enumerate(obj if isinstance(obj, list) else [obj])]
        if found and all(c is not None for c in found):
            calls.extend(c for c in found if c is not None)
            spans.append((i, end))
        i = end
    if not calls:
        named = FUNCTIONS_PREFIX.search(text)
        if named and (tool_names is None or named.group(1) in tool_names):
            # llama-cpp-python's chatml-function-calling format, `functions.NAME:` then the arguments, which
            # it returns as text when the model took its "message:" branch.
            rest = text[named.end():].lstrip()
            try:
                args, end = decoder.raw_decode(rest) if rest.startswith("{") else ({}, 0)
            except (json.JSONDecodeError, RecursionError):  # RecursionError: nested past the parser's depth
                args, end = rest, len(rest)
            call = ToolCallRequest(id=f"{prefix}_0", name=named.group(1), arguments=parse_arguments(args))
            return (text[:named.start()] + rest[end:]).strip(), [call]
        start = CALL_START.search(text)
        if start:
            # A call that does not parse (cut off, bad escapes): passed on raw so the harness answers it
            # with an error the model can act on, instead of the reply reading as "done".
            raw = text[start.start():].strip().removesuffix("```").strip()
            before = re.sub(r"```[a-zA-Z]*\s*$", "", text[:start.start()]).strip()  # the fence it opened
            return before, [ToolCallRequest(id=f"{prefix}_0", name=start.group(1), arguments=raw)]
        return text, []
    content, last = [], 0
    for start, end in spans:
        content.append(text[last:start])
        last = end
    content.append(text[last:])
    left = FENCE.sub(lambda m: "" if not m.group(1).strip() else m.group(0), "".join(content))
    return left.strip(), calls


def looks_like_tool_call(text: str, tool_names: set[str] | None = None) -> bool:
    """Whether a reply's text holds something meant as a tool call (tags, or JSON naming a tool)."""
    return "<tool_call>" in text or bool(salvage_tool_calls(text, "x", bare_json=True, tool_names=tool_names)[1])
