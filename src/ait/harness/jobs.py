"""The jobs of one episode: where each one runs, what it cost, what the agent is told, which is kept.

With `max_jobs > 1` the agent may run several valid jobs and refine between them. It is
shown each job's dev-set score (the spec's public examples, scored by the family's own
scorer) and never the hidden eval. The episode is scored on the job the agent chose
(`select_job`), else on the one with the best dev score: the hidden set never picks a job,
it only scores the one picked. Every job's record (hidden scores included) goes to the
trajectory and the run directory, which the agent's file tools cannot reach.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ait.compute.executors import Executor
from ait.evals.dev_eval import DevScore, run_dev_eval
from ait.harness.types import EpisodeConfig, JobRecord
from ait.job.types import Job, JobResult
from ait.metering import JobCost, PriceTable, detect_gpus, job_cost, job_wall_seconds


def job_run_dir(run_path: Path, index: int) -> Path:
    """The first job writes under <run>/job/ (as a one-job episode always has); job k >= 2 under
    <run>/jobs/k/job/, so a later job never wipes an earlier one's checkpoint."""
    return run_path if index == 1 else run_path / "jobs" / str(index)


def charged_gpus(config: EpisodeConfig, result: JobResult | None = None) -> tuple[float, str | None]:
    """GPUs (and device name) a job is charged for: its own report, else the config, else this machine."""
    detected: tuple[float, str | None] | None = None
    if result is not None and result.gpus is not None:
        gpus = result.gpus
    elif config.job_gpus is not None:
        gpus = config.job_gpus
    else:
        detected = detect_gpus()
        gpus = detected[0]
    gpu_type = config.gpu_type
    if gpus > 0 and gpu_type is None:
        gpu_type = (detected or detect_gpus())[1]
    return gpus, gpu_type


def estimate_job_usd(config: EpisodeConfig, time_budget_s: float, prices: PriceTable) -> float:
    """What a job may cost before it runs: its training budget on the GPUs it would be charged for
    (the eval comes on top, so this is a floor, not a cap)."""
    gpus, gpu_type = charged_gpus(config)
    return job_cost(time_budget_s, gpus, gpu_type, prices).usd


def dev_score(job: Job, result: JobResult, iterative: bool) -> tuple[float | None, str, float]:
    """(score, how to describe it, seconds spent here): the job's own dev score when it reports one,
    else, in an episode of several jobs (where it is shown and picks the scored job), a dev eval."""
    if not result.ok:
        return None, "", 0.0
    if result.dev is not None:
        return result.dev, "on the public dev examples", 0.0
    if not iterative:
        return None, "", 0.0
    scored = run_dev_eval(job, result)
    if isinstance(scored, DevScore):
        return scored.score, f"on {scored.n} public dev examples", scored.seconds
    return None, scored, 0.0


def discard_checkpoint(job: Job, result: JobResult) -> bool:
    """Delete the job's trained weights (only ever a directory inside the job's own run directory;
    a checkpoint path pointing anywhere else is left alone) and clear the result's pointer to them."""
    if not result.checkpoint:
        return False
    # Lexically inside the run directory, and never through a link the job planted (rmtree refuses
    # to follow a link at the top; links below it are removed, not followed).
    path, root = Path(os.path.abspath(result.checkpoint)), Path(os.path.abspath(job.run_dir))
    if path == root or not path.is_relative_to(root) or ".." in path.relative_to(root).parts or path.is_symlink():
        return False
    shutil.rmtree(path, ignore_errors=True)
    result.checkpoint = None
    result.metrics["checkpoint_discarded"] = 1.0
    return True


SLOT_POLL_S = 0.25  # how often run_until asks an executor whether a waiting job has started
KEPT_JOB_FILES = ("train_request.json", "train_output.json")  # small records of what ran, kept on purpose


def discard_job_files(job: Job, result: JobResult) -> int:
    """Once a job is scored and its weights are not kept: its checkpoint (`discard_checkpoint`) and
    everything else its training wrote in RUN_DIR/job (caches, scratch files: a gigabyte was seen in
    job/.cache), but the records in KEPT_JOB_FILES. Returns the entries removed besides the
    checkpoint. Links are removed, never followed."""
    discard_checkpoint(job, result)
    job_dir = Path(os.path.abspath(job.run_dir)) / "job"
    if job_dir.is_symlink() or not job_dir.is_dir():
        return 0
    removed = 0
    for entry in job_dir.iterdir():
        if entry.name in KEPT_JOB_FILES and entry.is_file() and not entry.is_symlink():
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed += 1
    return removed


