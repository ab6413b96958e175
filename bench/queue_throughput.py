"""Queue throughput and dispatch latency, for two variants of the SQLite queue.

    python bench/queue_throughput.py [--jobs 2000] [--dispatch-jobs 200] [--poll 0.05]

throughput: enqueue N jobs, then claim + complete them all in one process; jobs/s over
            the whole (enqueue + claim + complete).
dispatch:   a worker process runs the real `serve` loop (one slot, a job function that
            returns at once, polling an idle queue every --poll s); the bench enqueues jobs
            one at a time, each into an idle queue, and measures enqueue -> job start.

Variants: "per-call" opens and closes a connection on every call and enqueues one job per
transaction (the queue as first written); "reused" keeps one connection per thread and
enqueues a batch in one transaction (`enqueue_many`). Targets: >= 1,000 jobs/s and
<= 50 ms median dispatch.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

from ait.compute.local import LocalLauncher
from ait.compute.worker import WorkerOptions, serve
from ait.job.types import Job, JobConfig, JobResult
from ait.queue import JobQueue

CONFIG = JobConfig.model_validate({"job": {"base_model": "tiny"}, "train": {
    "max_steps": 10, "learning_rate": 1e-5, "num_generations": 4, "max_completion_length": 128}})


def make_job(prefix: str, i: int) -> Job:
    return Job(job_id=f"{prefix}{i:06d}", run_dir="/tmp/run", workspace="/tmp/ws", task_path="/tmp/task.json",
               config=CONFIG, time_budget_s=600)


class Figures(BaseModel):
    variant: str
    enqueue_per_s: float
    claim_complete_per_s: float
    total_per_s: float
    """Jobs through enqueue + claim + complete, per second."""
    dispatch_median_ms: float
    dispatch_p95_ms: float


def throughput(path: Path, n: int, reuse: bool) -> tuple[float, float, float]:
    queue = JobQueue(path, reuse_connections=reuse)
    jobs = [make_job("t", i) for i in range(n)]
    start = time.perf_counter()
    if reuse:
        queue.enqueue_many(jobs)
    else:
        for job in jobs:
            queue.enqueue(job)
    enqueued = time.perf_counter()
    done = 0
    while (lease := queue.claim("bench")) is not None:
        queue.complete(lease, JobResult(job_id=lease.job_id, ok=True, pre=0.1, post=0.2))
        done += 1
    end = time.perf_counter()
    assert done == n, f"claimed {done} of {n}"
    return n / (enqueued - start), n / (end - enqueued), n / (end - start)


def instant_job(job: Job, env: dict[str, str]) -> JobResult:
    # The claim-to-start moment, read back by the bench from the stored result.
    return JobResult(job_id=job.job_id, ok=True, metrics={"started": time.time()})


def worker_main(args: argparse.Namespace) -> None:
    queue = JobQueue(args.queue, reuse_connections=args.reuse == "1")
    serve(queue, LocalLauncher([{}], job_fn=instant_job), WorkerOptions(poll_s=args.poll))


def dispatch(path: Path, n: int, reuse: bool, poll: float) -> tuple[float, float]:
    queue = JobQueue(path, reuse_connections=reuse)
    worker = subprocess.Popen([sys.executable, __file__, "worker", "--queue", str(path), "--reuse", str(int(reuse)),
                               "--poll", str(poll)])
    try:
        time.sleep(2.0)  # the worker's imports; it then polls an empty queue
        rng = random.Random(0)
        for i in range(n):
            job = make_job("d", i)
            queue.enqueue(job)
            queue.wait(job.job_id, timeout_s=30, poll_s=0.005)
            time.sleep(rng.uniform(0, poll))  # enqueue at a random point of the worker's poll cycle
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    latencies = sorted((e.result.metrics["started"] - e.created_at) * 1000 for e in queue.list())
    return statistics.median(latencies), latencies[int(0.95 * (len(latencies) - 1))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", default="run", choices=["run", "worker"])
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--dispatch-jobs", type=int, default=200)
    p.add_argument("--poll", type=float, default=0.05, help="The worker's idle poll interval (ait worker's default).")
    p.add_argument("--json", action="store_true")
    p.add_argument("--queue", help=argparse.SUPPRESS)
    p.add_argument("--reuse", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mode == "worker":
        worker_main(args)
        return
    root = Path(tempfile.mkdtemp(prefix="ait-qbench-"))
    figures = []
    for variant, reuse in (("per-call", False), ("reused", True)):
        enq, cc, total = throughput(root / f"{variant}-t.sqlite", args.jobs, reuse)
        median, p95 = dispatch(root / f"{variant}-d.sqlite", args.dispatch_jobs, reuse, args.poll)
        figures.append(Figures(variant=variant, enqueue_per_s=round(enq), claim_complete_per_s=round(cc),
                               total_per_s=round(total), dispatch_median_ms=round(median, 1),
                               dispatch_p95_ms=round(p95, 1)))
    if args.json:
        print("[" + ",".join(f.model_dump_json() for f in figures) + "]")
        return
    print(f"{args.jobs} jobs for throughput, {args.dispatch_jobs} for dispatch (worker polls every {args.poll * 1000:g} ms)")
    print(f"{'variant':<10} {'enqueue/s':>10} {'claim+complete/s':>17} {'total jobs/s':>13} {'dispatch p50':>13} {'p95':>8}")
    for f in figures:
        print(f"{f.variant:<10} {f.enqueue_per_s:>10,.0f} {f.claim_complete_per_s:>17,.0f} {f.total_per_s:>13,.0f} "
              f"{f.dispatch_median_ms:>10.1f} ms {f.dispatch_p95_ms:>5.1f} ms")
    old, new = figures
    print(f"reused / per-call: total throughput x{new.total_per_s / old.total_per_s:.1f}, "
          f"enqueue x{new.enqueue_per_s / old.enqueue_per_s:.1f}, claim+complete "
          f"x{new.claim_complete_per_s / old.claim_complete_per_s:.1f}")
    ok = new.total_per_s >= 1000 and new.dispatch_median_ms <= 50
    print(f"targets (>= 1,000 jobs/s, <= 50 ms median dispatch): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
