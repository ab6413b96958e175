"""The Ray executor on a private local Ray (loopback, usage stats off, a private temp dir):
fractional-GPU packing, failures as results, lost jobs handed back, the episode executors,
and ait without Ray installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

from ait.compute.worker import WorkerOptions, serve
from ait.job.types import FailReason, Job, JobConfig, JobResult
from ait.queue import JobQueue, JobState

CFG = JobConfig.model_validate({"job": {"base_model": "tiny"}, "train": {
    "max_steps": 1, "learning_rate": 1e-4, "num_generations": 2, "max_completion_length": 16}})


def make_job(tmp_path: Path, i: int) -> Job:
    return Job(job_id=f"j{i}", run_dir=str(tmp_path / f"r{i}"), workspace=str(tmp_path),
               task_path=str(tmp_path / "t.json"), config=CFG, time_budget_s=60)


@pytest.fixture(scope="module")
def ray():
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # bind and advertise loopback only
    ray = pytest.importorskip("ray")
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths have a length limit
    # Two GPUs declared on a CPU machine: Ray schedules and assigns them like real ones.
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, _temp_dir=temp,
             log_to_driver=False, _node_ip_address="127.0.0.1")
    # The job functions below live in this test module, which Ray's workers cannot import.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


def test_local_ray_is_on_loopback(ray):
    assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")


def gpu_job(job: Job, env: dict[str, str]) -> JobResult:
    """Wait until all four jobs run at once (so Ray had to pack them), then report the GPU."""
    barrier = Path(job.workspace) / "barrier"
    barrier.mkdir(exist_ok=True)
    (barrier / job.job_id).touch()
    deadline = time.time() + 60
    while len(list(barrier.iterdir())) < 4 and time.time() < deadline:
        time.sleep(0.05)
    return JobResult(job_id=job.job_id, ok=len(list(barrier.iterdir())) == 4,
                     metrics={"gpu": float(env["CUDA_VISIBLE_DEVICES"]), "pid": float(os.getpid())})


def test_worker_on_ray_packs_two_jobs_per_gpu(ray, tmp_path):
    from ait.compute.ray_executor import RayLauncher, task_options

    assert task_options(True, jobs_per_gpu=2)["num_gpus"] == 0.5
    assert task_options(False)["num_gpus"] == 0 and task_options(False)["max_retries"] == 0
    queue = JobQueue(tmp_path / "q.sqlite")
    queue.enqueue_many([make_job(tmp_path, i) for i in range(4)])
    launcher = RayLauncher(None, use_gpus=True, jobs_per_gpu=2, cpus_per_job=0.5, job_fn=gpu_job)
    assert len(launcher.slots) == 4  # 2 GPUs x 2 jobs each
    stats = serve(queue, launcher, WorkerOptions(once=True, poll_s=0.02))
    assert stats.done == 4, [e.error for e in queue.list()]
    results = [queue.result(f"j{i}") for i in range(4)]
    assert Counter(r.metrics["gpu"] for r in results) == {0.0: 2, 1.0: 2}  # four at once, two per GPU
    assert all(r.metrics["pid"] != os.getpid() for r in results)  # ran in Ray's worker processes


def env_job(job: Job, env: dict[str, str]) -> JobResult:
    if job.job_id == "j0":
        raise ValueError("bad job function")
    if job.job_id == "j1":
        os._exit(3)  # the Ray worker process dies under the task
    return JobResult(job_id=job.job_id, ok=True, base_model=f"cuda={env['CUDA_VISIBLE_DEVICES']!r}")


def test_failures_lost_jobs_and_cpu_jobs(ray, tmp_path):
    from ait.compute.ray_executor import RayLauncher

    queue = JobQueue(tmp_path / "q.sqlite", max_attempts=2)
    queue.enqueue_many([make_job(tmp_path, i) for i in range(3)])
    stats = serve(queue, RayLauncher(2, job_fn=env_job), WorkerOptions(once=True, poll_s=0.02))
    crashed, lost, fine = queue.get("j0"), queue.get("j1"), queue.get("j2")
    # run_job never raises: a task that raised is Ray's or our code's failure, not the job's.
    assert crashed.state is JobState.failed and crashed.result.fail_reason is FailReason.infra
    assert "bad job function" in crashed.error
    # A dead Ray worker is not the job's fault: handed back once, then failed as an infra error.
    assert stats.released == 1
    assert (lost.state, lost.attempts, lost.result.fail_reason) == (JobState.failed, 2, FailReason.infra)
    assert "executor lost the job" in queue.log_path("j1").read_text()
    assert fine.state is JobState.done and fine.result.base_model == "cuda=''"  # CPU job: no GPU visible


def slow_job(job: Job, env: dict[str, str]) -> JobResult:
    if job.job_id == "slow":
        time.sleep(60)
    return JobResult(job_id=job.job_id, ok=True, base_model=env["CUDA_VISIBLE_DEVICES"])


def test_episode_ray_executor_runs_one_task_and_times_out(ray, tmp_path):
    from ait.compute.ray_executor import RayExecutor

    executor = RayExecutor(None, wait_s=30, job_fn=slow_job)  # joins the Ray this process started
    result = executor.run(make_job(tmp_path, 0))
    assert result.ok and result.base_model in ("0", "1")  # one whole GPU of the cluster's two
    start = time.monotonic()
    late = RayExecutor(None, wait_s=1, job_fn=slow_job).run(make_job(tmp_path, 1).model_copy(update={"job_id": "slow"}))
    assert time.monotonic() - start < 20
    # No result in time from the cluster (the job's own budget is enforced inside run_job): infra.
    assert not late.ok and late.fail_reason is FailReason.infra and "cancelled" in late.error


def test_make_executor_picks_local_and_ray():
    from ait.compute.executors import InlineExecutor, make_executor
    from ait.compute.local import LocalExecutor
    from ait.compute.ray_executor import RayExecutor
    from ait.harness.types import EpisodeConfig

    assert isinstance(make_executor(EpisodeConfig()), InlineExecutor)
    # A new pool each call: its owner (one `ait episode`, `ait eval`, outer run) shares it among its episodes.
    local = make_executor(EpisodeConfig(executor="local"))
    assert isinstance(local, LocalExecutor) and local is not make_executor(EpisodeConfig(executor="local"))
    ray_exec = make_executor(EpisodeConfig(executor="ray", ray_address="127.0.0.1:6379", job_wait_s=5))
    assert isinstance(ray_exec, RayExecutor) and (ray_exec.address, ray_exec.wait_s) == ("127.0.0.1:6379", 5)


def test_local_executor_gives_each_concurrent_job_its_own_slot(tmp_path):
    import threading

    from ait.compute.local import LocalExecutor, slot_envs

    seen, lock, busy = [], threading.Lock(), set()

    def job_fn(job: Job, env: dict[str, str]) -> JobResult:
        gpu = env["CUDA_VISIBLE_DEVICES"]
        with lock:
            assert gpu not in busy, "two jobs on one slot"
            busy.add(gpu)
        time.sleep(0.2)
        with lock:
            busy.discard(gpu)
            seen.append(gpu)
        return JobResult(job_id=job.job_id, ok=True)

    executor = LocalExecutor(slot_envs(None, ["0", "1"]), job_fn=job_fn)
    threads = [threading.Thread(target=executor.run, args=(make_job(tmp_path, i),)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == ["0", "0", "1", "1"]


def test_without_ray_installed_ait_works_and_asks_for_the_extra(tmp_path):
    code = (
        "import sys\n"
        "sys.modules['ray'] = None  # as if Ray were not installed\n"
        "import ait.cli, ait.compute.worker, ait.compute.ray_executor\n"
        "from ait.compute.executors import make_executor\n"
        "from ait.harness.types import EpisodeConfig\n"
        "assert make_executor(EpisodeConfig(executor='local'))\n"
        "try:\n"
        "    make_executor(EpisodeConfig(executor='ray'))\n"
        "except RuntimeError as e:\n"
        "    print(e)\n"
        "from typer.testing import CliRunner\n"
        "out = CliRunner().invoke(ait.cli.app, ['worker', '--executor', 'ray', '--create', '--queue', sys.argv[1]])\n"
        "print(out.exit_code, ' '.join(out.output.split()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "q.sqlite")], capture_output=True, text=True, check=False,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "the ray executor needs Ray, which is not installed: pip install 'ait[ray]'"
    assert lines[1] == "2 error: the ray executor needs Ray, which is not installed: pip install 'ait[ray]'"
