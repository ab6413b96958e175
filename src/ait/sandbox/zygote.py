"""A warm interpreter that forks one sandboxed child per request (a "zygote").

Probes are short, but a cold Python that imports torch and transformers spends seconds
before running any agent code. The zygote imports them once; each request forks it, the
child applies the same layers as `ait.sandbox.launch` (in-process instead of before an
exec), runs the target module as __main__, and exits. Requests are served one at a time,
so no other thread is running when the zygote forks.

The zygote itself never reads a request or sees a reply: each request is read, run and answered
by a one-shot server forked from it, so the process every child is forked from holds nothing of
an earlier run (its request, its reply and log tail, their residue on the heap). Agent code in
one episode's probe can then never find the previous episode's output in its own memory.

    parent --JSON line--> server (forked from the zygote) --fork--> child (setsid, layers, runpy)
                          <--JSON reply--                           --> exit code
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import importlib
import json
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from ait.sandbox.launch import LaunchPlan, apply
from ait.sandbox.process import Capture, kill_group_pid, python_argv
from ait.sandbox.watch import finish_watch, start_watchdog

PR_SET_PDEATHSIG = 1


class ZygoteError(RuntimeError):
    """The zygote process is gone or answered nonsense; callers fall back to a cold start."""


class Zygote:
    """Parent-side handle: starts the zygote lazily and sends it one request at a time."""

    def __init__(self, preload: list[str], env: dict[str, str]):
        self.preload, self.env = preload, env
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        atexit.register(self.close)

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            home = self.env.get("HOME") or "/"
            self.proc = subprocess.Popen(python_argv(["-m", "ait.sandbox.zygote", *self.preload]), cwd=home,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env, text=True,
                                         start_new_session=True)
        return self.proc

    def start(self) -> int:
        """Start the zygote now (its imports run while the caller does other work); returns its pid,
        which is also its process group: killing that group kills the zygote, and its running
        child with it (the child dies with its parent)."""
        with self.lock:
            return self._start().pid

    def run(self, plan: LaunchPlan, module: str, argv: list[str], *, cwd: str, env: dict[str, str],
            log_path: str, timeout_s: float) -> dict:
        """Fork a child that runs `python -m module argv...` under `plan`; returns
        {"returncode", "timed_out", "seconds", "log_tail"}. Raises ZygoteError if the zygote failed."""
        request = {"plan": plan.model_dump(), "module": module, "argv": argv, "cwd": cwd, "env": env,
                   "log_path": log_path, "timeout_s": timeout_s}
        with self.lock:
            proc = self._start()
            start = time.monotonic()
            try:
                proc.stdin.write(json.dumps(request) + "\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
                return json.loads(line)
            except (OSError, ValueError) as e:
                try:
                    status = proc.wait(timeout=5)  # gone (EOF), or answered nonsense and is killed below
                except subprocess.TimeoutExpired:
                    status = None
                self.close()
                if status is not None and status < 0:
                    # Killed by a signal (a job killed through its process group, which is the
                    # zygote's): its child died with it. That is the job's end, not a reason to
                    # run it again cold.
                    return {"returncode": status, "timed_out": False, "seconds": time.monotonic() - start,
                            "log_tail": f"killed by signal {-status} (with its warm-start zygote)"}
                raise ZygoteError(f"zygote failed: {e}") from None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def _child(req: dict, write_fd: int, keep_fds: tuple[int, ...] = ()) -> None:
    """In the forked child: detach, wire output, apply the layers, run the module. Never returns.
    `keep_fds` are moved to 3, 4, ... (the launcher's disk report pipe and watch: its waiter keeps
    them, the run closes them at once); every other descriptor is closed."""
    code = 1
    try:
        os.setsid()
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in keep_fds]  # out of the way of 3, 4, ...
        for target, fd in enumerate(high, start=3):
            os.dup2(fd, target, inheritable=False)
        os.closerange(3 + len(keep_fds), 65536)  # the zygote's request pipes must not reach agent code
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        _apply_thread_count()
        apply(LaunchPlan.model_validate(req["plan"]))
        sys.argv = [req["module"], *req["argv"]]
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()  # as a cold interpreter would at exit (os._exit below skips them)
        except BaseException:  # noqa: BLE001 - an exit handler's failure is the child's, already logged
            pass
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _apply_thread_count() -> None:
    """OpenMP read OMP_NUM_THREADS when torch was imported in the zygote: a child's own share
    (the executor sets it per job) reaches torch only through set_num_threads."""
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _check_fork_safe() -> None:
    """A CUDA context does not survive fork: a preload that created one would break every child."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise SystemExit("ait zygote: CUDA was initialised while preloading; children could not use the GPU")


