"""Batched, greedy, multi-turn tool rollouts for the hidden eval.

Only the family's own tools run here (never agent code). Each turn renders every
unfinished conversation with the model's chat template (tools included), generates
greedily (ait.train.decode: static KV cache, CUDA graphs on a GPU), parses tool calls, and executes them against the example's
world. A conversation finishes when the model answers without a tool call or the
turn budget runs out.

Rendering the prompt and reading a reply back are ait.chat.renderers.HFRenderer's, shared with the
training rollouts and the HF policy.
"""

from __future__ import annotations

from typing import Any

from ait.chat.renderers import HFRenderer, stop_ids
from ait.chat.types import ToolCall
from ait.contract import EvalFormat
from ait.families import Example, Family
from ait.families.base import call_bound


class GreedyGenerator:
    """Greedy batched generation through ait.train.decode (static KV cache; CUDA graphs on GPU)."""

    def __init__(self, model, tokenizer):
        from ait.train.decode import Decoder

        self.decoder = Decoder(model, stop_ids=stop_ids(tokenizer, model), pad_id=tokenizer.pad_token_id)

    def __call__(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        return [s.ids for s in self.decoder.generate(prompts, max_new_tokens, temperature=0.0)]


def run_conversations(model, tokenizer, family: Family, fmt: EvalFormat, examples: list[Example],
                      batch_size: int = 256, generate=None) -> list[list[dict[str, Any]]]:
    """Roll out every example; returns each full conversation (system, user, assistant, tool...).
    `generate(prompt_ids_list, max_new_tokens) -> reply ids per prompt`; default: greedy on `model`."""
    generate = generate or GreedyGenerator(model, tokenizer)
    renderer = HFRenderer(tokenizer)
    offered = {t.name for t in fmt.tools}  # the eval exposes the format's tools, none where it lists none
    tool_fns = [fn for fn in family.tools(examples[0].world) if fn.__name__ in offered] if examples else []
    convs = [[{"role": "system", "content": fmt.system_prompt}, {"role": "user", "content": ex.prompt}]
             for ex in examples]
    # once per conversation: tools may keep state
    bound = [{name: fn for name, fn in family.bind_tools(ex.world).items() if name in offered} for ex in examples]
    active = list(range(len(examples)))
    for _turn in range(fmt.max_turns):
        if not active:
            break
        still_active = []
        for start in range(0, len(active), batch_size):
            batch = active[start:start + batch_size]
            prompts = [renderer.build_generation_prompt(convs[i], tool_fns) for i in batch]
            for i, prompt_ids, ids in zip(batch, prompts, generate(prompts, fmt.max_new_tokens)):
                content, calls = renderer.parse_response(ids, prompt_ids)
                # JSON can spell a lone surrogate ("\ud800"), which no tokenizer encodes: the next turn's
                # prompt would fail the whole eval, on text the trained model chose to write.
                content = scrub(content)
                calls = [ToolCall(name=scrub(c.name), arguments=scrub(c.arguments)) for c in calls]
                msg: dict[str, Any] = {"role": "assistant", "content": content}
                if calls:
                    msg["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                         for c in calls]
                convs[i].append(msg)
                if calls:
                    for c in calls:
                        convs[i].append({"role": "tool", "name": c.name, "content": scrub(call_bound(bound[i], c))})
                    still_active.append(i)
        active = still_active
    return convs


def scrub(value: Any) -> Any:
    """`value` with every string (in dicts and lists too, keys included) made encodable as UTF-8:
    a lone surrogate becomes '?'."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def final_response(conv: list[dict[str, Any]]) -> str:
    for msg in reversed(conv):
        if msg["role"] == "assistant":
            return msg.get("content") or ""
    return ""
