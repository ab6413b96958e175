"""Running untrusted (agent-written) code. Every run of agent code goes through `run_untrusted`.

This first layer is a subprocess in its own session and process group, killed as a
group on timeout, with a scrubbed environment (no API keys or tokens leak in) and its
output captured to a log file with a size cap. Stronger layers (rlimits, Landlock,
seccomp, namespaces) slot in behind this same function.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# Variables a child needs to run Python and find its libraries; everything else
# (API keys, cloud credentials, tokens) is dropped.
KEEP_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "HOME", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV",
            "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "AIT_HOME", "HF_HOME", "HF_HUB_OFFLINE",
            "TRANSFORMERS_OFFLINE", "PYTORCH_CUDA_ALLOC_CONF")
MAX_LOG_BYTES = 5_000_000


@dataclass
class RunOutcome:
    returncode: int | None
    """Exit status (negative: killed by that signal); None if it timed out."""
    timed_out: bool
    """True when the process group was killed for exceeding the timeout."""
    seconds: float
    """Wall time."""
    log_tail: str
    """Last lines of combined stdout/stderr."""


def scrubbed_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in KEEP_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_untrusted(args: list[str], *, cwd: str | Path, timeout_s: float, log_path: str | Path,
                  env: dict[str, str] | None = None) -> RunOutcome:
    """Run agent code: `python args...` with a scrubbed environment (and, later, more layers)."""
    return run_process(args, cwd=cwd, timeout_s=timeout_s, log_path=log_path, env=scrubbed_env(env))


def run_process(args: list[str], *, cwd: str | Path, timeout_s: float, log_path: str | Path,
                env: dict[str, str] | None = None) -> RunOutcome:
    """Run `python args...` in a new session; kill the whole group at `timeout_s`."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            kill_group(proc)  # also reaps grandchildren left behind by a finished parent
            proc.wait()
    _truncate(log_path)
    return RunOutcome(None if timed_out else proc.returncode, timed_out, time.monotonic() - start, tail(log_path))


def _truncate(path: Path) -> None:
    if path.stat().st_size > MAX_LOG_BYTES:
        with open(path, "r+b") as f:
            f.seek(-MAX_LOG_BYTES, os.SEEK_END)
            data = f.read()
            f.seek(0)
            f.write(b"[... log truncated ...]\n" + data)
            f.truncate()


def tail(path: Path, lines: int = 30) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 20_000))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