def _serve_one(req: dict) -> dict:
    from ait.sandbox.diskfs import read_report, watch_group

    read_fd, write_fd = os.pipe()
    report_r, keep_fds = None, ()
    if req["plan"].get("disk"):  # the run's own file system: its waiter's report pipe and watch (ait.sandbox.diskfs)
        report_r, report_w = os.pipe()
        watch = watch_group()
        keep_fds = (report_w,) if watch is None else (report_w, watch)
        req["plan"]["disk"].update(report_fd=3, watch_fd=None if watch is None else 4)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        if report_r is not None:
            os.close(report_r)
        _child(req, write_fd, keep_fds)
    os.close(write_fd)
    if keep_fds:
        os.close(keep_fds[0])  # the watch is held until the run has ended (see DiskPlan.watch_fd)
    capture = Capture(os.fdopen(read_fd, "rb"), Path(req["log_path"]))
    plan = LaunchPlan.model_validate(req["plan"])
    watchdog = start_watchdog(pid, plan.policy, plan.cgroups)  # the child's setsid makes its pid the session
    deadline, status, timed_out = start + req["timeout_s"], None, False
    while status is None:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = raw
        elif time.monotonic() > deadline:
            timed_out = True
            kill_group_pid(pid)
            _, status = os.waitpid(pid, 0)
        else:
            time.sleep(0.005)
    kill_group_pid(pid)  # whatever the child left running in its group
    capture.join()
    disk = read_report(report_r, plan.disk) if report_r is not None else None
    for fd in keep_fds[1:]:
        os.close(fd)
    return {"returncode": None if timed_out else os.waitstatus_to_exitcode(status), "timed_out": timed_out,
            "seconds": time.monotonic() - start, "log_tail": capture.tail(), "watch": finish_watch(watchdog),
            **({"disk": disk} if disk is not None else {})}


EXIT_EOF = 3  # a server's exit status: the parent closed the request pipe, so the zygote exits too


def read_request_line(fd: int = 0) -> bytes | None:
    """One request line from `fd`, read a byte at a time so nothing of the next request is taken
    (the parent sends one and waits for its reply); None at end of input."""
    line = bytearray()
    while True:
        byte = os.read(fd, 1)
        if not byte:
            return None if not line else bytes(line)
        if byte == b"\n":
            return bytes(line)
        line += byte


def _serve_next() -> None:
    """In a server forked from the zygote: serve one request, write its reply, exit. Never returns."""
    code = 1
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # die with the zygote
        line = read_request_line()
        if line is None:
            code = EXIT_EOF
        else:
            reply = (json.dumps(_serve_one(json.loads(line))) + "\n").encode()
            while reply:
                reply = reply[os.write(1, reply):]
            code = 0
    except BaseException:  # noqa: BLE001 - the parent sees the pipe close and falls back to a cold start
        traceback.print_exc()
    finally:
        os._exit(code)


def main(preload: list[str]) -> None:
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # die with the harness
    for name in preload:
        module = importlib.import_module(name)
        if hasattr(module, "zygote_warmup"):
            module.zygote_warmup()
    _check_fork_safe()
    while True:  # from here on this process only forks servers and waits for them
        pid = os.fork()
        if pid == 0:
            _serve_next()
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:  # end of input, or a server that failed: the parent then starts afresh
            sys.exit(0 if code == EXIT_EOF else 1)


if __name__ == "__main__":
    main(sys.argv[1:])
