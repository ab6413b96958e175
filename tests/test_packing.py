"""`ait worker --jobs-per-gpu auto`: K and the MPS share come from committed measurements, and the
worker's slots admit packed jobs by memory as the episode executor's do."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ait.cli import app
from ait.compute import local
from ait.compute.local import LocalLauncher, slot_envs
from ait.compute.packing import Packing, PackRun, choose_packing, load_runs, per_model
from ait.job.types import FailReason, JobResult
from tests.test_gpu_packing import reference_job

ROOT = Path(__file__).resolve().parents[1]


def run(k: int, jph: float, peak: float, pct: int | None = None, gpu: str = "NVIDIA H200") -> PackRun:
    return PackRun(gpu=gpu, model="smollm2-135m", jobs_per_gpu=k, mps_thread_percentage=pct, jobs_per_hour=jph,
                   peak_gib_per_job=peak, source="docs/measurements/x.json")


def test_the_measured_k_with_the_most_jobs_per_hour_that_fits_is_chosen():
    runs = [run(1, 58, 15.4), run(8, 243, 9.5, 25), run(8, 236, 9.6, 50), run(12, 300, 9.5, 25)]
    # 12 x 9.5 GiB fits 90% of 139.8 GiB: the fastest measured K wins, with its MPS share.
    choice = choose_packing("NVIDIA H200", 139.8, runs)
    assert (choice.jobs_per_gpu, choice.mps_thread_percentage) == (12, 25) and "300 jobs/hour" in choice.why
    # On a smaller card of the same name K=12 would not fit: the best K that does.
    choice = choose_packing("NVIDIA H200", 100.0, runs)
    assert (choice.jobs_per_gpu, choice.mps_thread_percentage) == (8, 25)


def test_an_unmeasured_gpu_gets_what_memory_allows():
    runs = [run(1, 58, 15.4), run(8, 243, 9.5, 25)]
    choice = choose_packing("NVIDIA A100-SXM4-80GB", 80.0, runs)
    assert choice.jobs_per_gpu == 4 and choice.mps_thread_percentage == 50  # 72 GiB // 15.4 GiB
    assert "no packing measured" in choice.why
    small = choose_packing("NVIDIA A10G", 24.0, runs)
    assert (small.jobs_per_gpu, small.mps_thread_percentage) == (1, None)


def test_the_shipped_measurements_load_and_name_committed_files():
    runs = load_runs()
    assert runs and any(r.jobs_per_gpu > 1 for r in runs)
    for r in runs:
        assert (ROOT / r.source).is_file(), r.source


def test_the_worker_flag_is_checked():
    result = CliRunner().invoke(app, ["worker", "--queue", "/nonexistent/q.sqlite", "--jobs-per-gpu", "many"])
    assert result.exit_code != 0 and "must be a number >= 1 or auto" in result.output


def test_worker_slots_admit_packed_jobs_by_memory_and_rerun_an_oom_alone(tmp_path, monkeypatch):
    """Two slots on one GPU, jobs estimated at 60 GiB each on a 100 GiB card: never both at once
    (before, the worker started every slot's job whatever its size)."""
    monkeypatch.setattr(local, "estimate_gib", lambda job, budget=0: 60.0)
    running, peak, lock = [0], [0], threading.Lock()

    def job_fn(job, env):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1
        return JobResult(job_id=job.job_id, ok=True, train_seconds=1.0)

    launcher = LocalLauncher(slot_envs(2, ["0"], jobs_per_gpu=2), job_fn=job_fn, capacity_gib={"0": 100.0})
    jobs = [reference_job(tmp_path / n).model_copy(update={"job_id": n}) for n in ("a", "b")]
    futures = [launcher.submit(j, env) for j, env in zip(jobs, launcher.slots)]
    assert all(f.result(30).ok for f in futures) and peak[0] == 1
    launcher.close()

    # Small estimates: both run together, and the one that runs out of memory beside the other is re-run alone.
    monkeypatch.setattr(local, "estimate_gib", lambda job, budget=0: 1.0)
    together = threading.Barrier(2, timeout=30)
    calls = []

    def oom_when_shared(job, env):
        calls.append(job.job_id)
        if calls.count(job.job_id) == 1:
            together.wait()
            if job.job_id == "a":
                return JobResult(job_id="a", ok=False, fail_reason=FailReason.oom, error="CUDA out of memory",
                                 train_seconds=3.0)
        return JobResult(job_id=job.job_id, ok=True, train_seconds=2.0)

    launcher = LocalLauncher(slot_envs(2, ["0"], jobs_per_gpu=2), job_fn=oom_when_shared, capacity_gib={"0": 100.0})
    results = [f.result(30) for f in [launcher.submit(j, env) for j, env in zip(jobs, launcher.slots)]]
    launcher.close()
    assert results[0].ok and results[0].metrics["pack/retried_alone"] == 1.0 and results[0].train_seconds == 4.0
    assert results[1].ok and calls.count("a") == 2 and calls.count("b") == 1


@pytest.mark.parametrize("value", ["0", "-1", "2.5"])
def test_bad_k_values_fail_in_one_line(value):
    result = CliRunner().invoke(app, ["worker", "--queue", "/nonexistent/q.sqlite", "--jobs-per-gpu", value])
    assert result.exit_code != 0 and "--jobs-per-gpu" in result.output


def test_agent_gpus_is_a_ray_setting(tmp_path):
    result = CliRunner().invoke(app, ["worker", "--queue", str(tmp_path / "q.sqlite"), "--create",
                                      "--agent-gpus", "0.5"])
    assert result.exit_code != 0 and "--agent-gpus applies to --executor ray" in result.output
    result = CliRunner().invoke(app, ["worker", "--queue", str(tmp_path / "q.sqlite"), "--create",
                                      "--agent-gpus", "1.5"])
    assert result.exit_code != 0 and "--agent-gpus" in result.output


def test_each_model_gets_its_own_best_k_and_share():
    runs = [run(1, 82, 15.4), run(8, 251, 9.6, 25),
            PackRun(gpu="NVIDIA H200", model="big", jobs_per_gpu=1, jobs_per_hour=20, peak_gib_per_job=40,
                    source="x"),
            PackRun(gpu="NVIDIA H200", model="big", jobs_per_gpu=2, mps_thread_percentage=100, jobs_per_hour=31,
                    peak_gib_per_job=41, source="x"),
            PackRun(gpu="NVIDIA H200", model="big", jobs_per_gpu=4, mps_thread_percentage=50, jobs_per_hour=35,
                    peak_gib_per_job=41, source="x")]  # 4 x 41 GiB does not fit 90% of 139.8 GiB
    models = per_model("NVIDIA H200", 139.8, runs)
    assert (models["smollm2-135m"].jobs_per_gpu, models["smollm2-135m"].mps_thread_percentage) == (8, 25)
    assert (models["big"].jobs_per_gpu, models["big"].mps_thread_percentage) == (2, 100)
    assert per_model("NVIDIA A100-SXM4-80GB", 80.0, runs) == {}  # nothing measured there: memory alone admits


def test_a_job_shares_its_gpu_with_at_most_its_models_k():
    from ait.compute.gpu_memory import GpuLedger

    ledger = GpuLedger({"0": 1000.0}, headroom=1.0)
    order: list[str] = []

    def hold(name: str, max_jobs: int | None, release: threading.Event) -> None:
        with ledger.reserve("0", 1.0, max_jobs=max_jobs):
            order.append(name)
            release.wait(10)

    def until(n: int) -> None:
        deadline = time.monotonic() + 10
        while len(order) < n and time.monotonic() < deadline:
            time.sleep(0.01)

    big, small1, small2 = threading.Event(), threading.Event(), threading.Event()
    t_big = threading.Thread(target=hold, args=("big", 2, big))
    t_big.start()
    until(1)
    t1 = threading.Thread(target=hold, args=("small1", 8, small1))
    t1.start()
    until(2)
    t2 = threading.Thread(target=hold, args=("small2", 8, small2))  # a third job beside the K=2 one: waits
    t2.start()
    time.sleep(0.3)
    assert order == ["big", "small1"]
    big.set()
    t_big.join(5)
    until(3)
    assert order == ["big", "small1", "small2"]  # the K=2 job gone, eight may share the GPU again
    small1.set(), small2.set()
    t1.join(5), t2.join(5)


def test_a_packed_job_runs_at_its_models_measured_share(tmp_path):
    seen: dict[str, dict[str, str]] = {}

    def job_fn(job, env):
        seen[job.job_id] = dict(env)
        return JobResult(job_id=job.job_id, ok=True, train_seconds=1.0)

    job = reference_job(tmp_path / "a").model_copy(update={"job_id": "a"})
    model = job.config.job.base_model
    env = slot_envs(8, ["0"], jobs_per_gpu=8, mps_thread_percentage=25)[0]
    ledger = local.ledger_for([env], {"0": 139.8})
    packs = {model: Packing(jobs_per_gpu=2, mps_thread_percentage=100, why="")}
    local.run_admitted(ledger, job_fn, job, env, packs)
    assert seen["a"][local.MPS_THREAD_PERCENTAGE_ENV] == "100"
    packs = {model: Packing(jobs_per_gpu=1, mps_thread_percentage=None, why="")}
    local.run_admitted(ledger, job_fn, job, env, packs)
    assert local.MPS_THREAD_PERCENTAGE_ENV not in seen["a"]  # measured alone, uncapped: no cap
    local.run_admitted(ledger, job_fn, job, env, {"another-model": packs[model]})
    assert seen["a"][local.MPS_THREAD_PERCENTAGE_ENV] == "25"  # no row for its model: the slot's share


def test_auto_packing_takes_the_slots_and_each_models_row_from_the_shipped_matrix(monkeypatch):
    from ait.cli.worker import packing_for
    from ait.compute import gpu_memory, packing

    monkeypatch.setattr(packing, "gpu_name", lambda index: "NVIDIA H200")
    monkeypatch.setattr(gpu_memory, "gpu_total_gib", lambda index: 139.8)
    k, share, models = packing_for("auto", ["0"], None)
    best = max((r for r in load_runs() if r.gpu == "NVIDIA H200"), key=lambda r: r.jobs_per_hour)
    assert (k, share) == (best.jobs_per_gpu, best.mps_thread_percentage)
    assert {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"} <= set(models)
    assert models["qwen2.5-coder-1.5b"].jobs_per_gpu < k  # the 1.5B shares its GPU with fewer
    # An operator's SM share wins everywhere: no per-model shares then.
    assert packing_for("auto", ["0"], 40) == (k, 40, {})
    assert packing_for("3", ["0"], None) == (3, None, {})


def test_jobs_join_their_own_mps_daemon_while_the_launching_process_stays_out(monkeypatch, tmp_path):
    """AIT_JOBS_MPS_PIPE_DIRECTORY: GPU slots name the jobs' MPS daemon (the sandbox's GPU settings then
    give the job that pipe directory), CPU slots do not; the launching process's own environment is
    left as it is, so the agent is no client of that daemon (an MPS client's fatal fault ends them all)."""
    from ait.sandbox import gpu_settings

    pipe = tmp_path / "jobs-mps"
    pipe.mkdir()
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    assert all("CUDA_MPS_PIPE_DIRECTORY" not in e for e in slot_envs(2, ["0"], jobs_per_gpu=2))
    monkeypatch.setenv(local.JOBS_MPS_ENV, str(pipe))
    envs = slot_envs(4, ["0", "1"], jobs_per_gpu=2, mps_thread_percentage=50)
    assert [e["CUDA_MPS_PIPE_DIRECTORY"] for e in envs] == [str(pipe)] * 4
    assert "CUDA_MPS_PIPE_DIRECTORY" not in slot_envs(1, [])[0]  # a CPU slot joins no daemon
    assert "CUDA_MPS_PIPE_DIRECTORY" not in __import__("os").environ
    monkeypatch.setattr("ait.sandbox.unsafe_allowed", lambda: True)
    monkeypatch.setattr("ait.sandbox.Path", lambda p: tmp_path if p == "/dev/nvidiactl" else Path(p))
    assert gpu_settings(envs[0]) == (True, str(pipe))


def test_a_job_that_finds_cuda_unusable_is_re_run_alone_not_scored_as_its_crash():
    """Under MPS a neighbour's fatal fault leaves the daemon refusing new clients ("MPS server is not
    ready") until the faulting ones exit: jobs starting then exit EXIT_NO_GPU, a GPU fault (re-run
    alone, the first attempt's time added), not a crash of the agent's code."""
    from ait.compute.run_job import classify_failure
    from ait.sandbox import RunOutcome
    from ait.train.request import EXIT_GPU_FAULT, EXIT_NO_GPU

    for code in (EXIT_NO_GPU, EXIT_GPU_FAULT):
        assert classify_failure(RunOutcome(code, False, 2.2, "")) is FailReason.gpu_fault
    assert FailReason.gpu_fault in local.RETRY_ALONE
    assert classify_failure(RunOutcome(1, False, 2.2, "")) is FailReason.crash
