"""Reference dispatch job: route a request through an ordered rule table.

Training rows are task_tools' rule tables at the task's own difficulty (task.json's knobs: rules,
conditions per rule, attributes, near misses, inline). Rewards: full credit for the right queue,
partial credit for naming a queue the table really has (a model learns to read the tools), a little
for the answer format.
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


def reward_known_queue(completion: str, answer: str, info: dict) -> float:
    """Partial credit for naming a queue the table really has (read via the tools)."""
    got = tt.parse_answer(completion)
    if not got:
        return 0.0
    world = (info or {}).get("world") or {}
    queues = {tt.norm(r["queue"]) for r in world.get("rules", [])} | {tt.norm(world.get("default_queue", ""))}
    return 1.0 if got == tt.gold(answer) else 0.4 if got in queues else 0.0


def reward_format(completion: str, answer: str, info: dict) -> float:
    return 1.0 if tt.parse_answer(completion) is not None else 0.0


REWARD_FUNCS = [reward_correct, reward_known_queue, reward_format]
REWARD_WEIGHTS = [1.0, 0.3, 0.1]
