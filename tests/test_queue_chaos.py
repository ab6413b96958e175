"""A small chaos run (bench/chaos_queue.py): workers SIGKILLed and frozen at random, every
job still done exactly once, on local slots and on Ray; and the checker catches violations."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ait.job.types import JobResult
from ait.queue import JobQueue

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "chaos_queue.py"


def chaos(*args: str) -> dict:
    out = subprocess.run([sys.executable, str(SCRIPT), "--json", *args], capture_output=True, text=True, timeout=170,
                         check=False)
    assert out.stdout.strip(), out.stderr[-3000:]
    report = json.loads(out.stdout[out.stdout.index("{"):])
    assert out.returncode == 0, report
    return report


def test_chaos_local_every_job_done_exactly_once():
    r = chaos("--jobs", "24", "--workers", "3", "--slots", "1", "--kill-min", "1", "--kill-max", "2",
              "--lease", "1", "--seed", "1", "--min-kills", "2")
    assert r["done"] == r["jobs"] == 24
    assert (r["duplicates"], r["lost"], r["bad_results"]) == (0, 0, 0)
    assert r["kills"] >= 2
    assert r["reclaims"] >= 1 and r["executions"] > r["jobs"]  # kills really cost re-runs
    assert r["wall_s"] < 60


@pytest.mark.slow  # 15 s on 2 shared cores: in CI's `pytest -m slow` pass
def test_chaos_ray_every_job_done_exactly_once():
    pytest.importorskip("ray")
    # Timed kills 3-5 s after the first claim race a fast machine draining the queue; --min-kills
    # makes two kills happen by the time two thirds of the jobs are done, whatever the machine's speed.
    r = chaos("--executor", "ray", "--jobs", "24", "--workers", "2", "--kill-min", "3", "--kill-max", "5",
              "--lease", "2", "--seed", "3", "--min-kills", "2")
    assert r["executor"] == "ray" and r["done"] == r["jobs"] == 24
    assert (r["duplicates"], r["lost"], r["bad_results"]) == (0, 0, 0)
    assert r["kills"] >= 1 and r["reclaims"] >= 1


@pytest.mark.slow  # 14 s on 2 shared cores: in CI's `pytest -m slow` pass
def test_chaos_ray_on_declared_gpus_with_ray_worker_processes_killed():
    pytest.importorskip("ray")
    # Four GPUs declared to the private Ray; every other chaos event SIGKILLs the Ray worker process
    # (job slot) running a job instead of a whole worker.
    r = chaos("--executor", "ray", "--gpus", "4", "--kill-slots", "--jobs", "24", "--workers", "2", "--slots", "2",
              "--kill-min", "1.5", "--kill-max", "3", "--lease", "2", "--seed", "4", "--min-kills", "2")
    assert r["done"] == r["jobs"] == 24
    assert (r["duplicates"], r["lost"], r["bad_results"]) == (0, 0, 0)
    assert r["slot_kills"] >= 1 and r["reclaims"] >= r["slot_kills"]  # each killed slot's job ran again
    assert r["gpus_used"] == [0.0, 1.0, 2.0, 3.0]  # 2 workers x 2 slots of one GPU: every GPU, each job on its own


def test_checker_counts_duplicates_lost_jobs_and_forged_results(tmp_path):
    spec = importlib.util.spec_from_file_location("chaos_queue", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    queue = JobQueue(tmp_path / "q.sqlite")
    jobs = bench.make_jobs(tmp_path, 3)
    queue.enqueue_many(jobs)
    for job, nonce in zip(jobs[:2], (11, 22)):
        lease = queue.claim("w")
        queue.complete(lease, JobResult(job_id=job.job_id, ok=True, metrics={"nonce": float(nonce)}))
    (Path(jobs[0].run_dir) / "runs.txt").write_text("start 11\nend 11\n")
    (Path(jobs[1].run_dir) / "runs.txt").write_text("start 22\n")  # never finished: a forged result
    queue.log_path(jobs[0].job_id).parent.mkdir(parents=True, exist_ok=True)
    queue.log_path(jobs[0].job_id).write_text("t worker=a attempt=1 end state=done\nt worker=b attempt=2 end state=done\n")
    args = argparse.Namespace(executor="local", workers=1)
    report = bench.check(queue, jobs, kills=0, freezes=0, args=args, wall=1.0)
    assert (report.done, report.lost, report.duplicates, report.bad_results, report.executions) == (2, 1, 1, 1, 2)
    assert not report.ok
