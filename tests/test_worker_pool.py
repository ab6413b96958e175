"""The worker loop on local slots: GPU packing, concurrency, per-job logs, lost leases,
SIGTERM drain and release, and a real job's training process killed from outside."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ait.compute.local import LocalLauncher, kill_job_processes, parse_gpus, slot_envs
from ait.compute.worker import WorkerOptions, serve
from ait.job.types import FailReason, Job, JobConfig, JobResult
from ait.queue import JobQueue, JobState

TASK = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "calc_chain.json"
CFG = JobConfig.model_validate({"job": {"base_model": "tiny"}, "train": {
    "max_steps": 1, "learning_rate": 1e-4, "num_generations": 2, "max_completion_length": 16}})


def fake_job(tmp_path: Path, i: int) -> Job:
    run_dir = tmp_path / "runs" / f"j{i}"
    return Job(job_id=f"j{i}", run_dir=str(run_dir), workspace=str(tmp_path), task_path=str(TASK),
               config=CFG, time_budget_s=60)


def test_slot_envs_pack_jobs_per_gpu_and_hide_gpus_from_cpu_slots():
    assert [e["CUDA_VISIBLE_DEVICES"] for e in slot_envs(None, [])] == [""]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in slot_envs(3, [])] == [""] * 3
    packed = [e["CUDA_VISIBLE_DEVICES"] for e in slot_envs(None, ["0", "1"], jobs_per_gpu=2)]
    assert packed == ["0", "1", "0", "1"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in slot_envs(2, ["0", "1"], jobs_per_gpu=3)] == ["0", "1"]
    with pytest.raises(ValueError, match="at most 4"):
        slot_envs(5, ["0", "1"], jobs_per_gpu=2)
    with pytest.raises(ValueError, match="names a GPU twice"):
        parse_gpus("0,0")
    assert parse_gpus(" 2, 3 ") == ["2", "3"] and parse_gpus(None) == []


def test_mps_thread_percentage_reaches_each_slot_and_the_sandboxed_job():
    from ait.sandbox import KEEP_ENV

    envs = slot_envs(None, ["0"], jobs_per_gpu=4, mps_thread_percentage=25)
    assert [e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for e in envs] == ["25"] * 4
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in slot_envs(None, ["0"], jobs_per_gpu=4)[0]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in KEEP_ENV  # the scrubbed job environment keeps it
    for bad in (0, 101):
        with pytest.raises(ValueError, match="1..100"):
            slot_envs(None, ["0"], jobs_per_gpu=2, mps_thread_percentage=bad)


def test_slots_run_jobs_concurrently_never_more_than_k_per_gpu(tmp_path):
    queue = JobQueue(tmp_path / "q.sqlite")
    queue.enqueue_many([fake_job(tmp_path, i) for i in range(6)])
    lock, on_gpu, peak = threading.Lock(), {"0": 0, "1": 0}, {"0": 0, "1": 0, "all": 0}

    def job_fn(job: Job, env: dict[str, str]) -> JobResult:
        gpu = env["CUDA_VISIBLE_DEVICES"]
        with lock:
            on_gpu[gpu] += 1
            peak[gpu] = max(peak[gpu], on_gpu[gpu])
            peak["all"] = max(peak["all"], sum(on_gpu.values()))
        time.sleep(0.4)
        with lock:
            on_gpu[gpu] -= 1
        return JobResult(job_id=job.job_id, ok=True, metrics={"gpu": float(gpu)})

    start = time.monotonic()
    stats = serve(queue, LocalLauncher(slot_envs(None, ["0", "1"], jobs_per_gpu=2), job_fn=job_fn),
                  WorkerOptions(once=True, poll_s=0.01))
    assert stats.done == 6 and queue.counts()["done"] == 6
    assert peak == {"0": 2, "1": 2, "all": 4}  # packed two per GPU, four at once
    assert time.monotonic() - start < 6 * 0.4  # concurrent, not one after another
    # Every job leaves a worker-side log with its start (and slot's GPU) and its outcome.
    log = queue.log_path("j0").read_text()
    assert "start slot=" in log and "CUDA_VISIBLE_DEVICES=" in log and "end state=done" in log


def test_job_function_errors_and_wrong_results_are_failed_results(tmp_path):
    queue = JobQueue(tmp_path / "q.sqlite")
    queue.enqueue_many([fake_job(tmp_path, i) for i in range(2)])

    def job_fn(job: Job, env: dict[str, str]) -> JobResult:
        if job.job_id == "j0":
            raise RuntimeError("boom in the job function")
        return JobResult(job_id="someone-else", ok=True)

    stats = serve(queue, LocalLauncher([{}], job_fn=job_fn), WorkerOptions(once=True, poll_s=0.01))
    assert (stats.done, stats.failed) == (0, 2)
    first, second = queue.get("j0"), queue.get("j1")
    # run_job never raises, so a job function that raised, or answered for another job, is our code's
    # failure, not the job's: an infrastructure error (the episode ends as infra_error).
    assert first.state is JobState.failed and first.result.fail_reason is FailReason.infra
    assert "boom in the job function" in first.error
    assert second.result.fail_reason is FailReason.infra and "another job" in second.error


def test_lost_lease_stops_the_run_and_its_result_is_rejected(tmp_path):
    """Another worker took the job (simulated by rewriting the token): the heartbeat notices,
    the worker kills the run (its process in <run_dir>/job), and the late result is refused."""
    queue = JobQueue(tmp_path / "q.sqlite", lease_s=0.3)
    job = fake_job(tmp_path, 0)
    queue.enqueue(job)
    pids = []

    def job_fn(job: Job, env: dict[str, str]) -> JobResult:
        job_dir = Path(job.run_dir) / "job"
        job_dir.mkdir(parents=True)
        proc = subprocess.Popen(["sleep", "30"], cwd=job_dir, start_new_session=True)
        pids.append(proc.pid)
        with sqlite3.connect(queue.path) as conn:
            conn.execute("UPDATE jobs SET token = 'stolen', worker_id = 'thief', lease_expires_at = lease_expires_at + 3600"
                         " WHERE job_id = ?", (job.job_id,))
        code = proc.wait(timeout=20)  # killed by the worker once the heartbeat fails
        return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.killed, error=f"exit {code}")

    stats = serve(queue, LocalLauncher([{}], job_fn=job_fn), WorkerOptions(once=True, poll_s=0.01))
    assert (stats.lost, stats.rejected, stats.done, stats.failed) == (1, 1, 0, 0)
    entry = queue.get("j0")
    assert entry.state is JobState.running and entry.worker_id == "thief" and entry.result is None
    log = queue.log_path("j0").read_text()
    assert "lease lost while running" in log and "result rejected" in log


def _sleeping_job_fn(started: threading.Event, seconds: float):
    def job_fn(job: Job, env: dict[str, str]) -> JobResult:
        job_dir = Path(job.run_dir) / "job"  # where run_job runs a job's processes
        job_dir.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(["sleep", str(seconds)], cwd=job_dir, start_new_session=True)
        (job_dir / "pid").write_text(str(proc.pid))
        started.set()
        code = proc.wait()
        return JobResult(job_id=job.job_id, ok=code == 0, fail_reason=None if code == 0 else FailReason.killed)
    return job_fn


def _signal_when(started: threading.Event, *delays: float) -> threading.Thread:
    def send():
        started.wait(20)
        for delay in delays:
            time.sleep(delay)
            os.kill(os.getpid(), signal.SIGTERM)
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_first_sigterm_finishes_the_running_job_and_claims_no_more(tmp_path):
    queue = JobQueue(tmp_path / "q.sqlite")
    queue.enqueue_many([fake_job(tmp_path, i) for i in range(2)])
    started, before = threading.Event(), signal.getsignal(signal.SIGTERM)
    _signal_when(started, 0.1)
    stats = serve(queue, LocalLauncher([{}], job_fn=_sleeping_job_fn(started, 1.0)), WorkerOptions(poll_s=0.02))
    assert stats.stopping and stats.done == 1 and stats.claimed == 1
    assert queue.get("j0").state is JobState.done
    assert (queue.get("j1").state, queue.get("j1").attempts) == (JobState.queued, 0)
    assert signal.getsignal(signal.SIGTERM) is before  # the worker restored the handler


@pytest.mark.parametrize("how", ["second_sigterm", "drain_timeout"])
def test_release_kills_the_running_job_and_hands_it_back(tmp_path, how):
    queue = JobQueue(tmp_path / "q.sqlite")
    job = fake_job(tmp_path, 0)
    queue.enqueue(job)
    started = threading.Event()
    _signal_when(started, *((0.1, 0.3) if how == "second_sigterm" else (0.1,)))
    options = WorkerOptions(poll_s=0.02, drain_timeout_s=0.5 if how == "drain_timeout" else None)
    begin = time.monotonic()
    stats = serve(queue, LocalLauncher([{}], job_fn=_sleeping_job_fn(started, 30)), options)
    assert time.monotonic() - begin < 10
    assert (stats.released, stats.done, stats.failed) == (1, 0, 0)
    entry = queue.get("j0")
    assert (entry.state, entry.attempts, entry.result) == (JobState.queued, 1, None)
    pid = int((Path(job.run_dir) / "job" / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the job's process was killed (and reaped), not left running
    assert "released back to the queue" in queue.log_path("j0").read_text()


def test_kill_job_processes_only_touches_that_jobs_directory(tmp_path):
    mine, other = fake_job(tmp_path, 0), fake_job(tmp_path, 1)
    procs = []
    for job in (mine, other):
        (Path(job.run_dir) / "job").mkdir(parents=True)
        procs.append(subprocess.Popen(["sleep", "30"], cwd=Path(job.run_dir) / "job", start_new_session=True))
    try:
        assert kill_job_processes(mine) == 1
        assert procs[0].wait(timeout=5) == -signal.SIGKILL
        assert procs[1].poll() is None
    finally:
        procs[1].kill()
        procs[1].wait()


# -- a real job through `ait worker`: its training process killed from outside ------------

ROOT = Path(__file__).resolve().parents[1]
SLEEP_IN_TRAINING = 'import sys, time\nif ("ait.train.fast_grpo" in sys.modules or "ait.train.grpo" in sys.modules):\n    time.sleep(600)\n'


def _descendant(pid: int, needle: str, timeout: float = 60.0) -> int:
    """A process under `pid` whose command line contains `needle`."""
    from ait.compute.local import _children

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in _children(pid):
            try:
                if needle in Path(f"/proc/{child}/cmdline").read_text():
                    return child
            except OSError:
                continue
        time.sleep(0.1)
    raise AssertionError(f"no process running {needle!r} under {pid}")


def test_training_process_killed_from_outside_is_a_failed_result_with_a_reason(tmp_path):
    import shutil

    from ait.job.config import load_job_config
    from ait.spec import load_spec

    task = ROOT / "examples" / "tasks" / "calc_chain.json"
    ws = tmp_path / "ws"
    shutil.copytree(ROOT / "src" / "ait" / "policy" / "reference_jobs" / "calc_chain", ws)
    (ws / "env.py").write_text(SLEEP_IN_TRAINING + (ws / "env.py").read_text())
    job = Job(job_id="killed-1", run_dir=str(tmp_path / "run"), workspace=str(ws), task_path=str(task),
              config=load_job_config(ws / "job.toml", load_spec(task).constraints), time_budget_s=300, eval_size=8)
    queue = JobQueue(tmp_path / "q.sqlite")
    queue.enqueue(job)
    # A host whose GPU 3 is visible (faked: CUDA_VISIBLE_DEVICES; the job runs on the CPU regardless).
    worker = subprocess.Popen([sys.executable, "-m", "ait.cli", "worker", "--queue", str(queue.path), "--gpus", "3",
                               "--idle-exit", "60", "--poll", "0.05"], cwd=tmp_path,
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": "3"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        train = _descendant(worker.pid, "ait.train.main")
        env = dict(kv.split("=", 1) for kv in Path(f"/proc/{train}/environ").read_text().split("\0") if "=" in kv)
        assert env["CUDA_VISIBLE_DEVICES"] == "3"  # the slot's GPU reached the job's process
        os.kill(train, signal.SIGKILL)
        entry = queue.wait("killed-1", timeout_s=60)
    finally:
        worker.send_signal(signal.SIGTERM)
        out = worker.communicate(timeout=60)[0]
    assert entry.state is JobState.failed, out
    # A SIGKILL the memory cgroup did not see as an OOM kill is a kill; with no memory cgroup to
    # ask, it is most likely the kernel's OOM killer.
    expected = FailReason.killed if memory_cgroup_here() else FailReason.oom
    assert entry.result.fail_reason is expected and "status -9" in entry.error
    assert entry.attempts == 1 and worker.returncode == 0
    assert f"end state=failed reason={expected.value}" in queue.log_path("killed-1").read_text()
    assert "failed" in out and "done 0, failed 1" in out


def test_episode_on_the_local_executor_survives_its_training_being_killed(tmp_path):
    """`--executor local` end to end: the job's training process is SIGKILLed from outside;
    the episode still completes, keeps its validation term and scores job_quality 0."""
    from ait.evals.baselines import BaselineStore
    from ait.harness.episode import run_episode
    from ait.harness.types import EpisodeConfig, StopReason
    from ait.policy.reference import ReferencePolicy
    from ait.spec import load_spec

    task = ROOT / "examples" / "tasks" / "calc_chain.json"
    killed = []

    def killer():
        try:
            train = _descendant(os.getpid(), "ait.train.main", timeout=120)
        except AssertionError:
            return
        os.kill(train, signal.SIGKILL)
        killed.append(train)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    episode = run_episode(load_spec(task), task, ReferencePolicy(), EpisodeConfig(executor="local", eval_size=8),
                          runs_dir=tmp_path / "runs", baselines=BaselineStore(tmp_path / "b.json"))
    thread.join(timeout=5)
    assert killed, "the training process never appeared"
    assert episode.stop_reason is StopReason.job_done
    expected = FailReason.killed if memory_cgroup_here() else FailReason.oom
    assert not episode.job.ok and episode.job.fail_reason is expected
    assert episode.reward.validation == 1.0 and episode.reward.job_quality == 0.0
    assert episode.reward.total == pytest.approx(0.35)


def memory_cgroup_here() -> bool:
    """Whether this host gives runs a memory cgroup (so OOM kills are observed, not guessed)."""
    from ait.sandbox import cgroup

    groups = cgroup.create(8, 2**28)
    try:
        return cgroup.oom_events(groups)["memory_observed"]
    finally:
        cgroup.destroy(groups)


def test_slots_share_the_cpu_cores_unless_the_operator_set_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(16)))
    assert {e["OMP_NUM_THREADS"] for e in slot_envs(None, ["0"], jobs_per_gpu=8)} == {"2"}
    assert {e["OMP_NUM_THREADS"] for e in slot_envs(32, [])} == {"1"}  # never 0
    assert slot_envs(None, ["0"])[0]["OMP_NUM_THREADS"] == "16"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the operator's choice reaches the jobs untouched
    assert "OMP_NUM_THREADS" not in slot_envs(4, ["0"], jobs_per_gpu=4)[0]


def test_a_jobs_training_and_eval_processes_split_its_threads(monkeypatch, tmp_path):
    from ait.compute import run_job as run_job_mod
    from ait.sandbox import RunOutcome

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(16)))
    assert run_job_mod.split_threads(None) == ({"OMP_NUM_THREADS": "8"}, 16)
    assert run_job_mod.split_threads({"OMP_NUM_THREADS": "2", "X": "y"}) == ({"OMP_NUM_THREADS": "1", "X": "y"}, 2)
    assert run_job_mod.split_threads({"OMP_NUM_THREADS": "1"}) == ({"OMP_NUM_THREADS": "1"}, 1)  # never 0
    # Both processes of a real run_job get the halved share.
    seen = {}

    class FakeEval:
        pid = 0

        def kill(self):
            pass

    def fake_eval(req, eval_dir, log_path, readable, extra_env):
        seen["eval"], seen["threads_after_go"] = extra_env.get("OMP_NUM_THREADS"), req.threads_after_go
        return FakeEval()

    class FakeTrain:
        pid = 0

        def finish(self, timeout_s):
            return RunOutcome(returncode=1, timed_out=False, seconds=0.1, log_tail="stopped by the test")

    def fake_train(argv, cwd, log_path, policy, env):
        seen["train"] = env.get("OMP_NUM_THREADS")
        return FakeTrain()

    monkeypatch.setattr(run_job_mod, "start_eval", fake_eval)
    monkeypatch.setattr(run_job_mod, "start_untrusted", fake_train)
    result = run_job_mod.run_job(fake_job(tmp_path, 0), extra_env={"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "4"})
    assert not result.ok and seen == {"eval": "2", "train": "2", "threads_after_go": 4}
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the operator's own setting is left as it is
    assert run_job_mod.split_threads({}) == ({}, None)


def test_jobs_that_share_a_gpu_score_in_smaller_micro_batches(monkeypatch):
    from ait.train.fast_grpo import microbatch_tokens

    assert "AIT_LOGIT_BUDGET" not in slot_envs(None, ["0"])[0]  # alone: the full budget
    env = slot_envs(None, ["0"], jobs_per_gpu=8)[0]
    assert int(env["AIT_LOGIT_BUDGET"]) == 2**28
    full = microbatch_tokens(49152)
    monkeypatch.setenv("AIT_LOGIT_BUDGET", env["AIT_LOGIT_BUDGET"])
    assert microbatch_tokens(49152) == full // 2  # the training process reads it
    monkeypatch.setenv("AIT_LOGIT_BUDGET", "not a number")
    assert microbatch_tokens(49152) == full  # a garbled value falls back, it does not crash the job


@pytest.mark.parametrize("failure,reason", [
    ({}, FailReason.infra),                    # the eval (no agent code in it) failed: not the job's doing
    ({"job_fault": True}, FailReason.crash),   # the checkpoint the job wrote was refused
    ({"gpu_fault": True}, FailReason.gpu_fault),
    ({"oom": True}, FailReason.oom),            # re-run alone when packed (local.RETRY_ALONE)
])
def test_an_eval_failure_is_classed_by_whose_it_is(monkeypatch, tmp_path, failure, reason):
    from ait.compute import run_job as run_job_mod
    from ait.evals.runner import EvalFailed
    from ait.sandbox import RunOutcome
    from ait.train.request import TrainOutput

    job = fake_job(tmp_path, 0)

    class Process:
        pid = 0

        def kill(self):
            pass

        def finish(self, timeout_s):
            out = Path(job.run_dir) / "job" / "train_output.json"
            out.write_text(TrainOutput(checkpoint="x", train_seconds=1.0, steps=1).model_dump_json())
            return RunOutcome(returncode=0, timed_out=False, seconds=1.0, log_tail="")

    def failing_eval(*args, **kwargs):
        raise EvalFailed("the eval exited with status 1", **failure)

    monkeypatch.setattr(run_job_mod, "start_eval", lambda *a, **k: Process())
    monkeypatch.setattr(run_job_mod, "start_untrusted", lambda *a, **k: Process())
    monkeypatch.setattr(run_job_mod, "finish_eval", failing_eval)
    result = run_job_mod.run_job(job, extra_env={"CUDA_VISIBLE_DEVICES": ""})
    assert not result.ok and result.fail_reason is reason and "hidden eval" in result.error
