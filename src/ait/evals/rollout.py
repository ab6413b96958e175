"""Batched, greedy, multi-turn tool rollouts for the hidden eval.

Only the family's own tools run here (never agent code). Each turn renders every
unfinished conversation with the model's chat template (tools included), generates
greedily (ait.train.decode: static KV cache, CUDA graphs on a GPU), parses tool calls, and executes them against the example's
world. A conversation finishes when the model answers without a tool call or the
turn budget runs out.
"""

from __future__ import annotations

import json
from typing import Any

from ait.families import Example, Family, ToolCall
from ait.families.base import call_bound
from ait.spec import EvalFormat


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
            except json.JSONDecodeError:
                args = {}
        if isinstance(fn.get("name"), str) and isinstance(args, dict):
            calls.append(ToolCall(name=fn["name"], arguments=args))
    content = str(parsed.get("content") or "")
    if not calls and (bare := bare_tool_calls(content)):
        return "", bare
    return content, calls


def bare_tool_calls(content: str) -> list[ToolCall]:
    """Tool calls written as bare JSON: one object, a list of objects, or several objects one
    after another (one per line, as small models write parallel calls), each exactly
    {"name": str, "arguments": object}, optionally in a ``` fence; [] for anything else."""
    text = content.strip()
    if text.startswith("```"):
        text = text.split("\n", 1)[1] if "\n" in text else ""
        text = text.rsplit("```", 1)[0] if text.rstrip().endswith("```") else text
    items = _json_values(text.strip())
    if len(items) == 1 and isinstance(items[0], list):
        items = items[0]
    calls = []
    for item in items:
        if not (isinstance(item, dict) and set(item) == {"name", "arguments"} and isinstance(item["name"], str)
                and isinstance(item["arguments"], dict)):
            return []
        calls.append(ToolCall(name=item["name"], arguments=item["arguments"]))
    return calls


def _json_values(text: str) -> list:
    """The JSON values that make up `text` back to back (whitespace between them); [] when any
    part is not JSON, so prose around a call is never half-read as one."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while at < len(text):
        try:
            value, end = decoder.raw_decode(text, at)
        except (json.JSONDecodeError, ValueError):
            return []
        values.append(value)
        at = end
        while at < len(text) and text[at].isspace():
            at += 1
    return values


class GreedyGenerator:
    """Greedy batched generation through ait.train.decode (static KV cache; CUDA graphs on GPU)."""

    def __init__(self, model, tokenizer):
        from ait.train.decode import Decoder
        from ait.train.rollouts import stop_ids

        self.decoder = Decoder(model, stop_ids=stop_ids(tokenizer, model), pad_id=tokenizer.pad_token_id)

    def __call__(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        return [s.ids for s in self.decoder.generate(prompts, max_new_tokens, temperature=0.0)]


def run_conversations(model, tokenizer, family: Family, fmt: EvalFormat, examples: list[Example],
                      batch_size: int = 256, generate=None) -> list[list[dict[str, Any]]]:
    """Roll out every example; returns each full conversation (system, user, assistant, tool...).
    `generate(prompt_ids_list, max_new_tokens) -> reply ids per prompt`; default: greedy on `model`."""
    generate = generate or GreedyGenerator(model, tokenizer)
    tool_fns = family.tools(examples[0].world) if examples else []
    convs = [[{"role": "system", "content": fmt.system_prompt}, {"role": "user", "content": ex.prompt}]
             for ex in examples]
    bound = [family.bind_tools(ex.world) for ex in examples]  # once per conversation: tools may keep state
    active = list(range(len(examples)))
    for _turn in range(fmt.max_turns):
        if not active:
            break
        still_active = []
        for start in range(0, len(active), batch_size):
            batch = active[start:start + batch_size]
            prompts = [tokenizer(tokenizer.apply_chat_template(convs[i], tools=tool_fns or None, tokenize=False,
                                                               add_generation_prompt=True),
                                 add_special_tokens=False)["input_ids"] for i in batch]
            for i, prompt_ids, ids in zip(batch, prompts, generate(prompts, fmt.max_new_tokens)):
                text = tokenizer.decode(ids, skip_special_tokens=True)
                content, calls = parse_reply(tokenizer, ids, text, prompt_ids)
                msg: dict[str, Any] = {"role": "assistant", "content": content}
                if calls:
                    msg["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                         for c in calls]
                convs[i].append(msg)
                if calls:
                    for c in calls:
                        convs[i].append({"role": "tool", "name": c.name, "content": call_bound(bound[i], c)})
                    still_active.append(i)
        active = still_active
    return convs


def final_response(conv: list[dict[str, Any]]) -> str:
    for msg in reversed(conv):
        if msg["role"] == "assistant":
            return msg.get("content") or ""
    return ""
