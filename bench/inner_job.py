"""The standard inner job, timed: ait's fast GRPO trainer against TRL's default, side by side.

    python bench/inner_job.py --model smollm2-135m [--family calc_chain ...] [--trainers fast,trl]
    python bench/inner_job.py --model smollm2-135m --trainers fast --pack 1,2,4,8

The standard job: the family's reference env.py, 30 GRPO steps x 64 rollouts (8 prompts x 8
generations), up to 128 completion tokens, pre/post hidden eval on 200 examples. Each job
runs for real through run_job (training inside the sandbox, then the trusted hidden eval).
Prints the wall-time split (load, pre-eval, train, post-eval), seconds per GRPO step,
generated tokens/s, peak GPU memory, pre/post/uplift, $/job at --usd-per-gpu-hour, and the
TRL/fast ratio. --pack K runs K jobs at once on one GPU and prints aggregate jobs/hour.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ait.compute.local import LocalExecutor, slot_envs
from ait.compute.run_job import run_job
from ait.job.config import parse_job_config
from ait.job.types import Job, JobResult

ROOT = Path(__file__).resolve().parents[1]
console = Console(width=max(120, Console().width))


def standard_job(family: str, model: str, trainer: str, out: Path, args, seed: int = 0, tag: str = "",
                 lr: float | None = None) -> Job:
    ws = out / f"ws-{family}-{trainer}{tag}"
    shutil.rmtree(ws, ignore_errors=True)
    shutil.copytree(ROOT / "src" / "ait" / "policy" / "reference_jobs" / family, ws)
    lora = f"\n[train.lora]\nr = {args.lora}\nlora_alpha = {2 * args.lora}\n" if args.lora else ""
    text = f"""[job]
base_model = "{model}"

