"""Reference string_pipeline job: fetch a record, then chain string transforms.

Training rows are task_tools' chains at the task's own difficulty (task.json's knobs: transforms,
lengths, ops, shifts, records, inline). Rewards: full credit for the exact final string, partial
credit for a near miss (a gradient for a weak model), a little for an 'Answer:' line at all.
"""

import difflib
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
    """Partial credit for a near miss: squared similarity of the answer to the gold string."""
    got = tt.parse_answer(completion)
    if got is None:
        return 0.0
    return difflib.SequenceMatcher(None, got, answer).ratio() ** 2


def reward_format(completion: str, answer: str, info: dict) -> float:
    return 1.0 if tt.parse_answer(completion) is not None else 0.0


REWARD_FUNCS = [reward_correct, reward_close, reward_format]
REWARD_WEIGHTS = [1.0, 0.3, 0.1]
