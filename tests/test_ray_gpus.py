"""Several GPUs through Ray, on this CPU machine with four GPUs declared to a private local Ray
(Ray places, counts and assigns declared GPUs as it does real ones): job slots K per GPU on every
GPU, jobs spread over the least busy GPUs, each job given the GPU Ray assigned it, the outer loop's
agent holding its own share; a job whose process is killed is re-run on another GPU; a Ray worker
process SIGKILLed mid-job leaves no job lost and none done twice."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from ait.compute.worker import WorkerOptions, serve
from ait.job.types import Job, JobConfig, JobResult
from ait.queue import JobQueue, JobState

CFG = JobConfig.model_validate({"job": {"base_model": "tiny"}, "train": {
    "max_steps": 1, "learning_rate": 1e-4, "num_generations": 2, "max_completion_length": 16}})
GPUS = 4


def make_job(root: Path, name: str) -> Job:
    run_dir = root / name
    run_dir.mkdir(parents=True, exist_ok=True)
    return Job(job_id=name, run_dir=str(run_dir), workspace=str(root), task_path=str(root / "t.json"), config=CFG,
               time_budget_s=60)


@pytest.fixture(scope="module")
def ray():
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # bind and advertise loopback only
    ray = pytest.importorskip("ray")
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths have a length limit
    ray.init(address="local", num_cpus=8, num_gpus=GPUS, include_dashboard=False, _temp_dir=temp,
             log_to_driver=False, _node_ip_address="127.0.0.1")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the job functions below
    yield ray
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


def barrier_job(job: Job, env: dict[str, str]) -> JobResult:
    """Mark this job running on its GPU, wait until the whole batch runs at once (so the placement
    is the pool's, not the order jobs happened to finish in), then report what it saw."""
    root = Path(job.workspace)
    batch = int((root / "batch").read_text())
    gpu = env["CUDA_VISIBLE_DEVICES"]
    running = root / "running" / gpu
    running.mkdir(parents=True, exist_ok=True)
    (running / job.job_id).touch()
    (root / "started" / job.job_id).touch()
    deadline = time.time() + 60
    while len(list((root / "started").iterdir())) < batch and time.time() < deadline:
        time.sleep(0.05)
    sharing = len(list(running.iterdir()))  # jobs on this GPU right now, this one included
    time.sleep(0.2)
    (running / job.job_id).unlink()
    return JobResult(job_id=job.job_id, ok=len(list((root / "started").iterdir())) >= batch,
                     base_model=gpu, metrics={"sharing": float(sharing), "pid": float(os.getpid()),
                                              "packed_budget": float(LOGIT in env)})


LOGIT = "AIT_LOGIT_BUDGET"


def run_batch(run, root: Path, names: list[str]) -> list[JobResult]:
    shutil.rmtree(root, ignore_errors=True)
    (root / "started").mkdir(parents=True)
    (root / "batch").write_text(str(len(names)))
    results: list[JobResult] = []
    threads = [threading.Thread(target=lambda n=n: results.append(run(make_job(root, n)))) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_slots_fill_every_gpu_k_per_gpu_jobs_spread_and_the_agent_keeps_its_share(ray, tmp_path):
    from ait.compute.ray_executor import RayExecutor, RaySlots, agent_share, gpu_share
    from ait.train.request import LOGIT_BUDGET_ENV

    assert LOGIT_BUDGET_ENV == LOGIT
    assert gpu_share(2) == 0.5 and gpu_share(6) * 6 <= 1  # Ray's grid: six 1/6 shares still fit one GPU
    assert agent_share(2) == 0.5 and agent_share(4, agent_gib=30, gpu_gib=140) == 0.25
    assert agent_share(4, agent_gib=80, gpu_gib=140) == 0.75 and agent_share(1) == 1.0

    pool = RaySlots(ray, use_gpus=True, jobs_per_gpu=2, cpus_per_job=0.5, agent_gpus=agent_share(2),
                    job_fn=barrier_job)
    try:
        # The agent's half of a GPU is held first; 2 slots on every other GPU, 1 beside the agent.
        agent_gpu = pool.agent_gpu
        assert agent_gpu in {str(g) for g in range(GPUS)}
        assert len(pool.actors) == 7
        assert Counter(pool.gpus) == {str(g): 1 if str(g) == agent_gpu else 2 for g in range(GPUS)}
        assert ray.available_resources().get("GPU", 0) < 1e-3  # nothing left for anyone else
        assert agent_gpu in pool.describe() and "7 job slot(s) of 0.5 GPU" in pool.describe()

        # Four jobs on seven slots: one per GPU (Ray's own placement would put them on two GPUs), through
        # the episode executor the outer loop uses on this pool.
        spread = run_batch(RayExecutor(None, wait_s=60, pool=pool).run, tmp_path / "four", [f"a{i}" for i in range(4)])
        assert all(r.ok for r in spread)
        assert sorted(r.base_model for r in spread) == [str(g) for g in range(GPUS)]
        assert all(r.metrics["sharing"] == 1 for r in spread)
        assert all(r.metrics["ray/gpu_try1"] == float(r.base_model) for r in spread)

        # Seven at once: every slot busy, never more than K=2 jobs on a GPU (1 beside the agent).
        full = run_batch(pool.run, tmp_path / "seven", [f"b{i}" for i in range(7)])
        assert all(r.ok for r in full)
        on_gpu = Counter(r.base_model for r in full)
        assert on_gpu == {str(g): 1 if str(g) == agent_gpu else 2 for g in range(GPUS)}
        assert max(r.metrics["sharing"] for r in full) == 2
        assert all(r.metrics["packed_budget"] == 1 for r in full)  # packed jobs score in half-size micro-batches
        assert all(r.metrics["pid"] != os.getpid() for r in full)  # in Ray's processes, not this one
    finally:
        pool.close()


def test_an_agent_holding_a_whole_gpu_leaves_k_slots_on_each_other_gpu(ray):
    from ait.compute.ray_executor import RaySlots

    with pytest.raises(ValueError, match="agent GPU share needs GPU jobs"):
        RaySlots(ray, use_gpus=False, agent_gpus=0.5)
    with pytest.raises(ValueError, match="no room"):
        RaySlots(ray, use_gpus=True, slots=0)
    pool = RaySlots(ray, use_gpus=True, jobs_per_gpu=1, cpus_per_job=0.5, agent_gpus=1.0, job_fn=barrier_job)
    try:
        assert len(pool.actors) == GPUS - 1 and pool.agent_gpu not in pool.gpus
        assert sorted(pool.gpus + [pool.agent_gpu]) == [str(g) for g in range(GPUS)]
    finally:
        pool.close()


def killable_job(job: Job, env: dict[str, str]) -> JobResult:
    """The job's process: a child the test can SIGKILL (as a GPU fault or a preemption kills a
    training process); its exit status is classified as run_job classifies it."""
    from ait.compute.run_job import classify_failure
    from ait.sandbox.process import RunOutcome

    run_dir = Path(job.run_dir)
    attempt = len(list(run_dir.glob("try*"))) + 1
    (run_dir / f"try{attempt}").write_text(env["CUDA_VISIBLE_DEVICES"])
    seconds = "30" if attempt == 1 else "0.1"
    proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"], env={**os.environ, **env})
    (run_dir / f"pid{attempt}").write_text(str(proc.pid))
    code = proc.wait()
    if code != 0:
        reason = classify_failure(RunOutcome(returncode=code, timed_out=False, seconds=1.0, log_tail=""))
        return JobResult(job_id=job.job_id, ok=False, fail_reason=reason, train_seconds=1.0,
                         error=f"training exited with status {code}")
    return JobResult(job_id=job.job_id, ok=True, base_model=env["CUDA_VISIBLE_DEVICES"], train_seconds=0.5)


def test_a_job_whose_gpu_process_is_killed_runs_again_on_another_gpu(ray, tmp_path):
    from ait.compute.ray_executor import RayLauncher

    queue = JobQueue(tmp_path / "q.sqlite")
    queue.enqueue(make_job(tmp_path, "k0"))
    launcher = RayLauncher(None, use_gpus=True, jobs_per_gpu=1, cpus_per_job=0.5, job_fn=killable_job)
    assert len(launcher.slots) == GPUS

    def kill_first_run() -> None:
        pid_file = tmp_path / "k0" / "pid1"
        deadline = time.time() + 60
        while not pid_file.exists() and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)

    killer = threading.Thread(target=kill_first_run)
    killer.start()
    stats = serve(queue, launcher, WorkerOptions(once=True, poll_s=0.02))
    killer.join()
    entry = queue.get("k0")
    assert (entry.state, entry.attempts, stats.done, stats.released) == (JobState.done, 1, 1, 0)
    first, second = (tmp_path / "k0" / "try1").read_text(), (tmp_path / "k0" / "try2").read_text()
    assert first != second  # another GPU
    m = entry.result.metrics
    assert (m["ray/gpu_try1"], m["ray/gpu_try2"]) == (float(first), float(second))
    assert m["ray/retried_elsewhere"] == 1.0
    # SIGKILL with no memory cgroup watching reads as the kernel's OOM killer: retried too.
    assert m.get("ray/first_oom", 0) + m.get("ray/first_killed", 0) == 1.0
    assert entry.result.base_model == second and entry.result.train_seconds == 0.5  # only the run that counted is timed
    assert m["ray/first_attempt_s"] == 1.0
    assert not (tmp_path / "k0" / "try3").exists()  # one retry, no more


def steady_job(job: Job, env: dict[str, str]) -> JobResult:
    """Record start and end of each run (with this process's pid, so the test can kill it)."""
    run_dir = Path(job.run_dir)
    with open(run_dir / "runs.txt", "a") as f:
        f.write(f"start {os.getpid()}\n")
    (run_dir / "slot.pid").write_text(str(os.getpid()))
    time.sleep(1.5 if job.job_id == "w0" else 0.3)
    with open(run_dir / "runs.txt", "a") as f:
        f.write(f"end {os.getpid()}\n")
    return JobResult(job_id=job.job_id, ok=True, base_model=env["CUDA_VISIBLE_DEVICES"],
                     metrics={"pid": float(os.getpid())})


def test_a_ray_worker_process_killed_mid_job_loses_no_job_and_runs_none_twice(ray, tmp_path):
    from ait.compute.ray_executor import RayLauncher

    queue = JobQueue(tmp_path / "q.sqlite", max_attempts=3)
    names = [f"w{i}" for i in range(6)]
    queue.enqueue_many([make_job(tmp_path, n) for n in names])
    launcher = RayLauncher(None, use_gpus=True, jobs_per_gpu=1, cpus_per_job=0.5, job_fn=steady_job)
    killed: list[int] = []

    def kill_w0_slot() -> None:
        pid_file = tmp_path / "w0" / "slot.pid"
        deadline = time.time() + 60
        while not pid_file.exists() and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # mid-job
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGKILL)  # the Ray worker process (job slot) running w0
        killed.append(pid)

    killer = threading.Thread(target=kill_w0_slot)
    killer.start()
    stats = serve(queue, launcher, WorkerOptions(once=True, poll_s=0.02))
    killer.join()
    assert killed
    entries = {e.job_id: e for e in queue.list()}
    assert all(e.state is JobState.done for e in entries.values()), [(e.job_id, e.error) for e in entries.values()]
    assert (stats.done, stats.released) == (6, 1)
    assert entries["w0"].attempts == 2 and all(entries[n].attempts == 1 for n in names[1:])  # the attempt counted
    runs = (tmp_path / "w0" / "runs.txt").read_text().split()
    assert runs == ["start", str(killed[0]), "start", runs[3], "end", runs[3]]  # the killed run never ended
    assert entries["w0"].result.metrics["pid"] == float(runs[3]) != killed[0]  # the result is the second run's
    for n in names:  # exactly one accepted result per job
        log = queue.log_path(n).read_text()
        assert log.count(" end state=done") == 1
    assert "executor lost the job" in queue.log_path("w0").read_text()


