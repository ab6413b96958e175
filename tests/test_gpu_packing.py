"""Packing jobs on a GPU: admission by estimated memory, and an OOM while packed is retried alone."""

from __future__ import annotations

import threading
import time

import pytest

from ait.compute.gpu_memory import GpuLedger, estimate_job_gib
from ait.compute.local import LocalExecutor, slot_envs
from ait.job.types import FailReason, JobResult
from ait.train.tiny import tiny_model_path
from tests.test_fast_grpo import reference_job


def test_jobs_wait_until_their_memory_fits():
    ledger = GpuLedger({"0": 10.0}, headroom=1.0)
    order = []

    def job(name, gib, hold):
        with ledger.reserve("0", gib):
            order.append(("start", name))
            time.sleep(hold)
            order.append(("end", name))

    a = threading.Thread(target=job, args=("a", 6.0, 0.3))
    a.start()
    time.sleep(0.05)
    b = threading.Thread(target=job, args=("b", 6.0, 0.0))  # 6 + 6 > 10: waits for a
    c = threading.Thread(target=job, args=("c", 3.0, 0.0))  # 6 + 3 fits: runs beside a
    b.start(), c.start()
    for t in (a, b, c):
        t.join()
    assert order.index(("start", "b")) > order.index(("end", "a"))
    assert order.index(("start", "c")) < order.index(("end", "a"))


def test_a_big_job_is_not_starved_by_a_stream_of_small_ones():
    """Small jobs may start ahead of a big one that does not fit yet (backfilling), at most
    MAX_OVERTAKES of them: then the big one goes first, and the rest wait behind it."""
    from ait.compute.gpu_memory import MAX_OVERTAKES

    ledger = GpuLedger({"0": 10.0}, headroom=1.0)
    order, lock, hold_a = [], threading.Lock(), threading.Event()

    def job(name, gib, hold):
        with ledger.reserve("0", gib):
            with lock:
                order.append(name)
            hold.wait(10) if isinstance(hold, threading.Event) else time.sleep(hold)

    def until(pred):
        deadline = time.monotonic() + 10
        while not pred() and time.monotonic() < deadline:
            time.sleep(0.01)

    threads = [threading.Thread(target=job, args=("a", 3.0, hold_a))]  # holds the GPU: the big one cannot fit
    threads[0].start()
    until(lambda: order == ["a"])
    threads.append(threading.Thread(target=job, args=("big", 8.0, 0.0)))
    threads[-1].start()
    until(lambda: ledger.waiting["0"])  # the big one waits
    for i in range(MAX_OVERTAKES + 4):
        threads.append(threading.Thread(target=job, args=(f"s{i}", 3.0, 0.02)))
        threads[-1].start()
    until(lambda: len(order) >= 1 + MAX_OVERTAKES)
    time.sleep(0.3)  # the four small jobs left wait behind the big one, not beside job a
    assert len(order) == 1 + MAX_OVERTAKES and "big" not in order
    hold_a.set()
    for t in threads:
        t.join(10)
    assert order.index("big") == 1 + MAX_OVERTAKES and len(order) == len(threads)


def test_memory_reserved_for_the_agent_is_left_out_of_admission():
    ledger = GpuLedger({"0": 100.0}, headroom=1.0, reserved_gib=40.0)
    assert ledger.capacity["0"] == 60.0
    started = threading.Event()

    def second():
        with ledger.reserve("0", 30.0):  # 35 + 30 > 100 - 40: waits for the first
            started.set()

    with ledger.reserve("0", 35.0):
        t = threading.Thread(target=second)
        t.start()
        assert not started.wait(0.3)
    t.join(5)
    assert started.is_set()
    with pytest.raises(ValueError, match="reserved GPU memory"):
        GpuLedger({"0": 100.0}, reserved_gib=-1.0)


def test_the_outer_loop_pool_reserves_the_agents_share(monkeypatch):
    from ait.compute import local
    from ait.outer.config import OuterConfig
    from ait.outer.executors import job_executor

    monkeypatch.setattr(local, "detect_gpus", lambda: ["0"])
    monkeypatch.setattr("ait.compute.gpu_memory.gpu_total_gib", lambda index: 100.0)
    config = OuterConfig(jobs_per_gpu=4, agent_gpu_gib=30.0, episode={"executor": "local"})
    pool, out = job_executor(config)
    assert isinstance(pool, local.LocalExecutor)
    assert pool.ledger.capacity["0"] == pytest.approx(100.0 * 0.9 - 30.0)
    # the episodes are told what that leaves a job (tests/test_job_memory_limit.py), and nothing else changes
    assert out.episode.job_gpu_memory_gib == 60.0 and out.model_copy(update={"episode": config.episode}) == config


