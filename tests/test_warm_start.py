"""Warm starts (AIT_WARM_START=1): training processes forked from a per-slot zygote.

The same jobs as a cold start must train, fail and be contained the same way: a good job
trains twice from one zygote (the second skips the imports), hostile env.py attacks meet the
same refusals, a killed job takes the zygote with it and the next job gets a fresh one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ait.compute import processes, warm
from ait.compute.run_job import run_job
from ait.compute.worker import run_worker
from ait.home import hidden_secret
from ait.job.types import FailReason
from ait.queue import JobQueue
from ait.sandbox.detect import cached_capabilities
from tests.test_hostile_jobs import attacks, loopback_server, make_job  # noqa: F401 - the fixture is used

pytestmark = pytest.mark.skipif(not cached_capabilities().active("landlock"), reason="needs Landlock on this kernel")


@pytest.fixture
def warm_start(monkeypatch):
    monkeypatch.setenv(warm.WARM_START_ENV, "1")
    yield
    zygote = getattr(warm._local, "zygote", None)
    if zygote is not None:
        zygote.close()
        del warm._local.zygote


def test_jobs_train_from_one_warm_zygote(tmp_path, warm_start):
    first = run_job(make_job(tmp_path, "one", "pass"))
    zygote = warm.train_zygote()
    pid = zygote.proc.pid
    second = run_job(make_job(tmp_path, "two", "pass"))
    assert first.ok and second.ok, (first.error, second.error)
    assert zygote.proc.pid == pid and zygote.proc.poll() is None  # the same zygote served both
    # The trainer's modules were already imported in the zygote: the child's own import is instant.
    assert second.metrics["train/import_seconds"] < 0.5, second.metrics["train/import_seconds"]
    assert second.post is not None
    assert (Path(second.checkpoint or tmp_path / "two" / "run" / "job" / "checkpoint")).exists()


@pytest.mark.slow  # 18 s on 2 shared cores: in CI's `pytest -m slow` pass
def test_attacks_are_contained_under_warm_starts(tmp_path, loopback_server, monkeypatch, warm_start):  # noqa: F811
    port, accepted = loopback_server
    monkeypatch.setenv("OPENAI_API_KEY", "sk-parent-secret-123")
    # The attacks whose refusal depends on what a forked child inherits (files, sockets, environment,
    # limits); the full list runs cold in test_hostile_jobs.py.
    chosen = ["read_secret", "net", "env_secret", "memory_bomb", "fork_bomb"]
    table = attacks(port, tmp_path)
    queue = JobQueue(tmp_path / "queue.sqlite", lease_s=30)
    for name in chosen:
        queue.enqueue(make_job(tmp_path, name, table[name][0]))
    queue.enqueue(make_job(tmp_path, "atexit", f"import atexit\natexit.register(lambda: open({str(tmp_path / 'ae.txt')!r}, 'w'))"))
    assert run_worker(queue, once=True) == len(chosen) + 1
    for name in chosen:
        r = queue.result(name)
        assert not r.ok and any(n in (r.error or "") for n in table[name][1]), (name, (r.error or "")[-800:])
    assert queue.result("memory_bomb").fail_reason is FailReason.oom
    bomb = queue.result("fork_bomb")  # the zygote watches its child as a cold start's parent does
    assert bomb.fail_reason is FailReason.crash and "a fork bomb" in bomb.error and bomb.train_seconds < 20
    # An exit handler runs as in a cold interpreter, and is refused the same way.
    assert not (tmp_path / "ae.txt").exists()
    assert not accepted
    blob = "\n".join(queue.result(n).error or "" for n in chosen)
    assert hidden_secret() not in blob and "sk-parent-secret-123" not in blob


@pytest.mark.slow  # 14 s on 2 shared cores: in CI's `pytest -m slow` pass
def test_a_killed_job_takes_its_zygote_and_the_next_job_gets_a_fresh_one(tmp_path, warm_start):
    job = make_job(tmp_path, "slow", "import time\ntime.sleep(120)")
    results = []
    thread = threading.Thread(target=lambda: results.append(run_job(job)))
    thread.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (tmp_path / "slow" / "run" / "logs" / "train.log").exists():
        time.sleep(0.2)
    time.sleep(2)
    assert processes.kill("slow") >= 1
    thread.join(60)
    assert results and not results[0].ok
    processes.forget("slow")
    zygote = warm.train_zygote()
    assert zygote.proc is None or zygote.proc.poll() is not None  # gone with its child
    after = run_job(make_job(tmp_path, "after", "pass"))
    assert after.ok, after.error


def test_a_slots_zygote_home_is_removed_when_the_worker_exits(tmp_path):
    code = ("import ait.compute.warm as w; z = w.train_zygote(); z.start(); "
            "print(z.env['HOME'], z.proc.pid, flush=True)")
    env = {**os.environ, warm.WARM_START_ENV: "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True)
    home, pid = out.stdout.split()
    home = next(p for p in Path(home).parents if p.name.startswith("ait-train-zygote-"))
    assert not home.exists()  # removed at exit, after the zygote was stopped
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
