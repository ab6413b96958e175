"""Reference multi_hop job: chained lookups through a directory of fictional people.

Training rows are task_tools' questions at the task's own difficulty (task.json's knobs: hops,
people, fields, near-duplicate names, inline). Rewards: full credit for the exact final value,
partial credit for the value reached after some but not all hops (a gradient for a model that gets
one hop right), a little for ending with an 'Answer:' line.
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


def reward_progress(completion: str, answer: str, info: dict) -> float:
    """The asked field of a person part-way along the chain scores the fraction of hops done;
    any value of the right field scores a little."""
    got = tt.parse_answer(completion)
    world = (info or {}).get("world") or {}
    q = world.get("query")
    if not got or not q:
        return 0.0
    people = world["people"]
    path = tt.follow(people, q["start"], q["relations"])
    for i in range(len(path) - 1, 0, -1):
        if tt.normalize(people[path[i]][q["attribute"]]) == got:
            return i / (len(path) - 1)
    if any(tt.normalize(p[q["attribute"]]) == got for p in people.values()):
        return 0.1
    return 0.0


def reward_format(completion: str, answer: str, info: dict) -> float:
    return 1.0 if tt.parse_answer(completion) is not None else 0.0


REWARD_FUNCS = [reward_correct, reward_progress, reward_format]
REWARD_WEIGHTS = [1.0, 0.3, 0.1]
