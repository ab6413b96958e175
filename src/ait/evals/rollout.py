"""Batched, greedy, multi-turn tool rollouts for the hidden eval.

Only the family's own tools run here (never agent code). A conversation's turn renders it with the
model's chat template (tools included), generates greedily (ait.train.decode: static KV cache, CUDA
graphs on a GPU), parses tool calls, and executes them against the example's world. A conversation
finishes when the model answers without a tool call or the turn budget runs out.

Continuous by default: a conversation whose tool results are in goes back into the running batch at
once (ait.train.decode.Decoder.run), instead of waiting for every other conversation's turn to end, as
the training rollouts do (ait.train.rollouts). Greedy, both give each conversation the same replies
(tests/test_rollout.py); with a `generate` callable the turns run in lock step.

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


def run_conversations(model, tokenizer, family: Family, fmt: EvalFormat, examples: list[Example],
                      batch_size: int = 256, generate=None, decoder=None) -> list[list[dict[str, Any]]]:
    """Roll out every example; returns each full conversation (system, user, assistant, tool...).
    Default: greedy on `model`, continuous, at most `batch_size` conversations decoding at once
    (`decoder`: an ait.train.decode.Decoder to serve them instead of a new one on `model`).
    `generate(prompt_ids_list, max_new_tokens) -> reply ids per prompt`: that instead, turn by turn."""
    renderer = HFRenderer(tokenizer)
    offered = {t.name for t in fmt.tools}  # the eval exposes the format's tools, none where it lists none
    tool_fns = [fn for fn in family.tools(examples[0].world) if fn.__name__ in offered] if examples else []
    convs = [[{"role": "system", "content": fmt.system_prompt}, {"role": "user", "content": ex.prompt}]
             for ex in examples]
    # once per conversation: tools may keep state
    bound = [{name: fn for name, fn in family.bind_tools(ex.world).items() if name in offered} for ex in examples]

    def prompt(i: int) -> list[int]:
        return renderer.build_generation_prompt(convs[i], tool_fns)

    def reply(i: int, prompt_ids: list[int], ids: list[int]) -> bool:
        """Append the model's reply (and its tools' results) to conversation i; True: it called a tool."""
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
        for c in calls:
            convs[i].append({"role": "tool", "name": c.name, "content": scrub(call_bound(bound[i], c))})
        return bool(calls)

    if generate is None:
        if decoder is None:
            from ait.train.decode import Decoder

            decoder = Decoder(model, stop_ids=stop_ids(tokenizer, model), pad_id=tokenizer.pad_token_id,
                              max_batch=batch_size)
        continuous(decoder, fmt, len(examples), prompt, reply)
    else:
        lock_step(generate, fmt, len(examples), batch_size, prompt, reply)
    return convs


def continuous(decoder, fmt: EvalFormat, n: int, prompt, reply) -> None:
    from ait.train.decode import Request

    turns = [0] * n

    def request(i: int) -> Request:
        ids = prompt(i)
        return Request(ids, fmt.max_new_tokens, 0.0, tag=(i, ids))

    def done(req: Request) -> None:
        i, prompt_ids = req.tag
        turns[i] += 1
        if reply(i, prompt_ids, req.ids) and turns[i] < fmt.max_turns:
            decoder.submit([request(i)])

    if fmt.max_turns > 0 and fmt.max_new_tokens > 0:
        decoder.run([request(i) for i in range(n)], done, caller="run_conversations()")


def lock_step(generate, fmt: EvalFormat, n: int, batch_size: int, prompt, reply) -> None:
    active = list(range(n))
    for _turn in range(fmt.max_turns):
        if not active:
            break
        still_active = []
        for start in range(0, len(active), batch_size):
            batch = active[start:start + batch_size]
            prompts = [prompt(i) for i in batch]
            for i, prompt_ids, ids in zip(batch, prompts, generate(prompts, fmt.max_new_tokens)):
                if reply(i, prompt_ids, ids):
                    still_active.append(i)
        active = still_active


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
