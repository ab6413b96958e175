"""Reading tool calls out of a model's reply: one module, two strictnesses, one core.

The core is shared: scanning text for JSON values, recognising a call object (`call_object`), and
dropping a schema's `required` list a small model copied into its arguments (`without_schema_echo`).
Two readings are built on it, and they differ on purpose:

- the trainer's and the hidden eval's (`template_calls`, `bare_tool_calls`): a reply is a call only
  when the template parser found one or the reply is nothing but call objects, so prose that merely
  mentions JSON never runs a tool in a rollout that is being scored;
- the agent's (`agent_template_calls`, `salvage_tool_calls`, `json_tool_calls`): calls are salvaged
  from prose, tags and fences, and a malformed one is passed on with its raw text as arguments, so
  the harness answers it with an error the agent can act on instead of the turn reading as "done".
"""

from __future__ import annotations

import json
import re
from typing import Any

from ait.chat.types import ToolCall

# ---- the shared core ------------------------------------------------------------------------------


def call_object(obj: Any, *, keys: frozenset[str] | None, arg_keys: tuple[str, ...],
                unwrap_function: bool) -> tuple[str, Any, bool] | None:
    """(name, raw arguments, whether any were given) of a JSON object shaped like a tool call, else None.
    `keys`: every key the object may have (None: any); `arg_keys`: the keys that may hold the arguments,
    first found wins ({} when none); `unwrap_function`: `{"function": {...}}` without a name of its own
    is read as the object inside."""
    if not isinstance(obj, dict):
        return None
    if unwrap_function and isinstance(obj.get("function"), dict) and "name" not in obj:
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or (keys is not None and not set(obj) <= keys):
        return None
    given = [k for k in arg_keys if k in obj]
    return name, (obj[given[0]] if given else {}), bool(given)


def without_schema_echo(args: dict) -> dict:
    """The arguments without a copied `"required": ["index"]`: Qwen2.5-Coder-0.5B adds the schema's
    required list to almost every call (on 2026-12-04, every ledger call of 8 examples, inline or not),
    and a tool then fails on the unexpected keyword, so the model never sees a result. Only a list of
    strings naming the call's own or no keys is dropped; a real argument called `required` is kept."""
    echo = args.get("required")
    if isinstance(echo, list) and all(isinstance(k, str) for k in echo) and set(echo) <= set(args) - {"required"}:
        return {k: v for k, v in args.items() if k != "required"}
    return args


def json_values(text: str) -> list:
    """The JSON values that make up `text` back to back (whitespace between them); [] when any
    part is not JSON, so prose around a call is never half-read as one."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while at < len(text):
        try:
            value, end = decoder.raw_decode(text, at)
        except (ValueError, RecursionError):
            return []
        values.append(value)
        at = end
        while at < len(text) and text[at].isspace():
            at += 1
    return values


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


# ---- the trainer's and the hidden eval's reading: strict ------------------------------------------

# Keys a bare call object may carry beside name and arguments: small models copy them from the tool's
# JSON schema in the prompt ({"name": ..., "arguments": ..., "return": {"type": "string", ...}}).
CALL_KEYS = frozenset({"name", "arguments", "type", "description", "return", "returns"})


def template_calls(tool_calls: list[dict] | None) -> list[ToolCall]:
    """The calls a template's response parser found (TRL's `tool_calls`), for a rollout: arguments that
    are not JSON become {}, a call whose arguments are not an object or whose name is not a string is
    dropped, and a copied schema `required` list is removed."""
    calls = []
    for call in tool_calls or []:
        fn = call.get("function", call)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except (json.JSONDecodeError, RecursionError):  # RecursionError: nested past the parser's depth
                args = {}
        if isinstance(fn.get("name"), str) and isinstance(args, dict):
            calls.append(ToolCall(name=fn["name"], arguments=without_schema_echo(args)))
    return calls


def bare_tool_calls(content: str) -> list[ToolCall]:
    """Tool calls written as bare JSON: one object, a list of objects, or several objects one
    after another (one per line, as small models write parallel calls), each exactly
    {"name": str, "arguments": object} (schema keys copied beside them allowed), optionally in a ```
    fence, and optionally followed by JSON objects with no "name" (imagined results, dropped);
    [] for anything else."""
    text = content.strip()
    if text.startswith("```"):
        text = text.split("\n", 1)[1] if "\n" in text else ""
        text = text.rsplit("```", 1)[0] if text.rstrip().endswith("```") else text
    items = json_values(text.strip())
    if len(items) == 1 and isinstance(items[0], list):
        items = items[0]
    calls = []
    for item in items:
        found = call_object(item, keys=CALL_KEYS, arg_keys=("arguments",), unwrap_function=False)
        if found is None or not found[2] or not isinstance(found[1], dict):
            # JSON objects after the calls are the model imagining their results ({"response": ...}):
            # the real results replace them. Anything else makes the reply plain text.
            imagined = all(isinstance(rest, dict) and "name" not in rest for rest in items[len(calls):])
            return calls if calls and imagined else []
        calls.append(ToolCall(name=found[0], arguments=without_schema_echo(found[1])))
    return calls


