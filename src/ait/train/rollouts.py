"""Multi-turn tool rollouts for GRPO, built in token space.

Each rollout's token sequence is extended exactly as sampled: prompt, the sampled reply
(kept verbatim, never re-rendered), then the chat template's rendering of the tool
results and the next assistant header. So the sequence the trainer scores is the one the
sampler produced, and only sampled tokens are trained on (tool results are masked).

Tools are the public methods of the agent's `Environment` (one instance per rollout);
a tool that raises answers "error: ..." so the model can recover, as in TRL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch

from ait.chat.renderers import HFRenderer
from ait.train.decode import Decoder, Request, Sample

TOOL_RESULT_CHARS = 4000  # longer tool output is cut: one chatty tool must not fill the context


@dataclass
class Rollout:
    row: dict[str, Any]
    """The dataset row (prompt messages, answer, info JSON)."""
    ids: list[int]
    """The whole sequence: prompt, sampled replies, tool results."""
    prompt_len: int
    """Tokens of the initial prompt."""
    sampled: list[bool] = field(default_factory=list)
    """Per token after the prompt: True where the policy sampled it (trained on)."""
    logprobs: list[float] = field(default_factory=list)
    """Sampling logprob per token after the prompt (0 where not sampled)."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The completion as chat messages (assistant and tool), for reward functions."""
    final: str = ""
    """The last assistant message's text (what the reward and the hidden eval read)."""
    tool_calls: int = 0
    tool_errors: int = 0
    truncated: bool = False
    """Ran out of completion tokens before finishing."""

    @property
    def completion_tokens(self) -> int:
        return sum(self.sampled)


def tool_schemas(surface) -> list[dict[str, Any]]:
    """JSON schemas of the Environment's tools (the same path TRL and the probe use)."""
    from transformers.utils import get_json_schema

    env = surface.env_class()
    return [get_json_schema(getattr(env, name)) for name in surface.tools]


def run_tool(env, tools: set[str], name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
    """(result text, ok). Unknown tools and raising tools answer an error string."""
    if name not in tools:
        return f"error: unknown tool {name!r}; available: {sorted(tools)}", False
    try:
        result = getattr(env, name)(**arguments)
    except Exception as e:  # agent code: any failure becomes the tool's answer
        return f"error: {type(e).__name__}: {e}"[:TOOL_RESULT_CHARS], False
    text = result if isinstance(result, str) else json.dumps(result, default=str)
    return text[:TOOL_RESULT_CHARS], True


class Continuation:
    """Token ids that follow a sampled tool-calling reply: the template's end-of-turn tail,
    the tool results, and the next assistant header. Found by rendering a stand-in
    conversation with the tool messages and taking what follows the assistant turn's end
    marker, so it works for any chat template with per-turn end tokens (ChatML, Llama 3, ...)."""

    def __init__(self, tokenizer, schemas: list[dict[str, Any]]):
        self.tokenizer, self.schemas = tokenizer, schemas
        self.cache: dict[tuple, str | None] = {}  # (stop token, tool names) -> text with placeholders

    def __call__(self, stop_token: int, calls: list[dict[str, Any]], results: list[dict[str, Any]]) -> list[int] | None:
        # Rendering the template twice per tool call costs more CPU than a decode step, so the
        # text is rendered once per (stop token, tool names) with placeholder results and the
        # real results substituted, when the template copies results verbatim (checked).
        key = (stop_token, tuple(r["name"] for r in results))
        if key not in self.cache:
            marks = [f"\x00ait-result-{i}\x00" for i in range(len(results))]
            text = self.render(stop_token, calls, [{**r, "content": m} for r, m in zip(results, marks)])
            ok = text is not None and all(text.count(m) == 1 for m in marks)
            self.cache[key] = text if ok else None
        template = self.cache[key]
        if template is None:
            text = self.render(stop_token, calls, results)
        else:
            text = template
            for i, r in enumerate(results):
                text = text.replace(f"\x00ait-result-{i}\x00", r["content"], 1)
        return None if text is None else self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def render(self, stop_token: int, calls: list[dict[str, Any]], results: list[dict[str, Any]]) -> str | None:
        tok = self.tokenizer
        base = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                {"role": "assistant", "content": "", "tool_calls": calls}]
        try:
            before = tok.apply_chat_template(base, tools=self.schemas or None, tokenize=False)
            after = tok.apply_chat_template(base + results, tools=self.schemas or None, tokenize=False,
                                            add_generation_prompt=True)
        except Exception:
            return None
        end_text = tok.decode([stop_token], skip_special_tokens=False)
        # The assistant message is the last one `before` closes; in `after` it is closed by the
        # same-numbered end marker. Only what follows it is new (templates may re-render earlier
        # turns differently, e.g. Qwen3 drops the empty think block from non-final turns).
        closed = before.count(end_text) if end_text else 0
        if closed == 0 or after.count(end_text) <= closed:
            return None
        cut = -1
        for _ in range(closed):
            cut = after.index(end_text, cut + 1)
        return after[cut + len(end_text):]


