"""The outer loop's task order: training families round robin (shuffled once by the seed), every
family equally often, one step's groups on distinct families, held-out families never, and the
order a pure function of the slot so a resumed run continues it."""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import pytest
from test_outer_rollouts import Versioned, instant_play

from ait.compute.executors import InlineExecutor
from ait.families import FAMILIES
from ait.harness.types import EpisodeConfig
from ait.outer import rollouts
from ait.outer.config import OuterConfig
from ait.outer.tasks import HeldOutError, family_cycle, round_robin_task

TASKS = sorted((Path(__file__).resolve().parents[1] / "examples" / "tasks").glob("*.json"))
TRAINING = {name for name, f in FAMILIES.items() if not f.held_out}


def families_of(cycle, slots) -> list[str]:
    return [round_robin_task(cycle, s)[0].family for s in slots]


def test_every_family_equally_often_and_distinct_within_a_step() -> None:
    cycle = family_cycle(TASKS, seed=0)
    assert {fam[0][0].family for fam in cycle} == TRAINING and len(cycle) == len(TRAINING) == 5
    for per_step in range(1, len(cycle) + 1):
        steps = [families_of(cycle, range(t * per_step, (t + 1) * per_step)) for t in range(len(cycle))]
        assert all(len(set(groups)) == per_step for groups in steps), (per_step, steps)
        # F steps of G groups: every family exactly G times (no family starved, none drawn twice as often).
        assert set(Counter(f for groups in steps for f in groups).values()) == {per_step}
    # The brief's example: 2 groups a step over 5 families go (A,B), (C,D), (E,A), ...
    a, b, c, d, e = families_of(cycle, range(5))
    assert families_of(cycle, range(6)) == [a, b, c, d, e, a]


def test_a_family_with_several_task_files_cycles_through_them() -> None:
    cycle = family_cycle(TASKS, seed=0)
    position = next(i for i, fam in enumerate(cycle) if fam[0][0].family == "calc_chain")
    assert len(cycle[position]) == 3  # calc_chain.json, calc_chain_cpu.json and calc_chain_fast.json
    turns = [round_robin_task(cycle, position + k * len(cycle))[1].name for k in range(6)]
    assert turns == ["calc_chain.json", "calc_chain_cpu.json", "calc_chain_fast.json"] * 2
    # ... and the family still gets one turn in five, not two in six as a draw over task files gave it.
    assert families_of(cycle, range(50)).count("calc_chain") == 10


def test_held_out_families_are_never_in_the_cycle() -> None:
    triage = [p for p in TASKS if p.stem == "triage"]
    assert triage and all("triage" != f for f in families_of(family_cycle(TASKS, 3), range(100)))
    with pytest.raises(HeldOutError):
        family_cycle(triage, 0)
    with pytest.raises(ValueError):
        round_robin_task(family_cycle(TASKS, 0), -1)


def test_the_order_is_the_seeds_and_the_task_lists_not_the_order_given() -> None:
    first = families_of(family_cycle(TASKS, 7), range(5))
    assert families_of(family_cycle(list(reversed(TASKS)), 7), range(5)) == first
    orders = {tuple(families_of(family_cycle(TASKS, seed), range(5))) for seed in range(8)}
    assert len(orders) > 1  # the seed shuffles it


def run_sampler(tmp_path: Path, *, steps: int, first_slot: int = 0, per_step: int = 2, max_off_policy: int = 0,
                task_sampling: str = "round_robin", seed: int = 0) -> list[list[tuple[str, str]]]:
    """(family, task id) of the groups each step trains on, with episodes that finish at once."""
    s = rollouts.GroupSampler(backend=Versioned(), executor=InlineExecutor(), task_paths=TASKS, rng=random.Random(seed),
                              episode_config=EpisodeConfig(), runs_dir=tmp_path, group_size=2,
                              groups_per_step=per_step, max_off_policy=max_off_policy, concurrency=1, seed=seed,
                              task_sampling=task_sampling, first_slot=first_slot)
    out = []
    try:
        for step in range(steps):
            s.fill(groups_still_needed=(steps - step) * per_step)
            taken, _ = s.take(per_step, version=0, groups_still_needed=(steps - step) * per_step)
            out.append(sorted((g.group.trajectories[0].family, g.group.task_id) for g in taken))
    finally:
        s.close()
    return out


