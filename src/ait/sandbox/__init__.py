"""Running untrusted (agent-written) code, and code that reads what agents wrote. Every such
run goes through `run_untrusted` / `start_untrusted`.

Layers, strongest available first, detected at run time (`ait doctor` lists them):
a new session and process group killed as a group on timeout, with a parent-death
signal; rlimits; a scrubbed environment with a private HOME and TMPDIR; per-run cgroups
(pids.max, a memory limit whose OOM kills are observed, cgroup.kill to end every process a
run made); all capabilities dropped when running as root; a private root file system in
mount and PID namespaces (only the allowed paths exist; no host sockets, /tmp or /dev/shm);
Landlock (reads from an allow-list, writes only in the run's directory, no TCP, no signals
outside); seccomp (no network sockets, no connect(2), ptrace, mount, namespaces, bpf,
keyctl); a private network namespace; in the private root, a file system of the run's own for
its directory, capped at its disk limit (ait.sandbox.diskfs: a write past it fails with ENOSPC,
and only the names the policy keeps are copied out). The layers are applied in the child by
`ait.sandbox.launch` before it execs the target.

Fail closed: agent code runs only where a layer that confines the file system works
(Landlock or the private root), and only when AIT_HOME lies outside every path the run may
reach; otherwise it is refused unless AIT_UNSAFE_NO_SANDBOX=1 (`--unsafe-no-sandbox`).
"""

from __future__ import annotations

import os
from pathlib import Path

from ait.sandbox import cgroup
from ait.sandbox.process import RunOutcome, StartedProcess, kill_group_pid, python_argv
from ait.sandbox.types import Limits, SandboxPolicy
from ait.sandbox.watch import finish_watch, proc_stats, start_watchdog

__all__ = ["UNSAFE_ENV", "Limits", "RunOutcome", "SandboxPolicy", "SandboxUnavailable", "StartedProcess",
           "gpu_settings", "kill_group_pid", "python_argv", "require_isolation", "run_untrusted",
           "scrubbed_env", "start_untrusted", "unsafe_allowed"]

# Variables a child needs to run Python and find its libraries; everything else
# (API keys, cloud credentials, tokens, AIT_HIDDEN_SEED) is dropped.
KEEP_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "PYTHONPATH", "VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES",
            "OMP_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF", "CUDA_MPS_PIPE_DIRECTORY",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "AIT_LOGIT_BUDGET")
UNSAFE_ENV = "AIT_UNSAFE_NO_SANDBOX"


class SandboxUnavailable(RuntimeError):
    """Agent code cannot be confined here (no file-system layer, or AIT_HOME reachable) and the
    user did not accept running it anyway."""


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


NO_ISOLATION = ("no sandbox layer that confines the file system (Landlock or a private mount namespace) works on "
                "this host, so agent code is not run (seccomp, capabilities or namespaces alone leave the hidden "
                "secret readable); see `ait doctor`, or pass --unsafe-no-sandbox to run it anyway (recorded in the "
                "run's manifest)")


def _refuse_if_unconfined(capabilities, policy: SandboxPolicy) -> None:
    from ait.home import ait_home
    from ait.sandbox.launch import ExposedSecret, check_secret_hidden, plan_paths

    if unsafe_allowed():
        return
    if not capabilities.isolating:
        raise SandboxUnavailable(NO_ISOLATION)
    try:
        check_secret_hidden(plan_paths(policy), ait_home())
    except ExposedSecret as e:
        raise SandboxUnavailable(str(e)) from None


def require_isolation() -> dict:
    """Fail fast before an episode or a worker starts; returns what the manifest records."""
    from ait.sandbox.detect import cached_capabilities

    caps = cached_capabilities()
    _refuse_if_unconfined(caps, SandboxPolicy())
    return {"layers": [layer.name for layer in caps.layers if layer.active], "kernel": caps.kernel,
            "unsafe_no_sandbox": unsafe_allowed()}


