"""GPU memory accounting for packed jobs.

Several small jobs share one GPU; each is admitted only while the sum of the running
jobs' estimates fits the GPU, and a job that still runs out of memory while it had
neighbours is re-run alone. So packing never fails a job that would fit by itself.

The estimate is deliberately pessimistic (it counts the fast trainer's largest buffers):
  weights, grads and AdamW state: 16 B/param trained in full (fp32 master + 2 moments
  + grad) and a 2 B/param bf16 sampling copy; with LoRA a bf16 base (2 B/param) twice;
  KV cache: rollouts x (prompt + completion) tokens x layers x 2 x kv_heads x head_dim x 2 B;
  scoring: one micro-batch's activations and logits (ait.train.fast_grpo caps its size by vocab);
  allocator slack: 15% over what torch allocates (its caching allocator reserves more);
  two CUDA contexts: the training process and the hidden eval, which waits beside it holding
  the base weights in bf16 (ait.compute.run_job starts both at once).
Measured on an H200 (SmolLM2-135M standard job): 15.6 GB allocated at peak, ~17 GB per
training process in nvidia-smi, 0.8 GB for the waiting eval; eight such jobs did not fit
139.8 GB when the waiting eval was not counted.
"""

from __future__ import annotations

import json
import subprocess
import threading
from contextlib import contextmanager
from pathlib import Path

from ait.job.types import Job, JobConfig
from ait.train.request import LOGIT_BUDGET

GIB = 2**30
PROMPT_TOKENS = 1024  # a generous allowance for the system prompt, tool schemas and tool results
CONTEXT_GIB = 0.75    # one process's CUDA context and cuBLAS/cuDNN workspaces
ALLOCATOR_SLACK = 1.15  # calibrated on the H200 measurement below


def model_shape(model_dir: str) -> dict:
    """params, layers, kv heads, head dim, hidden, vocab from config.json and the weights' size."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    size = sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors"))
    dtype_bytes = 4 if str(cfg.get("torch_dtype", cfg.get("dtype", "bfloat16"))) in ("float32", "torch.float32") else 2
    heads = cfg.get("num_attention_heads", 8)
    hidden = cfg.get("hidden_size", 512)
    return {"params": size / dtype_bytes, "layers": cfg.get("num_hidden_layers", 12),
            "kv_heads": cfg.get("num_key_value_heads", heads), "head_dim": cfg.get("head_dim", hidden // heads),
            "hidden": hidden, "vocab": cfg.get("vocab_size", 32000)}


def estimate_job_gib(job: Job, model_dir: str, logit_budget: int = LOGIT_BUDGET) -> float:
    """Peak GPU memory of one job (training process and the eval waiting beside it), pessimistic."""
    return estimate_config_gib(job.config, model_dir, logit_budget)


def estimate_config_gib(config: JobConfig, model_dir: str, logit_budget: int = LOGIT_BUDGET) -> float:
    """The same estimate from the job's config alone (the probe's check, before any Job exists)."""
    s = model_shape(model_dir)
    t = config.train
    weights = s["params"] * (2 + 2 + (t.lora.r / 64 if t.lora else 0)) if t.lora else s["params"] * (16 + 2)
    rollouts = t.prompts_per_step * t.num_generations
    tokens = PROMPT_TOKENS + t.max_completion_length
    kv = rollouts * tokens * s["layers"] * 2 * s["kv_heads"] * s["head_dim"] * 2
    micro = max(1024, min(16_384, logit_budget // s["vocab"]))  # ait.train.fast_grpo.microbatch_tokens
    activations = micro * s["hidden"] * s["layers"] * 24
    logits = micro * s["vocab"] * 12  # bf16 logits and their grad, fp32 log-softmax and its grad
    waiting_eval = s["params"] * 2  # bf16 base weights, loaded while training runs
    return ((weights + kv + activations + logits) * ALLOCATOR_SLACK + waiting_eval) / GIB + 2 * CONTEXT_GIB


def gpu_total_gib(index: str) -> float | None:
    """Total memory of GPU `index` from nvidia-smi (None when it cannot be read)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", index],
                             capture_output=True, text=True, timeout=10)
        return float(out.stdout.strip().splitlines()[0]) / 1024 if out.returncode == 0 else None
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