def test_a_resumed_sampler_continues_the_sequence(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(rollouts, "play", instant_play)
    whole = run_sampler(tmp_path / "a", steps=5)
    assert all(len({family for family, _ in step}) == 2 for step in whole)
    # The loop resumes at slot step · groups_per_step (ait.outer.loop.open_run): steps 3-5 again.
    assert run_sampler(tmp_path / "b", steps=3, first_slot=2 * 2) == whole[2:]
    assert run_sampler(tmp_path / "c", steps=5) == whole  # and the same seed gives the same run


def test_a_group_dropped_as_stale_hands_its_family_to_its_replacement(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(rollouts, "play", instant_play)
    backend = Versioned()
    s = rollouts.GroupSampler(backend=backend, executor=InlineExecutor(), task_paths=TASKS, rng=random.Random(0),
                              episode_config=EpisodeConfig(), runs_dir=tmp_path, group_size=2, groups_per_step=1,
                              max_off_policy=0, concurrency=1, seed=0)
    try:
        s.fill(groups_still_needed=3)
        backend.step = 1  # the group sampled at version 0 is now stale
        taken, dropped = s.take(1, version=1, groups_still_needed=3)
        assert [g.slot for g in dropped] == [0] and [g.slot for g in taken] == [0]
        assert taken[0].group.task_id == dropped[0].group.task_id == round_robin_task(s.cycle, 0)[0].id
        s.fill(groups_still_needed=2)
        taken, _ = s.take(1, version=1, groups_still_needed=2)
        assert [g.slot for g in taken] == [1]  # the cycle goes on where it was
    finally:
        s.close()


def test_uniform_sampling_is_still_there(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(rollouts, "play", instant_play)
    steps = run_sampler(tmp_path, steps=30, task_sampling="uniform")
    families = [family for step in steps for family, _ in step]
    assert "triage" not in families and len(set(families)) > 1
    assert any(len({family for family, _ in step}) == 1 for step in steps)  # a draw: one family twice happens
    assert OuterConfig().task_sampling == "round_robin"
    with pytest.raises(ValueError, match="task_sampling"):
        OuterConfig.model_validate({"task_sampling": "random"})


def test_each_group_prefetches_its_tasks_baselines_off_the_sampling_threads(tmp_path: Path, monkeypatch) -> None:
    """prefetch_baselines: as a group starts, its task goes to the prefetch callable, on a thread of its
    own (the agent's episodes need not wait for it); a prefetch that fails does not fail the group."""
    import threading

    from ait.outer import prefetch as loop

    monkeypatch.setattr(rollouts, "play", instant_play)
    seen = []

    def prefetch(spec):
        seen.append((spec.id, threading.current_thread().name))
        raise RuntimeError("the baseline eval ran out of memory")  # the episodes meet it themselves

    s = rollouts.GroupSampler(backend=Versioned(), executor=InlineExecutor(), task_paths=TASKS, rng=random.Random(0),
                              episode_config=EpisodeConfig(), runs_dir=tmp_path, group_size=2, groups_per_step=2,
                              max_off_policy=0, concurrency=1, seed=0, prefetch=prefetch)
    try:
        s.fill(groups_still_needed=2)
        taken, _ = s.take(2, version=0, groups_still_needed=2)
        deadline = time.monotonic() + 30  # the prefetch thread is the groups' own: it may lag behind them
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        s.close()  # cancels what has not started: so only after both ran
    assert sorted(task for task, _ in seen) == sorted(g.group.task_id for g in taken)
    assert all(name.startswith("ait-prefetch") for _, name in seen)
    # The run's prefetch measures on the hidden set its jobs are scored on: the episodes' eval size.
    calls = []
    monkeypatch.setattr("ait.evals.best_pre.best_pre", lambda spec, n, store: calls.append((spec.id, n)))
    spec = rollouts.round_robin_task(s.cycle, 0)[0]
    loop.baseline_prefetch(EpisodeConfig(eval_size=50))(spec)
    loop.baseline_prefetch(EpisodeConfig())(spec)
    assert calls == [(spec.id, 50), (spec.id, spec.hidden_eval_size)]
    assert OuterConfig().prefetch_baselines is False


def test_every_tasks_baselines_are_prefetched_in_group_order_while_the_run_starts(tmp_path: Path, monkeypatch) -> None:
    """A fresh machine has no baselines: the run measures every task's before its first groups need them,
    on a thread of its own, beside the warm start (a new run) or the policy's load (a resumed one), in the
    order the groups will come from the run's next slot; one task's failure does not stop the others."""
    import threading

    from ait.outer import loop, prefetch

    seen, order = [], []

    def measure(spec):
        seen.append((spec.id, threading.current_thread().name))
        if len(seen) == 1:
            raise RuntimeError("the baseline eval ran out of memory")

    monkeypatch.setattr(prefetch, "baseline_prefetch", lambda episode: measure)
    said = []
    config = OuterConfig(tasks=[str(p) for p in TASKS], prefetch_baselines=True, seed=3)
    prefetch.prefetch_every_task(config, TASKS, first_slot=7, say=said.append).join(timeout=30)
    cycle = family_cycle(TASKS, seed=3)
    drawn = [round_robin_task(cycle, slot)[0].id for slot in range(7, 7 + 5 * 3)]  # calc_chain has 3 tasks
    want = list(dict.fromkeys(drawn))                     # every training task once, in the order groups draw them
    assert [task for task, _ in seen] == want and len(want) == sum(len(f) for f in cycle) == 7
    assert seen[0][0] == round_robin_task(cycle, 7)[0].id  # the next group's task first
    assert {name for _, name in seen} == {"ait-prefetch-all"}
    assert any("failed: the baseline eval ran out of memory" in m for m in said) and "ready" in said[-1]

    # The run starts it before the warm start (new run) and before loading the policy (resume).
    monkeypatch.setattr(loop, "prefetch_every_task", lambda cfg, paths, first_slot, say: order.append(("prefetch", first_slot)))
    monkeypatch.setattr(loop, "with_warm_start", lambda cfg, paths: order.append(("warm start",)) or cfg)
    monkeypatch.setattr(loop, "job_executor", lambda cfg, say: (_ for _ in ()).throw(RuntimeError("stop here")))
    cfg = config.model_copy(update={"warmstart": config.warmstart.model_copy(update={"steps": 2})})
    with pytest.raises(RuntimeError, match="stop here"):
        loop.open_run(cfg, tmp_path / "run", resume=False, say=lambda m: None)
    assert order == [("prefetch", 0), ("warm start",)]


def test_the_prefetch_thread_starts_with_transformers_names_already_resolved() -> None:
    """Both the prefetch thread and the warm start resolve transformers' lazy names; two threads resolving
    them at once can meet a half-initialised module (an H100 arc's first run died of it). In a fresh
    interpreter, the names are resolved before the thread's first measurement, not by it."""
    import subprocess
    import sys

    code = f"""
import sys, threading
from pathlib import Path
from ait.outer import prefetch
from ait.outer.config import OuterConfig
tasks = {[str(p) for p in TASKS]!r}
assert "transformers" not in sys.modules
found = []
def measure(spec):
    t = sys.modules.get("transformers")
    found.append([name for name in prefetch.SHARED_NAMES if t is None or name not in vars(t)])
prefetch.baseline_prefetch = lambda episode: measure
config = OuterConfig(tasks=tasks, prefetch_baselines=True)
prefetch.prefetch_every_task(config, [Path(p) for p in tasks], first_slot=0, say=lambda m: None).join(timeout=120)
assert found and found[0] == [], found
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
