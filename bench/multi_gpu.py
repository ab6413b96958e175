"""Several GPUs of one host through Ray: jobs/hour of the standard job on 1, 2 and 4 GPUs, and an
outer step's jobs spread over the GPUs vs packed on one.

    # a 4-GPU host (each call stays under 10 minutes; --json merges into one file)
    python bench/multi_gpu.py --gpus 1,2,4 --jobs-per-gpu 4 --only throughput --json docs/measurements/multi-gpu-h200-x4.json
    python bench/multi_gpu.py --gpus 4 --jobs-per-gpu 4 --only step --json docs/measurements/multi-gpu-h200-x4.json
    # here, on CPU: four GPUs declared to Ray, each job a short CPU process (tests/test_multi_gpu_bench.py)
    python bench/multi_gpu.py --smoke

Throughput: for each G in --gpus, a private local Ray with G GPUs (the first G of the host's, or
G declared ones with --smoke) and a worker (`ait.compute.worker.serve` on a RayLauncher, the
`ait worker --executor ray` loop) draining a queue of G x K x --rounds standard jobs
(bench/inner_job.py: the family's reference env.py, 30 GRPO steps x 64 rollouts, pre/post hidden
eval on 200 examples) through K job slots per GPU. jobs/hour = jobs done / wall; the ratio is to
G = 1 at the same K (linear would be G).

Outer step: the jobs of one outer step (--step-jobs, default G x K) submitted at once through the
episode executor the outer loop uses (RayExecutor on the shared pool), with the agent's share of a
GPU held (one job slot's, unless --no-agent): spread over G GPUs at K per GPU, then packed on one
GPU (all of them at once, K = step jobs). The agent's own sampling and training are not in the
step's wall time here: only its jobs, which are most of an outer step's time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from ait.job.types import Job, JobConfig, JobResult

ROOT = Path(__file__).resolve().parents[1]

# The smoke job's process: a short CPU run that reports the GPU it was given.
SMOKE_CODE = "import os, sys, time; time.sleep(float(sys.argv[1])); print(os.environ.get('CUDA_VISIBLE_DEVICES', ''))"


def smoke_job_fn(seconds: float):
    def run(job: Job, env: dict[str, str]) -> JobResult:
        out = subprocess.run([sys.executable, "-c", SMOKE_CODE, str(seconds)], env={**os.environ, **env},
                             capture_output=True, text=True, check=True)
        return JobResult(job_id=job.job_id, ok=True, train_seconds=seconds, base_model=out.stdout.strip())
    return run


def inner_job_module():
    spec = importlib.util.spec_from_file_location("inner_job", ROOT / "bench" / "inner_job.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def standard_args(args: argparse.Namespace) -> argparse.Namespace:
    """bench/inner_job.py's defaults for the standard job."""
    return argparse.Namespace(model=args.model, family=[args.family], lora=0, steps=args.steps, lr=[1e-5],
                              generations=8, rollouts=64, max_completion=128, max_turns=4,
                              time_budget=args.time_budget, eval_n=args.eval_n, calibration=None, gpu="0")


def make_jobs(args: argparse.Namespace, out: Path, n: int, tag: str) -> list[Job]:
    if args.smoke:
        cfg = JobConfig.model_validate({"job": {"base_model": "tiny"}, "train": {
            "max_steps": 1, "learning_rate": 1e-4, "num_generations": 2, "max_completion_length": 16}})
        jobs = []
        for i in range(n):
            run_dir = out / f"{tag}-{i}"
            run_dir.mkdir(parents=True, exist_ok=True)
            jobs.append(Job(job_id=f"{tag}-{i}", run_dir=str(run_dir), workspace=str(out), task_path=str(out / "t.json"),
                            config=cfg, time_budget_s=60))
        return jobs
    inner = inner_job_module()
    ns = standard_args(args)
    return [inner.standard_job(args.family, args.model, "fast", out, ns, seed=i, tag=f"-{tag}-{i}") for i in range(n)]


def start_ray(gpus: int, smoke: bool, cpus: int | None) -> object:
    from ait.compute.ray_executor import init_ray

    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths have a length limit
    options = {"num_gpus": gpus, "_temp_dir": temp}
    if cpus:
        options["num_cpus"] = cpus
    if not smoke:  # the first G of this host's GPUs
        from ait.compute.local import detect_gpus

        visible = detect_gpus()
        if len(visible) < gpus:
            raise SystemExit(f"asked for {gpus} GPU(s); this host shows {len(visible)} ({','.join(visible)})")
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(visible[:gpus])
    return init_ray(None, **options)


