"""Sampling groups of episodes for the outer loop, asynchronously.

    GroupSampler.fill   start groups (a task each, G episodes) on a thread pool of `concurrency`
                        episodes, as many as the off-policy bound allows: with k =
                        max_steps_off_policy, at most (1 + k) steps' worth of groups are in
                        flight or waiting, so a group started at policy version v is normally
                        trained on by step v + k
    GroupSampler.take   the next finished groups for a step; one sampled more than k versions
                        ago (it was overtaken by faster groups) is dropped, counted, and replaced

Each group has a slot, its place in the run's task order (ait.outer.tasks): round robin over the
training families, slot s being step s // groups_per_step's group s % groups_per_step. A group dropped
as too stale hands its slot to its replacement, so a family whose episodes are slow is not crowded
out by faster ones; one dropped for infra errors does not (a family whose eval keeps failing would
otherwise be re-sampled forever), and its replacement takes the next slot. A resumed run starts at
slot step · groups_per_step: groups in flight when the checkpoint was written are not in it.

An episode records the policy version it started with; a group's version is its oldest
member's. Episodes run the real harness (run_episode: probe, inner job, reward) on the run's
one executor (its pool of job slots, shared by every episode) with a wall-clock limit, so one
slow episode holds its group up by at most episode_timeout_s, plus what its job waited for a slot (up to
[episode] slot_wait_s: other episodes' jobs held it, not the agent), and is then scored as it stood.
Episodes whose policy raised, timed out or hit a budget are kept: nothing is dropped silently.
Episodes that ended as infra_error (the eval or a worker failed, not the agent) are left out of
their group's advantages and counted; a group left with fewer than two members carries no
signal and is sampled again.
"""

from __future__ import annotations

import heapq
import queue
import random
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from ait.compute.executors import Executor
from ait.harness.episode import run_episode
from ait.harness.types import EpisodeConfig, Message, PolicyStop, StopReason
from ait.outer.backends import episode_policy
from ait.outer.metrics import Episode, SampledGroup, infra_error, timed_out, trajectory_components
from ait.outer.tasks import family_cycle, round_robin_task, sample_training_tasks
from ait.outer.types import TrainerBackend, Trajectory, TrajectoryGroup, Turn
from ait.spec import TaskSpec


class Recorder:
    """Wraps a policy for one episode and keeps the token trace of every reply (the Trajectory's
    turns), so the loop never reads the episode's files for them."""

    def __init__(self, inner: Any, stopping: threading.Event):
        self.inner, self.stopping = inner, stopping
        self.name = inner.name
        self.settings = getattr(inner, "settings", {})
        self.turns: list[Turn] = []

    def reset(self, spec: TaskSpec) -> None:
        self.turns = []
        self.inner.reset(spec)

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        if self.stopping.is_set():
            raise PolicyStop(StopReason.budget, "the outer run is stopping")
        reply = self.inner.act(messages, tools)
        if reply.tokens is not None:
            t = reply.tokens
            self.turns.append(Turn(prompt_ids=t.prompt_ids, completion_ids=t.completion_ids, logprobs=t.logprobs))
        return reply


def play(backend: TrainerBackend, spec: TaskSpec, task_path: Path, config: EpisodeConfig, runs_dir: Path, run_id: str,
         seed: int | None, stopping: threading.Event, temperature: float | None = None, *,
         executor: Executor) -> Episode:
    """One episode with a fresh policy on the backend's current weights, its job on the run's `executor`."""
    version = backend.step
    policy = Recorder(episode_policy(backend, seed=seed, temperature=temperature), stopping)
    result = run_episode(spec, task_path, policy, config, runs_dir=runs_dir, run_id=run_id, executor=executor)
    trajectory = Trajectory(episode_id=result.run_id, task_id=spec.id, family=spec.family, turns=policy.turns,
                            reward=result.reward.total, components=trajectory_components(result),
                            base_model=result.job.base_model if result.job is not None else None,
                            policy_version=version, timed_out=timed_out(result))
    return Episode(trajectory=trajectory, result=result)


