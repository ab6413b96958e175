"""calc_chain: chained arithmetic that a small model cannot do reliably in its head.

"Start with 482. Multiply it by 37, then subtract 915, then add 204. What is the
result?" The calculator tool does one binary operation per call, so the chain needs
one tool call per step; operands are large enough that guessing fails.
"""

from __future__ import annotations

import random
import re
from decimal import Decimal
from fractions import Fraction
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ait.contract import EvalFormat, ToolParam, ToolSpec
from ait.families.base import Example, Family, ToolCall

OPS = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide"}
PHRASES = {
    "+": ["add {b}", "increase it by {b}", "add another {b}"],
    "-": ["subtract {b}", "decrease it by {b}", "take away {b}"],
    "*": ["multiply it by {b}", "multiply the result by {b}", "scale it by a factor of {b}"],
    "/": ["divide it by {b}", "split it into {b} equal parts and keep one part"],
}
MAX_MAGNITUDE = 10**100  # above any gold value the difficulty bounds allow; keeps tool output short
MAX_EXPONENT = 120  # a number's decimal exponent, either way: beyond MAX_MAGNITUDE, and cheap to make exact
MAX_NUMBER_TEXT = 400  # characters of one number's text
ANSWER_RE = re.compile(r"answer\s*[:=]\s*([-+−]?\s*[\d,]+(?:\.\d+)?)", re.IGNORECASE)


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

    @model_validator(mode="after")
    def _range(self) -> "CalcDifficulty":
        if self.operand_min >= self.operand_max:
            raise ValueError("operand_min must be below operand_max")
        if self.operand_max ** (self.n_ops + 1) > MAX_MAGNITUDE:
            raise ValueError("operand_max ** (n_ops + 1) must stay below 1e100 so every value fits the calculator")
        return self


def to_number(x: object) -> int | Fraction:
    """Exact value of a tool argument: ints stay ints (no float rounding past 2**53)."""
    if isinstance(x, bool):
        raise ValueError("a boolean is not a number")
    if isinstance(x, int):
        return x
    text = str(x).strip().replace(",", "").replace("−", "-")
    if len(text) > MAX_NUMBER_TEXT:  # a number's digits are parsed in linear time, but not a page of them
        raise ValueError("too many digits")
    d = Decimal(text)
    if not d.is_finite():
        raise ValueError("not a finite number")
    if d and not -MAX_EXPONENT <= d.adjusted() <= MAX_EXPONENT:
        # Fraction("1e999999999") would build a billion-digit integer: the eval would spin until its timeout
        raise ValueError("out of range")
    f = Fraction(d)
    return f.numerator if f.denominator == 1 else f


def format_number(x: int | Fraction) -> str:
    """Integers without a decimal point; other values rounded to 6 decimals."""
    if isinstance(x, int) or x.denominator == 1:
        return str(int(x))
    return f"{Decimal(x.numerator) / Decimal(x.denominator):.6f}".rstrip("0").rstrip(".")


def normalize_number(text: str) -> str | None:
    """'1,234' / '+1234' / '1234.0' / '−5' -> canonical string; None if not a number (exact, no floats)."""
    try:
        return format_number(to_number(text.replace(" ", "").lstrip("+")))
    except (ArithmeticError, ValueError):
        return None


def apply_op(a: int | Fraction, op: str, b: int | Fraction) -> int | Fraction:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        q = Fraction(a) / Fraction(b)
        return q.numerator if q.denominator == 1 else q
    raise ValueError(f"unknown operator {op!r}")


def calculator(a: float, op: str, b: float) -> str:
    """Apply one arithmetic operation to two numbers and return the result.

    Args:
        a: The left operand.
        op: The operator, one of "+", "-", "*", "/".
        b: The right operand.

    Returns:
        The result as text, or a line starting with "error:".
    """
    try:
        a, b = to_number(a), to_number(b)
    except (ArithmeticError, ValueError, TypeError):
        return "error: a and b must be finite numbers"
    if op not in OPS:
        return f"error: op must be one of + - * /, got {op!r}"
    if op == "/" and b == 0:
        return "error: division by zero"
    result = apply_op(a, op, b)
    if abs(result) > MAX_MAGNITUDE:
        return "error: result out of range (magnitude above 1e100)"
    return format_number(result)


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
        return [calculator]  # stateless: the world is only used by gold_trace

    def score(self, response: str, answer: str) -> float:
        matches = ANSWER_RE.findall(response or "")
        if not matches:
            return 0.0
        return 1.0 if normalize_number(matches[-1]) == normalize_number(answer) else 0.0

    def gold_trace(self, example: Example) -> list[ToolCall]:
        return [ToolCall(name="calculator", arguments=dict(s)) for s in example.world["steps"]]

    def eval_format(self, difficulty: BaseModel) -> EvalFormat:
        d = CalcDifficulty.model_validate(difficulty.model_dump())
        return EvalFormat(
            system_prompt=(
                "You are a careful assistant that solves arithmetic with a calculator tool. "
                "Call the calculator once for each operation, in order, using the previous "
                "result as the next left operand. When done, reply with the final line "
                "'Answer: <integer>'."
            ),
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
