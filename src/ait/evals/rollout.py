"""Batched, greedy, multi-turn tool rollouts for the hidden eval.

Only the family's own tools run here (never agent code). Each turn renders every
unfinished conversation with the model's chat template (tools included), generates
greedily with a KV cache, parses tool calls, and executes them against the example's
world. A conversation finishes when the model answers without a tool call or the
turn budget runs out.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from ait.families import Example, Family, ToolCall
from ait.families.base import call_bound
from ait.spec import EvalFormat


def prepare_tokenizer(tokenizer):
    """Left padding and TRL's response parser for known chat templates (tool-call parsing)."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        from trl.chat_template_utils import add_response_schema

        try:
            add_response_schema(tokenizer)
        except ValueError:
            pass  # unknown template: replies are read as plain text (no tool calls)
    return tokenizer


def parse_reply(tokenizer, ids: list[int], text: str, prefix: list[int]) -> tuple[str, list[ToolCall]]:
    """(content, tool calls) of one generated reply; unparseable replies are plain text.
    `prefix` is the rendered prompt's token ids: the response template needs it to find
    where the assistant turn starts (without it, tool calls come back as plain text)."""
    try:
        from trl.chat_template_utils import parse_response

        parsed = parse_response(tokenizer, ids, prefix=prefix)
    except Exception:
        return text, []
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
    return str(parsed.get("content") or ""), calls


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], max_new_tokens: int) -> list[tuple[list[int], list[int]]]:
    """Greedy, batched; returns (prompt ids without padding, reply ids) per prompt."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_p=None,
                         top_k=None, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    pairs = []
    width = enc["input_ids"].shape[1]
    for prompt_row, mask_row, row in zip(enc["input_ids"].tolist(), enc["attention_mask"].tolist(),
                                         out[:, width:].tolist()):
        while row and row[-1] == tokenizer.pad_token_id:
            row.pop()
        pairs.append(([t for t, m in zip(prompt_row, mask_row) if m], row))
    return pairs


def run_conversations(model, tokenizer, family: Family, fmt: EvalFormat, examples: list[Example],
                      batch_size: int = 32) -> list[list[dict[str, Any]]]:
    """Roll out every example; returns each full conversation (system, user, assistant, tool...)."""
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
            prompts = [tokenizer.apply_chat_template(convs[i], tools=tool_fns or None, tokenize=False,
                                                     add_generation_prompt=True) for i in batch]
            for i, (prompt_ids, ids) in zip(batch, generate(model, tokenizer, prompts, fmt.max_new_tokens)):
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
