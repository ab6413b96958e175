"""Reference triage job: find the deploy that caused an incident.

Training rows are task_tools' incidents at the task's own difficulty (task.json's knobs: services,
chain depth, distractor and background deploys, log noise, inline). Rewards: full credit for the
exact service@version, partial credit for the right service (or a deploy that really happened), a
little for the answer format.
"""

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


def reward_partial(completion: str, answer: str, info: dict) -> float:
    """0.5 for the right service with a wrong version; 0.2 for any deploy that really happened."""
    got, gold = tt.parse_answer(completion), tt.gold(answer)
    if got is None or gold is None:
        return 0.0
    if got == gold:
        return 1.0
    if got[0] == gold[0]:
        return 0.5
    deployed = {(d["service"], d["version"]) for d in ((info or {}).get("world") or {}).get("deploys", [])}
    return 0.2 if got in deployed else 0.0


def reward_format(completion: str, answer: str, info: dict) -> float:
    return 1.0 if tt.parse_answer(completion) is not None else 0.0


REWARD_FUNCS = [reward_correct, reward_partial, reward_format]
REWARD_WEIGHTS = [1.0, 0.3, 0.1]