class GroupSampler:
    def __init__(self, *, backend: TrainerBackend, executor: Executor, task_paths: list[Path], rng: random.Random,
                 episode_config: EpisodeConfig, runs_dir: Path, group_size: int, groups_per_step: int,
                 max_off_policy: int, concurrency: int, seed: int, groups_launched: int = 0,
                 task_sampling: Literal["round_robin", "uniform"] = "round_robin", first_slot: int = 0,
                 prefetch: Callable[[TaskSpec], Any] | None = None):
        """`executor`: the run's, which every episode's job runs on (its owner closes it, not the sampler).
        `prefetch(spec)`: called on a background thread of its own as each group starts (the run's baseline
        prefetch: prefetch_baselines); what it raises is left for the episodes to meet."""
        self.backend, self.executor, self.task_paths, self.rng = backend, executor, task_paths, rng
        self.episode_config, self.runs_dir = episode_config, runs_dir
        self.group_size, self.groups_per_step, self.max_off_policy = group_size, groups_per_step, max_off_policy
        self.seed = seed
        self.launched = groups_launched
        """Groups started over the run (resumes from the checkpoint): numbers groups and seeds."""
        self.outstanding = 0
        """Groups started and not yet taken or dropped."""
        self.cycle = family_cycle(task_paths, seed) if task_sampling == "round_robin" else None
        self.next_slot = first_slot
        """The slot of the next group that is no replacement (a resumed run: step · groups_per_step)."""
        self.free_slots: list[int] = []
        """Slots of groups dropped as too stale, for their replacements (a heap: the oldest first)."""
        self.stopping = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="ait-episode")
        self.ready: queue.Queue[SampledGroup | BaseException] = queue.Queue()
        self.prefetch = prefetch
        self.prefetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ait-prefetch") if prefetch else None

    def fill(self, groups_still_needed: int) -> None:
        """Start groups up to the off-policy bound, never more than the run still needs."""
        cap = min(self.groups_per_step * (1 + self.max_off_policy), groups_still_needed)
        while self.outstanding < cap:
            self.start_group()

    def task(self, slot: int) -> tuple[TaskSpec, Path]:
        """The task of a group: its slot's (round robin), or a uniform draw from the run's rng."""
        if self.cycle is not None:
            return round_robin_task(self.cycle, slot)
        (spec, path), = sample_training_tasks(self.task_paths, 1, self.rng)
        return spec, path

    def start_group(self) -> None:
        if self.free_slots:
            slot = heapq.heappop(self.free_slots)
        else:
            slot, self.next_slot = self.next_slot, self.next_slot + 1
        spec, path = self.task(slot)
        if self.prefetcher is not None:
            self.prefetcher.submit(self.prefetch, spec)
        index = self.launched
        self.launched += 1
        self.outstanding += 1
        futures = []
        for member in range(self.group_size):
            run_id = f"g{index:05d}-{member}-{spec.id}-{secrets.token_hex(2)}"
            seed = (self.seed * 1_000_003 + index * 1009 + member) % 2**63
            futures.append(self.pool.submit(play, self.backend, spec, path, self.episode_config, self.runs_dir,
                                            run_id, seed, self.stopping, executor=self.executor))
        self._when_all(futures, spec, slot)

    def _when_all(self, futures: list[Future], spec: TaskSpec, slot: int) -> None:
        left = [len(futures)]
        lock = threading.Lock()

        def done(_: Future) -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            if any(f.cancelled() for f in futures):  # the run is closing: nobody will take this group
                return
            errors = [f.exception() for f in futures if f.exception() is not None]
            if errors:
                self.ready.put(errors[0])
                return
            episodes = [f.result() for f in futures]
            kept = [e for e in episodes if not infra_error(e.result)]
            group = TrajectoryGroup(task_id=spec.id, trajectories=[e.trajectory for e in kept],
                                    policy_version=min(e.trajectory.policy_version for e in episodes))
            self.ready.put(SampledGroup(group=group, episodes=kept, slot=slot,
                                        infra=[e for e in episodes if infra_error(e.result)]))

        for f in futures:
            f.add_done_callback(done)

    def take(self, n: int, version: int, groups_still_needed: int) -> tuple[list[SampledGroup], list[SampledGroup]]:
        """(n groups fresh enough for training at `version`, the groups dropped as too stale meanwhile)."""
        taken: list[SampledGroup] = []
        dropped: list[SampledGroup] = []
        while len(taken) < n:
            item = self.ready.get()
            if isinstance(item, BaseException):
                raise item
            self.outstanding -= 1
            too_few = len(item.group.trajectories) < 2  # infra errors left no comparison to learn from
            if version - item.group.policy_version > self.max_off_policy or too_few:
                dropped.append(item)
                if not too_few and item.slot is not None:  # stale only: its family keeps its turn
                    heapq.heappush(self.free_slots, item.slot)
                self.fill(groups_still_needed - len(taken))  # re-sample in its place
                continue
            taken.append(item)
        return taken, dropped

    def close(self, wait: bool = True) -> None:
        """Cancel groups not started; episodes under way stop at their next turn."""
        self.stopping.set()
        self.pool.shutdown(wait=wait, cancel_futures=True)
        if self.prefetcher is not None:
            self.prefetcher.shutdown(wait=wait, cancel_futures=True)
