"""Reference calc_chain environment: chained arithmetic with a one-operation calculator.

Training prompts mimic the task's phrasing at the task's own difficulty (task.json beside
this file: number of operations, operand range, operators); rewards give full credit for
the exact answer in the eval's format, partial credit for a close number (so a weak model
gets a gradient), and a little for using the calculator.
"""

import json
import random
import re
from pathlib import Path

SYSTEM_PROMPT = (
    "You are a careful assistant that solves arithmetic with a calculator tool. "
    "Call the calculator once for each operation, in order, using the previous "
    "result as the next left operand. When done, reply with the final line "
    "'Answer: <integer>'."
)

PHRASES = {
    "+": ["add {b}", "increase it by {b}"],
    "-": ["subtract {b}", "decrease it by {b}"],
    "*": ["multiply it by {b}", "multiply the result by {b}"],
}


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
        self.calls += 1
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
        return str(int(r)) if r == int(r) else f"{r:.6f}".rstrip("0").rstrip(".")


def task_difficulty() -> dict:
    """The task's difficulty knobs from task.json next to this file ({} when it is not there).
    Training at another difficulty teaches the wrong problems: at an easy rung the model would
    only ever see chains it cannot solve, and learn the shaped rewards instead of the answer."""
    try:
        return json.loads(Path(__file__).with_name("task.json").read_text()).get("difficulty", {})
    except (OSError, ValueError, AttributeError):
        return {}


def _problem(rng: random.Random, difficulty: dict) -> dict:
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


def build_dataset(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    difficulty = task_difficulty()
    rows, seen = [], set()
    for _ in range(50 * n):  # a tiny difficulty has fewer distinct problems than asked for: stop
        if len(rows) == n:
            break
        row = _problem(rng, difficulty)
        if row["prompt"] not in seen:
            seen.add(row["prompt"])
            rows.append(row)
    return rows


def _last_answer(text: str):
    found = re.findall(r"answer\s*[:=]\s*(-?[\d,]+)", text or "", re.IGNORECASE)
    return found[-1].replace(",", "") if found else None


def reward_correct(completion: str, answer: str, info: dict) -> float:
    return 1.0 if _last_answer(completion) == answer else 0.0


def reward_close(completion: str, answer: str, info: dict) -> float:
    """Partial credit for the last number written being near the answer."""
    numbers = re.findall(r"-?\d+", completion or "")
    if not numbers:
        return 0.0
    guess, gold = int(numbers[-1]), int(answer)
    return 1.0 / (1.0 + abs(guess - gold) / max(abs(gold), 1))


def reward_format(completion: str, answer: str, info: dict) -> float:
    return 1.0 if _last_answer(completion) is not None else 0.0


REWARD_FUNCS = [reward_correct, reward_close, reward_format]
REWARD_WEIGHTS = [1.0, 0.3, 0.1]
