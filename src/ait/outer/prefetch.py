"""Each task's baselines (the untrained scores best_pre takes its maximum over) measured before the
episodes need them: per group as it starts, and for every task while the run starts up."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ait.harness.types import EpisodeConfig
from ait.outer.config import OuterConfig
from ait.outer.tasks import family_cycle, round_robin_task, training_tasks
from ait.spec import TaskSpec


def baseline_prefetch(episode: EpisodeConfig) -> Callable[[TaskSpec], Any]:
    """The sampler's prefetch: a task's missing baselines measured on the hidden set its episodes' jobs are
    scored on (the eval size they run with), into the store the episodes read."""
    from ait.evals.baselines import BaselineStore
    from ait.evals.best_pre import best_pre

    store = BaselineStore()
    return lambda spec: best_pre(spec, episode.eval_size or spec.hidden_eval_size, store)


# The names both this thread and the run's own (the warm start, the sampler) resolve first.
SHARED_NAMES = ("AutoConfig", "AutoModelForCausalLM", "AutoTokenizer", "GenerationConfig", "PreTrainedTokenizerFast",
                "Qwen2ForCausalLM", "Qwen3Config", "Qwen3ForCausalLM")


def resolve_shared_imports() -> None:
    """Import, in the caller's thread, what the prefetch thread and the run's start-up both import.
    transformers resolves its names lazily, at first use; two threads resolving them at once can each meet
    the other's module half-initialised ("cannot import name 'PreTrainedTokenizerFast' from 'transformers'"
    ended an H100 arc's first run on 2026-12-07, as the warm start built the tiny model beside this thread's
    first baseline eval). Resolved once here, before the thread starts, neither imports them again."""
    import peft  # noqa: F401 - the warm start's adapter: peft imports transformers' modules of its own
    import torch  # noqa: F401
    import transformers

    for name in SHARED_NAMES:
        getattr(transformers, name)


def prefetch_every_task(config: OuterConfig, task_paths: list[Path], first_slot: int,
                        say: Callable[[str], None]) -> threading.Thread:
    """Every training task's missing baselines measured on a thread of its own, in the order the groups
    will come, while the warm start trains or the resumed policy loads. A fresh machine has no baselines
    (the hidden set is the machine's), and each group's own prefetch starts only with the group: then an
    episode whose job has ended waits for its task's baselines (an H100 arc's first step on a new machine
    took 399-610 s where the next took 146-295 s). The groups' prefetches still run; the store's lock makes
    them wait for this one and then read what it froze. A failure is left for the episodes to meet."""
    if config.task_sampling == "round_robin":
        cycle = family_cycle(task_paths, config.seed)
        specs = []  # each task once, at the first slot that draws it
        for slot in range(first_slot, first_slot + len(cycle) * max(len(tasks) for tasks in cycle)):
            spec = round_robin_task(cycle, slot)[0]
            if spec.id not in {s.id for s in specs}:
                specs.append(spec)
    else:
        specs = [spec for spec, _ in training_tasks(task_paths)]
    prefetch = baseline_prefetch(config.episode)
    resolve_shared_imports()

    def measure_all() -> None:
        t0 = time.monotonic()
        for spec in specs:
            try:
                prefetch(spec)
            except Exception as e:  # noqa: BLE001 - an episode meets it again and reports it
                say(f"baseline prefetch for {spec.id} failed: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}")
        say(f"baselines of {len(specs)} tasks ready in {time.monotonic() - t0:.0f} s")

    thread = threading.Thread(target=measure_all, name="ait-prefetch-all", daemon=True)
    thread.start()
    return thread
