"""calc_chain: chained arithmetic that a small model cannot do reliably in its head.

"Start with 482. Multiply it by 37, then subtract 915, then add 204. What is the
result?" The calculator tool does one binary operation per call, so the chain needs
one tool call per step; operands are large enough that guessing fails.

Knob `calculator` (default true): when false no tool is offered at all. The eval format lists none,
the system prompt asks for the arithmetic to be worked out in the reply, and the first reply is
final (one turn). It is the rung below every tool-using one, for a model that cannot drive a tool yet:
with the calculator listed, SmolLM2-135M-Instruct writes code or copies the tool's schema and never
answers; without it, it adds single digits right but never writes the 'Answer:' line the scorer reads,
which a short GRPO job on a laptop's CPU teaches it (docs/cpu-learning.md). A true `calculator` is left
out of the difficulty's dump, so existing specs, hidden-set seeds and baselines are unchanged.
"""

from __future__ import annotations

import random
import re
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from ait.contract import EvalFormat, ToolParam, ToolSpec
from ait.families.base import Example, Family, ToolCall

# The calculator, the exact arithmetic the generator and the scorer share with it, and the system
# prompts are the stdlib-only module every workspace gets as task_tools.py: one source for the hidden
# eval and the jobs.
from ait.job.task_tools.calc_chain import MAX_MAGNITUDE, NO_TOOL_SYSTEM_PROMPT, TOOL_SYSTEM_PROMPT, apply_op
from ait.job.task_tools.calc_chain import format_number, make_tools, to_number

PHRASES = {
    "+": ["add {b}", "increase it by {b}", "add another {b}"],
    "-": ["subtract {b}", "decrease it by {b}", "take away {b}"],
    "*": ["multiply it by {b}", "multiply the result by {b}", "scale it by a factor of {b}"],
    "/": ["divide it by {b}", "split it into {b} equal parts and keep one part"],
}
ANSWER_RE = re.compile(r"answer\s*[:=]\s*([-+−]?\s*[\d,]+(?:\.\d+)?)", re.IGNORECASE)
NO_TOOL_MAX_NEW_TOKENS = 64
"""The reply's budget where no calculator is offered: '7 + 8 = 15' and the Answer line take about 15 tokens,
and every decoded token is paid for twice (pre and post) on a CPU."""


