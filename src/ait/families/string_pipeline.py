"""string_pipeline: composed string transforms on a string the prompt does not contain.

"Take record R7. Reverse it, then rotate it left by 3, then replace every 'a' with 'x'.
What is the resulting string?" The record's text (a random mix of letters and digits)
lives only in the world: the model must fetch it with `get_record`, then apply each step
with one `transform` call, feeding every result into the next call, and report the exact
final string (case-sensitive).

Defaults (provisional, to be calibrated on a GPU): n_transforms=3 (four dependent tool
calls: one fetch and three transforms), strings of 10-16 characters, all eleven ops,
rotations and Caesar shifts of 1-5, four records per world (the target plus three
distractors, so reading the wrong id gives a wrong answer). Reasoning: a small untrained
model cannot guess the hidden string at all, so its score comes only from running the
chain; mapping a phrase to an op name and copying the previous result forward three
times is within reach of a 0.6B-1.7B tool-calling model but error-prone, which should
land the base score in the weak-but-not-hopeless band. Every step is drawn so that it
changes the string (no no-op steps), so skipping a step always gives a wrong answer.

Knob `inline` (default false; the same knob in every family): when true the question states
the record's text ("Take record R7, whose text is \"aB3xY\". Reverse it, ... What is the
resulting string? End your reply with the line 'Answer: <string>'."), so a model that cannot
yet chain a fetch into the transforms still has an easy rung (the closing reminder is what makes
Qwen2.5-Coder-0.5B write an Answer line instead of a tool-call JSON object). The tools stay
available and behave the same, the gold answer is computed exactly as without it (the same
draws from the rng), and the system prompt says the text is in the question (get_record is
optional; transform gives exact results). A false `inline` is left out of the difficulty's
dump, so existing specs, hidden-set seeds and baselines keyed by the difficulty are unchanged.
"""

from __future__ import annotations

import random
import re
import string
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ait.contract import EvalFormat, ToolParam, ToolSpec
from ait.families.base import Example, Family, InlineDifficulty, ToolCall

# The tools, and the transforms the generator shares with them, are the stdlib-only module every
# workspace gets as task_tools.py: one source for the hidden eval and the jobs. Its helpers keep their
# leading underscore there, so what env.py sees of the module (and the probe's hints, which list its
# public names) stays the surface its docstring documents.
from ait.job.task_tools.string_pipeline import NUMERIC_OPS, OPS, apply_transform, make_tools

OP_HELP = {
    "reverse": "reverse the string",
    "upper": "uppercase every letter",
    "lower": "lowercase every letter",
    "rotate_left": "move the first N characters to the end (arg: N)",
    "rotate_right": "move the last N characters to the front (arg: N)",
    "replace": "replace every occurrence of A with B, case-sensitive (arg: 'A->B')",
    "drop_vowels": "remove the vowels a, e, i, o, u (either case)",
    "every_other": "keep the characters at positions 0, 2, 4, ... (the 1st, 3rd, 5th, ...)",
    "caesar": "shift every letter N places forward in the alphabet, wrapping, keeping case; digits unchanged (arg: N)",
    "sort_chars": "sort the characters in ASCII order (digits, then uppercase, then lowercase)",
    "dedupe": "remove repeated characters, keeping the first occurrence of each (case-sensitive)",
}
PHRASES = {
    "reverse": ["reverse it", "write it backwards"],
    "upper": ["convert it to uppercase", "make every letter uppercase"],
    "lower": ["convert it to lowercase", "make every letter lowercase"],
    "rotate_left": ["rotate it left by {n}", "move its first {n} characters to the end"],
    "rotate_right": ["rotate it right by {n}", "move its last {n} characters to the front"],
    "replace": ["replace every '{a}' with '{b}'", "change each '{a}' into '{b}'"],
    "drop_vowels": ["remove the vowels", "drop every vowel"],
    "every_other": ["keep every other character, starting with the first",
                    "take the characters at even positions (0, 2, 4, ...)"],
    "caesar": ["apply a Caesar shift of {n}", "shift every letter {n} places forward in the alphabet"],
    "sort_chars": ["sort its characters", "arrange its characters in ASCII order"],
    "dedupe": ["remove repeated characters, keeping the first of each", "delete duplicate characters"],
}
SYSTEM_PROMPT = (
    "You are a careful assistant that transforms strings with tools. First call "
    "get_record with the record id from the question to fetch its text. Then apply "
    "each requested step in order with one transform call, passing the previous "
    "result as text. When done, reply with the final line 'Answer: <string>', "
    "copying the last result exactly (case matters)."
)
INLINE_SYSTEM_PROMPT = (
    "You are a careful assistant that transforms strings. The question states the record's "
    "text, so you do not need get_record. Apply each requested step in order, starting from "
    "that text. The tools are optional, but transform gives exact results: call it once per "
    "step, passing the previous result as text. When done, reply with the final line "
    "'Answer: <string>', copying the final result exactly (case matters)."
)
INLINE_REMINDER = " End your reply with the line 'Answer: <string>'."
"""Closes an inline question: with the tools listed, Qwen2.5-Coder-0.5B otherwise answers an inline
question with a tool-call JSON object (often with a made-up "return" field) and never writes the
Answer line; this sentence in the question (not the system prompt) makes it answer."""
ALPHABET = string.ascii_letters + string.digits
ANSWER_RE = re.compile(r"answer\**\s*[:=]\**[ \t]*([^\n]*)", re.IGNORECASE)
STRIP_CHARS = " \t\r\n\"'`"