# ---- the agent's reading: lenient, malformed calls passed on raw ---------------------------------

TOOL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
NAME = re.compile(r'"name"\s*:\s*"([^"]*)"')
FENCE = re.compile(r"```[a-zA-Z]*[ \t]*\n?(.*?)```", re.DOTALL)
FUNCTIONS_PREFIX = re.compile(r"(?:^|\n)\s*functions\.([A-Za-z_][\w-]*):")
CALL_START = re.compile(r'\{\s*"name"\s*:\s*"([A-Za-z_][\w.-]*)"\s*,\s*"(?:arguments|parameters)"\s*:')
OPENERS = re.compile(r"[\[{\s]+")
MAX_FAILED_STARTS = 2000
"""Brackets that start no JSON value before the scan for calls gives up: each failed start costs a pass
over the text before it (the decoder's error counts lines), so a reply of brackets would cost n^2."""
AGENT_CALL_KEYS = frozenset({"name", "type", "id", "arguments", "parameters"})
"""Every key a call object found in prose may have: any other key means it is some other JSON that
merely has a "name"."""


def agent_template_calls(tool_calls: list[dict] | None, prefix: str) -> list[ToolCall]:
    """The calls a template's response parser found, for the agent: every one is kept, its arguments
    raw when they are not a JSON object (the harness answers it with an error)."""
    calls = []
    for i, call in enumerate(tool_calls or []):
        fn = call.get("function", call)
        calls.append(ToolCall(id=f"{prefix}_{i}", name=str(fn.get("name") or ""),
                              arguments=parse_arguments(fn.get("arguments"))))
    return calls


def salvage_tool_calls(text: str, prefix: str, *, bare_json: bool = False,
                       tool_names: set[str] | None = None) -> tuple[str, list[ToolCall]]:
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
    calls: list[ToolCall] = []
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
            calls.append(ToolCall(id=f"{prefix}_{i}", name=name.group(1) if name else "", arguments=body))
    if calls or not bare_json:
        return TOOL_BLOCK.sub("", text).strip(), calls
    return json_tool_calls(text, prefix, tool_names)


def strip_fence(body: str) -> str:
    m = FENCE.fullmatch(body.strip())
    return m.group(1).strip() if m else body


def call_from_json(obj: Any, call_id: str, tool_names: set[str] | None, strict: bool = True) -> ToolCall | None:
    """A call from `{"name", "arguments" | "parameters"}` (or that under "function"), else None. `strict`
    (bare JSON in prose): no other keys, so that any object that merely has a "name" is not taken."""
    found = call_object(obj, keys=AGENT_CALL_KEYS if strict else None, arg_keys=("arguments", "parameters"),
                        unwrap_function=True)
    if found is None or not found[0]:
        return None
    name, raw, has_arguments = found
    if tool_names is not None and name not in tool_names and not has_arguments:
        return None  # {"name": "x"} alone is a call only when x is a tool; with arguments it is one anyway
    return ToolCall(id=call_id, name=name, arguments=parse_arguments(raw))


def json_tool_calls(text: str, prefix: str, tool_names: set[str] | None) -> tuple[str, list[ToolCall]]:
    """Every top-level JSON object (or list of objects) in `text` that reads as a tool call; the
    text around them (code fences that held only calls removed) is the content."""
    decoder = json.JSONDecoder(strict=False)
    calls: list[ToolCall] = []
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
            call = ToolCall(id=f"{prefix}_0", name=named.group(1), arguments=parse_arguments(args))
            return (text[:named.start()] + rest[end:]).strip(), [call]
        start = CALL_START.search(text)
        if start:
            # A call that does not parse (cut off, bad escapes): passed on raw so the harness answers it
            # with an error the model can act on, instead of the reply reading as "done".
            raw = text[start.start():].strip().removesuffix("```").strip()
            before = re.sub(r"```[a-zA-Z]*\s*$", "", text[:start.start()]).strip()  # the fence it opened
            return before, [ToolCall(id=f"{prefix}_0", name=start.group(1), arguments=raw)]
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