def test_outer_loop_on_ray_holds_the_agents_gpu_and_spreads_episode_jobs(ray, tmp_path, monkeypatch):
    from ait.compute.executors import InlineExecutor
    from ait.compute.ray_executor import RayExecutor
    from ait.outer.config import OuterConfig
    from ait.outer.executors import job_executor

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    config = OuterConfig(jobs_per_gpu=2, trainer={"device": "cuda"}, episode={"executor": "ray", "job_wait_s": 60})
    executor, moved = job_executor(config)
    try:
        pool = executor.pool  # the one pool every episode of the run shares
        assert isinstance(executor, RayExecutor) and executor.wait_s == 60
        assert pool is not None and pool.agent_gpus == 0.5 and len(pool.actors) == 7
        assert moved.trainer.device == f"cuda:{pool.agent_gpu}"  # the agent trains on the GPU share Ray holds for it
    finally:
        executor.close()  # the run closes its pool: the next one (a resumed run) places its own
    assert pool.actors == [] and pool.agent is None
    executor, same = job_executor(config.model_copy(update={"trainer": config.trainer.model_copy(
        update={"device": "cpu"})}))
    try:
        assert same.trainer.device == "cpu"
        assert executor.pool.agent is None and len(executor.pool.actors) == 8  # no agent on a GPU: no share
    finally:
        executor.close()
    with pytest.raises(ValueError, match="trainer.device"):
        job_executor(config.model_copy(update={"trainer": config.trainer.model_copy(update={"device": "cuda:9"})}))
    executor, same = job_executor(OuterConfig())  # not executor = ray: no pool, nothing placed
    assert isinstance(executor, InlineExecutor) and same == OuterConfig()