def stop_ray(ray) -> None:
    ray.shutdown()


def job_fn(args: argparse.Namespace):
    from ait.compute.local import run_job_in_slot

    return smoke_job_fn(args.smoke_job_s) if args.smoke else run_job_in_slot


def throughput(args: argparse.Namespace, gpus: int, out: Path, saved_cuda: str | None) -> dict:
    """G x K x rounds jobs through a worker on G GPUs at K per GPU."""
    from ait.compute.ray_executor import RayLauncher
    from ait.compute.worker import WorkerOptions, serve
    from ait.queue import JobQueue

    k = args.jobs_per_gpu
    ray = start_ray(gpus, args.smoke, args.cpus)
    try:
        queue = JobQueue(out / f"queue-g{gpus}.sqlite", lease_s=120)
        jobs = make_jobs(args, out, gpus * k * args.rounds, f"g{gpus}")
        launcher = RayLauncher(None, use_gpus=True, jobs_per_gpu=k, cpus_per_job=args.cpus_per_job,
                               job_fn=job_fn(args))
        slots = len(launcher.slots)
        placed = dict(Counter(launcher.pool.gpus))
        queue.enqueue_many(jobs)
        start = time.monotonic()
        stats = serve(queue, launcher, WorkerOptions(once=True, poll_s=0.05))
        wall = time.monotonic() - start
        results = [queue.result(j.job_id) for j in jobs]
    finally:
        stop_ray(ray)
        restore_cuda(saved_cuda)
    ok = sum(bool(r and r.ok) for r in results)
    used = Counter(str(int(r.metrics.get("ray/gpu_try1", -1))) for r in results if r)
    return {"gpus": gpus, "jobs_per_gpu": k, "slots": slots, "slots_per_gpu": placed, "jobs": len(jobs), "ok": ok,
            "wall_s": round(wall, 2), "jobs_per_hour": ok / wall * 3600, "jobs_by_gpu": dict(used),
            "failed": stats.failed, "errors": [(r.error or "")[-300:] for r in results if r and not r.ok][:5]}


def outer_step(args: argparse.Namespace, gpus: int, k: int, n_jobs: int, out: Path, tag: str,
               saved_cuda: str | None) -> dict:
    """One outer step's jobs at once through the outer loop's executor on a shared pool."""
    from ait.compute.ray_executor import RayExecutor, agent_share, place_slots

    ray = start_ray(gpus, args.smoke, args.cpus)
    executor = None
    try:
        share = 0.0 if args.no_agent else agent_share(k)
        pool = place_slots(None, jobs_per_gpu=k, agent_gpus=share, cpus_per_job=args.cpus_per_job,
                           job_fn=job_fn(args))
        executor = RayExecutor(None, wait_s=args.time_budget * 4, pool=pool)  # it owns the pool
        described = pool.describe()
        jobs = make_jobs(args, out, n_jobs, tag)
        results: list[JobResult] = []
        lock = threading.Lock()

        def one(job: Job) -> None:
            r = executor.run(job)
            with lock:
                results.append(r)

        start = time.monotonic()
        threads = [threading.Thread(target=one, args=(j,)) for j in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - start
    finally:
        if executor is not None:
            executor.close()  # the pool's slots, before Ray goes
        stop_ray(ray)
        restore_cuda(saved_cuda)
    return {"gpus": gpus, "jobs_per_gpu": k, "agent_share": share, "pool": described, "jobs": n_jobs,
            "ok": sum(r.ok for r in results), "wall_s": round(wall, 2),
            "jobs_by_gpu": dict(Counter(str(int(r.metrics.get("ray/gpu_try1", -1))) for r in results))}


def restore_cuda(saved: str | None) -> None:
    if saved is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = saved


def merge_json(path: Path, report: dict) -> dict:
    """Add this call's figures to the file's (one file for the several calls of a run)."""
    old = json.loads(path.read_text()) if path.exists() else {}
    for key in ("throughput", "outer_step"):
        if key in report:
            old.setdefault(key, {}).update(report[key])
    merged = {**old, **{k: v for k, v in report.items() if k not in ("throughput", "outer_step")}}
    base = merged.get("throughput", {}).get("1")
    if base and base["jobs_per_hour"]:
        merged["ratio_to_1_gpu"] = {g: r["jobs_per_hour"] / base["jobs_per_hour"] for g, r in merged["throughput"].items()
                                    if r["jobs_per_gpu"] == base["jobs_per_gpu"]}
    step = merged.get("outer_step", {})
    if "spread" in step and "packed" in step and step["spread"]["wall_s"]:
        merged["packed_over_spread_wall"] = step["packed"]["wall_s"] / step["spread"]["wall_s"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merged, indent=2) + "\n")
    return merged