class StringDifficulty(InlineDifficulty):
    model_config = ConfigDict(extra="forbid")

    n_transforms: int = Field(default=3, ge=1, le=10)
    """Transforms chained after fetching the record (one transform call each)."""
    min_length: int = Field(default=10, ge=4, le=40)
    """Shortest record string."""
    max_length: int = Field(default=16, ge=4, le=40)
    """Longest record string."""
    ops: list[str] = Field(default_factory=lambda: list(OPS), min_length=1)
    """Which transform ops may appear (names from the transform tool)."""
    max_shift: int = Field(default=5, ge=1, le=25)
    """Rotation amounts and Caesar shifts are drawn from 1..max_shift."""
    n_records: int = Field(default=4, ge=1, le=20)
    """Records in the world (the target plus distractors)."""
    inline: bool = False
    """State the target record's text in the question ("Take record R7, whose text is \"aB3xY\". ...",
    closed by a reminder of the Answer line) instead of leaving it only behind get_record. The tools
    stay available and behave the same, the gold answer is unchanged, and the system prompt says the
    text is in the question (tools optional, transform exact). An easy rung for models that cannot
    yet chain a fetch into further calls. Left out of the dump when false, so specs and hidden-set
    seeds without it are unchanged."""

    @field_validator("ops")
    @classmethod
    def _known_ops(cls, ops: list[str]) -> list[str]:
        unknown = [o for o in ops if o not in OPS]
        if unknown:
            raise ValueError(f"unknown op(s) {unknown}; known: {OPS}")
        if len(set(ops)) != len(ops):
            raise ValueError("ops must not repeat")
        return ops

    @model_validator(mode="after")
    def _lengths(self) -> "StringDifficulty":
        if self.min_length > self.max_length:
            raise ValueError("min_length must not exceed max_length")
        return self


def unanswer(text: str) -> str:
    return text.strip().strip(STRIP_CHARS)


# ---------------------------------------------------------------- the family


