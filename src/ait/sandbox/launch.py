"""The sandbox launcher: runs first in the child, applies every layer, then execs the target.

    python -m ait.sandbox.launch PLAN_JSON -- -m ait.train.main req.json

Order matters: join the pids cgroup and set rlimits while still privileged, drop
capabilities, then Landlock and seccomp (both need no_new_privs, both survive exec).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
from pathlib import Path

from pydantic import BaseModel, Field

from ait.sandbox.types import SandboxPolicy

PR_SET_PDEATHSIG = 1
SYSTEM_READ = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/ld.so.conf",
               "/etc/ld.so.conf.d", "/etc/localtime", "/etc/ssl", "/etc/ca-certificates", "/etc/pki", "/etc/passwd",
               "/etc/group", "/etc/nsswitch.conf", "/etc/os-release", "/etc/hosts", "/etc/mime.types",
               "/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/sys/vm/overcommit_memory",
               "/sys/devices/system/cpu", "/sys/fs/cgroup", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/full"]
GPU_READ = ["/proc/driver/nvidia", "/sys/bus/pci", "/sys/devices", "/sys/module/nvidia", "/run/nvidia-persistenced"]
GPU_DEVICES = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]


class LaunchPlan(BaseModel):
    policy: SandboxPolicy
    """What the run may touch."""
    layers: list[str]
    """Layers to apply (those detected active)."""
    cgroups: list[str] = Field(default_factory=list)
    """cgroup directories to join, created by the parent."""
    nproc_limit: int | None = None
    """RLIMIT_NPROC to set when no pids cgroup is used."""
    args: list[str] = Field(default_factory=list)
    """Python arguments to exec after the layers are applied."""


def python_read_paths() -> list[str]:
    """The interpreter, its stdlib and site-packages, and the directory holding the ait package
    (site-packages, or src/ for an editable install: nothing else of the repo)."""
    import ait

    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.realpath(sys.executable),
             str(Path(ait.__file__).resolve().parents[1])}
    paths.update(p for p in sys.path if p and os.path.isdir(p) and "site-packages" in p)
    # PYTHONPATH entries are installs too (e.g. wheels unpacked into a --target directory).
    paths.update(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.isdir(p))
    return sorted(paths)


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
    from ait.sandbox import caps, landlock, seccomp

    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # die with the worker
    for group in plan.cgroups:
        Path(group, "cgroup.procs").write_text(str(os.getpid()))
    set_limits(plan)
    if "namespaces" in plan.layers:  # before capabilities are dropped: as root, unshare needs them
        from ait.sandbox import namespaces

        namespaces.enter(ipc=not (plan.policy.gpu and plan.policy.mps_pipe_dir))
    if "capabilities" in plan.layers:
        caps.drop_all()
    if "landlock" in plan.layers:
        own_proc = f"/proc/{os.getpid()}"  # this process only (and its threads); other pids stay unreadable
        read = SYSTEM_READ + python_read_paths() + plan.policy.read + [own_proc]
        write = plan.policy.write + ["/dev/null"]
        devices: list[str] = []
        if plan.policy.gpu:
            read += GPU_READ
            write.append(own_proc)  # the CUDA driver writes to its own /proc entries; cuInit fails (304) otherwise
            devices = GPU_DEVICES + [f"/dev/{d}" for d in os.listdir("/dev") if d.startswith("nvidia")]
            if plan.policy.mps_pipe_dir:  # the MPS client talks to the daemon through these
                read += [plan.policy.mps_pipe_dir, "/dev/shm"]
                write += [plan.policy.mps_pipe_dir, "/dev/shm"]
        landlock.restrict(read, write, devices)
    if "seccomp" in plan.layers:
        seccomp.install()


def main(argv: list[str]) -> None:
    plan = LaunchPlan.model_validate_json(argv[0])
    apply(plan)
    os.execv(sys.executable, [sys.executable, *plan.args])


if __name__ == "__main__":
    main(sys.argv[1:])
