"""The sandbox launcher: runs first in the child, applies every layer, then execs the target.

    python -I -c BOOT PATHS -m ait.sandbox.launch PLAN_JSON     (then: python -I ... -m ait.train.main ...)

Order matters: join the run's cgroups and set rlimits while still privileged, enter the
namespaces (a private root needs the mount and PID namespaces, and a fork to become PID 1; the
run's own size-capped file system, ait.sandbox.diskfs, is mounted just before that fork),
drop capabilities, then Landlock and seccomp (both need no_new_privs, both survive exec).
The allow-lists are computed by the parent (`plan_paths`), which also refuses any list that
would expose AIT_HOME.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
from pathlib import Path

from pydantic import BaseModel, Field

from ait.sandbox.diskfs_waiter import DiskPlan
from ait.sandbox.types import SandboxPolicy

PR_SET_PDEATHSIG = 1
SYSTEM_READ = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/ld.so.conf",
               "/etc/ld.so.conf.d", "/etc/localtime", "/etc/ssl", "/etc/ca-certificates", "/etc/pki", "/etc/passwd",
               "/etc/group", "/etc/nsswitch.conf", "/etc/os-release", "/etc/hosts", "/etc/mime.types",
               "/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/sys/vm/overcommit_memory",
               "/sys/devices/system/cpu", "/sys/fs/cgroup", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/full"]
GPU_READ = ["/proc/driver/nvidia", "/sys/bus/pci", "/sys/devices", "/sys/module/nvidia", "/run/nvidia-persistenced"]
GPU_DEVICES = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]


class PlanPaths(BaseModel):
    read: list[str] = Field(default_factory=list)
    """Readable (system, the interpreter and its packages, the policy's read paths)."""
    write: list[str] = Field(default_factory=list)
    """Writable (the policy's write paths; the MPS pipe directory)."""
    devices: list[str] = Field(default_factory=list)
    """Device nodes read, written and ioctl'd (the GPU's)."""


class LaunchPlan(BaseModel):
    policy: SandboxPolicy
    """What the run may touch."""
    layers: list[str]
    """Layers to apply (those detected active)."""
    paths: PlanPaths = Field(default_factory=PlanPaths)
    """The allow-lists, as computed by the parent."""
    cgroups: list[str] = Field(default_factory=list)
    """cgroup directories to join, created by the parent."""
    nproc_limit: int | None = None
    """RLIMIT_NPROC to set when no pids cgroup is used."""
    args: list[str] = Field(default_factory=list)
    """The target's full argv (an isolated-mode python command line) to exec once confined."""
    disk: DiskPlan | None = None
    """The run's own file system for write[0] (with the mounts layer only), planned by the parent."""


def python_read_paths() -> list[str]:
    """The interpreter, its stdlib and site-packages, the directory holding the ait package
    (site-packages, or src/ for an editable install: nothing else of the repo) and the
    operator's PYTHONPATH entries (installs too, e.g. wheels unpacked into a --target directory)."""
    from ait.sandbox.process import import_paths

    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.realpath(sys.executable), *import_paths()}
    paths.update(p for p in sys.path if p and os.path.isdir(p) and "site-packages" in p)
    return sorted(paths)


def plan_paths(policy: SandboxPolicy) -> PlanPaths:
    read = SYSTEM_READ + python_read_paths() + list(policy.read)
    write = list(policy.write) + ["/dev/null"]
    devices: list[str] = []
    if policy.gpu:
        read += GPU_READ
        devices = GPU_DEVICES + sorted(f"/dev/{d}" for d in os.listdir("/dev") if d.startswith("nvidia"))
        if policy.mps_pipe_dir:  # the MPS client talks to the daemon through its pipe directory (alone:
            write.append(policy.mps_pipe_dir)  # on an H200 MPS clients ran with a private, empty /dev/shm)
    return PlanPaths(read=read, write=write, devices=devices)


class ExposedSecret(ValueError):
    """An allow-list would let sandboxed code read AIT_HOME (the hidden secret, baselines)."""


def check_secret_hidden(paths: PlanPaths, home: Path) -> None:
    """Refuse when AIT_HOME lies inside (or is) any path the run may read or write: a PYTHONPATH
    entry or a read path that is an ancestor of AIT_HOME would hand the run the hidden secret."""
    home = Path(os.path.realpath(home))
    for path in [*paths.read, *paths.write]:
        if path.startswith(("/dev/", "/proc/")):
            continue
        allowed = Path(os.path.realpath(path))
        if home == allowed or allowed in home.parents:
            raise ExposedSecret(
                f"AIT_HOME ({home}) lies inside {path}, which sandboxed code may read: the hidden secret would be "
                f"readable. Move AIT_HOME elsewhere (export AIT_HOME=/var/lib/ait, say) or take {path} off "
                "PYTHONPATH / the job's paths")


def set_limits(plan: LaunchPlan) -> None:
    lim = plan.policy.limits
    pairs = [(resource.RLIMIT_CPU, lim.cpu_s), (resource.RLIMIT_FSIZE, lim.file_bytes),
             (resource.RLIMIT_NOFILE, lim.open_files), (resource.RLIMIT_CORE, 0)]
    if lim.address_space_bytes is not None and not plan.policy.gpu:
        pairs.append((resource.RLIMIT_AS, lim.address_space_bytes))
    if plan.nproc_limit is not None:
        pairs.append((resource.RLIMIT_NPROC, plan.nproc_limit))
    for kind, value in pairs:
        soft, hard = resource.getrlimit(kind)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(kind, (value, value))


def apply(plan: LaunchPlan) -> None:
    """Confine this process (irreversible). With the mounts layer the calling process stays outside
    as a waiter and only its PID-1 child returns from here."""
    from ait.sandbox import caps, landlock, seccomp

    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # die with the worker
    for group in plan.cgroups:
        Path(group, "cgroup.procs").write_text(str(os.getpid()))
    set_limits(plan)
    mps = bool(plan.policy.gpu and plan.policy.mps_pipe_dir)
    if "namespaces" in plan.layers or "mounts" in plan.layers:  # before capabilities are dropped
        from ait.sandbox import namespaces

        namespaces.enter_user_namespace()
        if "namespaces" in plan.layers:
            namespaces.enter(ipc=not mps)
        if "mounts" in plan.layers:
            from ait.sandbox import mounts

            waiter = None
            if plan.disk is not None:
                from ait.sandbox.diskfs_waiter import Waiter

                waiter = Waiter(plan.disk)
            mounts.unshare_and_fork(waiter)
            mounts.build_root(mounts.RootView(read=plan.paths.read, write=plan.paths.write,
                                              devices=plan.paths.devices, host_shm=False))
    if "capabilities" in plan.layers:
        caps.drop_all()
    if "landlock" in plan.layers:
        own_proc = f"/proc/{os.getpid()}"  # this process only (and its threads); other pids stay unreadable
        write = list(plan.paths.write)
        if plan.policy.gpu:
            write.append(own_proc)  # the CUDA driver writes to its own /proc entries; cuInit fails (304) otherwise
        landlock.restrict(plan.paths.read + [own_proc], write, plan.paths.devices)
    if "seccomp" in plan.layers:
        seccomp.install(allow_connect=mps)


def main(argv: list[str]) -> None:
    plan = LaunchPlan.model_validate_json(argv[0])
    apply(plan)
    os.execv(plan.args[0], plan.args)


if __name__ == "__main__":
    main(sys.argv[1:])
