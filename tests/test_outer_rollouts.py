"""Sampling groups for the outer loop: too-stale groups are dropped and re-sampled (counted), and a
slow episode is cut at its wall-clock limit and scored as it stood, never dropped."""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time
import tomllib
from pathlib import Path

import pytest
from fakes import TASK, Canned

import ait.harness.episode as episode_mod
from ait.compute.executors import InlineExecutor
from ait.evals.baselines import BaselineStore
from ait.harness.episode import run_episode
from ait.harness.types import EpisodeConfig, EpisodeResult, Message, StopReason
from ait.job.types import FailReason, Job, JobConfig, JobResult
from ait.outer import rollouts
from ait.outer.metrics import Episode
from ait.outer.types import Trajectory
from ait.policy.reference import ReferencePolicy
from ait.probe.types import ProbeReport
from ait.reward import RewardBreakdown
from ait.spec import load_spec


class Versioned:
    """A backend stand-in: only the policy version matters to the sampler."""

    step = 0

    def policy(self, seed=None, temperature=None):
        raise AssertionError("play is replaced in these tests")


def instant_play(backend, spec, path, config, runs_dir, run_id, seed, stopping, temperature=None, *,
                 executor=None) -> Episode:
    result = EpisodeResult(run_id=run_id, run_dir=str(runs_dir / run_id), task_id=spec.id, policy="fake",
                           stop_reason=StopReason.no_submission, turns=1, submissions=[], job=None,
                           reward=RewardBreakdown(total=-0.1, max_attempts=3, parseable_submission=False),
                           wall_seconds=0.0)
    trajectory = Trajectory(episode_id=run_id, task_id=spec.id, family=spec.family, turns=[], reward=-0.1,
                            policy_version=backend.step)
    return Episode(trajectory=trajectory, result=result)


def sampler(backend, tmp_path: Path, max_off_policy: int) -> rollouts.GroupSampler:
    return rollouts.GroupSampler(backend=backend, executor=InlineExecutor(),
                                 task_paths=[TASK, TASK.parent / "triage.json"],
                                 rng=random.Random(0), episode_config=EpisodeConfig(), runs_dir=tmp_path,
                                 group_size=2, groups_per_step=1, max_off_policy=max_off_policy,
                                 concurrency=1, seed=0)


def wait_ready(s: rollouts.GroupSampler, n: int) -> None:
    """Until n groups are finished (an episode records the version it starts with: settle them first)."""
    deadline = time.monotonic() + 10
    while s.ready.qsize() < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.ready.qsize() >= n