def gpu_settings(extra_env: dict[str, str] | None = None) -> tuple[bool, str | None]:
    """(whether a run with this environment uses the GPU, the CUDA MPS pipe directory it may reach).
    A slot with CUDA_VISIBLE_DEVICES="" is a CPU slot. MPS only where its pipe directory exists and
    the private root works: an MPS client must connect(2) to its daemon, and only the private root
    then keeps every other host socket out of reach (it holds the pipe directory alone). Elsewhere
    packed jobs share the GPU time-sliced instead (measured on an H200: docs/measurements/
    gpu-trust-check-h200-s8.json, MPS clients with a private, empty /dev/shm)."""
    from ait.sandbox.detect import cached_capabilities

    merged = {**os.environ, **(extra_env or {})}
    gpu = merged.get("CUDA_VISIBLE_DEVICES") != "" and Path("/dev/nvidiactl").exists()
    mps = merged.get("CUDA_MPS_PIPE_DIRECTORY") or None
    usable = gpu and mps and Path(mps).is_dir() and (cached_capabilities().active("mounts") or unsafe_allowed())
    return gpu, (mps if usable else None)


def count_user_tasks() -> int:
    """Tasks (threads) this user has now: RLIMIT_NPROC counts threads, so a run's limit of
    `processes` more than this leaves it exactly that many (counting processes alone would leave
    a run on a host with many threads, such as a Ray worker, far fewer)."""
    uid = os.getuid()
    count = 0
    for pid, _, threads in proc_stats():
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                count += threads
        except OSError:
            pass
    return count


class _Disk:
    """One run's disk bound on the parent's side: its own file system where this host has the kind the
    policy asks for (ait.sandbox.diskfs; the image is made here), and what is kept when it ends."""

    def __init__(self, policy: SandboxPolicy, capabilities, layers: list[str], paths) -> None:
        from ait.sandbox import diskfs

        self.policy = policy
        # Regular files there before the run (its request) stay; HOME and TMPDIR are the run's scratch.
        self.before = diskfs.regular_files(policy.write[0]) if policy.keep is not None and policy.write else set()
        available = capabilities.disk_fs if "mounts" in layers else []
        self.plan = diskfs.prepare(policy, available, [*paths.read, *paths.write])
        self.report_r: int | None = None

    def pass_fds(self) -> tuple[int, ...]:
        """For a launcher started here: its report pipe's write end and its fanotify group (their
        numbers go in the plan); none without a file system of its own."""
        from ait.sandbox import diskfs

        if self.plan is None:
            return ()
        self.report_r, self.plan.report_fd = os.pipe()
        self.plan.watch_fd = diskfs.watch_group()  # held here until the run has ended (see DiskPlan.watch_fd)
        return tuple(fd for fd in (self.plan.report_fd, self.plan.watch_fd) if fd is not None)

    def close_writer(self) -> None:
        if self.plan is not None and self.plan.report_fd is not None:
            os.close(self.plan.report_fd)
            self.plan.report_fd = None

    def done(self, reported: dict | None = None, keep: bool = True) -> dict:
        """After the run (its processes gone): what the waiter saw, as RunOutcome fields; the image
        deleted; the run's directory stripped of everything but the kept names (and, with
        keep=False, of those too: a run started again cold must not find them)."""
        from ait.sandbox import diskfs

        if self.report_r is not None:
            fields = diskfs.read_report(self.report_r, self.plan)
            self.report_r = None
        elif reported is not None:
            fields = {"disk_fs": reported.get("disk_fs") if reported.get("disk_fs") in ("tmpfs", "image") else None,
                      "disk_full": reported.get("disk_full") is True}
        else:
            fields = {"disk_fs": None, "disk_full": False}
        if self.plan is not None and self.plan.watch_fd is not None:
            os.close(self.plan.watch_fd)  # the waiter's mark went with its file system: no wait here
            self.plan.watch_fd = None
        diskfs.release(self.plan)
        if self.policy.keep is not None and self.policy.write:
            diskfs.discard_unkept(self.policy.write[0], self.policy.keep if keep else [], self.before)
        return fields