class StringPipeline(Family):
    name = "string_pipeline"
    calibrated = {"n_transforms": 1, "min_length": 6, "max_length": 10, "ops": ["reverse", "upper", "lower"],
                  "inline": True}  # Qwen2.5-Coder-0.5B 0.290, n=200
    description = (
        "Composed string transforms: fetch a stored string by its record id (the string is "
        "not in the prompt), then apply a named sequence of transforms (reverse, rotate, "
        "replace, Caesar shift, ...) in order with one transform tool call per step, feeding "
        "each result into the next call, and report the exact final string."
    )
    Difficulty = StringDifficulty

    def example(self, rng: random.Random, difficulty: BaseModel) -> Example:
        d = StringDifficulty.model_validate(difficulty.model_dump())
        ids = rng.sample(range(1, 100), d.n_records)
        records = {f"R{i}": "".join(rng.choice(ALPHABET) for _ in range(rng.randint(d.min_length, d.max_length)))
                   for i in ids}
        target = f"R{ids[0]}" if d.n_records == 1 else f"R{rng.choice(ids)}"
        value = records[target]
        steps: list[dict[str, str]] = []
        phrases: list[str] = []
        for _ in range(d.n_transforms):
            op, arg, phrase, out = self._draw_step(rng, d, value)
            steps.append({"op": op, "arg": arg})
            phrases.append(phrase)
            value = out
        chain = ", then ".join(phrases)
        prompt = f"Take record {target}. {chain[0].upper()}{chain[1:]}. What is the resulting string?"
        if d.inline:
            prompt = (f'Take record {target}, whose text is "{records[target]}". {chain[0].upper()}{chain[1:]}. '
                      f"What is the resulting string?{INLINE_REMINDER}")
        world = {"records": records, "record_id": target, "steps": steps}
        return Example(prompt=prompt, world=world, answer=value)

    @staticmethod
    def _draw_step(rng: random.Random, d: StringDifficulty, value: str) -> tuple[str, str, str, str]:
        """One (op, arg, phrase, result) that changes the string and keeps it non-empty."""
        fallback = None
        for _ in range(40):
            op = rng.choice(d.ops)
            template = rng.choice(PHRASES[op])
            if op in NUMERIC_OPS:
                n = rng.randint(1, d.max_shift)
                arg, phrase = str(n), template.format(n=n)
            elif op == "replace":
                a = rng.choice(sorted(set(value)))
                b = rng.choice([c for c in ALPHABET if c != a])
                arg, phrase = f"{a}->{b}", template.format(a=a, b=b)
            else:
                arg, phrase = "", template
            out = apply_transform(value, op, arg)
            if fallback is None and out:
                fallback = (op, arg, phrase, out)
            if out and out != value:
                return op, arg, phrase, out
        # Every draw was a no-op (e.g. a one-character string): accept a non-empty one.
        if fallback is not None:
            return fallback
        return "reverse", "", PHRASES["reverse"][0], value[::-1]

    def tools(self, world: dict[str, Any]) -> list[Callable[..., str]]:
        return make_tools(world)

    def score(self, response: str, answer: str) -> float:
        matches = ANSWER_RE.findall(response or "")
        if not matches:
            return 0.0
        got = unanswer(matches[-1])
        return 1.0 if got and got == unanswer(answer) else 0.0

    def gold_trace(self, example: Example) -> list[ToolCall]:
        world = example.world
        value = world["records"][world["record_id"]]
        calls = [ToolCall(name="get_record", arguments={"record_id": world["record_id"]})]
        for step in world["steps"]:
            calls.append(ToolCall(name="transform", arguments={"text": value, "op": step["op"], "arg": step["arg"]}))
            value = apply_transform(value, step["op"], step["arg"])
        return calls

    def eval_format(self, difficulty: BaseModel) -> EvalFormat:
        d = StringDifficulty.model_validate(difficulty.model_dump())
        op_lines = "; ".join(f"{op}: {OP_HELP[op]}" for op in OPS)
        return EvalFormat(
            system_prompt=INLINE_SYSTEM_PROMPT if d.inline else SYSTEM_PROMPT,
            tools=[
                ToolSpec(
                    name="get_record",
                    description="Fetch a record's stored text by its id (e.g. 'R7'); unknown ids give "
                    "a text starting with 'error:'.",
                    parameters=[ToolParam(name="record_id", type="string", description="the record id, e.g. 'R7'")],
                    returns="the record's text",
                    example={"record_id": "R1"},
                ),
                ToolSpec(
                    name="transform",
                    description=f"Apply one string transform to text and return the result. Ops: {op_lines}. "
                    "Errors start with 'error:'.",
                    parameters=[
                        ToolParam(name="text", type="string", description="the text to transform"),
                        ToolParam(name="op", type="string", description="the op name, e.g. 'rotate_left'"),
                        ToolParam(name="arg", type="string",
                                  description="N for rotate_left/rotate_right/caesar (e.g. '3'), 'A->B' for "
                                  "replace, '' otherwise"),
                    ],
                    returns="the transformed text",
                    example={"text": "Hello42", "op": "rotate_left", "arg": "2"},
                ),
            ],
            answer_format="The last line of the final reply is 'Answer: <string>' with the exact final "
            "string (case-sensitive), e.g. 'Answer: k3TqXb9'.",
            max_turns=d.n_transforms + 2,
            max_new_tokens=128,
        )
