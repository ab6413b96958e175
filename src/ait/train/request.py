"""What the worker hands a training process, what it hands back, and the helpers both
inner trainers (TRL's and the fast one) share: dataset rows and safe reward calls."""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Literal

from pydantic import BaseModel, Field

from ait.job.env_loader import EnvSurface, call_reward
from ait.job.types import Job, TrainConfig

EXIT_OOM = 3  # the worker maps this exit status to FailReason.oom
EXIT_GPU_FAULT = 5  # ... and this one to FailReason.gpu_fault (a CUDA error: a packed job is re-run alone)
EXIT_NO_GPU = 6  # the slot gave this process a GPU it cannot use: the host's fault, never run on the CPU instead


class GpuMissing(RuntimeError):
    """CUDA_VISIBLE_DEVICES names a GPU but CUDA does not work in this process."""


EXPECT_GPU_ENV = "AIT_EXPECT_GPU"  # set by the sandbox for a run its policy gives a GPU


def require_given_gpu() -> None:
    """A process the sandbox gave a GPU must be able to use it: a job that quietly fell back to the
    CPU would run for hours and be scored on a slow clock."""
    import os

    import torch

    if os.environ.get(EXPECT_GPU_ENV) == "1" and not torch.cuda.is_available():
        raise GpuMissing(f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']} but CUDA is not usable here "
                         "(the driver's libraries or device nodes are missing inside the sandbox?)")
LOGIT_BUDGET = 2**29  # fast trainer's scoring micro-batch: padded tokens x vocab stays under this (~5 GB of logits)
LOGIT_BUDGET_ENV = "AIT_LOGIT_BUDGET"  # a smaller budget the executor sets for jobs that share a GPU
PACKED_LOGIT_BUDGET = LOGIT_BUDGET // 2  # that budget: the executors set it, the probe estimates memory at it


class TrainRequest(BaseModel):
    job: Job
    """The job to train."""
    base_model_path: str
    """Local directory of the base weights, resolved by the worker (trusted) before this process starts."""
    trainer: Literal["fast", "trl"] = "fast"
    """Which GRPO implementation runs the job (ait.train.fast_grpo or TRL's GRPOTrainer)."""


class TrainOutput(BaseModel):
    checkpoint: str
    """Directory holding the trained model.safetensors."""
    train_seconds: float
    """GRPO loop wall time as seen from inside (the worker keeps its own clock)."""
    steps: int
    """Optimizer steps completed."""
    metrics: dict[str, float] = Field(default_factory=dict)
    """Flat train/* metrics averaged over the run."""


def build_rows(surface: EnvSurface, train: TrainConfig) -> list[dict[str, Any]]:
    """env.py's dataset as chat rows; `info` stays a JSON string (datasets needs one schema)."""
    rows = surface.build_dataset(train.dataset_size, train.seed)
    return [
        {
            "prompt": [{"role": "system", "content": surface.system_prompt},
                       {"role": "user", "content": str(r["prompt"])}],
            "answer": str(r["answer"]),
            "info": json.dumps(r.get("info") or {}),
        }
        for r in rows
    ]


def safe_reward(fn: Callable[..., Any], completion: str, answer: str, info: dict, messages: list[dict],
                errors: dict[str, int]) -> float:
    """One reward value in [0, 1]. A reward that raises or returns a non-finite value scores 0
    and is counted, so one bad completion cannot crash a whole job."""
    try:
        value = float(call_reward(fn, completion, answer, info, messages))
        if not math.isfinite(value):
            raise ValueError("non-finite reward")
    except Exception:
        name = getattr(fn, "__name__", "reward")
        errors[name] = errors.get(name, 0) + 1
        value = 0.0
    return min(1.0, max(0.0, value))
