"""Reference ledger job: process a ledger of transactions with an overdraft rule.

Training rows are task_tools' ledgers at the task's own difficulty (task.json's knobs: accounts,
transactions, fee and overdraft rates, question types, inline). Rewards: full credit for the exact
integer, partial credit for a number near it (a gradient for a weak model), a little for the
'Answer:' line.
"""

import re
import random

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
    """Partial credit for the last number written being near the answer (sign included)."""
    found = re.findall(r"-?\d[\d,]*", completion or "")
    if not found:
        return 0.0
    guess, gold = int(found[-1].replace(",", "")), int(answer)
    return 1.0 / (1.0 + abs(guess - gold) / max(abs(gold), 50))


def reward_format(completion: str, answer: str, info: dict) -> float:
    return 1.0 if tt.parse_answer(completion) is not None else 0.0


REWARD_FUNCS = [reward_correct, reward_close, reward_format]
REWARD_WEIGHTS = [1.0, 0.3, 0.1]