def test_stale_groups_are_dropped_and_resampled(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(rollouts, "play", instant_play)
    backend = Versioned()
    s = sampler(backend, tmp_path, max_off_policy=1)
    s.fill(groups_still_needed=10)
    assert s.outstanding == 2 and s.launched == 2  # (1 + max_off_policy) steps' worth in flight
    wait_ready(s, 2)
    taken, dropped = s.take(1, version=0, groups_still_needed=10)
    assert len(taken) == 1 and dropped == [] and taken[0].group.policy_version == 0
    assert len(taken[0].group.trajectories) == 2 and taken[0].group.task_id == "calc_chain"  # never triage
    backend.step = 1
    s.fill(groups_still_needed=9)  # one more group, sampled at version 1
    wait_ready(s, 2)
    backend.step = 3  # two updates later, the queued groups (versions 0 and 1) are too stale
    taken, dropped = s.take(1, version=3, groups_still_needed=9)
    assert [g.group.policy_version for g in dropped] == [0, 1]
    assert [g.group.policy_version for g in taken] == [3]  # re-sampled at the current version
    assert s.launched == 5
    s.close()


def test_on_policy_sampling_never_runs_ahead(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(rollouts, "play", instant_play)
    s = sampler(Versioned(), tmp_path, max_off_policy=0)
    s.fill(groups_still_needed=10)
    assert s.outstanding == 1
    s.take(1, version=0, groups_still_needed=10)
    s.fill(groups_still_needed=0)  # the run needs no more groups: none start
    assert s.outstanding == 0 and s.launched == 1
    s.close()


class Slow:
    """A policy that takes `delay` seconds a turn and never submits."""

    name = "slow"

    def __init__(self, delay: float):
        self.delay = delay

    def reset(self, spec) -> None:
        pass

    def act(self, messages, tools) -> Message:
        time.sleep(self.delay)
        return Message(role="assistant", content="thinking")


def test_a_slow_policy_is_cut_at_the_limit_and_scored(tmp_path) -> None:
    class Backend:
        step = 4

        def policy(self):
            return Slow(0.3)

    start = time.monotonic()
    ep = rollouts.play(Backend(), load_spec(TASK), TASK, EpisodeConfig(timeout_s=1.0, max_turns=100, max_nudges=10),
                       tmp_path / "runs", "slow-1", None, threading.Event(), executor=InlineExecutor())
    assert time.monotonic() - start < 5
    assert ep.result.stop_reason is StopReason.timeout and "wall-clock" in ep.result.error
    assert ep.trajectory.timed_out and ep.trajectory.policy_version == 4
    assert ep.trajectory.reward == ep.result.reward.total == -0.1  # as it stood: nothing submitted


def valid_probe(workspace: Path, spec, timeout_s: float, gpu_memory_gib: float | None = None) -> ProbeReport:
    data = tomllib.loads((workspace / "job.toml").read_text())
    return ProbeReport(valid=True, config=JobConfig.model_validate(data, context={"constraints": spec.constraints}))


def test_a_job_running_past_the_limit_is_killed_and_the_episode_scored(tmp_path, monkeypatch) -> None:
    started: list[subprocess.Popen] = []

    class Sleeper(Canned):
        def run(self, job: Job, on_event=None) -> JobResult:
            job_dir = Path(job.run_dir) / "job"
            job_dir.mkdir(parents=True, exist_ok=True)
            proc = subprocess.Popen(["sleep", "60"], cwd=job_dir, start_new_session=True)
            started.append(proc)
            proc.wait()
            return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.killed)

        def started(self, job: Job) -> bool:
            return bool(started)

    monkeypatch.setattr(episode_mod, "probe_workspace", valid_probe)
    from ait.train.models import resolve_base_model

    resolve_base_model("tiny")  # built once per AIT_HOME (get_baseline_scores hashes it): not on the clock
    start = time.monotonic()
    result = run_episode(load_spec(TASK), TASK, ReferencePolicy(jobs=1), EpisodeConfig(timeout_s=3.0),
                         runs_dir=tmp_path / "runs", baselines=BaselineStore(tmp_path / "b.json"), executor=Sleeper())
    assert time.monotonic() - start < 10
    assert result.stop_reason is StopReason.timeout
    assert result.job is not None and result.job.fail_reason is FailReason.timeout
    # Scored as it stood: the job was valid at the first attempt, it never finished.
    r = result.reward
    assert r.valid_attempt == 1 and r.validation == 1.0 and r.job_quality == 0.0
    assert r.total == pytest.approx(0.35)
    deadline = time.monotonic() + 10
    while started[0].poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert started[0].poll() is not None, "the job's process outlived the episode's limit"
    assert not os.path.exists(f"/proc/{started[0].pid}/cwd") or started[0].returncode is not None


def test_infra_errors_are_left_out_of_their_group_and_counted(tmp_path, monkeypatch) -> None:
    """An episode whose eval or worker failed is not a verdict on the agent: it leaves the group (no
    advantage is computed from it), and a group left with one member is sampled again."""
    from ait.outer.metrics import step_metrics
    from ait.outer.types import StepStats

    calls = []

    def play(backend, spec, path, config, runs_dir, run_id, seed, stopping, temperature=None, *, executor) -> Episode:
        ep = instant_play(backend, spec, path, config, runs_dir, run_id, seed, stopping)
        calls.append(run_id)
        if len(calls) in (2, 4, 5):  # the first group (episodes 1-3) loses one member, the second (4-6) two
            ep.result.stop_reason = StopReason.infra_error
        return ep

    monkeypatch.setattr(rollouts, "play", play)
    s = sampler(Versioned(), tmp_path, max_off_policy=0)
    s.group_size = 3
    s.fill(groups_still_needed=5)
    taken, dropped = s.take(1, version=0, groups_still_needed=5)
    (group,) = taken
    assert len(group.group.trajectories) == 2 and len(group.infra) == 1 and dropped == []
    s.fill(groups_still_needed=4)
    taken, dropped = s.take(1, version=0, groups_still_needed=4)
    assert len(dropped) == 1 and len(dropped[0].infra) == 2 and len(dropped[0].group.trajectories) == 1
    assert len(taken[0].group.trajectories) == 3  # sampled again in its place
    row = step_metrics(1, taken, StepStats(step=1, loss=0.0, tokens=0, datums=0, seconds=0.0), version=0, seconds=1.0, staleness=[0], resampled=len(dropped),
                       usd=0.0, usd_total=0.0, infra_errors=sum(len(g.infra) for g in taken + dropped))
    assert row["infra_errors"] == 2 and row["episodes"] == 3
    s.close()
