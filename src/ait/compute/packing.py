"""How many jobs a worker packs on one GPU, and each one's SM share, chosen from measurements.

`ait worker --jobs-per-gpu auto` reads the packing runs committed in pack_measurements.json
(bench/inner_job.py --pack ... on a real GPU: jobs/hour, peak memory per job, the MPS share)
and takes, for the GPU model it runs on, the measured K with the most jobs/hour whose jobs fit
the GPU's memory. On a GPU model nobody measured, K is what memory allows for the largest job
measured anywhere (capped at the largest K measured), and the SM share is split evenly. The
memory ledger (ait.compute.gpu_memory) still admits each job by its own estimate, and a packed
job that runs out of memory is re-run alone, so a wrong choice costs speed, never a job.

The rows form a base-model x K matrix (bench/gpu.sh's matrix stage). Under auto, each
job is also admitted by its own model's row (`per_model`): a job of a model whose best measured K
is 2 (a 1.5B model fully fine-tuned) starts only while at most one other job runs on its GPU, no
job starts beside it past that, and it gets that row's SM share instead of the slots' (a 25% cap
sized for eight 135M jobs would starve it).
"""

from __future__ import annotations

import json
import math
import subprocess
from importlib.resources import files

from pydantic import BaseModel, Field

HEADROOM = 0.9
"""Share of a GPU's memory the packed jobs may fill (the same headroom as the ledger's)."""
DEFAULT_JOB_GIB = 16.0
"""A job's peak when nothing was measured: the SmolLM2 standard job alone allocates 15.6 GB."""


class PackRun(BaseModel):
    """One measured packing run (a row of pack_measurements.json)."""

    gpu: str
    model: str
    jobs_per_gpu: int = Field(ge=1)
    mps_thread_percentage: int | None = Field(default=None, ge=1, le=100)
    jobs_per_hour: float = Field(gt=0)
    peak_gib_per_job: float = Field(gt=0)
    source: str
    """The committed measurement file the row comes from."""


class Packing(BaseModel):
    jobs_per_gpu: int
    mps_thread_percentage: int | None
    why: str
    slowdown: float | None = None
    """A job's seconds at this K over its seconds alone (K x jobs/hour alone / jobs/hour at K), where
    both rows were measured; None where the job alone was not."""


def packed_slowdown(measured: Packing | None, jobs: int) -> float:
    """How much slower a job runs with `jobs` jobs on its GPU (itself included) than alone: the
    measured slowdown, interpolated linearly from 1 alone to its measured K; where nothing was
    measured, `jobs` (K jobs time-sliced on one GPU take at most K times as long, if GPU-bound)."""
    if jobs <= 1:
        return 1.0
    if measured is None or measured.slowdown is None or measured.jobs_per_gpu <= 1:
        return float(jobs)
    k = measured.jobs_per_gpu
    return 1.0 + (measured.slowdown - 1.0) * (min(jobs, k) - 1) / (k - 1)


def load_runs() -> list[PackRun]:
    data = json.loads(files("ait.compute").joinpath("pack_measurements.json").read_text())
    return [PackRun.model_validate(r) for r in data["runs"]]


def choose_packing(gpu_name: str, total_gib: float, runs: list[PackRun]) -> Packing:
    """K and the MPS share for a GPU called `gpu_name` with `total_gib` of memory."""
    budget = HEADROOM * total_gib
    here = [r for r in runs if r.gpu == gpu_name and r.jobs_per_gpu * r.peak_gib_per_job <= budget]
    if here:
        best = max(here, key=lambda r: r.jobs_per_hour)
        share = f", MPS share {best.mps_thread_percentage}%" if best.mps_thread_percentage else ""
        return Packing(jobs_per_gpu=best.jobs_per_gpu, mps_thread_percentage=best.mps_thread_percentage,
                       why=f"measured on {gpu_name}: K={best.jobs_per_gpu}{share} gave {best.jobs_per_hour:.0f} "
                           f"jobs/hour ({best.model}, {best.source})")
    job_gib = max((r.peak_gib_per_job for r in runs), default=DEFAULT_JOB_GIB)
    largest = max((r.jobs_per_gpu for r in runs), default=1)
    k = max(1, min(largest, int(budget // job_gib)))
    share = None if k == 1 else min(100, max(10, math.ceil(200 / k)))  # two jobs' worth of SMs each
    return Packing(jobs_per_gpu=k, mps_thread_percentage=share,
                   why=f"no packing measured on {gpu_name}: K={k} jobs of up to {job_gib:.1f} GiB fit "
                       f"{HEADROOM:.0%} of its {total_gib:.0f} GiB")


def per_model(gpu_name: str, total_gib: float, runs: list[PackRun]) -> dict[str, Packing]:
    """Each model measured on `gpu_name`: the K (and its SM share) with the most jobs/hour that fits."""
    budget = HEADROOM * total_gib
    best: dict[str, PackRun] = {}
    for r in runs:
        if r.gpu == gpu_name and r.jobs_per_gpu * r.peak_gib_per_job <= budget:
            if r.model not in best or r.jobs_per_hour > best[r.model].jobs_per_hour:
                best[r.model] = r
    alone = {r.model: r.jobs_per_hour for r in runs if r.gpu == gpu_name and r.jobs_per_gpu == 1}
    return {m: Packing(jobs_per_gpu=r.jobs_per_gpu, mps_thread_percentage=r.mps_thread_percentage,
                       why=f"{m} on {gpu_name}: K={r.jobs_per_gpu} gave {r.jobs_per_hour:.0f} jobs/hour ({r.source})",
                       slowdown=(max(1.0, r.jobs_per_gpu * alone[m] / r.jobs_per_hour) if m in alone else None))
            for m, r in best.items()}


def gpu_name(index: str) -> str | None:
    """The GPU's model name from nvidia-smi (None when it cannot be read)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", index],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return None
