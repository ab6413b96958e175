"""The executor every inner job of an outer run goes through: built once per run, before the policy
(on Ray the agent's GPU share is placed first and fixes its device), and closed by the run."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from ait.compute.executors import Executor, make_executor
from ait.outer.config import OuterConfig

if TYPE_CHECKING:
    from ait.compute.local import LocalExecutor


class OuterRunError(ValueError):
    """A run that cannot start: no tasks, nothing to resume, a config that does not fit the run."""


def job_executor(config: OuterConfig, say: Callable[[str], None] = lambda _m: None) -> tuple[Executor, OuterConfig]:
    """The executor every episode of the run shares (the run closes it), and the config with the agent's
    device set where Ray holds a GPU share for it."""
    if config.episode.executor == "ray":
        return ray_executor(config, say)
    if config.episode.executor == "local" and config.jobs_per_gpu != 1:
        executor = packed_local_executor(config)
        limit = executor.job_memory_limit_gib()  # the agent holds part of the GPU: jobs are held to the rest
        if limit is not None and config.episode.job_gpu_memory_gib is None:
            limit = math.floor(limit * 10) / 10  # rounded down: a job the probe passes is never refused for its size
            say(f"a job may use at most {limit:.1f} GiB of GPU memory beside the agent (the probe holds it to that)")
            config = config.model_copy(update={"episode": config.episode.model_copy(update={"job_gpu_memory_gib": limit})})
        return executor, config
    return make_executor(config.episode), config


def packed_local_executor(config: OuterConfig) -> LocalExecutor:
    """With executor = local, one slot pool packs `jobs_per_gpu` inner jobs per GPU, holding agent_gpu_gib
    back for the agent; a job whose base model's packing was measured on this GPU model shares its GPU
    with at most that K jobs (ait.compute.packing.per_model: a 1.5B inner job beside one other, not seven)."""
    from ait.compute import local
    from ait.compute.gpu_memory import gpu_total_gib
    from ait.compute.packing import gpu_name, load_runs, per_model

    gpus = local.detect_gpus()
    name, total = (gpu_name(gpus[0]), gpu_total_gib(gpus[0])) if gpus else (None, None)
    models = per_model(name, total, load_runs()) if name and total else {}
    return local.LocalExecutor(local.slot_envs(None, gpus, config.jobs_per_gpu),
                               reserved_gib=config.agent_gpu_gib, model_packing=models)


def ray_executor(config: OuterConfig, say: Callable[[str], None] = lambda _m: None) -> tuple[Executor, OuterConfig]:
    """With executor = ray: one pool of Ray job slots for every episode, `jobs_per_gpu` on every GPU of
    the cluster; when the agent trains on a GPU (local backend), a share of one GPU is held for it (one
    job slot's, or what agent_gpu_gib needs) so no inner job lands there, and the agent is put on that
    GPU. Returns the executor on that pool and the config with the agent's device set."""
    from ait.compute.gpu_memory import gpu_total_gib
    from ait.compute.local import detect_gpus, parse_gpus
    from ait.compute.ray_executor import RayExecutor, agent_share, place_slots
    from ait.outer.backends.local import default_device

    device = config.trainer.device or (default_device() if config.trainer.backend == "local" else "cpu")
    on_gpu = config.trainer.backend == "local" and device.startswith("cuda")
    share = 0.0
    if on_gpu:
        gpus = detect_gpus()
        share = agent_share(config.jobs_per_gpu, config.agent_gpu_gib, gpu_total_gib(gpus[0]) if gpus else None)
    pool = place_slots(config.episode.ray_address, jobs_per_gpu=config.jobs_per_gpu, agent_gpus=share)
    executor = RayExecutor(config.episode.ray_address, config.episode.job_wait_s, pool=pool)  # it owns the pool
    say(f"inner jobs on Ray: {pool.describe()}")
    if not (on_gpu and pool.agent_gpu):
        return executor, config
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ray_gpu = pool.agent_gpu.split(",")[0]
    index = parse_gpus(visible).index(ray_gpu) if visible is not None else int(ray_gpu)
    if device not in ("cuda", f"cuda:{index}"):
        executor.close()
        raise OuterRunError(f"trainer.device = {device!r}, but Ray holds the agent's GPU share on cuda:{index}; "
                            "leave trainer.device unset or set it to \"cuda\"")
    trainer = config.trainer.model_copy(update={"device": f"cuda:{index}"})
    return executor, config.model_copy(update={"trainer": trainer})
