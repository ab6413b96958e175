"""Held-out transfer at an arc's end: the warm start against the final adapter, on one machine.

An arc spread over preemptible machines keeps held-out evaluation off while it runs (each machine would
score it on its own hidden set). At its end, the warm start's bundle (step_0, which every run writes
before its first step) and the newest bundle play the held-out tasks on this machine: the same tasks,
the same episode seeds (ait.outer.heldout derives them from the config's seed and the episode's index,
never from the step), the same hidden set (this machine's secret), so the two are a paired comparison.
The secret need not outlive the machine and is never written into the results: they name the hidden
set by the secret's fingerprint.

    RUN/start/   the warm start's run: its bundle imported, RUN/start/heldout/step-00000/results.json
    RUN/final/   the final adapter's run: RUN/final/heldout/step-0000N/results.json
    RUN/transfer.json  both means with 2 SE, the paired difference final − start with 2 SE, n, the pairs
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from ait.outer import checkpoint as ckpt
from ait.outer.config import OuterConfig
from ait.outer.heldout import heldout_results
from ait.outer.loop import OuterRunError, import_bundle, open_run


def evaluate_bundle(bundle: Path, run_dir: Path, config: OuterConfig | None, episodes: int,
                    say: Callable[[str], None]):
    """The bundle's adapter on the held-out tasks (heldout_episodes = `episodes`); its results."""
    config = import_bundle(bundle, run_dir, config)
    if not config.heldout_tasks:
        raise OuterRunError(f"{bundle}: the config names no heldout_tasks to evaluate on")
    # Held-out on, at the size asked: open_run resolves the tasks only when heldout_every is set.
    config = config.model_copy(update={"heldout_every": 1, "heldout_episodes": episodes})
    run = open_run(config, run_dir, resume=True, say=say)
    try:
        step = run.state.step
        say(f"{bundle}: held-out evaluation of the policy after step {step} ({episodes} episodes)")
        run.evaluate_heldout(step)
    finally:
        run.close()
    return step, heldout_results(run_dir, step)


def compare_bundles(start: Path, final: Path, out: Path, *, config: OuterConfig | None = None, episodes: int = 16,
                    say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Both bundles on the held-out tasks, the same seeds; writes and returns OUT/transfer.json."""
    from ait.agent_eval.stats import paired_difference, pairs

    out = Path(out)
    if (out / "transfer.json").exists():
        raise OuterRunError(f"{out} already holds a comparison; give another --out")
    if ckpt.verify_bundle(start)["config"]["seed"] != ckpt.verify_bundle(final)["config"]["seed"]:
        raise OuterRunError(f"{start} and {final} come from runs with different seeds: their held-out "
                            "episodes would not be paired")
    start_step, a = evaluate_bundle(Path(start), out / "start", config, episodes, say)
    final_step, b = evaluate_bundle(Path(final), out / "final", config, episodes, say)
    diff = paired_difference(a.episodes, b.episodes)
    summary = {
        "start": {"bundle": str(start), "step": start_step, "reward": a.overall.reward.mean,
                  "reward_se2": a.overall.reward.se2, "n": len(a.episodes)},
        "final": {"bundle": str(final), "step": final_step, "reward": b.overall.reward.mean,
                  "reward_se2": b.overall.reward.se2, "n": len(b.episodes)},
        "final_minus_start": diff.mean, "final_minus_start_se2": diff.se2,
        "hidden_secret_id": ckpt.hidden_secret_id(),
        "n_pairs": len(pairs(a.episodes, b.episodes)),
        "pairs": [{"task": x.task_id, "run_id": x.run_id, "start": x.reward, "final": y.reward}
                  for x, y in pairs(a.episodes, b.episodes)],
    }
    (out / "transfer.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
