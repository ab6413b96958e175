"""Starting Python processes that must not trust their surroundings, and capturing their output.

Every process ait starts (trusted or not) runs `python -I`: isolated mode ignores the working
directory, the user site and PYTHON* variables, so a module an agent planted in a directory
(`job/pydantic.py`, say) is never imported by the process that happens to start there. The
operator's import path (where ait and its dependencies are installed, PYTHONPATH included) is
handed over explicitly instead, by a one-line bootstrap.

Output goes through a pipe into a log the parent opens itself (never following a link), and
the last lines are kept in memory: what is reported about a run is never read back from a path
the run could have replaced.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

MAX_LOG_BYTES = 5_000_000
TAIL_BYTES = 20_000

# Runs `-m module args` or `-c code args` after putting the operator's import path first.
BOOT = ("import sys, json, runpy\n"
        "sys.path[:0] = json.loads(sys.argv.pop(1))\n"
        "kind, target = sys.argv.pop(1), sys.argv.pop(1)\n"
        "if kind == '-m':\n"
        "    sys.argv[0] = target\n"
        "    runpy.run_module(target, run_name='__main__', alter_sys=True)\n"
        "else:\n"
        "    sys.argv[0] = '-c'\n"
        "    exec(compile(target, '<string>', 'exec'), {'__name__': '__main__', '__builtins__': __builtins__})\n")


def import_paths() -> list[str]:
    """Where this interpreter finds ait and the operator's packages beyond site-packages: the
    directory holding the ait package (src/ for an editable install) and PYTHONPATH's entries.
    Never the working directory or a relative entry."""
    import ait

    paths = [str(Path(ait.__file__).resolve().parents[1])]
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and os.path.isabs(entry) and os.path.isdir(entry) and entry not in paths:
            paths.append(entry)
    return paths


def python_argv(args: list[str]) -> list[str]:
    """`python args...` (args = ["-m", module, ...] or ["-c", code, ...]) in isolated mode."""
    if len(args) < 2 or args[0] not in ("-m", "-c"):
        raise ValueError(f"expected ['-m', module, ...] or ['-c', code, ...], got {args[:2]}")
    return [sys.executable, "-I", "-c", BOOT, json.dumps(import_paths()), *args]


@dataclass
class RunOutcome:
    returncode: int | None
    """Exit status (negative: killed by that signal); None if it timed out."""
    timed_out: bool
    """True when the process group was killed for exceeding the timeout."""
    seconds: float
    """Wall time."""
    log_tail: str
    """Last lines of combined stdout/stderr, as captured from the pipe (never re-read from disk)."""
    oom_killed: bool = False
    """The kernel's OOM killer killed a process of the run (seen in its memory cgroup's events)."""
    memory_observed: bool = False
    """A memory cgroup (or ait's watchdog, where no cgroup is writable) watched the run, so
    `oom_killed` is a real observation, not a default."""
    watchdog: str | None = None
    """Why ait's watchdog killed the run (ait.sandbox.watch), if it did."""
    watchdog_rule: str | None = None
    """Which of the watchdog's limits that was: "tasks", "memory" or "disk"."""
    disk_fs: str | None = None
    """The file system of its own the run wrote to ("tmpfs" or "image", ait.sandbox.diskfs), capped
    at its disk limit by the kernel; None: the host's directory, bounded by the watchdog's walk."""
    disk_full: bool = False
    """That file system was seen full: a write past the run's disk limit failed (ENOSPC)."""


def open_log(path: Path):
    """The log file, created fresh by the parent; a link planted at the path is refused."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    return os.fdopen(fd, "wb")


class Capture:
    """Copies a pipe into a log: the first MAX_LOG_BYTES/2 and the last MAX_LOG_BYTES/2 bytes, so a
    flood of output can neither fill the disk nor hide the end. Keeps the last TAIL_BYTES in memory."""

    def __init__(self, pipe, log_path: Path):
        self.log = open_log(Path(log_path))
        self.last = b""
        self.thread = threading.Thread(target=self._run, args=(pipe,), daemon=True)
        self.thread.start()

    def _run(self, pipe) -> None:
        head_left = MAX_LOG_BYTES // 2
        ring: collections.deque[bytes] = collections.deque()
        ring_bytes = dropped = 0
        with self.log as log:
            for chunk in iter(lambda: pipe.read1(65536), b""):
                self.last = (self.last + chunk)[-TAIL_BYTES:]
                if head_left > 0:
                    log.write(chunk[:head_left])
                    log.flush()
                    chunk, head_left = chunk[head_left:], head_left - len(chunk[:head_left])
                if chunk:
                    ring.append(chunk)
                    ring_bytes += len(chunk)
                    while ring_bytes - len(ring[0]) >= MAX_LOG_BYTES // 2:
                        ring_bytes -= len(ring[0])
                        dropped += len(ring.popleft())
            if dropped:
                log.write(f"\n[... {dropped} bytes of output dropped ...]\n".encode())
            log.writelines(ring)

    def join(self, timeout: float = 10.0) -> None:
        self.thread.join(timeout=timeout)

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.last.decode("utf-8", errors="replace").splitlines()[-lines:])


def kill_group_pid(pid: int) -> None:
    """SIGKILL the process group `pid` leads (never 0 or 1: killpg(0) would be our own group)."""
    import signal

    if pid <= 1:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class StartedProcess:
    """`python -I args...` started now in a new session, finished later: the caller can do other
    work meanwhile and then hand it one line on stdin (for example "go"). `kill()` stops the whole
    group and is safe to call more than once; `on_exit` runs once, after the group is dead."""

    def __init__(self, args: list[str], *, cwd: str | Path, log_path: str | Path, env: dict[str, str] | None = None,
                 stdin: bool = False, argv: list[str] | None = None, on_exit=None, pass_fds: tuple[int, ...] = ()):
        """`argv` replaces the isolated-mode `python args` command line (the sandbox's launcher);
        `pass_fds` are inherited (the launcher's report pipe)."""
        self.start = time.monotonic()
        self.on_exit = on_exit
        self.proc = subprocess.Popen(argv or python_argv(args), cwd=cwd, env=env,
                                     stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                     pass_fds=pass_fds)
        self.pid = self.proc.pid
        self.capture = Capture(self.proc.stdout, Path(log_path))
        self._exit_info: dict | None = None

    def finish(self, timeout_s: float, stdin_line: str | None = None) -> RunOutcome:
        """Send `stdin_line` (then close stdin), wait up to `timeout_s` more, kill the group."""
        if self.proc.stdin is not None:
            try:
                if stdin_line is not None:
                    self.proc.stdin.write((stdin_line.rstrip("\n") + "\n").encode())
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass  # it exited already: its status says why
        timed_out = False
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            self.kill()
        info = self._exit_info or {}
        return RunOutcome(None if timed_out else self.proc.returncode, timed_out, time.monotonic() - self.start,
                          self.capture.tail(), oom_killed=info.get("oom_killed", False),
                          memory_observed=info.get("memory_observed", False), watchdog=info.get("watchdog"),
                          watchdog_rule=info.get("watchdog_rule"), disk_fs=info.get("disk_fs"),
                          disk_full=info.get("disk_full", False))

    def kill(self) -> None:
        kill_group_pid(self.proc.pid)  # also reaps grandchildren left behind by a finished parent
        self.proc.wait()
        if self.on_exit is not None and self._exit_info is None:
            self._exit_info = self.on_exit() or {}
        self.capture.join()

