"""Reference calc_chain job: chained arithmetic with the task's calculator (task_tools.py).

Training rows are task_tools' chains at the task's own difficulty (task.json's knobs); rewards give
full credit for the exact answer, partial credit for a close number (a gradient for a weak model)
and a little for the 'Answer:' line.
"""

import random
import re

import task_tools as tt
from task_tools import Environment  # the task's tools, read-only

SYSTEM_PROMPT = tt.SYSTEM_PROMPT


def build_dataset(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    difficulty = tt.task_difficulty()  # train at the task's own knobs
    return tt.distinct_rows(n, lambda: tt.make_row(rng, difficulty))


def reward_correct(completion: str, answer: str, info: dict) -> float:
    got = tt.parse_answer(completion)
    return 1.0 if got is not None and got == tt.gold(answer) else 0.0


def reward_close(completion: str, answer: str, info: dict) -> float:
    """Partial credit for the last number written being near the answer."""
    numbers = re.findall(r"-?\d+", completion or "")
    if not numbers:
        return 0.0
    guess, gold = int(numbers[-1]), int(answer)
    return 1.0 / (1.0 + abs(guess - gold) / max(abs(gold), 1))


def reward_format(completion: str, answer: str, info: dict) -> float:
    return 1.0 if tt.parse_answer(completion) is not None else 0.0


REWARD_FUNCS = [reward_correct, reward_close, reward_format]
REWARD_WEIGHTS = [1.0, 0.3, 0.1]