def rollout_batch(decoder: Decoder, tokenizer, surface, rows: list[dict[str, Any]], *, max_completion_length: int,
                  max_turns: int, temperature: float, top_p: float, max_length: int,
                  generator: torch.Generator | None = None, continuous: bool = True) -> list[Rollout]:
    """Sample one multi-turn rollout per row (rows repeat for a GRPO group).

    continuous (the default): a row whose tool results are in goes back into the running batch at once
    (the decoder's continuous API), so a step decodes about as long as its longest rollout. Turn by turn
    (continuous=False), every turn waits for the turn's longest reply, and the step decodes the sum of
    the turns' longest replies: a row that answers in one short turn still waits out another's long one.
    Both build every rollout the same way (`take`); only the order of the decoder's work differs
    (bench/rollout_schedule.py measures the two)."""
    schemas = tool_schemas(surface)
    continuation = Continuation(tokenizer, schemas)
    names = set(surface.tools)
    renderer = HFRenderer(tokenizer)  # the hidden eval and the HF policy read replies through it too
    envs, rollouts = [], []
    rendered: dict[int, list[int]] = {}  # a GRPO group repeats one row object: render its prompt once
    for row in rows:
        env = surface.env_class()
        if hasattr(env, "reset"):
            env.reset(json.loads(row["info"]) if isinstance(row["info"], str) else row["info"])
        envs.append(env)
        if id(row) not in rendered:
            rendered[id(row)] = renderer.build_generation_prompt(row["prompt"], schemas)
        ids = list(rendered[id(row)])
        rollouts.append(Rollout(row=row, ids=ids, prompt_len=len(ids)))
    remaining = [max_completion_length] * len(rows)
    turns = [0] * len(rows)

    def budget(i: int) -> int:
        return min(remaining[i], max_length - len(rollouts[i].ids))

    def take(i: int, s: Sample) -> bool:
        """Append row i's sampled reply, run its tool calls; True when it goes on with another turn."""
        r, turn = rollouts[i], turns[i]
        turns[i] += 1
        ids, lps, stopped = s.ids[:remaining[i]], s.logprobs[:remaining[i]], s.stopped
        if len(ids) < len(s.ids):
            stopped = False
        prefix = r.ids
        content, calls = renderer.parse_response(ids, prefix)
        r.ids = prefix + ids
        r.sampled += [True] * len(ids)
        r.logprobs += lps
        remaining[i] -= len(ids)
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in calls]
        r.messages.append(msg)
        r.final = content
        if not stopped:
            r.truncated = True
            return False
        if not calls or turn == max_turns:
            return False
        results = []
        for c in calls:
            text, ok = run_tool(envs[i], names, c.name, c.arguments)
            r.tool_calls += 1
            r.tool_errors += not ok
            results.append({"role": "tool", "name": c.name, "content": text})
        r.messages += results
        tail = continuation(ids[-1], msg["tool_calls"], results)
        if tail is None or len(r.ids) + len(tail) >= max_length:
            return False
        r.ids += tail
        r.sampled += [False] * len(tail)
        r.logprobs += [0.0] * len(tail)
        return budget(i) > 0

    if continuous:
        run_continuous(decoder, rollouts, budget, take, temperature, top_p, generator)
    else:
        run_turn_by_turn(decoder, rollouts, remaining, max_length, take, max_turns, temperature, top_p, generator)
    return rollouts


def run_continuous(decoder: Decoder, rollouts: list[Rollout], budget, take, temperature: float, top_p: float,
                   generator: torch.Generator | None) -> None:
    def request(i: int) -> Request:
        return Request(list(rollouts[i].ids), budget(i), temperature, top_p, tag=i)

    def done(req: Request) -> None:
        if take(req.tag, req.sample()):
            decoder.submit([request(req.tag)])

    decoder.run([request(i) for i in range(len(rollouts)) if budget(i) > 0], done, generator,
                caller="rollout_batch()")


def run_turn_by_turn(decoder: Decoder, rollouts: list[Rollout], remaining: list[int], max_length: int, take,
                     max_turns: int, temperature: float, top_p: float, generator: torch.Generator | None) -> None:
    active = list(range(len(rollouts)))
    for _ in range(max_turns + 1):
        active = [i for i in active if remaining[i] > 0 and len(rollouts[i].ids) < max_length]
        if not active:
            break
        # one batch per turn, one length for all: the largest budget, within the longest row's room
        n = min(max(remaining[i] for i in active), max_length - max(len(rollouts[i].ids) for i in active))
        if n <= 0:
            break
        samples = decoder.generate([rollouts[i].ids for i in active], n, temperature, top_p, generator)
        active = [i for i, s in zip(active, samples) if take(i, s)]