def sleepy_job(job: Job, env: dict[str, str]) -> JobResult:
    if job.job_id == "slow":
        time.sleep(60)
    return JobResult(job_id=job.job_id, ok=True, base_model=env["CUDA_VISIBLE_DEVICES"], metrics={"pid": float(os.getpid())})


def test_one_slot_pool_retries_on_the_same_gpu_and_a_stopped_job_frees_its_slot(ray, tmp_path):
    from ait.compute.ray_executor import RayExecutor, RaySlots
    from ait.job.types import FailReason

    pool = RaySlots(ray, use_gpus=True, jobs_per_gpu=1, cpus_per_job=0.5, slots=1, job_fn=killable_job)
    try:
        # A killed job with no other GPU in the pool: its one retry runs on the same GPU.
        threading.Thread(target=lambda: (wait_for(tmp_path / "k1" / "pid1"),
                                         os.kill(int((tmp_path / "k1" / "pid1").read_text()), signal.SIGKILL))).start()
        result = pool.run(make_job(tmp_path, "k1"))
        assert result.ok and result.metrics["ray/retried_elsewhere"] == 0.0
        assert result.metrics["ray/gpu_try1"] == result.metrics["ray/gpu_try2"]
    finally:
        pool.close()
    pool = RaySlots(ray, use_gpus=True, jobs_per_gpu=1, cpus_per_job=0.5, slots=1, job_fn=sleepy_job)
    try:
        # The episode stops waiting: the job's slot process is killed, Ray restarts it, the next job runs there.
        start = time.monotonic()
        late = RayExecutor(None, wait_s=2, pool=pool).run(make_job(tmp_path, "slow"))
        assert not late.ok and late.fail_reason is FailReason.infra and "cancelled" in late.error
        assert time.monotonic() - start < 20
        after = pool.run(make_job(tmp_path, "next"))
        assert after.ok and after.base_model == pool.gpus[0]
    finally:
        pool.close()


def wait_for(path: Path, timeout_s: float = 60) -> None:
    deadline = time.time() + timeout_s
    while not path.exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
