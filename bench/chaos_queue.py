"""Chaos run of the job queue: short jobs, worker processes SIGKILLed at random and restarted.

    python bench/chaos_queue.py                      # 100 jobs, 4 workers, local slots
    python bench/chaos_queue.py --executor ray       # the same through Ray tasks on a local Ray
    python bench/chaos_queue.py --jobs 20 --workers 3 --json
    python bench/chaos_queue.py --executor ray --gpus 4 --kill-slots   # declared GPUs; Ray's job slots killed too
    python bench/chaos_queue.py --executor ray --gpus 4 --real-gpus --cuda --kill-slots   # a multi-GPU host

Each job is a subprocess that sleeps 0.1-1 s, appends `start NONCE` and `end NONCE` lines
to its own runs file and prints a JobResult carrying NONCE. Workers are the real
`ait.compute.worker.serve` loop (local slots or Ray tasks) in processes of their own; the
bench kills one (preferring one that holds a lease) every few seconds and starts another.
With --freeze, some of those events SIGSTOP a worker past its lease instead, then SIGCONT
it: its jobs run again elsewhere and its late results must be rejected by the queue. With Ray,
--gpus N gives the private Ray N GPUs (declared on a CPU machine, the real ones with
--real-gpus) and the jobs ask for 1/--jobs-per-gpu of one each; --kill-slots makes every other
event SIGKILL the Ray worker process (job slot) running a job instead of the worker; --cuda
makes each job's process touch its GPU (a CUDA context on the device Ray assigned).

At the end every job must be done exactly once: all `done`, one stored result each, that
result produced by a run that really finished (its nonce has an `end` line), never two
results accepted for one job (the worker logs), none lost. Exits 1 when any check fails.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
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
import json, os, random, sys, time
runs, job_id = sys.argv[1], sys.argv[2]
nonce = random.getrandbits(48)
with open(runs, "a") as f: f.write(f"start {nonce}\\n")
if os.environ.get("CHAOS_CUDA") == "1":
    import torch
    assert torch.cuda.device_count() == 1, os.environ.get("CUDA_VISIBLE_DEVICES")
    torch.ones(1 << 20, device="cuda").sum().item()
time.sleep(random.uniform(0.1, 1.0))
with open(runs, "a") as f: f.write(f"end {nonce}\\n")
gpu = os.environ.get("CUDA_VISIBLE_DEVICES") or "-1"
print(json.dumps({"job_id": job_id, "ok": True, "pre": 0.0, "post": 1.0,
                  "metrics": {"nonce": float(nonce), "gpu": float(gpu) if gpu.lstrip("-").isdigit() else -2.0}}))
"""


def sleep_job(job: Job, env: dict[str, str]) -> JobResult:
    """The bench's job function (same signature as run_job_in_slot): one short subprocess."""
    runs = Path(job.run_dir) / "runs.txt"
    job_dir = Path(job.run_dir) / "job"  # where run_job runs a job's processes: a worker stops them there
    job_dir.mkdir(exist_ok=True)
    (Path(job.run_dir) / "slot.pid").write_text(str(os.getpid()))  # with Ray: the job slot's process, to kill
    out = subprocess.run([sys.executable, "-c", JOB_CODE, str(runs), job.job_id], capture_output=True, text=True,
                         env={**os.environ, **env}, cwd=job_dir, check=True)
    return JobResult.model_validate_json(out.stdout)


class ChaosReport(BaseModel):
    executor: str
    jobs: int
    workers: int
    kills: int
    freezes: int
    slot_kills: int = 0
    """Ray worker processes (job slots) SIGKILLed while running a job."""
    gpus: int = 0
    """GPUs the jobs asked Ray for (declared, or real with --real-gpus)."""
    gpus_used: list[float] = []
    """The GPUs the stored results ran on (CUDA_VISIBLE_DEVICES; -1 for CPU jobs)."""
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

        launcher = RayLauncher(args.slots, job_fn=sleep_job, address=args.ray_address, cpus_per_job=0.5,
                               use_gpus=args.gpus > 0, jobs_per_gpu=args.jobs_per_gpu)
    else:
        from ait.compute.local import LocalLauncher, slot_envs

        launcher = LocalLauncher(slot_envs(args.slots, []), job_fn=sleep_job)
    serve(queue, launcher, WorkerOptions(poll_s=0.02))


def start_worker(args: argparse.Namespace, queue: Path, address: str | None) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "worker", "--queue", str(queue), "--slots", str(args.slots),
           "--lease", str(args.lease), "--max-attempts", str(args.max_attempts), "--executor", args.executor,
           "--gpus", str(args.gpus), "--jobs-per-gpu", str(args.jobs_per_gpu)]
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


def owed_kill(args: argparse.Namespace, counts: dict[str, int], kills: int) -> bool:
    """True when the run is behind its --min-kills (worker and slot kills together): the k-th is due
    once k/(min_kills+1) of the jobs are done. Timed events alone race the queue (a fast machine drains it first), so a
    run that promises kills gets them whatever the machine's speed."""
    due = args.min_kills and kills < args.min_kills and counts["running"] > 0
    return bool(due and counts["done"] >= (kills + 1) * args.jobs / (args.min_kills + 1))


