"""Where a fast inner job's time goes, on a GPU: process start-up, load, sampling, optimisation.

    python bench/profile_fast_step.py --model smollm2-135m [--out DIR] [--skip-job]

1. import cost of a fresh Python process (torch, transformers, first CUDA call);
2. the fast trainer in-process on the standard job (bench/inner_job.py's), profiled with
   torch.profiler over two steady-state steps: the top ops by GPU and by CPU time, and the
   number of kernels launched per step;
3. one decode step: wall time per step from Python vs GPU time inside the CUDA graph;
4. the same standard job through run_job (sandboxed training, then the trusted eval): the
   wall split, so process start-up and checkpoint I/O show as what is left over.
Prints every figure; --out also gets profile.json and the profiler tables.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

IMPORT_PROBE = """
import time; t0 = time.monotonic()
import torch; t1 = time.monotonic()
import transformers; from transformers import AutoModelForCausalLM; t2 = time.monotonic()
torch.zeros(1, device='cuda' if torch.cuda.is_available() else 'cpu'); t3 = time.monotonic()
import ait.train.fast_grpo, ait.train.rollouts; t4 = time.monotonic()
print(t1 - t0, t2 - t1, t3 - t2, t4 - t3)
"""


def import_costs() -> dict:
    t = time.monotonic()
    out = subprocess.run([sys.executable, "-c", IMPORT_PROBE], capture_output=True, text=True, check=True).stdout
    torch_s, hf_s, cuda_s, ait_s = (float(x) for x in out.split())
    return {"process_total_s": time.monotonic() - t, "import_torch_s": torch_s, "import_transformers_s": hf_s,
            "first_cuda_call_s": cuda_s, "import_ait_trainer_s": ait_s}


def profile_training(job, model_path: str, out: Path | None, steps: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from ait.train import fast_grpo

    job.config.train.max_steps = steps
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    sched = schedule(wait=steps - 3, warmup=1, active=2, repeat=1)
    with profile(activities=activities, schedule=sched, record_shapes=False) as prof:
        t = time.monotonic()
        output = fast_grpo.train(job, model_path, on_step=lambda _: prof.step())
        wall = time.monotonic() - t
    avg = prof.key_averages()
    cuda_key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    by_gpu = avg.table(sort_by=cuda_key, row_limit=30)
    by_cpu = avg.table(sort_by="self_cpu_time_total", row_limit=30)
    kernels = sum(e.count for e in avg if getattr(e, "device_type", None) is not None
                  and str(e.device_type).endswith("CUDA"))
    launches = sum(e.count for e in avg if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
    graph_launches = sum(e.count for e in avg if e.key == "cudaGraphLaunch")
    gpu_us = sum(getattr(e, "self_device_time_total", 0) for e in avg if str(getattr(e, "device_type", "")).endswith("CUDA"))
    print(by_gpu)
    print(by_cpu)
    if out:
        (out / "profile_by_gpu.txt").write_text(by_gpu)
        (out / "profile_by_cpu.txt").write_text(by_cpu)
    return {"in_process_wall_s": wall, "metrics": output.metrics, "profiled_steps": 2,
            "kernels_per_step": kernels / 2, "kernel_launches_per_step": launches / 2,
            "graph_launches_per_step": graph_launches / 2, "gpu_busy_s_per_step": gpu_us / 2 / 1e6}


def decode_step_cost(model_path: str, batch: int, new_tokens: int) -> dict:
    """Wall time per decode step vs the GPU time of one graph replay."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ait.train.decode import Decoder

    if not torch.cuda.is_available():
        return {}
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16).cuda().eval()
    tok = AutoTokenizer.from_pretrained(model_path)
    dec = Decoder(model, stop_ids=[], pad_id=tok.pad_token_id or 0)
    prompts = [list(range(100, 400 + (i % 7))) for i in range(batch)]
    dec.generate(prompts, new_tokens, temperature=1.0)  # capture
    torch.cuda.synchronize()
    t = time.monotonic()
    dec.generate(prompts, new_tokens, temperature=1.0)
    torch.cuda.synchronize()
    wall = time.monotonic() - t
    slot = next(iter(dec.slots.values()))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(50):
        slot.graph.replay()
    end.record()
    torch.cuda.synchronize()
    replay_ms = start.elapsed_time(end) / 50
    return {"batch": batch, "new_tokens": new_tokens, "generate_wall_s": wall,
            "ms_per_decode_step": wall / new_tokens * 1000, "ms_per_graph_replay_gpu": replay_ms}


def timed_job(job) -> dict:
    from ait.compute.run_job import run_job

    t = time.monotonic()
    r = run_job(job)
    m = r.metrics
    total = time.monotonic() - t
    train_proc = r.train_seconds or 0.0
    inside = m.get("train/load_seconds", 0.0) + m.get("train/seconds", 0.0)
    evals = sum(v for k, v in m.items() if k in ("eval/load_s", "eval/pre_s", "eval/post_s"))
    return {"ok": r.ok, "error": (r.error or "")[-2000:] or None, "total_s": total,
            "train_process_s": train_proc, "train_load_s": m.get("train/load_seconds"),
            "train_loop_s": m.get("train/seconds"), "train_process_overhead_s": train_proc - inside,
            "eval_load_s": m.get("eval/load_s"), "eval_pre_s": m.get("eval/pre_s"), "eval_post_s": m.get("eval/post_s"),
            "eval_process_overhead_s": total - train_proc - evals, "s_per_step": m.get("train/seconds", 0) / 30,
            "pre": r.pre, "post": r.post}


def main() -> int:
    from inner_job import standard_job, warm_pre_cache

    from ait.train.models import resolve_base_model

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--family", default="calc_chain")
    p.add_argument("--profile-steps", type=int, default=6)
    p.add_argument("--skip-job", action="store_true", help="skip the full run_job timing (4.)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ait-profile-"))
    # inner_job's standard job needs its argparse namespace: the same defaults.
    job_args = argparse.Namespace(steps=30, rollouts=64, generations=8, max_completion=128, max_turns=4, lr=[1e-5],
                                  lora=0, eval_n=200, time_budget=900, calibration=None, family=[args.family],
                                  model=args.model, gpu="0")
    model_path = resolve_base_model(args.model).path
    report: dict = {"imports": import_costs()}
    print(json.dumps(report["imports"]), flush=True)
    report["decode"] = decode_step_cost(model_path, 64, 128)
    print(json.dumps(report["decode"]), flush=True)
    job = standard_job(args.family, args.model, "fast", work, job_args, tag="-profile")
    (Path(job.run_dir) / "job").mkdir(parents=True, exist_ok=True)
    report["training"] = profile_training(job, model_path, out, args.profile_steps)
    print(json.dumps({k: v for k, v in report["training"].items() if k != "metrics"}), flush=True)
    if not args.skip_job:
        warm_pre_cache(job_args, work)
        report["job"] = timed_job(standard_job(args.family, args.model, "fast", work, job_args, tag="-timed"))
        print(json.dumps(report["job"]), flush=True)
    if out:
        (out / "profile.json").write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
