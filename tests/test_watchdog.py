"""The sandbox's watchdog (ait.sandbox.watch): a run stuck at its task limit, or over its memory
where no cgroup bounds it, is killed as a whole group with a verdict that says why."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ait.sandbox.process import RunOutcome
from ait.sandbox.watch import Watchdog, finish_watch, memory_bytes, session_members
from ait.compute.run_job import classify_failure
from ait.job.types import FailReason

FORKS = """
import os, sys, time
for _ in range(int(sys.argv[1])):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
time.sleep(60)
"""

ALLOCATES = """
import sys, time
block = bytearray(int(sys.argv[1]) * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1  # touched: resident, not only reserved
print("allocated", flush=True)
time.sleep(60)
"""


def start(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], start_new_session=True,
                            stdout=subprocess.PIPE, text=True)


def wait_dead(proc: subprocess.Popen, seconds: float) -> bool:
    try:
        proc.wait(timeout=seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


def test_a_run_stuck_at_its_task_limit_is_killed_with_all_its_processes():
    proc = start(FORKS, "11")  # 12 processes
    try:
        deadline = time.monotonic() + 10
        while len(session_members(proc.pid)) < 12 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(session_members(proc.pid)) == 12
        dog = Watchdog(proc.pid, memory_limit=None, task_limit=12)
        assert wait_dead(proc, 10)
        result = finish_watch(dog)
        assert "held 12 processes" in result["watchdog"] and "fork bomb" in result["watchdog"]
        assert "oom_killed" not in result  # a task verdict is not an OOM
        deadline = time.monotonic() + 5
        while session_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert session_members(proc.pid) == []  # the children went with the group
    finally:
        if session_members(proc.pid):
            os.killpg(proc.pid, 9)


def test_a_run_below_its_limits_is_left_alone():
    proc = start(FORKS, "3")
    try:
        dog = Watchdog(proc.pid, memory_limit=2**30, task_limit=12)
        assert not wait_dead(proc, 3.5)  # past the 2 s a stuck run would get
        assert finish_watch(dog) == {} and dog.peak_memory > 0
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def test_memory_over_the_limit_is_an_observed_oom():
    proc = start(ALLOCATES, "300")
    try:
        assert proc.stdout.readline().strip() == "allocated"
        assert memory_bytes([proc.pid], 2**40) > 250 * 2**20
        dog = Watchdog(proc.pid, memory_limit=200 * 2**20, task_limit=None)
        assert wait_dead(proc, 10)
        result = finish_watch(dog)
        assert result["oom_killed"] and result["memory_observed"] and "over its limit of 200 MiB" in result["watchdog"]
        outcome = RunOutcome(proc.returncode, False, 1.0, "", **result)
        assert classify_failure(outcome) is FailReason.oom
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)


def test_a_task_verdict_is_the_jobs_crash_not_an_oom():
    outcome = RunOutcome(-9, False, 1.0, "", watchdog="the run held 128 processes (128 tasks) at its limit")
    assert classify_failure(outcome) is FailReason.crash


def test_a_watchdog_refuses_its_own_session():
    with pytest.raises(ValueError, match="own session"):
        Watchdog(os.getsid(0), memory_limit=None, task_limit=1)


WRITES = """
import os, sys
os.makedirs(sys.argv[1], exist_ok=True)
for i in range(100_000):
    with open(os.path.join(sys.argv[1], f"f{i}"), "wb") as f:
        f.write(b"x" * int(sys.argv[2]))
"""


@pytest.mark.parametrize("rule", ["bytes", "files"])
def test_a_run_that_fills_its_directory_is_killed(tmp_path, rule):
    out = tmp_path / "run"
    proc = start(WRITES + "\nimport time; time.sleep(60)", str(out), "1048576" if rule == "bytes" else "0")
    limits = {"disk_limit": 20 * 2**20} if rule == "bytes" else {"file_limit": 500}
    dog = Watchdog(proc.pid, memory_limit=None, task_limit=None, write_paths=[str(out)], **limits)
    try:
        assert wait_dead(proc, 20)
        result = finish_watch(dog)
        assert result["watchdog_rule"] == "disk"
        assert ("more than 20 MiB" in result["watchdog"]) if rule == "bytes" else ("more than 500 files" in result["watchdog"])
        assert classify_failure(RunOutcome(proc.returncode, False, 1.0, "", **result)) is FailReason.disk
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)


def test_a_sandboxed_job_that_fills_the_disk_is_killed_and_what_it_wrote_deleted(tmp_path, monkeypatch):
    """Through run_job, as a worker runs it: a training job writing in a loop into its directory, on a
    host without a file system of the run's own (tests/test_disk_fs.py has those): the watchdog's walk
    is the bound."""
    from ait.compute import run_job as run_job_mod
    from ait.sandbox.detect import cached_capabilities
    from tests.test_hostile_jobs import make_job

    if not cached_capabilities().active("landlock"):
        pytest.skip("needs Landlock on this kernel")
    policy_for = run_job_mod.train_policy

    def small_disk(*args, **kwargs):
        policy = policy_for(*args, **kwargs)
        return policy.model_copy(update={"disk_fs": None,
                                         "limits": policy.limits.model_copy(update={"disk_bytes": 64 * 2**20})})

    monkeypatch.setattr(run_job_mod, "train_policy", small_disk)
    fill = ("import os\nwhile True:\n    with open(os.path.join(os.getcwd(), f'fill{os.urandom(4).hex()}'), 'wb') as f:\n"
            "        f.write(os.urandom(2**20))")
    job = make_job(tmp_path, "fill", fill)
    result = run_job_mod.run_job(job)
    assert not result.ok and result.fail_reason is FailReason.disk
    assert "over its disk limit" in result.error and "what it wrote was deleted" in result.error
    job_dir = Path(job.run_dir) / "job"
    assert job_dir.is_dir() and not any(job_dir.iterdir())


HOLDS_DELETED = """
import os, sys, time
os.makedirs(sys.argv[1], exist_ok=True)
path = os.path.join(sys.argv[1], "hidden")
f = open(path, "wb")
os.unlink(path)  # no directory walk sees it now, yet it holds the disk while open
for _ in range(int(sys.argv[2])):
    f.write(b"x" * 1048576)
f.flush()
time.sleep(60)
"""


def test_a_run_that_holds_unlinked_files_open_is_counted_and_killed(tmp_path):
    out = tmp_path / "run"
    proc = start(HOLDS_DELETED, str(out), "40")
    dog = Watchdog(proc.pid, memory_limit=None, task_limit=None, write_paths=[str(out)], disk_limit=20 * 2**20)
    try:
        assert wait_dead(proc, 20)
        result = finish_watch(dog)
        assert result["watchdog_rule"] == "disk" and "more than 20 MiB" in result["watchdog"], result
        assert list(out.iterdir()) == []  # the walk alone would have counted nothing
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