def kill_a_slot(queue: JobQueue, rng: random.Random) -> bool:
    """SIGKILL the Ray worker process (job slot) of a running job, as a GPU fault or an OOM kill of
    the whole worker would; False when no running job has one yet."""
    running = [e for e in queue.list(JobState.running)]
    rng.shuffle(running)
    for entry in running:
        pid_file = Path(entry.job.run_dir) / "slot.pid"
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
            pid_file.unlink()
            return True
        except (OSError, ValueError):
            continue
    return False


def count_log_lines(queue: JobQueue, jobs: list[Job]) -> tuple[dict[str, int], int, int]:
    accepted, rejected, released = {}, 0, 0
    for job in jobs:
        path = queue.log_path(job.job_id)
        lines = path.read_text().splitlines() if path.exists() else []
        accepted[job.job_id] = sum(" end state=" in line for line in lines)
        rejected += sum(" result rejected" in line for line in lines)
        released += sum(" released" in line for line in lines)
    return accepted, rejected, released


def check(queue: JobQueue, jobs: list[Job], kills: int, freezes: int, args: argparse.Namespace, wall: float,
          slot_kills: int = 0) -> ChaosReport:
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
    used = sorted({e.result.metrics.get("gpu", -1.0) for e in entries.values() if e.result})
    return ChaosReport(executor=args.executor, jobs=len(jobs), workers=args.workers, kills=kills, freezes=freezes,
                       slot_kills=slot_kills, gpus=getattr(args, "gpus", 0), gpus_used=used,
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

        gpus = {} if args.real_gpus or not args.gpus else {"num_gpus": args.gpus}  # declared, or Ray finds them
        if args.cuda:
            os.environ["CHAOS_CUDA"] = "1"  # Ray's workers inherit it, and the jobs' processes from them
        ray = init_ray(None, num_cpus=args.workers * args.slots, _temp_dir=tempfile.mkdtemp(prefix="ray", dir="/tmp"),
                       **gpus)
        address = ray.get_runtime_context().gcs_address
    start = time.monotonic()
    queue.enqueue_many(jobs)
    workers = [start_worker(args, queue.path, address) for _ in range(args.workers)]
    kills, freezes, slot_kills, frozen = 0, 0, 0, {}  # frozen: worker index -> when to SIGCONT it
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
            forced = owed_kill(args, counts, kills + slot_kills)
            if (next_hit and time.monotonic() >= next_hit) or forced:
                hit = True
                if args.kill_slots and (kills + freezes + slot_kills) % 2 == 0 and kill_a_slot(queue, rng):
                    slot_kills += 1  # the Ray worker process running a job: the job must come back, once
                elif (i := pick_victim(queue, workers, frozen, rng)) is None:
                    hit = False
                elif args.freeze and not forced and rng.random() < 0.3:
                    os.kill(workers[i].pid, signal.SIGSTOP)  # past its lease: its results come back late
                    frozen[i] = time.monotonic() + args.lease * rng.uniform(1.5, 2.5)
                    freezes += 1
                else:
                    os.kill(workers[i].pid, signal.SIGKILL)
                    workers[i].wait()
                    kills += 1
                    workers[i] = start_worker(args, queue.path, address)
                if hit:
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
    report = check(queue, jobs, kills, freezes, args, wall, slot_kills)
    if args.keep:
        print(f"kept {root}", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", default="run", choices=["run", "worker"])
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--slots", type=int, default=2, help="Jobs at once per worker.")
    p.add_argument("--executor", choices=["local", "ray"], default="local")
    p.add_argument("--gpus", type=int, default=0, help="ray: GPUs for the jobs (declared to the private Ray unless "
                   "--real-gpus); each job asks for 1/--jobs-per-gpu of one.")
    p.add_argument("--jobs-per-gpu", type=int, default=1)
    p.add_argument("--real-gpus", action="store_true", help="ray: let Ray find this host's GPUs instead of declaring them.")
    p.add_argument("--cuda", action="store_true", help="Each job's process creates a CUDA context on its GPU.")
    p.add_argument("--kill-slots", action="store_true", help="ray: every other event SIGKILLs the Ray worker process "
                   "running a job instead of a worker.")
    p.add_argument("--lease", type=float, default=2.0, help="Lease seconds: how soon a killed worker's jobs return.")
    p.add_argument("--max-attempts", type=int, default=50, help="High: chaos must not turn jobs dead.")
    p.add_argument("--kill-min", type=float, default=1.0)
    p.add_argument("--kill-max", type=float, default=4.0)
    p.add_argument("--min-kills", type=int, default=0, help="Kills (of workers, and of Ray slots with --kill-slots) the run makes whatever its speed: the "
                   "k-th falls once k/(N+1) of the jobs are done, if the timed events have not made it yet.")
    p.add_argument("--freeze", action=argparse.BooleanOptionalAction, default=True,
                   help="Also SIGSTOP workers past their lease (late results to reject).")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--json", action="store_true", help="Print the report as JSON.")
    p.add_argument("--keep", action="store_true", help="Keep the run's folder (queue, job runs) and print where it is.")
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
              f"{report.slot_kills} Ray worker processes killed, GPUs used {report.gpus_used}, "
              f"{report.freezes} freezes, {report.executions} executions, {report.reclaims} re-claims, {report.rejected} duplicates rejected, "
              f"{report.released} released")
        print(f"done {report.done}, duplicate results {report.duplicates}, lost {report.lost}, "
              f"bad results {report.bad_results}, wall {report.wall_s:.1f}s -> {'OK' if report.ok else 'FAILED'}")
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main()
