"""Held-out transfer: the agent scored on tasks it never trains on (triage), through the agent
benchmark's runner (ait.agent_eval: one way to score an agent on a set of tasks).

    RUN_DIR/heldout/step-N/   its plan, its episodes' run directories and results.json

Every evaluation replays the same seeds, so any two (the starting policy's at step 0 and a later
one) are a paired comparison. An arc spread over several machines keeps its yardstick: each
checkpoint bundle carries the step-0 results as START_FILE, and a run continued from the bundle
puts them back (`restore_start`), so step N on machine C is still compared with step 0 on machine A.
"""

from __future__ import annotations

import math
import shutil
import threading
from pathlib import Path
from typing import Any

from ait.compute.executors import Executor
from ait.harness.types import EpisodeConfig
from ait.outer.config import OuterConfig
from ait.outer.metrics import Episode
from ait.outer.rollouts import play
from ait.outer.types import TrainerBackend
from ait.spec import load_spec

START_FILE = "heldout_start.json"
"""The step-0 evaluation's results.json, as a checkpoint bundle carries it."""


def results_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "heldout" / f"step-{step:05d}" / "results.json"


def evaluate_heldout(run_dir: Path, config: OuterConfig, backend: TrainerBackend, episode_config: EpisodeConfig,
                     tasks: list[Path], stopping: threading.Event, step: int, executor: Executor) -> list[Episode]:
    """heldout_episodes episodes spread over the held-out `tasks` (rounded up to a whole number per
    task), at heldout_temperature, with the policy as it is after `step`'s update, on threads of
    their own, their jobs on the run's `executor`; results.json holds means with two standard errors."""
    from ait.agent_eval.runner import run_eval
    from ait.agent_eval.types import EvalPlan

    specs = [(load_spec(p), p) for p in tasks]
    per_task = math.ceil(config.heldout_episodes / len(specs))
    plan = EvalPlan(policy=f"outer policy after step {step}", tasks=[str(p) for _, p in specs], episodes=per_task,
                    concurrency=min(config.concurrency, per_task * len(specs)),
                    executor=episode_config.executor, temperature=config.heldout_temperature,
                    max_turns=episode_config.max_turns, episode_timeout_s=episode_config.timeout_s)
    played: list[Episode] = []

    def play_one(spec, path, runs, run_id) -> Any:
        index = int(run_id.rsplit("-", 1)[1]) + per_task * [s.id for s, _ in specs].index(spec.id)
        # Not the step: every held-out evaluation replays the same seeds, so any two of them (the
        # starting policy's and a later one, say) are a paired comparison.
        seed = (config.seed * 7_919 + index) % 2**63
        episode = play(backend, spec, path, episode_config, runs, run_id, seed, stopping, config.heldout_temperature,
                       executor=executor)
        played.append(episode)
        return episode.result

    run_eval(plan, specs, results_path(run_dir, step).parent, play_one)
    return played


def heldout_results(run_dir: Path, step: int):
    """The held-out evaluation of `step` as ait.agent_eval wrote it (None when it did not run)."""
    from ait.agent_eval.types import EvalResults

    path = results_path(run_dir, step)
    return EvalResults.model_validate_json(path.read_text()) if path.is_file() else None


def heldout_transfer(run_dir: Path, step: int):
    """This step's held-out reward minus the starting policy's, paired by episode (same tasks, same
    seeds), with two standard errors; None without a step-0 evaluation."""
    from ait.agent_eval.stats import paired_difference

    start, now = heldout_results(run_dir, 0), heldout_results(run_dir, step)
    if start is None or now is None:
        return None
    return paired_difference(start.episodes, now.episodes), start.overall.reward.mean


def start_for_bundle(run_dir: Path) -> dict[str, Path]:
    """The files a checkpoint bundle of this run carries for the held-out comparison: the step-0
    results, once they exist."""
    path = results_path(run_dir, 0)
    return {START_FILE: path} if path.is_file() else {}


def restore_start(bundle: Path, run_dir: Path) -> None:
    """Put a bundle's step-0 results back where a continued run reads them (a bundle of an arc without
    held-out tasks, or written before its step-0 evaluation, has none: nothing to put back)."""
    source = Path(bundle) / START_FILE
    if source.is_file():
        dest = results_path(run_dir, 0)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest)
