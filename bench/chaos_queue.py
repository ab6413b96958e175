"""Chaos run of the job queue: short jobs, worker processes SIGKILLed at random and restarted.

    python bench/chaos_queue.py                      # 100 jobs, 4 workers, local slots
    python bench/chaos_queue.py --executor ray       # the same through Ray tasks on a local Ray
    python bench/chaos_queue.py --jobs 20 --workers 3 --json

Each job is a subprocess that sleeps 0.1-1 s, appends `start NONCE` and `end NONCE` lines
to its own runs file and prints a JobResult carrying NONCE. Workers are the real
`ait.compute.worker.serve` loop (local slots or Ray tasks) in processes of their own; the
bench kills one (preferring one that holds a lease) every few seconds and starts another.
With --freeze, some of those events SIGSTOP a worker past its lease instead, then SIGCONT
it: its jobs run again elsewhere and its late results must be rejected by the queue.

At the end every job must be done exactly once: all `done`, one stored result each, that
result produced by a run that really finished (its nonce has an `end` line), never two
results accepted for one job (the worker logs), none lost. Exits 1 when any check fails.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

from ait.compute.worker import WorkerOptions, serve
from ait.job.types import Job, JobConfig, JobResult
from ait.queue import JobQueue, JobState

# The fake job's process: record the run, sleep, report. Not real training: the point is the queue.
JOB_CODE = """
import json, random, sys, time
runs, job_id = sys.argv[1], sys.argv[2]
nonce = random.getrandbits(48)
with open(runs, "a") as f: f.write(f"start {nonce}\\n")
time.sleep(random.uniform(0.1, 1.0))
with open(runs, "a") as f: f.write(f"end {nonce}\\n")
print(json.dumps({"job_id": job_id, "ok": True, "pre": 0.0, "post": 1.0, "metrics": {"nonce": float(nonce)}}))
"""


def sleep_job(job: Job, env: dict[str, str]) -> JobResult:
    """The bench's job function (same signature as run_job_in_slot): one short subprocess."""
    runs = Path(job.run_dir) / "runs.txt"
    job_dir = Path(job.run_dir) / "job"  # where run_job runs a job's processes: a worker stops them there
    job_dir.mkdir(exist_ok=True)
    out = subprocess.run([sys.executable, "-c", JOB_CODE, str(runs), job.job_id], capture_output=True, text=True,
                         env={**os.environ, **env}, cwd=job_dir, check=True)
    return JobResult.model_validate_json(out.stdout)


class ChaosReport(BaseModel):
    executor: str
    jobs: int
    workers: int
    kills: int
    freezes: int
    executions: int
    """Job runs started (re-runs after kills included)."""
    reclaims: int
    """Claims beyond the first, summed over jobs (queue attempts - 1)."""
    rejected: int
    """Late results the queue refused (worker logs)."""
    released: int
    done: int
    duplicates: int
    """Jobs with more than one accepted result (must be 0)."""
    lost: int
    """Jobs not done at the end (must be 0)."""
    bad_results: int
    """Stored results that no finished run produced (must be 0)."""
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.done == self.jobs and self.duplicates == 0 and self.lost == 0 and self.bad_results == 0


def make_jobs(root: Path, n: int) -> list[Job]:
    cfg = JobConfig.model_validate({"job": {"base_model": "tiny"}, "train": {
        "max_steps": 1, "learning_rate": 1e-4, "num_generations": 2, "max_completion_length": 16}})
    jobs = []
    for i in range(n):
        run_dir = root / "runs" / f"job{i:03d}"
        run_dir.mkdir(parents=True, exist_ok=True)
        jobs.append(Job(job_id=f"job{i:03d}", run_dir=str(run_dir), workspace=str(root), task_path=str(root / "t.json"),
                        config=cfg, time_budget_s=60))
    return jobs


def worker_main(args: argparse.Namespace) -> None:
    queue = JobQueue(args.queue, lease_s=args.lease, max_attempts=args.max_attempts)
    if args.executor == "ray":
        from ait.compute.ray_executor import RayLauncher

        launcher = RayLauncher(args.slots, job_fn=sleep_job, address=args.ray_address, cpus_per_job=0.5)
    else:
        from ait.compute.local import LocalLauncher, slot_envs

        launcher = LocalLauncher(slot_envs(args.slots, []), job_fn=sleep_job)
    serve(queue, launcher, WorkerOptions(poll_s=0.02))


def start_worker(args: argparse.Namespace, queue: Path, address: str | None) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "worker", "--queue", str(queue), "--slots", str(args.slots),
           "--lease", str(args.lease), "--max-attempts", str(args.max_attempts), "--executor", args.executor]
    if address:
        cmd += ["--ray-address", address]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pick_victim(queue: JobQueue, workers: list[subprocess.Popen], frozen: dict[int, float],
                rng: random.Random) -> int | None:
    """Index of a worker to hit: one holding a lease when there is one, so it hurts."""
    busy_pids = {e.worker_id.rsplit("-", 1)[1] for e in queue.list(JobState.running) if e.worker_id}
    awake = [i for i in range(len(workers)) if i not in frozen]
    busy = [i for i in awake if str(workers[i].pid) in busy_pids]
    return rng.choice(busy or awake) if awake else None


def count_log_lines(queue: JobQueue, jobs: list[Job]) -> tuple[dict[str, int], int, int]:
    accepted, rejected, released = {}, 0, 0
    for job in jobs:
        path = queue.log_path(job.job_id)
        lines = path.read_text().splitlines() if path.exists() else []
        accepted[job.job_id] = sum(" end state=" in line for line in lines)
        rejected += sum(" result rejected" in line for line in lines)
        released += sum(" released" in line for line in lines)
    return accepted, rejected, released