def run(args: argparse.Namespace) -> dict:
    gpu_list = [int(g) for g in args.gpus.split(",")]
    out = Path(args.out or tempfile.mkdtemp(prefix="ait-multi-gpu-"))
    out.mkdir(parents=True, exist_ok=True)
    saved_cuda = os.environ.get("CUDA_VISIBLE_DEVICES")
    report: dict = {"mode": "smoke (declared GPUs, CPU jobs)" if args.smoke else "standard job",
                    "model": None if args.smoke else args.model, "family": None if args.smoke else args.family,
                    "host": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if not args.smoke and not args.no_warm:
        inner = inner_job_module()
        inner.warm_pre_cache(standard_args(args), out)  # the untrained score, cached once, untimed
    if args.only in (None, "throughput"):
        report["throughput"] = {}
        for g in gpu_list:
            report["throughput"][str(g)] = r = throughput(args, g, out, saved_cuda)
            print(json.dumps(r), file=sys.stderr, flush=True)
    if args.only in (None, "step"):
        g, k = max(gpu_list), args.jobs_per_gpu
        n = args.step_jobs or g * k - (0 if args.no_agent else 1)
        spread = outer_step(args, g, k, n, out, "spread", saved_cuda)
        print(json.dumps(spread), file=sys.stderr, flush=True)
        packed = outer_step(args, 1, n + (0 if args.no_agent else 1), n, out, "packed", saved_cuda)
        print(json.dumps(packed), file=sys.stderr, flush=True)
        report["outer_step"] = {"spread": spread, "packed": packed}
    if args.json:
        return merge_json(Path(args.json), report)
    return merge_json(out / "multi_gpu.json", report)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", default=None, help="comma list of GPU counts (default 1,2,4; --smoke: 1,2)")
    p.add_argument("--jobs-per-gpu", type=int, default=None, help="K job slots per GPU (default 4; --smoke: 2)")
    p.add_argument("--rounds", type=int, default=2, help="throughput: jobs = GPUs x K x rounds")
    p.add_argument("--step-jobs", type=int, default=0, help="outer step: jobs at once (default: the spread pool's slots)")
    p.add_argument("--only", choices=["throughput", "step"], default=None)
    p.add_argument("--no-agent", action="store_true", help="outer step: no GPU share held for the agent")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--family", default="calc_chain")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--eval-n", type=int, default=200)
    p.add_argument("--time-budget", type=float, default=900)
    p.add_argument("--cpus", type=int, default=None, help="CPUs to give Ray (default: the host's; --smoke: 8)")
    p.add_argument("--cpus-per-job", type=float, default=None, help="default 1 (--smoke: 0.25)")
    p.add_argument("--no-warm", action="store_true", help="skip caching the untrained score before timing")
    p.add_argument("--smoke", action="store_true", help="CPU only: declared GPUs, each job a short CPU process")
    p.add_argument("--smoke-job-s", type=float, default=0.5)
    p.add_argument("--out", default=None, help="work directory (default: a temp dir)")
    p.add_argument("--json", default=None, help="merge the figures into this JSON file")
    args = p.parse_args()
    args.gpus = args.gpus or ("1,2" if args.smoke else "1,2,4")
    args.jobs_per_gpu = args.jobs_per_gpu or (2 if args.smoke else 4)
    args.cpus = args.cpus or (8 if args.smoke else None)
    args.cpus_per_job = args.cpus_per_job if args.cpus_per_job is not None else (0.25 if args.smoke else 1.0)
    if args.smoke:
        args.rounds = min(args.rounds, 1)
    report = run(args)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