class CalcDifficulty(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n_ops: int = Field(default=3, ge=1, le=12)
    """Operations chained after the starting number."""
    operand_min: int = Field(default=2, ge=1)
    """Smallest operand."""
    operand_max: int = Field(default=999, ge=2, le=10**6)
    """Largest operand."""
    operators: str = Field(default="+-*", pattern=r"^[+\-*/]+$")
    """Which operators may appear ('/' only ever divides exactly)."""
    calculator: bool = True
    """False: no tool is offered (the eval lists none, the system prompt asks for the arithmetic in the
    reply, one turn): the rung for a model that cannot drive a tool yet. Left out of the dump while true,
    so specs and hidden-set seeds without it are unchanged."""

    @model_serializer(mode="wrap")
    def _omit_default_calculator(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        if isinstance(data, dict) and self.calculator:
            data.pop("calculator", None)
        return data

    @model_validator(mode="after")
    def _range(self) -> "CalcDifficulty":
        if self.operand_min >= self.operand_max:
            raise ValueError("operand_min must be below operand_max")
        if self.operand_max ** (self.n_ops + 1) > MAX_MAGNITUDE:
            raise ValueError("operand_max ** (n_ops + 1) must stay below 1e100 so every value fits the calculator")
        return self


def normalize_number(text: str) -> str | None:
    """'1,234' / '+1234' / '1234.0' / '−5' -> canonical string; None if not a number (exact, no floats)."""
    try:
        return format_number(to_number(text.replace(" ", "").lstrip("+")))
    except (ArithmeticError, ValueError):
        return None


MAX_DIVISOR = 2000  # bounded search keeps generation fast for huge intermediate values


def exact_divisors(value: int, lo: int, hi: int) -> list[int]:
    """Exact divisors of value in [max(lo, 2), min(hi, MAX_DIVISOR)]."""
    return [k for k in range(max(lo, 2), min(hi, MAX_DIVISOR) + 1) if value % k == 0]


class CalcChain(Family):
    name = "calc_chain"
    calibrated = {"n_ops": 1, "operand_min": 2, "operand_max": 99, "operators": "+-*"}  # Qwen2.5-Coder-0.5B 0.525, n=200
    description = (
        "Chained arithmetic: start from a number and apply a sequence of operations with "
        "large operands. The model must use the calculator tool once per step and report "
        "the exact final integer."
    )
    Difficulty = CalcDifficulty

    def describe(self, difficulty: BaseModel) -> str:
        if CalcDifficulty.model_validate(difficulty.model_dump()).calculator:
            return self.description
        return ("Chained arithmetic: start from a number and apply a sequence of operations. The model "
                "works each step out itself and reports the exact final integer.")

    def example(self, rng: random.Random, difficulty: BaseModel) -> Example:
        d = CalcDifficulty.model_validate(difficulty.model_dump())
        value = rng.randint(d.operand_min, d.operand_max)
        steps: list[dict[str, Any]] = []
        phrases = []
        for _ in range(d.n_ops):
            op = rng.choice(d.operators)
            if op == "/":
                divisors = exact_divisors(value, d.operand_min, d.operand_max)
                if not divisors:  # no exact divisor: fall back to another operator
                    op = rng.choice([o for o in d.operators if o != "/"] or ["+"])
            b = rng.choice(divisors) if op == "/" else rng.randint(d.operand_min, d.operand_max)
            steps.append({"a": value, "op": op, "b": b})
            phrases.append(rng.choice(PHRASES[op]).format(b=b))
            value = apply_op(value, op, b)  # ints only: '/' always divides exactly
        start = steps[0]["a"]
        chain = ", then ".join(phrases)
        prompt = f"Start with {start}. {chain[0].upper()}{chain[1:]}. What is the final result?"
        return Example(prompt=prompt, world={"steps": steps}, answer=str(value))

    def tools(self, world: dict[str, Any]) -> list[Callable[..., str]]:
        return make_tools(world)  # stateless: the world is only used by gold_trace

    def score(self, response: str, answer: str) -> float:
        matches = ANSWER_RE.findall(response or "")
        if not matches:
            return 0.0
        return 1.0 if normalize_number(matches[-1]) == normalize_number(answer) else 0.0

    def gold_trace(self, example: Example) -> list[ToolCall]:
        return [ToolCall(name="calculator", arguments=dict(s)) for s in example.world["steps"]]

    def eval_format(self, difficulty: BaseModel) -> EvalFormat:
        d = CalcDifficulty.model_validate(difficulty.model_dump())
        if not d.calculator:
            return EvalFormat(
                system_prompt=NO_TOOL_SYSTEM_PROMPT, tools=[],
                answer_format="The last line of the reply is 'Answer: <integer>', e.g. 'Answer: -1234'.",
                max_turns=1, max_new_tokens=NO_TOOL_MAX_NEW_TOKENS,
            )
        return EvalFormat(
            system_prompt=TOOL_SYSTEM_PROMPT,
            tools=[
                ToolSpec(
                    name="calculator",
                    description="Apply one binary arithmetic operation: returns a op b as text "
                    "(integers printed without a decimal point; errors start with 'error:').",
                    parameters=[
                        ToolParam(name="a", type="number", description="left operand"),
                        ToolParam(name="op", type="string", description='one of "+", "-", "*", "/"'),
                        ToolParam(name="b", type="number", description="right operand"),
                    ],
                    returns="the result as text",
                    example={"a": 12, "op": "*", "b": 34},
                )
            ],
            answer_format="The last line of the final reply is 'Answer: <integer>', e.g. 'Answer: -1234'.",
            max_turns=d.n_ops + 2,
            max_new_tokens=96,
        )