def start_untrusted(args: list[str], *, cwd: str | Path, log_path: str | Path, policy: SandboxPolicy,
                    env: dict[str, str] | None = None, stdin: bool = False) -> StartedProcess:
    """Start `python args...` (["-m", module, ...] or ["-c", code, ...]) inside every layer this
    host supports; finish it with `.finish(timeout_s, stdin_line)`. `policy.write[0]` is the run's
    private directory (HOME, TMPDIR and caches go there)."""
    from ait.sandbox.detect import cached_capabilities
    from ait.sandbox.launch import LaunchPlan, plan_paths

    capabilities = cached_capabilities()
    _refuse_if_unconfined(capabilities, policy)
    layers = [layer.name for layer in capabilities.layers if layer.active]
    groups = cgroup.create(policy.limits.processes, policy.limits.memory_bytes) if "cgroups" in layers else []
    has_pids_max = any(Path(g, "pids.max").exists() for g in groups)
    nproc = None if has_pids_max else count_user_tasks() + policy.limits.processes
    paths = plan_paths(policy)
    # HOME and TMPDIR first: the run's own file system is seeded with what its directory holds.
    child_env = scrubbed_env(Path(policy.write[0]), {**(env or {}), **({"AIT_EXPECT_GPU": "1"} if policy.gpu else {})})
    try:
        disk = _Disk(policy, capabilities, layers, paths)
    except BaseException:
        cgroup.destroy(groups)
        raise
    pass_fds = disk.pass_fds()
    plan = LaunchPlan(policy=policy, layers=layers, paths=paths, cgroups=groups, nproc_limit=nproc,
                      args=python_argv(args), disk=disk.plan)

    watchdog = []  # the run's watchdog, once its session exists

    def on_exit() -> dict:
        events = cgroup.oom_events(groups)
        cgroup.destroy(groups)
        return {**events, **finish_watch(watchdog[0] if watchdog else None), **disk.done()}

    try:
        started = StartedProcess(["-m", "ait.sandbox.launch", plan.model_dump_json()], cwd=cwd, log_path=log_path,
                                 env=child_env, stdin=stdin, on_exit=on_exit,
                                 pass_fds=pass_fds)
    except BaseException:
        cgroup.destroy(groups)
        disk.close_writer()
        disk.done(keep=False)
        raise
    disk.close_writer()
    watchdog.append(start_watchdog(started.pid, policy, groups))  # its session id is its pid
    return started


def run_untrusted(args: list[str], *, cwd: str | Path, timeout_s: float, log_path: str | Path,
                  policy: SandboxPolicy, env: dict[str, str] | None = None, zygote=None) -> RunOutcome:
    """Run agent code: `python args...` inside every layer this host supports.
    With a `zygote` (see ait.sandbox.zygote) and `args` of the form ["-m", module, ...], the
    child is forked from a warm interpreter instead of started cold; the layers are the same."""
    if zygote is not None and args[:1] == ["-m"]:
        from ait.sandbox.detect import cached_capabilities
        from ait.sandbox.launch import LaunchPlan, plan_paths
        from ait.sandbox.zygote import ZygoteError

        capabilities = cached_capabilities()
        _refuse_if_unconfined(capabilities, policy)
        layers = [layer.name for layer in capabilities.layers if layer.active]
        groups = cgroup.create(policy.limits.processes, policy.limits.memory_bytes) if "cgroups" in layers else []
        disk = None
        try:
            nproc = None if any(Path(g, "pids.max").exists() for g in groups) else \
                count_user_tasks() + policy.limits.processes
            paths = plan_paths(policy)
            child_env = scrubbed_env(Path(policy.write[0]), {**(env or {}),
                                                             **({"AIT_EXPECT_GPU": "1"} if policy.gpu else {})})
            disk = _Disk(policy, capabilities, layers, paths)  # the zygote's server makes the report pipe and watch
            plan = LaunchPlan(policy=policy, layers=layers, paths=paths, cgroups=groups, nproc_limit=nproc,
                              disk=disk.plan)
            reply = zygote.run(plan, args[1], args[2:], cwd=str(cwd), env=child_env, log_path=str(log_path),
                               timeout_s=timeout_s)
            events = {**cgroup.oom_events(groups), **reply.get("watch", {}),
                      **disk.done(reply.get("disk") if isinstance(reply.get("disk"), dict) else None)}
            disk = None
            return RunOutcome(reply["returncode"], reply["timed_out"], reply["seconds"], reply.get("log_tail", ""),
                              **events)
        except ZygoteError:
            pass  # fall back to a cold start below
        finally:
            cgroup.destroy(groups)
            if disk is not None:  # not run, or the zygote failed: a cold start begins afresh
                disk.done(keep=False)
    return start_untrusted(args, cwd=cwd, log_path=log_path, policy=policy, env=env).finish(timeout_s)

