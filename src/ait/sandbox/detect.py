"""Which isolation layers this host supports, detected by trying them (cached per kernel).

    python -m ait.sandbox.detect    # try every layer in a throwaway child, print JSON
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys

from ait.sandbox import cgroup
from ait.sandbox.types import Capabilities, Layer

DETECTOR_VERSION = 6  # bump when layers change, so cached detections are redone



def _try_in_child() -> dict[str, str]:
    """Run in a throwaway process: apply each layer and see it bite. Returns name -> detail ('' = works)."""
    from ait.sandbox import caps, landlock, mounts, namespaces, seccomp

    out: dict[str, str] = {}
    out["namespaces"] = namespaces.works()  # before seccomp, which refuses unshare
    out["mounts"] = mounts.works()
    if not out["mounts"]:  # a run's own file system is mounted in the private root's namespace
        from ait.sandbox import diskfs

        for kind in ("tmpfs", "image"):
            out[f"disk_{kind}"] = diskfs.works(kind)
    abi = landlock.abi_version()
    out["landlock"] = f"ABI {abi}" if abi else "kernel has no Landlock (needs Linux >= 5.13 with landlock in the LSM list)"
    try:
        seccomp.install()
        try:
            socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            out["seccomp"] = "installed but socket(AF_INET) still worked"
        except PermissionError:
            out["seccomp"] = "ok"
    except Exception as e:
        out["seccomp"] = f"unavailable: {e}"
    out["capabilities"] = "ok" if os.geteuid() != 0 or caps.drop_all() is None else "could not drop"
    return out


def detect() -> Capabilities:
    from ait.sandbox.process import python_argv

    proc = subprocess.run(python_argv(["-m", "ait.sandbox.detect", "--child"]), capture_output=True, text=True,
                          timeout=60, cwd="/")
    try:
        tried = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tried = {}
    abi_detail = tried.get("landlock", "detection failed")
    landlock_ok = abi_detail.startswith("ABI ")
    abi = int(abi_detail.split()[1]) if landlock_ok else 0
    root = os.geteuid() == 0
    groups = cgroup.available()
    ns_problem = tried.get("namespaces", "detection failed")
    mounts_problem = tried.get("mounts", "detection failed")
    disk_fs = [kind for kind in ("tmpfs", "image") if tried.get(f"disk_{kind}") == ""]
    layers = [
        Layer(name="session", active=True, isolating=False,
              detail="own session and process group, killed as a group on timeout; parent-death signal"),
        Layer(name="rlimits", active=True, isolating=False,
              detail="CPU, file size, open files, processes, address space (not with a GPU)"),
        Layer(name="env", active=True, isolating=False, detail="scrubbed environment, private HOME and TMPDIR"),
        Layer(name="landlock", active=landlock_ok, isolating=True,
              detail=(f"{abi_detail}: reads only from an allow-list, writes only in the job directory"
                      + ("; no TCP" if abi >= 4 else "; TCP not filtered (ABI < 4)")
                      + ("; no signals outside the sandbox" if abi >= 6 else "")) if landlock_ok else abi_detail),
        Layer(name="mounts", active=not mounts_problem, isolating=True,
              detail="private root in mount and PID namespaces: only the allowed paths exist (no host sockets, "
                     "/tmp or /dev/shm), a fresh /proc, PID 1 kills what the run leaves behind"
              if not mounts_problem else mounts_problem),
        Layer(name="disk", active=bool(disk_fs), isolating=False, detail=disk_detail(disk_fs, tried, mounts_problem)),
        Layer(name="seccomp", active=tried.get("seccomp") == "ok", isolating=True,
              detail="no network sockets, no connect(2), ptrace, mount, namespaces, bpf, keyctl, module loading"
              if tried.get("seccomp") == "ok" else tried.get("seccomp", "detection failed")),
        Layer(name="capabilities", active=root and tried.get("capabilities") == "ok", isolating=True,
              detail="running as root: every capability dropped before agent code runs" if root
              else "not root: nothing to drop"),
        Layer(name="cgroups", active=any(groups.values()), isolating=False,
              detail=("per-run " + ", ".join(n for n, ok in (("pids.max (v1)", groups["pids_v1"]),
                                                                 ("memory limit (v1)", groups["memory_v1"]),
                                                                 ("cgroup.kill (v2)", groups["v2_kill"])) if ok))
              if any(groups.values()) else "no writable cgroup hierarchy: RLIMIT_NPROC and group kill instead"),
        Layer(name="namespaces", active=not ns_problem, isolating=True,
              detail="private network (no interfaces), IPC and hostname via unshare(2)"
              + ("" if root else " in a user namespace") if not ns_problem else ns_problem),
    ]
    return Capabilities(kernel=platform.release(), detector=DETECTOR_VERSION, layers=layers, disk_fs=disk_fs)


WATCHDOG_BOUND = "the watchdog's walk every 2 s (a fast writer may pass the limit between walks)"


def disk_detail(disk_fs: list[str], tried: dict[str, str], mounts_problem: str) -> str:
    """Which bound holds a run's disk use here: the kernel's (a file system of the run's own, capped at
    its disk limit: writes past it fail with ENOSPC) or only the watchdog's."""
    if mounts_problem:
        return f"no private mount namespace: disk is bounded by {WATCHDOG_BOUND}"
    probe = ("the probe writes to a tmpfs of its disk limit" if "tmpfs" in disk_fs
             else f"the probe is bounded by {WATCHDOG_BOUND} (tmpfs: {tried.get('disk_tmpfs', 'not tried')})")
    train = ("training writes to an ext4 image of its disk limit on a loop device" if "image" in disk_fs
             else f"training is bounded by {WATCHDOG_BOUND} (ext4 image: {tried.get('disk_image', 'not tried')})")
    capped = "; writes past the limit fail with ENOSPC (unlinked, sparse, fallocated files too)" if disk_fs else ""
    return f"{probe}; {train}{capped}; only what is kept is copied out"


_memo: list[Capabilities] = []


def cached_capabilities(refresh: bool = False) -> Capabilities:
    """Detection is a few hundred ms; cache it per kernel release in AIT_HOME/sandbox.json (in memory
    only when AIT_HOME is not writable: `ait doctor` still answers)."""
    from ait.home import HomeError, ait_home

    try:
        path = ait_home() / "sandbox.json"
    except HomeError:
        if refresh or not _memo:
            _memo[:] = [detect()]
        return _memo[0]
    if not refresh and path.exists():
        try:
            caps = Capabilities.model_validate_json(path.read_text())
            if caps.kernel == platform.release() and caps.detector == DETECTOR_VERSION:
                return caps
        except (ValueError, OSError):
            pass
    caps = detect()
    try:
        path.write_text(caps.model_dump_json(indent=2))
    except OSError:
        pass  # detected again next time
    return caps


if __name__ == "__main__":
    if "--child" in sys.argv:
        print(json.dumps(_try_in_child()))
    else:
        print(detect().model_dump_json(indent=2))
