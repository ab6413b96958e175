"""Ctrl-C (a real SIGINT) during each stage of `ait episode`: the probe, training, the eval, a queue
wait. Each time: exit 130 with a message naming the run dir, an episode.json with stop reason
`interrupted`, the job's seconds in the ledger, nothing of the run left running, a queued job
cancelled (no later worker trains it into the abandoned run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from ait.sandbox.detect import cached_capabilities

pytestmark = pytest.mark.skipif(not cached_capabilities().isolating, reason="needs the sandbox")


WITH_CTRL_C = ("import runpy, signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
               "sys.argv[0] = 'ait'\nrunpy.run_module('ait.cli', run_name='__main__', alter_sys=True)")


class Episode:
    """`ait episode` in a subprocess, its piped progress lines collected as they come."""

    def __init__(self, tmp_path: Path, *extra: str):
        self.runs = tmp_path / "runs"
        tmp_path.mkdir(parents=True, exist_ok=True)
        # SIGINT's Python handler installed explicitly: a test run started in the background by a shell
        # without job control inherits SIGINT ignored, and a Python started so never sees Ctrl-C.
        # --task calc_chain: the tiny model's job, whether or not SmolLM2 (the default episode's) is installed
        self.proc = subprocess.Popen([sys.executable, "-c", WITH_CTRL_C, "episode", "--task", "calc_chain",
                                      "--runs-dir", str(self.runs), *extra], cwd=tmp_path, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.out: list[str] = []  # stdout too: an episode that ended without a job prints its summary there
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True)
        self.reader.start()
        self.out_reader = threading.Thread(target=lambda: self.out.extend(self.proc.stdout), daemon=True)
        self.out_reader.start()

    def wait_for(self, test, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not test():
            assert self.proc.poll() is None, f"ended before the stage: {self.lines}"
            assert time.monotonic() < deadline, f"stage never reached: {self.lines}"
            time.sleep(0.05)

    def run_dirs(self) -> list[Path]:
        return [p for p in self.runs.iterdir() if p.is_dir()] if self.runs.is_dir() else []

    def saw(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def interrupt(self) -> tuple[int, str, Path]:
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout=60)
        self.reader.join(timeout=10)  # every last line, a traceback's included, before anything is asserted
        self.out_reader.join(timeout=10)
        (run_dir,) = [p for p in self.runs.iterdir() if p.is_dir()]
        if code != 130:  # what the run recorded, so a rare failure explains itself (the stderr alone did not)
            trajectory = run_dir / "trajectory.jsonl"
            tail = trajectory.read_text()[-4000:] if trajectory.exists() else "(no trajectory)"
            return code, "".join(self.lines) + "\n--- stdout:\n" + "".join(self.out)[-3000:] + \
                f"\n--- reader alive: {self.reader.is_alive()}\n--- trajectory tail:\n{tail}", run_dir
        return code, "\n".join(self.lines), run_dir


def run_dir_processes(run_dir: Path) -> list[str]:
    """Processes whose command line or working directory is inside the run directory."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if str(run_dir) in cmd or cwd.startswith(str(run_dir)):
            found.append(f"{proc.name}: {cmd[:120]}")
    return found


def assert_recorded(code: int, stderr: str, run_dir: Path, job_ran: bool) -> dict:
    assert code == 130, stderr
    assert "interrupted" in stderr and str(run_dir) in stderr and "Traceback" not in stderr, stderr
    episode = json.loads((run_dir / "episode.json").read_text())
    assert episode["stop_reason"] == "interrupted"
    if job_ran:
        assert episode["jobs"] and episode["jobs"][0]["result"]["fail_reason"] == "killed"
        ledger = [json.loads(line) for line in (run_dir.parent / "costs.jsonl").read_text().splitlines()]
        jobs = [e for e in ledger if e.get("kind") == "job" and e.get("run_id") == run_dir.name]
        assert jobs and jobs[0]["wall_s"] > 0, ledger
    deadline = time.monotonic() + 10
    while (left := run_dir_processes(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, left
    return episode


def test_ctrl_c_during_the_probe(tmp_path):
    for attempt in range(3):
        ep = Episode(tmp_path / f"try{attempt}")
        ep.wait_for(lambda: ep.saw("probing submission 1"))
        time.sleep(0.5)
        code, stderr, run_dir = ep.interrupt()
        if code != 130 and (why := ended_before_the_signal(run_dir)):
            # Not the case under test: the episode was over before Ctrl-C came (CI saw exit 1 and nothing on
            # stderr twice in ~30 runs). Said as a warning, so the CI log shows how it ended, and tried again.
            warnings.warn(f"the episode ended before Ctrl-C ({why}); trying again")
            continue
        episode = assert_recorded(code, stderr, run_dir, job_ran=False)
        assert episode["jobs"] == []
        return
    pytest.fail("three episodes in a row ended before Ctrl-C came (see the warnings)")


def ended_before_the_signal(run_dir: Path) -> str:
    """How the episode ended on its own, if it did: its stop reason and its probe's errors; '' if it did not."""
    path = run_dir / "episode.json"
    episode = json.loads(path.read_text()) if path.exists() else {}
    if episode.get("stop_reason") in (None, "interrupted"):
        return ""
    probes = [json.loads(p.read_text()) for p in sorted(run_dir.glob("submissions/*/probe.json"))]
    errors = [e.get("message", "")[:300] for p in probes for e in p.get("errors", [])]
    return f"stop reason {episode['stop_reason']}, probe errors {errors}"


@pytest.mark.slow  # 11 s on 2 shared cores; Ctrl-C in the probe and in the queue stay in the default suite
def test_ctrl_c_during_training(tmp_path):
    ep = Episode(tmp_path)
    ep.wait_for(lambda: ep.saw("training and evaluating"))
    ep.wait_for(lambda: any((d / "logs" / "train.log").exists() for d in ep.run_dirs()))
    code, stderr, run_dir = ep.interrupt()
    assert not (run_dir / "job" / "train_output.json").exists()  # cut short, not finished
    assert_recorded(code, stderr, run_dir, job_ran=True)


@pytest.mark.slow  # 17 s on 2 shared cores: in CI's `pytest -m slow` pass
def test_ctrl_c_during_the_eval(tmp_path):
    ep = Episode(tmp_path, "--eval-size", "4000")  # a long post-training eval to land in
    ep.wait_for(lambda: any((d / "job" / "train_output.json").exists() for d in ep.run_dirs()), timeout=240)
    code, stderr, run_dir = ep.interrupt()
    assert not (run_dir / "eval" / "eval.json").exists()  # the eval never finished
    assert_recorded(code, stderr, run_dir, job_ran=True)


def test_ctrl_c_while_waiting_on_the_queue_cancels_the_job(tmp_path):
    from ait.queue import JobQueue, JobState

    queue = tmp_path / "q.sqlite"
    ep = Episode(tmp_path, "--executor", "queue", "--config", str(write_config(tmp_path, queue)))
    ep.wait_for(lambda: ep.saw("no worker is serving it"))
    code, stderr, run_dir = ep.interrupt()
    assert_recorded(code, stderr, run_dir, job_ran=True)
    (entry,) = JobQueue(queue).list()
    assert entry.state is JobState.dead and "cancelled" in entry.error
    assert JobQueue(queue).claim("a-later-worker") is None  # nobody trains it into the abandoned run


def write_config(tmp_path: Path, queue: Path) -> Path:
    path = tmp_path / "episode.toml"
    path.write_text(f'queue_path = "{queue}"\n')
    return path