def check(queue: JobQueue, jobs: list[Job], kills: int, freezes: int, args: argparse.Namespace, wall: float) -> ChaosReport:
    entries = {e.job_id: e for e in queue.list()}
    accepted, rejected, released = count_log_lines(queue, jobs)
    executions, bad = 0, 0
    for job in jobs:
        runs_file = Path(job.run_dir) / "runs.txt"
        lines = runs_file.read_text().split("\n") if runs_file.exists() else []
        executions += sum(line.startswith("start ") for line in lines)
        entry = entries.get(job.job_id)
        if entry is None or entry.result is None:
            continue
        nonce = int(entry.result.metrics.get("nonce", -1))
        if f"end {nonce}" not in lines:
            bad += 1  # a result no finished run produced
    done = sum(e.state is JobState.done for e in entries.values())
    return ChaosReport(executor=args.executor, jobs=len(jobs), workers=args.workers, kills=kills, freezes=freezes,
                       executions=executions, reclaims=sum(max(e.attempts - 1, 0) for e in entries.values()),
                       rejected=rejected, released=released, done=done,
                       duplicates=sum(n > 1 for n in accepted.values()), lost=len(jobs) - done,
                       bad_results=bad, wall_s=round(wall, 2))


def run(args: argparse.Namespace) -> ChaosReport:
    root = Path(tempfile.mkdtemp(prefix="ait-chaos-"))
    rng = random.Random(args.seed)
    queue = JobQueue(root / "queue.sqlite", lease_s=args.lease, max_attempts=args.max_attempts)
    jobs = make_jobs(root, args.jobs)
    address = None
    if args.executor == "ray":
        from ait.compute.ray_executor import init_ray

        ray = init_ray(None, num_cpus=args.workers * args.slots, _temp_dir=tempfile.mkdtemp(prefix="ray", dir="/tmp"))
        address = ray.get_runtime_context().gcs_address
    start = time.monotonic()
    queue.enqueue_many(jobs)
    workers = [start_worker(args, queue.path, address) for _ in range(args.workers)]
    kills, freezes, frozen = 0, 0, {}  # frozen: worker index -> when to SIGCONT it
    next_hit = None  # the clock starts at the first claim: killing workers still starting up proves little
    try:
        while True:
            counts = queue.counts()
            if counts["queued"] == 0 and counts["running"] == 0:
                break
            if time.monotonic() > start + args.timeout:
                print(f"timed out after {args.timeout}s: {counts}", file=sys.stderr)
                break
            if next_hit is None and counts["running"]:
                next_hit = time.monotonic() + rng.uniform(args.kill_min, args.kill_max)
            for i, until in list(frozen.items()):
                if time.monotonic() >= until:
                    os.kill(workers[i].pid, signal.SIGCONT)
                    del frozen[i]
            if next_hit and time.monotonic() >= next_hit and (i := pick_victim(queue, workers, frozen, rng)) is not None:
                if args.freeze and rng.random() < 0.3:
                    os.kill(workers[i].pid, signal.SIGSTOP)  # past its lease: its results come back late
                    frozen[i] = time.monotonic() + args.lease * rng.uniform(1.5, 2.5)
                    freezes += 1
                else:
                    os.kill(workers[i].pid, signal.SIGKILL)
                    workers[i].wait()
                    kills += 1
                    workers[i] = start_worker(args, queue.path, address)
                next_hit = time.monotonic() + rng.uniform(args.kill_min, args.kill_max)
            time.sleep(0.05)
        wall = time.monotonic() - start
    finally:
        for i in frozen:
            os.kill(workers[i].pid, signal.SIGCONT)
        for w in workers:
            w.terminate()  # SIGTERM: nothing is running, so each exits at once
        for w in workers:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.kill()
        if address:
            import ray

            ray.shutdown()
    time.sleep(1.2)  # orphaned runs of killed workers finish their runs file (jobs last <= 1 s)
    return check(queue, jobs, kills, freezes, args, wall)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", default="run", choices=["run", "worker"])
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--slots", type=int, default=2, help="Jobs at once per worker.")
    p.add_argument("--executor", choices=["local", "ray"], default="local")
    p.add_argument("--lease", type=float, default=2.0, help="Lease seconds: how soon a killed worker's jobs return.")
    p.add_argument("--max-attempts", type=int, default=50, help="High: chaos must not turn jobs dead.")
    p.add_argument("--kill-min", type=float, default=1.0)
    p.add_argument("--kill-max", type=float, default=4.0)
    p.add_argument("--freeze", action=argparse.BooleanOptionalAction, default=True,
                   help="Also SIGSTOP workers past their lease (late results to reject).")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--json", action="store_true", help="Print the report as JSON.")
    p.add_argument("--queue", help=argparse.SUPPRESS)
    p.add_argument("--ray-address", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mode == "worker":
        worker_main(args)
        return
    report = run(args)
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        print(f"executor {report.executor}: {report.jobs} jobs, {report.workers} workers, {report.kills} kills, "
              f"{report.freezes} freezes, {report.executions} executions, {report.reclaims} re-claims, {report.rejected} duplicates rejected, "
              f"{report.released} released")
        print(f"done {report.done}, duplicate results {report.duplicates}, lost {report.lost}, "
              f"bad results {report.bad_results}, wall {report.wall_s:.1f}s -> {'OK' if report.ok else 'FAILED'}")
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main()
