"""Infrastructure time is not the agent's: a packed job re-run alone after an OOM or GPU fault is timed
once (the attempt that counted, at the packing it was admitted to), and a job the episode's deadline
finds still waiting for a slot is infra_error, cancelled before it ever runs; a wait for a slot moves the
episode's deadline (up to slot_wait_s), so a job other work held up is not killed as the agent's timeout."""

from __future__ import annotations

import json
import threading
import time

import pytest
from fakes import TASK

import ait.harness.episode as episode_mod
from ait.compute.executors import QueueExecutor
from ait.compute.local import LocalExecutor, slot_envs
from ait.compute.packing import Packing, load_runs, packed_slowdown, per_model
from ait.evals.baselines import BaselineStore
from ait.harness.episode import run_episode
from ait.harness.types import EpisodeConfig, StopReason
from ait.job.types import FailReason, JobResult
from ait.policy.reference import ReferencePolicy
from ait.queue import JobQueue
from ait.spec import load_spec
from tests.test_fast_grpo import reference_job
from tests.test_outer_rollouts import valid_probe


def test_the_measured_slowdown_comes_from_the_rows_and_is_interpolated():
    packs = per_model("NVIDIA H200", 139.8, load_runs())
    half = packs["qwen2.5-coder-0.5b"]
    assert half.jobs_per_gpu == 4 and half.slowdown == pytest.approx(4 * 64.8 / 125.8)
    assert packed_slowdown(half, 1) == 1.0
    assert packed_slowdown(half, 4) == pytest.approx(half.slowdown)
    assert 1.0 < packed_slowdown(half, 2) < packed_slowdown(half, 3) < half.slowdown
    assert packed_slowdown(None, 3) == 3.0  # nothing measured: K jobs time-sliced, the bound


