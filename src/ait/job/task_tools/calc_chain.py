"""calc_chain's tool interface, shipped read-only into the workspace: `import task_tools as tt`.

    SYSTEM_PROMPT           the task's system prompt (the no-tool one when task.json sets calculator: false)
    Environment             the task's tool: calculator(a, op, b); none when task.json sets calculator: false
    make_tools(world)       the hidden eval's own tool as a plain function: [calculator], exact
    task_difficulty()       task.json's knobs: n_ops, operand_min, operand_max, operators, calculator
    make_row(rng, d)        one row {prompt, answer, info: {"n_ops"}}: a chain at knobs d
    distinct_rows(n, draw)  up to n rows with distinct prompts from draw()
    parse_answer(text)      the last 'Answer: <integer>' as a string of digits (commas dropped), or None
    gold(answer)            the row's answer as parse_answer returns it
"""

import json
import math
import random
import re
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

TOOL_SYSTEM_PROMPT = (
    "You are a careful assistant that solves arithmetic with a calculator tool. "
    "Call the calculator once for each operation, in order, using the previous "
    "result as the next left operand. When done, reply with the final line "
    "'Answer: <integer>'."
)
NO_TOOL_SYSTEM_PROMPT = (
    "You are a careful assistant that solves arithmetic. Work out each operation in order. "
    "When done, reply with the final line 'Answer: <integer>'."
)
"""The system prompt where the task offers no calculator (task.json's difficulty sets calculator: false)."""
PHRASES = {
    "+": ["add {b}", "increase it by {b}"],
    "-": ["subtract {b}", "decrease it by {b}"],
    "*": ["multiply it by {b}", "multiply the result by {b}"],
}


OPS = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide"}
MAX_MAGNITUDE = 10**100  # above any gold value the difficulty bounds allow; keeps tool output short
MAX_EXPONENT = 120  # a number's decimal exponent, either way: beyond MAX_MAGNITUDE, and cheap to make exact
MAX_NUMBER_TEXT = 400  # characters of one number's text


def to_number(x):
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


def format_number(x):
    """Integers without a decimal point; other values rounded to 6 decimals."""
    if isinstance(x, int) or x.denominator == 1:
        return str(int(x))
    return f"{Decimal(x.numerator) / Decimal(x.denominator):.6f}".rstrip("0").rstrip(".")


def apply_op(a, op, b):
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


# ---------------------------------------------------------------- tools


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


def make_tools(world):
    """The task's tools over one world, as plain functions: the hidden eval's own (ait.families.calc_chain
    returns these, and the eval's chat template shows their docstrings). The calculator reads no world."""
    return [calculator]


class Environment:
    def reset(self, info: dict) -> None:
        self.calls = 0

    def calculator(self, a: float, op: str, b: float) -> str:
        """Apply one arithmetic operation to two numbers and return the result.

        Args:
            a: The left operand.
            op: The operator, one of "+", "-", "*", "/".
            b: The right operand.
        """
        self.calls = getattr(self, "calls", 0) + 1
        # Computes in floats, unlike calculator() above (the hidden eval's, exact): the training tool has
        # always answered this way, and answering as the eval does would change what jobs train on.
        try:
            a, b = float(a), float(b)
        except (TypeError, ValueError):
            return "error: a and b must be numbers"
        if op == "+":
            r = a + b
        elif op == "-":
            r = a - b
        elif op == "*":
            r = a * b
        elif op == "/":
            if b == 0:
                return "error: division by zero"
            r = a / b
        else:
            return f"error: op must be one of + - * /, got {op!r}"
        if not math.isfinite(r):  # float("1e999") is inf: int(inf) would raise out of the tool
            return "error: result out of range"
        return str(int(r)) if r == int(r) else f"{r:.6f}".rstrip("0").rstrip(".")


def task_difficulty() -> dict:
    """The task's difficulty knobs from task.json next to this file ({} when it is not there)."""
    try:
        difficulty = json.loads(Path(__file__).with_name("task.json").read_text()).get("difficulty", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return difficulty if isinstance(difficulty, dict) else {}


class NoToolEnvironment:
    """The task offers no tool (calculator: false): nothing to call, the reply is the answer."""

    def reset(self, info: dict) -> None:
        pass


def _calculator(difficulty):
    """Whether the task offers the calculator (knob "calculator", true by default)."""
    flag = difficulty.get("calculator", True)
    return not (flag is False or (isinstance(flag, str) and flag.strip().lower() == "false"))


SYSTEM_PROMPT = TOOL_SYSTEM_PROMPT
if not _calculator(task_difficulty()):
    SYSTEM_PROMPT, Environment = NO_TOOL_SYSTEM_PROMPT, NoToolEnvironment  # noqa: F811 - the task's own choice


def make_row(rng: random.Random, difficulty: dict) -> dict:
    """A chain of n_ops operations (2-4 when unset) on operands in operand_min..operand_max (2..999),
    drawn from `operators` (+ - * by default)."""
    lo, hi = int(difficulty.get("operand_min", 2)), int(difficulty.get("operand_max", 999))
    ops = [o for o in difficulty.get("operators", "+-*") if o in PHRASES] or list(PHRASES)
    n_ops = difficulty.get("n_ops")
    value = rng.randint(lo, hi)
    start, parts = value, []
    for _ in range(int(n_ops) if n_ops else rng.randint(2, 4)):
        op, b = rng.choice(ops), rng.randint(lo, hi)
        parts.append(rng.choice(PHRASES[op]).format(b=b))
        value = value + b if op == "+" else value - b if op == "-" else value * b
    chain = ", then ".join(parts)
    prompt = f"Start with {start}. {chain[0].upper()}{chain[1:]}. What is the final result?"
    return {"prompt": prompt, "answer": str(value), "info": {"n_ops": len(parts)}}


def distinct_rows(n: int, draw) -> list:
    """Up to n rows from draw() with distinct prompts (None draws skipped; gives up after 50*n draws,
    as a tiny difficulty has fewer distinct problems than asked for)."""
    rows, seen = [], set()
    for _ in range(50 * n):
        if len(rows) == n:
            break
        row = draw()
        if row is not None and row["prompt"] not in seen:
            seen.add(row["prompt"])
            rows.append(row)
    return rows


def parse_answer(text):
    found = re.findall(r"answer\s*[:=]\s*(-?[\d,]+)", text or "", re.IGNORECASE)
    return found[-1].replace(",", "") if found else None


def gold(answer):
    return answer