MAX_OVERTAKES = 8
"""How many later jobs may start ahead of a waiting one (backfilling: a small job runs beside a big one
while another big one waits). Past that the waiting job goes first: otherwise a job that needs much of
the GPU, or may share it with few, could wait forever behind a stream of small jobs."""


class GpuLedger:
    """Admission by estimated memory, per GPU; `exclusive` waits for the GPU to empty. Later jobs may
    start ahead of a waiting one that does not fit yet, at most MAX_OVERTAKES times."""

    def __init__(self, capacity_gib: dict[str, float | None], headroom: float = 0.9, reserved_gib: float = 0.0):
        if reserved_gib < 0:
            raise ValueError(f"reserved GPU memory must be >= 0 GiB, got {reserved_gib}")
        self.capacity = {g: (max(0.0, c * headroom - reserved_gib) if c else None) for g, c in capacity_gib.items()}
        self.reserved_gib = reserved_gib
        """Held back on every GPU for a process outside the ledger (the outer loop's agent)."""
        self.used = {g: 0.0 for g in capacity_gib}
        self.running = {g: 0 for g in capacity_gib}
        self.active: dict[str, list[Reservation]] = {}
        self.waiting: dict[str, list[Reservation]] = {g: [] for g in capacity_gib}
        self.cond = threading.Condition()

    @contextmanager
    def reserve(self, gpu: str, gib: float, exclusive: bool = False, max_jobs: int | None = None):
        """Yields a Reservation whose `shared` turns True if any other job ran on the GPU meanwhile
        (and whose `peak_jobs` counts the most that ran at once).
        `max_jobs`: the most jobs this one may share its GPU with, itself included (its model's measured
        best K); it waits until that holds, and no job is admitted beside it past that either."""
        cap = self.capacity.get(gpu)
        token = Reservation(max_jobs)
        with self.cond:
            queue = self.waiting.setdefault(gpu, [])
            queue.append(token)

            def fits() -> bool:
                ahead = queue[:queue.index(token)]
                if any(t.overtaken >= MAX_OVERTAKES for t in ahead):
                    return False  # an earlier job has been passed over enough: it goes first
                if exclusive:
                    return self.running[gpu] == 0
                if self.running[gpu] == 0:
                    return True  # a lone job always starts, even above its estimate: the estimate may be wrong
                limits = [t.max_jobs for t in self.active.get(gpu, []) if t.max_jobs] + ([max_jobs] if max_jobs else [])
                if limits and self.running[gpu] + 1 > min(limits):
                    return False
                return cap is None or self.used[gpu] + gib <= cap
            try:
                self.cond.wait_for(fits)
                for t in queue[:queue.index(token)]:
                    t.overtaken += 1
            finally:  # admitted, or interrupted while waiting: either way out of the queue
                queue.remove(token)
                self.cond.notify_all()
            self.used[gpu] += gib
            self.running[gpu] += 1
            self.active.setdefault(gpu, []).append(token)
            if len(self.active[gpu]) > 1:
                for t in self.active[gpu]:
                    t.shared = True
                    t.peak_jobs = max(t.peak_jobs, len(self.active[gpu]))
        try:
            yield token
        finally:
            with self.cond:
                self.used[gpu] -= gib
                self.running[gpu] -= 1
                self.active[gpu].remove(token)
                self.cond.notify_all()


class Reservation:
    shared = False
    peak_jobs = 1
    """The most jobs that ran on the GPU at once while this one held it, itself included."""

    def __init__(self, max_jobs: int | None = None):
        self.max_jobs = max_jobs
        self.overtaken = 0  # later jobs admitted while this one waited


def cap_process_memory(device: str, gib: float) -> float | None:
    """Hold this process to `gib` of GPU memory on `device` (torch's per-process memory fraction) and
    return the fraction set; None off CUDA or for gib <= 0. The packed jobs' admission leaves the agent
    [outer] agent_gpu_gib and no more: without the cap its caching allocator kept growing into the jobs'
    share (an H100 arc on 2026-12-07: 40.8 GiB allocated at peak but 50.9 GiB reserved against 46 held,
    and a 0.5B job that fits its estimate ran out of memory). At the cap the allocator frees its cached
    blocks and retries before it raises, so fragmentation costs a cache flush instead of a neighbour's job."""
    import torch

    if gib <= 0 or not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    total = torch.cuda.get_device_properties(index).total_memory
    fraction = min(1.0, gib * 2**30 / total)
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return fraction
