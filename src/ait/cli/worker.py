"""`ait worker`: serve jobs from the queue on local GPU/CPU slots or on a Ray cluster."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer
from rich.markup import escape

from ait.cli.common import console, err, fail
from ait.compute.packing import Packing

ONCE_GRACE_S = 10.0


class WorkerExecutor(str, Enum):
    local = "local"
    ray = "ray"


def packing_for(jobs_per_gpu: str, gpu_ids: list[str], mps_thread_percentage: int | None,
                ) -> tuple[int, int | None, dict[str, Packing]]:
    """(K, MPS share, per-model packing) from --jobs-per-gpu: a number as given, or auto, chosen from
    the packing measured on this GPU model (an explicit --mps-thread-percentage wins over the measured
    one, and then every job keeps it); under auto each job is also admitted by its base model's row."""
    if jobs_per_gpu != "auto":
        if not jobs_per_gpu.isdigit() or int(jobs_per_gpu) < 1:
            raise ValueError(f"--jobs-per-gpu must be a number >= 1 or auto, got {jobs_per_gpu!r}")
        return int(jobs_per_gpu), mps_thread_percentage, {}
    if not gpu_ids:
        return 1, mps_thread_percentage, {}  # CPU slots (or Ray's own placement): nothing to pack
    from ait.compute.gpu_memory import gpu_total_gib
    from ait.compute.packing import choose_packing, gpu_name, load_runs, per_model

    name, total = gpu_name(gpu_ids[0]), gpu_total_gib(gpu_ids[0])
    if name is None or total is None:
        raise ValueError(f"--jobs-per-gpu auto: cannot read GPU {gpu_ids[0]}'s name and memory from nvidia-smi; "
                         "give a number instead")
    runs = load_runs()
    choice = choose_packing(name, total, runs)
    err.print(f"packing: {choice.jobs_per_gpu} job(s) per GPU ({choice.why})", highlight=False)
    models = {} if mps_thread_percentage else per_model(name, total, runs)
    for m in models.values():
        err.print(f"packing: {m.why}", highlight=False)
    return choice.jobs_per_gpu, mps_thread_percentage or choice.mps_thread_percentage, models


def check_jobs_per_gpu(value: str) -> str:
    if value != "auto" and not (value.isdigit() and int(value) >= 1):
        raise typer.BadParameter(f"must be a number >= 1 or auto, got {value!r}")
    return value


