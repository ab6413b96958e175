"""Running untrusted (agent-written) code. Every run of agent code goes through `run_untrusted`.

Layers, strongest available first, detected at run time (`ait doctor` lists them):
a new session and process group killed as a group on timeout, with a parent-death
signal; rlimits; a scrubbed environment with a private HOME and TMPDIR; per-run cgroups (pids.max, and cgroup.kill to end every process a run made);
all capabilities dropped when running as root; Landlock (reads from an allow-list,
writes only in the run's directory, no TCP, no signals outside); seccomp (no network
sockets, ptrace, mount, namespaces, bpf, keyctl). The layers are applied in the child
by `ait.sandbox.launch` before it execs the target. With no isolating layer available,
agent code is refused unless AIT_UNSAFE_NO_SANDBOX=1 (the `--unsafe-no-sandbox` flag).
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ait.sandbox import cgroup
from ait.sandbox.types import Limits, SandboxPolicy

__all__ = ["UNSAFE_ENV", "Limits", "RunOutcome", "SandboxPolicy", "SandboxUnavailable", "StartedProcess",
           "run_process", "require_isolation", "run_untrusted", "unsafe_allowed"]

# Variables a child needs to run Python and find its libraries; everything else
# (API keys, cloud credentials, tokens) is dropped.
KEEP_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "PYTHONPATH", "VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES",
            "OMP_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF", "CUDA_MPS_PIPE_DIRECTORY",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "AIT_LOGIT_BUDGET")
UNSAFE_ENV = "AIT_UNSAFE_NO_SANDBOX"
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


class SandboxUnavailable(RuntimeError):
    """No isolating layer works here and the user did not accept running without one."""


def scrubbed_env(private_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Only what Python needs; HOME, TMPDIR and every cache point into the run's own directory."""
    env = {k: v for k, v in os.environ.items() if k in KEEP_ENV}
    home, tmp = private_dir / ".home", private_dir / ".tmp"
    home.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(home), TMPDIR=str(tmp), PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1",
               HF_HOME=str(home / "hf"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TRITON_CACHE_DIR=str(tmp / "triton"), TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"),
               MPLCONFIGDIR=str(tmp), WANDB_MODE="disabled", TRL_EXPERIMENTAL_SILENCE="1")
    env.update(extra or {})
    return env


def unsafe_allowed() -> bool:
    return os.environ.get(UNSAFE_ENV) == "1"


NO_ISOLATION = ("no isolating sandbox layer (Landlock, seccomp, namespaces) works on this host, so agent code is "
                "not run; see `ait doctor`, or pass --unsafe-no-sandbox to run it anyway (recorded in the run's "
                "manifest)")


def require_isolation() -> dict:
    """Fail fast before an episode or a worker starts; returns what the manifest records."""
    from ait.sandbox.detect import cached_capabilities

    caps = cached_capabilities()
    if not caps.isolating and not unsafe_allowed():
        raise SandboxUnavailable(NO_ISOLATION)
    return {"layers": [layer.name for layer in caps.layers if layer.active], "kernel": caps.kernel,
            "unsafe_no_sandbox": unsafe_allowed()}


def count_user_processes() -> int:
    uid = os.getuid()
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += 1
            except OSError:
                pass
    return count


def kill_group(proc: subprocess.Popen) -> None:
    kill_group_pid(proc.pid)


def kill_group_pid(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_untrusted(args: list[str], *, cwd: str | Path, timeout_s: float, log_path: str | Path,
                  policy: SandboxPolicy, env: dict[str, str] | None = None, zygote=None) -> RunOutcome:
    """Run agent code: `python args...` inside every layer this host supports.
    `policy.write[0]` is the run's private directory (HOME, TMPDIR and caches go there).
    With a `zygote` (see ait.sandbox.zygote) and `args` of the form ["-m", module, ...], the
    child is forked from a warm interpreter instead of started cold; the layers are the same."""
    from ait.sandbox.detect import cached_capabilities
    from ait.sandbox.launch import LaunchPlan

    capabilities = cached_capabilities()
    if not capabilities.isolating and not unsafe_allowed():
        raise SandboxUnavailable(NO_ISOLATION)
    layers = [layer.name for layer in capabilities.layers if layer.active]
    groups = cgroup.create(policy.limits.processes, policy.limits.memory_bytes) if "cgroups" in layers else []
    has_pids_max = any(Path(g, "pids.max").exists() for g in groups)
    nproc = None if has_pids_max else count_user_processes() + policy.limits.processes
    plan = LaunchPlan(policy=policy, layers=layers, cgroups=groups, nproc_limit=nproc, args=args)
    child_env = scrubbed_env(Path(policy.write[0]), env)
    try:
        if zygote is not None and args[:1] == ["-m"]:
            from ait.sandbox.zygote import ZygoteError

            try:
                reply = zygote.run(plan, args[1], args[2:], cwd=str(cwd), env=child_env, log_path=str(log_path),
                                   timeout_s=timeout_s)
                return RunOutcome(reply["returncode"], reply["timed_out"], reply["seconds"], tail(Path(log_path)))
            except ZygoteError:
                pass  # fall back to a cold start below
        return run_process(["-m", "ait.sandbox.launch", plan.model_dump_json()], cwd=cwd, timeout_s=timeout_s,
                           log_path=log_path, env=child_env)
    finally:
        cgroup.destroy(groups)


def run_process(args: list[str], *, cwd: str | Path, timeout_s: float, log_path: str | Path,
                env: dict[str, str] | None = None) -> RunOutcome:
    """Run `python args...` in a new session; kill the whole group at `timeout_s`.
    Output goes through a pipe: the log keeps the first MAX_LOG_BYTES/2 and the last
    MAX_LOG_BYTES/2 bytes, so a flood of output can neither fill the disk nor hide the end."""
    return StartedProcess(args, cwd=cwd, log_path=log_path, env=env).finish(timeout_s)


class StartedProcess:
    """`python args...` started now in a new session, finished later (run_process in two halves):
    the caller can do other work meanwhile and then hand it one line on stdin (for example "go").
    `kill()` stops the whole group; it is safe to call more than once."""

    def __init__(self, args: list[str], *, cwd: str | Path, log_path: str | Path, env: dict[str, str] | None = None,
                 stdin: bool = False):
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.start = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, *args], cwd=cwd, env=env,
                                     stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.reader = threading.Thread(target=_capture, args=(self.proc.stdout, self.log_path), daemon=True)
        self.reader.start()

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
        return RunOutcome(None if timed_out else self.proc.returncode, timed_out, time.monotonic() - self.start,
                          tail(self.log_path))

    def kill(self) -> None:
        kill_group(self.proc)  # also reaps grandchildren left behind by a finished parent
        self.proc.wait()
        self.reader.join(timeout=10)


def _capture(pipe, log_path: Path) -> None:
    head_left = MAX_LOG_BYTES // 2
    ring: collections.deque[bytes] = collections.deque()
    ring_bytes = dropped = 0
    with open(log_path, "wb") as log:
        for chunk in iter(lambda: pipe.read1(65536), b""):
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


def tail(path: Path, lines: int = 30) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 20_000))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
