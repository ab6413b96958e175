"""The chat format: how a model's chat template is prepared, where its replies stop, and how
a reply is read back into content and tool calls.

Training rollouts (ait.train.rollouts), the hidden eval's rollouts (ait.evals.rollout), the
probe's dry run and the policies all render and read the model's turns the same way, through
here. It lives in ait.train because that is the lower layer: the evals, the probe, the outer
loop and the policies already import ait.train (models, decode), while ait.train.rollouts must
not import ait.evals; a leaf here is importable from both sides without either importing the
other. It imports neither rollout module (only the families' ToolCall type, and TRL lazily).
"""

from __future__ import annotations

import json

from ait.families.base import ToolCall


def prepare_tokenizer(tokenizer):
    """Left padding, and a chat template whose tool calls TRL's response parser can read.

    A ChatML model whose own template cannot carry tools (SmolLM2) or is not one TRL knows
    (a GGUF copy of Qwen2.5's template with different whitespace) gets TRL's Qwen2.5 tool
    template: the most common ChatML tool format, so tool definitions reach the model and
    its `<tool_call>` blocks are parsed. Training, the probe and the hidden eval all come
    through here, so they always render the same prompts."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(tokenizer, "response_template", None) is not None or getattr(tokenizer, "response_schema", None) is not None:
        return tokenizer
    from trl.chat_template_utils import add_response_schema, qwen2_5_chat_template

    try:
        add_response_schema(tokenizer)
        return tokenizer
    except ValueError:
        pass
    vocab = tokenizer.get_vocab()
    if "<|im_start|>" in vocab and "<|im_end|>" in vocab:
        tokenizer.chat_template = qwen2_5_chat_template
        add_response_schema(tokenizer)
    return tokenizer  # otherwise: replies are read as plain text (no tool calls)


def parse_reply(tokenizer, ids: list[int], text: str, prefix: list[int]) -> tuple[str, list[ToolCall]]:
    """(content, tool calls) of one generated reply; unparseable replies are plain text.
    `prefix` is the rendered prompt's token ids: the response template needs it to find
    where the assistant turn starts (without it, tool calls come back as plain text).
    A reply that is nothing but a tool-call JSON object ({"name": ..., "arguments": {...}}),
    bare or in a code fence, is a tool call too: small Qwen2.5-Coder models answer that way
    instead of wrapping it in <tool_call> tags."""
    try:
        from trl.chat_template_utils import parse_response

        parsed = parse_response(tokenizer, ids, prefix=prefix)
    except Exception:
        parsed = {"content": text}
    calls = []
    for call in parsed.get("tool_calls") or []:
        fn = call.get("function", call)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except (json.JSONDecodeError, RecursionError):  # RecursionError: nested past the parser's depth
                args = {}
        if isinstance(fn.get("name"), str) and isinstance(args, dict):
            calls.append(ToolCall(name=fn["name"], arguments=without_schema_echo(args)))
    content = str(parsed.get("content") or "")
    if not calls and (bare := bare_tool_calls(content)):
        return "", bare
    return content, calls


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
    items = _json_values(text.strip())
    if len(items) == 1 and isinstance(items[0], list):
        items = items[0]
    calls = []
    for item in items:
        if not (isinstance(item, dict) and {"name", "arguments"} <= set(item) <= CALL_KEYS
                and isinstance(item["name"], str) and isinstance(item["arguments"], dict)):
            # JSON objects after the calls are the model imagining their results ({"response": ...}):
            # the real results replace them. Anything else makes the reply plain text.
            imagined = all(isinstance(rest, dict) and "name" not in rest for rest in items[len(calls):])
            return calls if calls and imagined else []
        calls.append(ToolCall(name=item["name"], arguments=without_schema_echo(item["arguments"])))
    return calls


# Keys a bare call object may carry beside name and arguments: small models copy them from the tool's
# JSON schema in the prompt ({"name": ..., "arguments": ..., "return": {"type": "string", ...}}).
CALL_KEYS = {"name", "arguments", "type", "description", "return", "returns"}


def without_schema_echo(args: dict) -> dict:
    """The arguments without a copied `"required": ["index"]`: Qwen2.5-Coder-0.5B adds the schema's
    required list to almost every call (on 2026-12-04, every ledger call of 8 examples, inline or not),
    and a tool then fails on the unexpected keyword, so the model never sees a result. Only a list of
    strings naming the call's own or no keys is dropped; a real argument called `required` is kept."""
    echo = args.get("required")
    if isinstance(echo, list) and all(isinstance(k, str) for k in echo) and set(echo) <= set(args) - {"required"}:
        return {k: v for k, v in args.items() if k != "required"}
    return args


def _json_values(text: str) -> list:
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


def stop_ids(tokenizer, model=None) -> list[int]:
    """Tokens that end an assistant turn: eos, <|im_end|>-style end markers, generation config's eos."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for text in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
        tid = tokenizer.convert_tokens_to_ids(text)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid is not None and tid >= 0:
            ids.add(tid)
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for tid in (gen if isinstance(gen, list) else [gen]):
        if isinstance(tid, int):
            ids.add(tid)
    return sorted(ids)
