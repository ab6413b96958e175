"""Where the outer loop's agent shares the GPU with the inner jobs, a job's GPU memory is a stated
limit: the agent is told it, and the probe rejects a job estimated above it (an invalid submission
with what to change) instead of the executor refusing the job as infra. On an H100 arc on 2026-12-07
the warm-started agent chose the full 1.5B in five of the first five episodes; each was refused as
infra and left out of its group, so the arc could learn nothing from them."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from ait.compute.local import LocalExecutor, slot_envs
from ait.harness.episode import opening_messages
from ait.harness.types import EpisodeConfig
from ait.job.types import JobConfig
from ait.outer.config import OuterConfig
from ait.policy.job_variants import variant_job
from ait.probe.runner import over_memory, probe_workspace
from ait.probe.types import ProbeCheck
from ait.spec import load_spec
from tests.test_gpu_packing import model_shaped
from tests.test_probe import TASK, build_workspace


def test_the_executor_states_the_limit_only_where_memory_is_held_back() -> None:
    slots = slot_envs(1, ["0", "1"], jobs_per_gpu=4)
    held = LocalExecutor(slots, job_fn=lambda job, env: None, capacity_gib={"0": 79.6, "1": 139.8}, reserved_gib=36.0)
    assert held.job_memory_limit_gib() == pytest.approx(79.6 * 0.9 - 36.0)  # the smaller GPU's share
    assert LocalExecutor(slots, job_fn=lambda job, env: None, capacity_gib={"0": 79.6, "1": 139.8}).job_memory_limit_gib() is None
    unknown = LocalExecutor(slots, job_fn=lambda job, env: None, capacity_gib={"0": None, "1": None}, reserved_gib=36.0)
    assert unknown.job_memory_limit_gib() is None


def test_the_outer_run_hands_the_limit_to_its_episodes_rounded_down(monkeypatch) -> None:
    from ait.outer import executors

    class Held:
        def job_memory_limit_gib(self):
            return 35.66

    monkeypatch.setattr(executors, "packed_local_executor", lambda config: Held())
    said = []
    config = OuterConfig(episode=EpisodeConfig(executor="local"), jobs_per_gpu=4)
    _, out = executors.job_executor(config, said.append)
    assert out.episode.job_gpu_memory_gib == 35.6 and config.episode.job_gpu_memory_gib is None
    assert "35.6 GiB" in said[0]
    stated = config.model_copy(update={"episode": config.episode.model_copy(update={"job_gpu_memory_gib": 20.0})})
    assert executors.job_executor(stated)[1].episode.job_gpu_memory_gib == 20.0  # a limit set in the config stays


def test_the_agent_is_told_the_limit() -> None:
    spec = load_spec(TASK)
    assert "GiB" not in opening_messages(spec)[1].content
    assert "at most 35.6 GiB of GPU memory" in opening_messages(spec, 35.6)[1].content


def test_a_full_1_5b_job_is_over_an_h100s_share_and_its_lora_variant_is_not(tmp_path: Path, monkeypatch) -> None:
    from ait.train import models

    shaped = model_shaped(tmp_path / "qwen15", 1536, 28, 12, 2, 151936, 1_543_714_304)
    monkeypatch.setattr(models, "resolve_base_model", lambda name: type("M", (), {"path": str(shaped)})())

    def config(variant: str) -> JobConfig:
        return JobConfig.model_validate(tomllib.loads(variant_job("string_pipeline", variant)["job.toml"]))

    why = over_memory(config("model_qwen15"), 35.7)
    assert "more than the 35.7 GiB" in why and "[train.lora]" in why
    assert over_memory(config("lora_qwen15"), 35.7) == ""
    assert "[train.lora]" not in over_memory(config("lora_qwen15"), 5.0)  # already an adapter: other advice


def test_the_probe_rejects_a_job_over_the_limit_and_passes_it_under(tmp_path: Path) -> None:
    spec = load_spec(TASK)
    workspace = build_workspace(tmp_path / "ws")
    over = probe_workspace(workspace, spec, gpu_memory_gib=0.1)
    assert not over.valid and over.config is None
    (error,) = [e for e in over.errors if "GPU memory" in e.message]
    assert error.check is ProbeCheck.config and "more than the 0.1 GiB" in error.message
    assert probe_workspace(workspace, spec, gpu_memory_gib=1000.0).valid


def test_an_episode_tells_the_agent_and_its_probe_holds_the_job_to_the_limit(tmp_path: Path) -> None:
    """Through run_episode: the opening message carries the limit, a job above it is an invalid
    submission (never given to the executor), and the same episode without a limit runs its job."""
    from fakes import fake_executor, ok_result

    from ait.evals.baselines import BaselineStore
    from ait.harness.episode import run_episode
    from ait.policy.reference import ReferencePolicy

    def episode(limit: float | None, name: str):
        executor = fake_executor(ok_result())
        policy = ReferencePolicy()
        result = run_episode(load_spec(TASK), TASK, policy, EpisodeConfig(job_gpu_memory_gib=limit),
                             runs_dir=tmp_path / name, baselines=BaselineStore(tmp_path / f"{name}.json"), executor=executor)
        return result, executor, (Path(result.run_dir) / "trajectory.jsonl").read_text()

    held, executor, trajectory = episode(0.1, "held")
    assert "at most 0.1 GiB of GPU memory" in trajectory
    assert held.submissions and not held.submissions[0].report.valid and executor.ran == []
    assert any("more than the 0.1 GiB" in e.message for e in held.submissions[0].report.errors)
    free, executor, trajectory = episode(None, "free")
    assert "GiB of GPU memory" not in trajectory and len(executor.ran) == 1 and free.job is not None