def worker(queue: Path = typer.Option(Path("runs/queue.sqlite"), help="SQLite queue file (must exist, unless "
                                      "--create)."),
           create: bool = typer.Option(False, "--create", help="Create the queue file if it does not exist."),
           executor: WorkerExecutor = typer.Option(WorkerExecutor.local, help="local (slots on this machine) or ray "
                                                   "(Ray tasks)."),
           slots: int | None = typer.Option(None, min=1, help="Jobs at once (default: GPUs x jobs-per-gpu, 1 on "
                                                              "CPU; ray: what the cluster fits)."),
           gpus: str | None = typer.Option(None, help="GPU ids for the slots, e.g. 0,1 (none: CPU slots "
                                                         "with CUDA_VISIBLE_DEVICES=''); all: every visible GPU. ray: any value asks Ray for GPUs."),
           jobs_per_gpu: str = typer.Option("1", callback=check_jobs_per_gpu, help="Jobs packed on one GPU: a number, or auto (the measured K "
                                            "with the most jobs/hour that fits this GPU, and its MPS share; "
                                            "ait.compute.packing)."),
           mps_thread_percentage: int | None = typer.Option(
               None, min=1, max=100, help="Under CUDA MPS, the share of a GPU's SMs (1-100) each local job may use."),
           once: bool = typer.Option(False, "--once", help="Drain the queued jobs, then exit (waiting up to "
                                     f"{ONCE_GRACE_S:g} s for a first one)."),
           idle_exit: float | None = typer.Option(None, min=0, help="Exit after this many idle seconds."),
           lease: float = typer.Option(60.0, min=1, help="Lease length in seconds (heartbeats renew it)."),
           max_attempts: int = typer.Option(3, min=1, help="Attempts before a job whose workers keep dying is dead."),
           drain_timeout: float | None = typer.Option(None, min=0, help="After SIGTERM, release still-running jobs "
                                                                          "after this many seconds."),
           poll: float = typer.Option(0.05, min=0.001, help="Seconds between polls of an idle queue."),
           ray_address: str | None = typer.Option(None, help="Ray cluster to join (default: a private local Ray)."),
           agent_gpus: float = typer.Option(0.0, min=0.0, max=1.0, help="ray: a share of one GPU (0-1) held for "
                                            "the outer loop's agent on this host; no job slot takes it."),
           warm_start: bool = typer.Option(False, "--warm-start", help="Fork each job's training process from a "
                                           "per-slot interpreter that has imported torch and transformers once "
                                           "(same sandbox layers; AIT_WARM_START=1)."),
           ) -> None:
    """Serve jobs from the queue: train, evaluate, report results.

    SIGTERM finishes the running jobs (no new ones); a second SIGTERM, or --drain-timeout,
    hands them back to the queue."""
    from ait.compute.local import LocalLauncher, detect_gpus, parse_gpus, slot_envs
    from ait.compute.worker import WorkerEvent, WorkerOptions, WorkerStats, serve
    from ait.queue import JobQueue, QueueError

    if warm_start:
        import os

        from ait.compute.warm import WARM_START_ENV

        os.environ[WARM_START_ENV] = "1"  # run_job reads it; Ray workers inherit it from this process

    try:
        q = JobQueue(queue, lease_s=lease, max_attempts=max_attempts, must_exist=not create)
        if executor is WorkerExecutor.ray:
            from ait.compute.ray_executor import RayLauncher

            k, _, _ = packing_for(jobs_per_gpu, [], None)
            launcher = RayLauncher(slots, use_gpus=bool(gpus), jobs_per_gpu=k, address=ray_address,
                                   agent_gpus=agent_gpus)
        else:
            if agent_gpus:
                raise ValueError("--agent-gpus applies to --executor ray (locally, the outer loop's agent_gpu_gib "
                                 "holds the agent's memory)")
            gpu_ids = detect_gpus() if gpus == "all" else parse_gpus(gpus)
            if gpus == "all" and not gpu_ids:
                raise ValueError("--gpus all: no GPU is visible here (CUDA_VISIBLE_DEVICES or torch)")
            if gpus and gpus != "all" and (unknown := sorted(set(gpu_ids) - set(detect_gpus()))):
                visible = ",".join(detect_gpus()) or "none"
                raise ValueError(f"--gpus {gpus}: GPU {','.join(unknown)} is not visible here (visible: {visible})")
            k, mps_thread_percentage, models = packing_for(jobs_per_gpu, gpu_ids, mps_thread_percentage)
            launcher = LocalLauncher(slot_envs(slots, gpu_ids, k, mps_thread_percentage), model_packing=models)
    except (QueueError, ValueError, RuntimeError, ConnectionError) as e:
        fail(str(e))  # fail() prints literally: "pip install 'ait[ray]'" is not rich markup
    options = WorkerOptions(once=once, once_grace_s=ONCE_GRACE_S, idle_exit_s=idle_exit, poll_s=poll,
                            drain_timeout_s=drain_timeout)
    err.print(f"worker on {q.path} ({launcher.describe()}); logs in {q.path.parent / 'logs'}", highlight=False)

    def line(s: WorkerStats) -> str:
        state = "stopping" if s.stopping else "serving"
        return (f"{state}: {s.busy}/{s.slots} busy · done {s.done} · failed {s.failed} · "
                f"rejected {s.rejected} · released {s.released}")

    with err.status(line(WorkerStats(worker_id="", slots=len(launcher.slots)))) as status:
        def on_event(event: WorkerEvent, stats: WorkerStats) -> None:
            if event.kind != "claimed":
                style = {"done": "green", "failed": "red", "rejected": "yellow"}.get(event.kind, "cyan")
                err.print(f"[{style}]{event.kind:>8}[/] {escape(event.message)}")
            status.update(line(stats))

        stats = serve(q, launcher, options, on_event=on_event)
    counts = " ".join(f"{k}={v}" for k, v in q.counts().items())
    console.print(f"worker {stats.worker_id} ran {stats.done + stats.failed} job(s): done {stats.done}, "
                  f"failed {stats.failed}, rejected {stats.rejected}, released {stats.released}; queue: {counts}",
                  highlight=False)