def run_two_packed(tmp_path, reason: FailReason, packs: dict[str, Packing] | None) -> dict[str, JobResult]:
    """Two jobs together on one GPU; "big" fails of `reason` (7 s) while shared, then takes 4 s alone."""
    together = threading.Barrier(2, timeout=30)
    calls: list[str] = []

    def job_fn(job, env):
        calls.append(job.job_id)
        if calls.count(job.job_id) == 1:
            together.wait()
            if job.job_id == "big":
                return JobResult(job_id="big", ok=False, fail_reason=reason, train_seconds=7.0)
        return JobResult(job_id=job.job_id, ok=True, train_seconds=4.0)

    ex = LocalExecutor(slot_envs(2, ["0"], jobs_per_gpu=2), job_fn=job_fn, capacity_gib={"0": 1000.0},
                       model_packing=packs)
    jobs = [reference_job(tmp_path / n).model_copy(update={"job_id": n}) for n in ("big", "small")]
    results: dict[str, JobResult] = {}
    threads = [threading.Thread(target=lambda j=j: results.update({j.job_id: ex.run(j)})) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert calls.count("big") == 2 and calls.count("small") == 1
    return results


@pytest.mark.parametrize("reason", [FailReason.oom, FailReason.gpu_fault])
def test_a_rerun_alone_is_timed_once_at_its_packing(tmp_path, reason):
    model = reference_job(tmp_path / "m").config.job.base_model
    measured = Packing(jobs_per_gpu=4, mps_thread_percentage=50, why="test", slowdown=2.5)
    results = run_two_packed(tmp_path, reason, {model: measured})
    big = results["big"]
    # The first attempt's 7 s (a neighbour's fault, or a faked one) is not charged; the 4 s alone are,
    # at two jobs' measured slowdown (1 + 1.5 * 1/3), what the job would have taken packed as admitted.
    assert big.ok and big.train_seconds == pytest.approx(4.0 * 1.5)
    assert big.metrics["pack/first_attempt_s"] == 7.0 and big.metrics["pack/alone_s"] == 4.0
    assert big.metrics["pack/charged_factor"] == pytest.approx(1.5)
    assert results["small"].train_seconds == 4.0 and "pack/retried_alone" not in results["small"].metrics


def test_faking_an_oom_buys_no_faster_time(tmp_path):
    """A job whose code exits as if out of memory the moment it starts runs alone, faster; it is
    charged as if it had run packed, so the reward's speed term cannot tell it from an honest run."""
    results = run_two_packed(tmp_path, FailReason.oom, None)  # nothing measured: x2 for two jobs
    assert results["big"].train_seconds == 2 * 4.0  # alone 4 s, charged as two jobs time-sliced
    assert results["big"].train_seconds != 7.0 + 4.0  # not both attempts either


def occupy(ex: LocalExecutor, tmp_path, release: threading.Event) -> threading.Thread:
    """Hold the executor's only slot with another episode's job until `release` is set."""
    blocker = reference_job(tmp_path / "blocker").model_copy(update={"job_id": "blocker"})
    t = threading.Thread(target=ex.run, args=(blocker,), daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not ex.started(blocker) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ex.started(blocker)
    return t


def test_a_job_still_waiting_for_a_slot_at_the_deadline_is_infra_and_never_runs(tmp_path, monkeypatch):
    release, ran = threading.Event(), []

    def job_fn(job, env):
        ran.append(job.job_id)
        if job.job_id == "blocker":
            release.wait(30)
        return JobResult(job_id=job.job_id, ok=True, pre=0.1, post=0.9, eval_n=8, train_seconds=1.0)

    ex = LocalExecutor([{}], job_fn=job_fn)
    holder = occupy(ex, tmp_path, release)
    monkeypatch.setattr(episode_mod, "probe_workspace", valid_probe)
    from ait.train.models import resolve_base_model

    resolve_base_model("tiny")  # built once per AIT_HOME: not on the episode's clock
    begun = time.monotonic()
    result = run_episode(load_spec(TASK), TASK, ReferencePolicy(jobs=1), EpisodeConfig(timeout_s=3.0, slot_wait_s=1.5),
                         runs_dir=tmp_path / "runs", baselines=BaselineStore(tmp_path / "b.json"), executor=ex)
    assert time.monotonic() - begun >= 4.0  # the wait moved the deadline by its 1.5 s, no further
    assert result.stop_reason is StopReason.infra_error, result.error
    assert result.job is not None and result.job.fail_reason is FailReason.infra
    assert "never ran" in (result.job.error or "") and "waited for a slot" in result.error
    release.set()
    holder.join(10)
    time.sleep(0.5)  # the episode's job gets the slot now: it must not start in an abandoned run
    assert ran == ["blocker"]


def test_a_job_held_up_by_another_episodes_job_gets_its_time_once_it_starts(tmp_path, monkeypatch):
    """The slot is busy for 5 s of a 6 s episode and the job itself takes 2 s: without the excused wait
    it would be killed as the agent's timeout; with it the job finishes and is scored. (The margins leave
    the agent's turns before it submits up to 4 s on a loaded machine.)"""
    release, ran = threading.Event(), []

    def job_fn(job, env):
        ran.append(job.job_id)
        if job.job_id == "blocker":
            release.wait(30)
        else:
            time.sleep(2.0)
        return JobResult(job_id=job.job_id, ok=True, pre=0.1, post=0.9, eval_n=8, train_seconds=1.0)

    ex = LocalExecutor([{}], job_fn=job_fn)
    holder = occupy(ex, tmp_path, release)
    monkeypatch.setattr(episode_mod, "probe_workspace", valid_probe)
    from ait.train.models import resolve_base_model

    resolve_base_model("tiny")
    threading.Timer(5.0, release.set).start()
    result = run_episode(load_spec(TASK), TASK, ReferencePolicy(jobs=1), EpisodeConfig(timeout_s=6.0),
                         runs_dir=tmp_path / "runs", baselines=BaselineStore(tmp_path / "b.json"), executor=ex)
    holder.join(10)
    assert result.stop_reason is StopReason.job_done, result.error
    assert result.job is not None and result.job.ok and ran[-1] == result.job.job_id
    events = [json.loads(line) for line in (tmp_path / "runs" / result.run_id / "trajectory.jsonl").open()]
    waits = [e for e in events if e.get("kind") == "slot_wait"]
    assert len(waits) == 1 and 1.0 < waits[0]["excused_s"] <= 5.5


def test_run_until_excuses_no_more_wait_than_allowed(tmp_path):
    """A job that waits 1 s for its slot and then runs 0.5 s, with 0.8 s of its own: in time when up to
    1 s of the wait is excused, killed (None) when only 0.2 s is, and the excused seconds are returned."""
    from ait.harness.jobs import run_until

    class SlowSlot:
        def __init__(self):
            self.begun = None

        def run(self, job, on_event=None):
            time.sleep(1.0)
            self.begun = time.monotonic()
            time.sleep(0.5)
            return JobResult(job_id=job.job_id, ok=True)

        def started(self, job):
            return self.begun is not None

    job = reference_job(tmp_path)
    result, excused = run_until(SlowSlot(), job, 0.8, slot_wait_s=5.0)
    assert result is not None and result.ok and 0.7 < excused < 1.1
    result, excused = run_until(SlowSlot(), job, 0.8, slot_wait_s=0.2)
    assert result is None and excused == pytest.approx(0.2)
    result, excused = run_until(SlowSlot(), job, 0.8)  # 0: the old rule, every second counts
    assert result is None and excused == 0.0


def test_a_job_that_started_and_runs_past_the_deadline_is_the_agents_timeout(tmp_path, monkeypatch):
    release = threading.Event()

    def job_fn(job, env):
        release.wait(30)
        return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.killed)

    ex = LocalExecutor([{}], job_fn=job_fn)
    monkeypatch.setattr(episode_mod, "probe_workspace", valid_probe)
    from ait.train.models import resolve_base_model

    resolve_base_model("tiny")
    try:
        result = run_episode(load_spec(TASK), TASK, ReferencePolicy(jobs=1), EpisodeConfig(timeout_s=3.0),
                             runs_dir=tmp_path / "runs", baselines=BaselineStore(tmp_path / "b.json"), executor=ex)
    finally:
        release.set()
    assert result.stop_reason is StopReason.timeout
    assert result.job is not None and result.job.fail_reason is FailReason.timeout


def test_a_queued_job_counts_as_started_once_a_worker_claims_it(tmp_path):
    job = reference_job(tmp_path / "q").model_copy(update={"job_id": "q1"})
    ex = QueueExecutor(str(tmp_path / "q.sqlite"), wait_s=1.0)
    ex.queue.enqueue(job)
    assert not ex.started(job)
    assert JobQueue(str(tmp_path / "q.sqlite")).claim("w1") is not None
    assert ex.started(job)