[train]
max_steps = {args.steps}
learning_rate = {lr or args.lr[0]}
num_generations = {args.generations}
prompts_per_step = {args.rollouts // args.generations}
max_completion_length = {args.max_completion}
max_tool_calling_iterations = {args.max_turns}
temperature = 1.0
dataset_size = 1024
loss_type = "dapo"
seed = {seed}
{lora}"""
    (ws / "job.toml").write_text(text)
    task = task_path(family, out, args)
    shutil.copy(task, ws / "task.json")  # as in an episode's workspace: the reference env reads its difficulty
    return Job(job_id=f"bench-{family}-{trainer}{tag}", run_dir=str(out / f"run-{family}-{trainer}{tag}"),
               workspace=str(ws), task_path=str(task), config=parse_job_config(text, None),
               time_budget_s=args.time_budget, eval_size=args.eval_n, trainer=trainer)


def task_path(family: str, out: Path, args) -> Path:
    """The family's example spec, or one at the difficulty bench/calibrate.py chose (--calibration)."""
    task = ROOT / "examples" / "tasks" / f"{family}.json"
    if not args.calibration:
        return task
    from ait.spec import build_spec, load_spec

    chosen = json.loads(Path(args.calibration).read_text())["families"][family]["chosen"]["difficulty"]
    spec = load_spec(task)
    path = out / f"spec-{family}.json"
    path.write_text(build_spec(family, task_id=spec.id, difficulty=chosen, constraints=spec.constraints)
                    .model_dump_json(indent=2))
    return path


def figures(r: JobResult, args) -> dict:
    m = r.metrics
    steps = args.steps
    train_s = m.get("train/seconds", r.train_seconds or 0.0)
    tokens = m.get("train/generated_tokens_total")
    if tokens is None and "train/completions/mean_length" in m:  # TRL logs a per-step mean length
        tokens = m["train/completions/mean_length"] * args.rollouts * steps
    total = r.total_seconds or 0.0
    return {
        "ok": r.ok, "error": (r.error or "")[-3000:] if not r.ok else None,
        "load_s": m.get("train/load_seconds", 0.0) + m.get("eval/load_s", 0.0),
        "pre_eval_s": m.get("eval/pre_s"), "train_s": train_s, "post_eval_s": m.get("eval/post_s"),
        "total_s": total, "s_per_step": train_s / steps if steps else None,
        # the training process's own timeline: sandbox + interpreter start, imports, load, loop, save
        "timeline": {"train_process_s": r.train_seconds, "import_s": m.get("train/import_seconds"),
                     "train_load_s": m.get("train/load_seconds"), "train_loop_s": train_s,
                     "save_s": m.get("train/save_seconds"), "in_process_s": m.get("train/in_process_seconds"),
                     "eval_load_s": m.get("eval/load_s"), "eval_waited_s": m.get("eval/waited_s"),
                     "post_eval_s": m.get("eval/post_s"),
                     # the load's parts (train/load/<part>_seconds; absent in code before they were metered)
                     **{k.removeprefix("train/load/"): v for k, v in m.items() if k.startswith("train/load/")}},
        "gen_tokens_per_s": (tokens / train_s) if tokens and train_s else None,
        "peak_gpu_gb": m.get("train/peak_gpu_memory_gb"), "pre": r.pre, "post": r.post,
        "uplift": (r.post - r.pre) if r.ok and r.pre is not None and r.post is not None else None,
        "noise_2se": noise(r.pre, r.post, r.eval_n), "reward_first": m.get("train/reward_first"),
        "reward_last": m.get("train/reward_last"), "usd_per_job": total / 3600 * args.usd_per_gpu_hour,
    }


def noise(pre: float | None, post: float | None, n: int | None) -> float | None:
    """Two standard errors of a difference of two proportions on n examples each."""
    if pre is None or post is None or not n:
        return None
    return 2 * math.sqrt((pre * (1 - pre) + post * (1 - post)) / n)


def fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def save_partial(args, key: str, value: dict) -> None:
    """Write the figures known so far to --json: a run cut short by a time limit keeps them."""
    if args.json:
        path = Path(args.json)
        report = json.loads(path.read_text()) if path.exists() else {"args": {k: v for k, v in vars(args).items()}}
        report[key] = value
        path.write_text(json.dumps(report, indent=2, default=str))


def run_side_by_side(args, out: Path) -> dict:
    rows = {}
    several = any(len(family_lrs(args, f)) > 1 for f in args.family)
    repeats = [""] if args.repeat == 1 else [f"#{i + 1}" for i in range(args.repeat)]
    jobs = {f"{family}/{trainer}" + (f"/lr{lr:g}" if several else "") + rep:
            standard_job(family, args.model, trainer, out, args,
                         tag=(f"-lr{lr:g}" if several else "") + rep.replace("#", "-r"), lr=lr)
            for family in args.family for trainer in args.trainers for lr in family_lrs(args, family)
            for rep in repeats}
    if args.parallel:  # uplift runs: every job at once on one GPU (timings are then not comparable)
        executor = LocalExecutor(slot_envs(len(jobs), [args.gpu], jobs_per_gpu=len(jobs)))
        results: dict[str, JobResult] = {}
        threads = [threading.Thread(target=lambda k=k, j=j: results.update({k: executor.run(j)}))
                   for k, j in jobs.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rows = {k: figures(results[k], args) for k in jobs}
    else:
        for name, job in jobs.items():
            console.print(f"[bold]{name}[/]: running the standard job on {args.model} ...")
            rows[name] = figures(run_job(job), args)
            console.print(json.dumps(rows[name]))
            save_partial(args, "side_by_side", rows)
    table = Table(title=f"standard job: {args.steps} steps x {args.rollouts} rollouts, <= {args.max_completion} "
                        f"tokens, eval n={args.eval_n}, model {args.model}")
    keys = ["load_s", "pre_eval_s", "train_s", "post_eval_s", "total_s", "s_per_step", "gen_tokens_per_s",
            "peak_gpu_gb", "pre", "post", "uplift", "noise_2se", "usd_per_job"]
    table.add_column("figure")
    for name in rows:
        table.add_column(name, justify="right")
    for k in keys:
        table.add_row(k, *[fmt(f[k]) for f in rows.values()])
    console.print(table)
    for family in args.family:
        fast, trl = rows.get(f"{family}/fast"), rows.get(f"{family}/trl")  # single-lr runs
        if fast and trl and fast["s_per_step"] and trl["s_per_step"]:
            console.print(f"{family}: TRL default / fast seconds per GRPO step = "
                          f"{trl['s_per_step'] / fast['s_per_step']:.2f}x; post {fmt(trl['post'])} (TRL) vs "
                          f"{fmt(fast['post'])} (fast)")
    return rows


def family_lrs(args, family: str) -> list[float]:
    """--lr-for FAMILY=LR[:LR...] where given, else --lr (a family whose updates are too big at the
    common rate, e.g. a 0.5B model fully fine-tuned on calc_chain, gets its own)."""
    return args.lr_for.get(family, args.lr)


def parse_lr_for(items: list[str]) -> dict[str, list[float]]:
    out = {}
    for item in items:
        family, _, values = item.partition("=")
        if not family or not values:
            raise SystemExit(f"--lr-for {item!r}: expected FAMILY=LR[:LR...], e.g. calc_chain=1e-6:3e-6")
        out[family.strip()] = [float(v) for v in values.split(":") if v.strip()]
    return out


def run_all(executor: LocalExecutor, jobs: list[Job]) -> tuple[float, list[tuple[float, JobResult]]]:
    """Every job submitted at once (each waits for a free slot); (wall, [(seconds to finish, result)])."""
    done: list[tuple[float, JobResult]] = []
    lock = threading.Lock()
    start = time.monotonic()

    def run_one(job: Job) -> None:
        result = executor.run(job)
        with lock:
            done.append((time.monotonic() - start, result))

    threads = [threading.Thread(target=run_one, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - start, done


def run_pack(args, out: Path) -> dict:
    """K jobs at once (a batch: they start, and mostly finish, together), or with --pack-jobs N a
    queue of N jobs through K slots, as a worker with a full queue runs them: a slot takes the next
    job as soon as its last one ends, so one job's start (imports, load; the GPU idle) overlaps the
    others' training. Both give jobs/hour = jobs / wall; the queue also gives the rate after the
    first wave (completions K+1..N over the time they took)."""
    results = {}
    base = None
    # K = 1 uncapped (the baseline), then each K > 1 at each --mps-pct value (0 = no cap; none given = no cap)
    runs = [(k, None) for k in args.pack if k == 1] + [(k, pct or None) for k in args.pack if k > 1
                                                        for pct in (args.mps_pct or [0])]
    for k, pct in runs:
        n = max(k, args.pack_jobs) if k > 1 else 1  # one slot runs jobs back to back: one job is its rate
        executor = LocalExecutor(slot_envs(k, [args.gpu], jobs_per_gpu=k, mps_thread_percentage=pct))
        jobs = [standard_job(args.family[0], args.model, args.trainers[0], out, args, seed=i,
                             tag=f"-k{k}-{i}" + (f"-mps{pct}" if pct else "") + (f"-of{n}" if n > k else ""))
                for i in range(n)]
        wall, done = run_all(executor, jobs)
        finished = sorted(t for t, _ in done)
        ok = sum(r.ok for _, r in done)
        per_hour = ok / wall * 3600
        base = base or per_hour
        after_first_wave = ((n - k) / (finished[-1] - finished[k - 1]) * 3600
                            if n > k and finished[-1] > finished[k - 1] else None)
        peak = max((r.metrics.get("train/peak_gpu_memory_gb") or 0.0) for _, r in done)
        key = f"{k}" + (f"@mps{pct}%" if pct else "") + (f"x{n}" if n > k else "")
        results[key] = {"slots": k, "jobs": n, "mps_thread_percentage": pct, "ok": ok, "wall_s": wall,
                        "jobs_per_hour": per_hour, "vs_k1": per_hour / base,
                        "jobs_per_hour_after_first_wave": after_first_wave, "finished_at_s": finished,
                        "usd_per_job": args.usd_per_gpu_hour / per_hour if per_hour else None,
                        "peak_gpu_gb_per_job": peak, "posts": [r.post for _, r in done],
                        "errors": [(r.error or "")[-300:] for _, r in done if not r.ok],
                        "per_job": [figures(r, args) for _, r in done]}  # where each job's time went
        console.print(json.dumps(results[key]))
        save_partial(args, "pack", results)
    table = Table(title=f"packing on GPU {args.gpu}: {args.family[0]} standard job, {args.model}")
    for col in ("K", "jobs", "ok", "wall s", "jobs/hour", "x K=1", "after 1st wave", "$/job"):
        table.add_column(col, justify="right")
    for key, r in results.items():
        table.add_row(key, str(r["jobs"]), str(r["ok"]), fmt(r["wall_s"]), fmt(r["jobs_per_hour"]), fmt(r["vs_k1"]),
                      fmt(r["jobs_per_hour_after_first_wave"]), fmt(r["usd_per_job"]))
    console.print(table)
    return results


def warm_pre_cache(args, out: Path) -> None:
    """Score each family's untrained base once, untimed: the hidden eval caches that score, so
    every timed job (either trainer, any K) then reads it the same way, as jobs of an outer
    step do, instead of the first timed job alone paying for it."""
    from ait.evals.runner import eval_request, run_eval
    from ait.spec import load_spec
    from ait.train.models import resolve_base_model

    model = resolve_base_model(args.model)
    for family in args.family:
        eval_dir = out / f"pre-{family}"
        req = eval_request(load_spec(task_path(family, out, args)), model, eval_dir, n=args.eval_n)
        t0 = time.monotonic()
        pre = run_eval(req, eval_dir, out / f"pre-{family}.log", readable=[],
                       extra_env={"CUDA_VISIBLE_DEVICES": args.gpu}).pre
        console.print(f"{family}: untrained score {pre:.3f} on n={args.eval_n} ({time.monotonic() - t0:.1f}s, "
                      "cached for the timed jobs)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--family", action="append", help="repeatable; default calc_chain")
    p.add_argument("--trainers", default="fast,trl", help="comma list of fast, trl")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rollouts", type=int, default=64)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--max-completion", type=int, default=128)
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--lr", default="1e-5", help="learning rate; a comma list runs one job per value")
    p.add_argument("--lora", type=int, default=0, help="LoRA rank (0 = full fine-tuning)")
    p.add_argument("--eval-n", type=int, default=200)
    p.add_argument("--time-budget", type=float, default=900)
    p.add_argument("--usd-per-gpu-hour", type=float, default=3.50, help="H200 on-demand price assumed")
    p.add_argument("--pack", default="", help="comma list of K, e.g. 1,2,4,8")
    p.add_argument("--lr-for", action="append", default=[], help="FAMILY=LR[:LR...]: that family's learning "
                   "rates instead of --lr (repeatable)")
    p.add_argument("--mps-pct", default="", help="run each K > 1 with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE at each of "
                   "these values (comma list; 0 = no cap, the default): each job's kernels then use at most that "
                   "share of the SMs")
    p.add_argument("--pack-jobs", type=int, default=0, help="with --pack: push this many jobs through each K > 1 "
                   "(a worker's full queue) instead of K at once")
    p.add_argument("--gpu", default="0")
    p.add_argument("--calibration", default=None, help="bench/calibrate.py JSON: use each family's chosen difficulty")
    p.add_argument("--parallel", action="store_true", help="run the families' jobs at once (uplift, not timing)")
    p.add_argument("--out", default=None, help="work directory (default: a temp dir)")
    p.add_argument("--json", default=None, help="write all figures to this JSON file")
    p.add_argument("--repeat", type=int, default=1, help="run each standard job this many times, one after "
                   "another (with --warm-start: the first pays the zygote's start, the rest fork from it)")
    p.add_argument("--warm-start", action="store_true", help="fork training processes from per-slot zygotes "
                   "(AIT_WARM_START=1, ait.compute.warm); the first job of each slot starts it")
    args = p.parse_args()
    if args.warm_start:
        os.environ["AIT_WARM_START"] = "1"
    args.family = args.family or ["calc_chain"]
    args.trainers = [t.strip() for t in args.trainers.split(",") if t.strip()]
    args.lr = [float(x) for x in args.lr.split(",") if x.strip()]
    args.pack = [int(k) for k in args.pack.split(",") if k.strip()]
    args.mps_pct = [int(x) for x in args.mps_pct.split(",") if x.strip()]
    args.lr_for = parse_lr_for(args.lr_for)
    out = Path(args.out or tempfile.mkdtemp(prefix="ait-bench-inner-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.json:
        Path(args.json).unlink(missing_ok=True)
    # Resolve (and, for a GGUF, dequantise) the base model before any clock starts: a one-time
    # conversion is not part of a job's cost, and it would land in whichever job ran first.
    from ait.train.models import resolve_base_model

    t0 = time.monotonic()
    resolved = resolve_base_model(args.model)
    console.print(f"base model {args.model}: {resolved.source}, sha256 {resolved.sha256[:12]} "
                  f"({time.monotonic() - t0:.1f}s to resolve, not counted)")
    warm_pre_cache(args, out)
    key = "pack" if args.pack else "side_by_side"
    save_partial(args, key, run_pack(args, out) if args.pack else run_side_by_side(args, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