def make_record(attempt: int, job: Job, result: JobResult, dev: float | None, config: EpisodeConfig,
                prices: PriceTable, extra_wall_s: float = 0.0) -> JobRecord:
    gpus, gpu_type = charged_gpus(config, result)
    cost: JobCost = job_cost(job_wall_seconds(result) + extra_wall_s, gpus, gpu_type, prices)
    return JobRecord(attempt=attempt, job_id=job.job_id, result=result, dev=dev, cost=cost)


def feedback(record: JobRecord, dev_note: str, jobs_left: int, iterative: bool, number: int) -> str:
    """What the agent reads after a valid submission ran (it is job `number`). Never a hidden-eval number."""
    result, attempt = record.result, record.attempt
    if result.ok:
        text = f"job {number} valid (attempt {attempt}); training finished in {result.train_seconds or 0:.0f}s"
    else:
        reason = result.fail_reason.value if result.fail_reason else "unknown"
        text = f"job {number} valid (attempt {attempt}) but it failed: {reason}"
    if not iterative:
        return text
    if record.dev is not None:
        text += f"; dev score {record.dev:.3f} {dev_note}".rstrip()
    elif result.ok:
        text += f"; no dev score ({dev_note or 'not available'})"
    choose = ("The episode is scored on the job you choose with select_job(job), else on the one with the best "
              "dev score.")
    if jobs_left > 0:
        return (text + f". {jobs_left} more job(s) allowed: change job.toml / env.py and call submit_job to try "
                f"to beat it, or stop. {choose}")
    return text + f". No jobs left. {choose}"


def scored_job(records: list[JobRecord], chosen: int | None = None) -> int | None:
    """Index of the job the episode is scored on: the agent's choice (`chosen`), else the best by dev
    score (the earliest on ties), else the last job that finished, else the last job. Hidden scores
    are never read here: picking the job by them would select on the test set."""
    if not records:
        return None
    if chosen is not None and 0 <= chosen < len(records):
        return chosen
    by_dev = [(r.dev, -i) for i, r in enumerate(records) if r.result.ok and r.dev is not None]
    if by_dev:
        return -max(by_dev)[1]
    finished = [i for i, r in enumerate(records) if r.result.ok]
    return finished[-1] if finished else len(records) - 1


def run_until(executor: Executor, job: Job, seconds: float, on_event: Callable[[str], None] | None = None,
              slot_wait_s: float = 0.0) -> tuple[JobResult | None, float]:
    """(executor.run(job), the seconds of its wait that are excused) if it returns in time, else (None, ...).

    The job has `seconds` to run, counted from when the executor starts it: up to `slot_wait_s` of
    waiting for a slot (other episodes' jobs held it) is not its time, and the excused part is returned
    so the caller can move its own deadline by as much. A wait past `slot_wait_s` counts against the
    `seconds`; a job that has not started when they are spent too is given up on (the caller cancels it).
    A job still running at its deadline is killed: its processes (children of this process working in the
    job's directory, as the inline and local executors start them) are killed until the executor returns,
    so a job that was still waiting for a slot dies as soon as it starts. A queue or Ray job keeps its
    own limits."""
    from ait.compute.local import kill_job_processes

    box: dict[str, object] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["result"] = executor.run(job, on_event=on_event)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=target, name=f"job-{job.job_id}", daemon=True).start()
    start = time.monotonic()
    waited = 0.0  # until the job was last seen waiting
    while not done.is_set() and slot_wait_s > 0:  # the wait for a slot, polled: executors report a start
        now = time.monotonic()
        if executor.started(job) or now - start >= seconds + slot_wait_s:
            break
        waited = now - start
        done.wait(min(SLOT_POLL_S, start + seconds + slot_wait_s - now))
    excused = min(waited, slot_wait_s)
    if done.wait(max(0.0, start + excused + seconds - time.monotonic())):
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return box["result"], excused  # type: ignore[return-value]

    def reap() -> None:
        kill_job_processes(job)
        while not done.wait(1.0):
            kill_job_processes(job)

    threading.Thread(target=reap, name=f"reap-{job.job_id}", daemon=True).start()
    return None, excused