def test_the_outer_loop_pool_admits_inner_jobs_by_their_models_measured_k(monkeypatch):
    from ait.compute import local
    from ait.outer.config import OuterConfig
    from ait.outer.executors import job_executor

    monkeypatch.setattr(local, "detect_gpus", lambda: ["0"])
    monkeypatch.setattr("ait.compute.gpu_memory.gpu_total_gib", lambda index: 139.8)
    monkeypatch.setattr("ait.compute.packing.gpu_name", lambda index: "NVIDIA H200")
    pool, _ = job_executor(OuterConfig(jobs_per_gpu=8, agent_gpu_gib=24.0, episode={"executor": "local"}))
    assert pool.model_packing["qwen2.5-coder-1.5b"].jobs_per_gpu == 2  # the shipped H200 matrix
    monkeypatch.setattr("ait.compute.packing.gpu_name", lambda index: None)  # nvidia-smi unreadable: memory alone
    pool, _ = job_executor(OuterConfig(jobs_per_gpu=8, episode={"executor": "local"}))
    assert pool.model_packing == {}


def test_a_lone_job_always_starts_even_above_the_estimate():
    ledger = GpuLedger({"0": 1.0})
    with ledger.reserve("0", 50.0) as held:
        assert not held.shared


@pytest.mark.parametrize("reason,error", [
    (FailReason.oom, "CUDA out of memory"),
    # Under MPS a fault in one client tears down every client on the GPU (seen on the H200).
    (FailReason.gpu_fault, "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"),
])
def test_an_oom_or_gpu_fault_while_packed_is_rerun_alone(tmp_path, reason, error):
    calls, running, lock = [], [0], threading.Lock()
    together = threading.Barrier(2, timeout=30)  # the first attempts overlap for sure

    def job_fn(job, env):
        with lock:
            running[0] += 1
            calls.append((job.job_id, running[0]))
            first = sum(c[0] == job.job_id for c in calls) == 1
        if first:
            together.wait()  # both first attempts are inside job_fn now
        with lock:
            alone = running[0] == 1
        time.sleep(0.1)
        with lock:
            running[0] -= 1
        if job.job_id == "big" and not alone:
            return JobResult(job_id=job.job_id, ok=False, fail_reason=reason, error=error, train_seconds=7.0)
        return JobResult(job_id=job.job_id, ok=True, train_seconds=5.0)

    ex = LocalExecutor(slot_envs(2, ["0"], jobs_per_gpu=2), job_fn=job_fn, capacity_gib={"0": 1000.0})
    big = reference_job(tmp_path / "a").model_copy(update={"job_id": "big"})
    small = reference_job(tmp_path / "b").model_copy(update={"job_id": "small"})
    results = {}
    threads = [threading.Thread(target=lambda j=j: results.update({j.job_id: ex.run(j)})) for j in (big, small)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["big"].ok and results["big"].metrics["pack/retried_alone"] == 1.0
    # Only the attempt that counted is timed, at the packing it was admitted to (two jobs, nothing
    # measured for its model: x2), so a faked OOM never buys a faster job alone.
    assert results["big"].train_seconds == 10.0 and results["big"].metrics["pack/first_attempt_s"] == 7.0
    assert results["small"].train_seconds == 5.0
    assert results["small"].ok and "pack/retried_alone" not in results["small"].metrics
    assert [c for c in calls if c[0] == "big"][-1][1] == 1  # the retry ran with nobody beside it


@pytest.mark.parametrize("error", ["ValueError: bad env.py",
                                   # a job's own output decides nothing: any job can print these
                                   "torch.OutOfMemoryError: CUDA out of memory",
                                   "CUDA error: an illegal memory access was encountered"])
def test_an_ordinary_crash_while_packed_is_not_rerun(tmp_path, error):
    calls = []

    def job_fn(job, env):
        calls.append(job.job_id)
        return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.crash, error=error)

    ex = LocalExecutor(slot_envs(2, ["0"], jobs_per_gpu=2), job_fn=job_fn, capacity_gib={"0": 1000.0})
    with ex.ledger.reserve("0", 1.0):  # a neighbour holds the GPU: the job runs shared
        result = ex.run(reference_job(tmp_path))
    assert not result.ok and calls == [result.job_id] and "pack/retried_alone" not in result.metrics


def test_estimates_grow_with_the_job(tmp_path):
    job = reference_job(tmp_path)
    small = estimate_job_gib(job, str(tiny_model_path()))
    bigger = job.model_copy(deep=True)
    bigger.config.train.num_generations *= 8
    assert estimate_job_gib(bigger, str(tiny_model_path())) > small > 0


def model_shaped(path, hidden: int, layers: int, heads: int, kv_heads: int, vocab: int, params: int):
    """A model directory the estimate reads: its config and a sparse bf16 weights file of `params`."""
    import json

    path.mkdir()
    (path / "config.json").write_text(json.dumps({
        "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "vocab_size": vocab, "torch_dtype": "bfloat16"}))
    with open(path / "model.safetensors", "wb") as f:  # sparse: only its size is read
        f.truncate(params * 2)
    return path


def test_the_estimate_covers_what_the_h200_measured_for_the_standard_job(tmp_path):
    """SmolLM2-135M's shape, the standard job (64 rollouts, 128 tokens, full fine-tuning): on an H200
    each training process held ~17 GiB and its waiting eval 0.8 GiB, and eight such jobs ran out of
    139.8 GiB. The estimate must cover one job and must not admit eight at once."""
    model = model_shaped(tmp_path / "smollm2", 576, 30, 9, 3, 49152, int(134.5e6))
    job = reference_job(tmp_path)
    job.config.train.prompts_per_step, job.config.train.num_generations = 8, 8
    job.config.train.max_completion_length = 128
    job.config.train.lora = None
    gib = estimate_job_gib(job, str(model))
    assert gib >= 17.0 + 0.8
    ledger = GpuLedger({"0": 139.8})  # 90% headroom, as LocalExecutor uses it
    assert 8 * gib > ledger.capacity["0"] >= 7 * gib
    # packed, jobs score in half-size micro-batches (ait.train.request.PACKED_LOGIT_BUDGET): eight fit
    packed = estimate_job_gib(job, str(model), logit_budget=2**28)
    assert packed < gib and 8 * packed <= ledger.capacity["0"]


def test_the_lora_1_5b_variant_fits_an_80_gb_card_beside_the_agent_where_the_full_one_does_not(tmp_path):
    """The arc on an H100 holds 36 GiB for its 1.5B agent (bench/gpu.sh): the full 1.5B job is refused there,
    so string_pipeline, dispatch and ledger, whose best untrained score is the 1.5B's, had no job that could
    beat it. Their lora_qwen15 job is admitted, beside a SmolLM2 job, at the arc's packed logit budget."""
    import tomllib

    from ait.job.types import Job, JobConfig
    from ait.policy.job_variants import variant_job

    model = model_shaped(tmp_path / "qwen15", 1536, 28, 12, 2, 151936, 1_543_714_304)

    def estimate(variant: str) -> float:
        cfg = JobConfig.model_validate(tomllib.loads(variant_job("string_pipeline", variant)["job.toml"]))
        job = Job(job_id=variant, run_dir=str(tmp_path), workspace=str(tmp_path), task_path="t.json", config=cfg,
                  time_budget_s=300)
        return estimate_job_gib(job, str(model), logit_budget=2**28)

    left = GpuLedger({"0": 79.6}, reserved_gib=36.0).capacity["0"]  # an H100's 80 GB, 10% headroom, the agent's 36
    assert estimate("model_qwen15") > left
    assert estimate("lora_qwen15") + 10.7 <= left  # and a SmolLM2 job (10.7 GiB in the arc) beside it


@pytest.mark.parametrize("estimate,reserved,refused", [
    (41.0, 46.0, True),    # a 1.5B job beside the 1.5B agent on an 80 GB card: more than is left
    (200.0, 46.0, True),   # more than the card: not run either (there is no telling it is the job's)
    (3.0, 46.0, False),    # fits beside the agent: it runs, and an OOM stays its own (its exit status could lie)
    (41.0, 0.0, False),    # nothing held for another process: a lone job always starts
])
def test_a_job_that_cannot_fit_beside_the_agent_is_not_run(tmp_path, monkeypatch, estimate, reserved, refused):
    """On 2026-12-07 every qwen2.5-coder-1.5b job on an H100 ran out of memory beside the 1.5B agent, alone
    and again alone, and was scored as the agent's dead job (on an H200 the same choice trains); it could
    as well have pushed the agent's training step out of memory."""
    from ait.compute import local

    monkeypatch.setattr(local, "estimate_gib", lambda job, budget=None: estimate)
    calls = []

    def job_fn(job, env):
        calls.append(job.job_id)
        return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.oom, error="training exited with status 3 (oom)")

    ex = LocalExecutor(slot_envs(1, ["0"], jobs_per_gpu=4), job_fn=job_fn, capacity_gib={"0": 79.2},
                       reserved_gib=reserved)
    job = reference_job(tmp_path)
    result = ex.run(job)
    assert not result.ok
    if refused:
        assert calls == [] and result.fail_reason is FailReason.infra and not ex.started(job)
        assert "46 GiB for the agent" in result.error and f"{estimate:.1f} GiB" in result.error
    else:
        assert calls == [job.job_id] and result.fail_reason is FailReason.oom


def test_the_agent_process_is_capped_at_what_the_jobs_admission_leaves_it(monkeypatch):
    """The packed jobs' ledger holds agent_gpu_gib back for the agent; cap_process_memory holds the agent
    to it (torch's per-process fraction on the agent's device), and caps nothing off CUDA or at 0."""
    import torch

    from ait.compute.gpu_memory import cap_process_memory

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: type("P", (), {"total_memory": 80 * 2**30 if i == 0 else 140 * 2**30})())
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, i: calls.append((round(f, 6), i)))
    assert cap_process_memory("cuda", 46.0) == pytest.approx(46 / 80)
    assert cap_process_memory("cuda:1", 46.0) == pytest.approx(46 / 140)
    assert cap_process_memory("cuda:0", 200.0) == 1.0  # never past the card
    assert calls == [(round(46 / 80, 6), 0), (round(46 / 140, 6), 1), (1.0, 0)]
    assert cap_process_memory("cpu", 46.0) is None and cap_process_memory("cuda", 0.0) is None
    assert len(calls) == 3
