"""Per-run cgroups: a pids.max against fork bombs, and a way to kill everything a run made.

cgroup v1's pids controller caps the run's processes; a cgroup v2 directory (the unified
hierarchy) gives `cgroup.kill`, which kills every member atomically, even processes
forking while they die. Either is used where it is writable; the launcher joins them.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

PIDS_V1 = Path("/sys/fs/cgroup/pids")
MEMORY_V1 = Path("/sys/fs/cgroup/memory")
V2_ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


def v2_root() -> Path | None:
    for root in V2_ROOTS:
        if (root / "cgroup.procs").exists() and (root / "cgroup.subtree_control").exists() and os.access(root, os.W_OK):
            return root
    return None


def memory_v1_root() -> Path | None:
    """This process's own v1 memory cgroup (children nest under it, so the host's limits still apply)."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                root = MEMORY_V1 / path.lstrip("/")
                return root if (root / "memory.limit_in_bytes").exists() and os.access(root, os.W_OK) else None
    except OSError:
        pass
    return None


def available() -> dict[str, bool]:
    return {"pids_v1": (PIDS_V1 / "cgroup.procs").exists() and os.access(PIDS_V1, os.W_OK),
            "memory_v1": memory_v1_root() is not None,
            "v2_kill": v2_root() is not None}


def create(max_pids: int, max_memory_bytes: int | None) -> list[str]:
    """Make this run's cgroups; returns their directories (possibly none).
    The memory cap matters as much as pids.max: forked copies of a 300 MB interpreter
    unshare their pages as they exit, so a capped fork bomb can still exhaust the host."""
    name = f"run-{os.getpid()}-{time.monotonic_ns()}"
    made: list[str] = []
    have = available()
    roots = ([PIDS_V1 / "ait"] if have["pids_v1"] else []) + ([v2_root() / "ait"] if have["v2_kill"] else [])
    if have["memory_v1"] and max_memory_bytes:
        roots.append(memory_v1_root() / "ait")
    for root in roots:
        try:
            path = root / name
            path.mkdir(parents=True)
            if (path / "pids.max").exists():
                (path / "pids.max").write_text(str(max_pids))
            if max_memory_bytes and (path / "memory.limit_in_bytes").exists():
                (path / "memory.limit_in_bytes").write_text(str(max_memory_bytes))
            if max_memory_bytes and (path / "memory.max").exists():
                (path / "memory.max").write_text(str(max_memory_bytes))
            made.append(str(path))
        except OSError:
            continue
    return made


def oom_events(dirs: list[str]) -> dict[str, bool]:
    """What the kernel saw of the run's memory: {"oom_killed": the OOM killer killed one of its
    processes, "memory_observed": a memory cgroup watched it (so the answer is an observation)}.
    Read before `destroy`; v2 memory.events and v1 memory.oom_control both count `oom_kill`."""
    observed = killed = False
    for d in dirs:
        for name in ("memory.events", "memory.oom_control"):
            try:
                text = (Path(d) / name).read_text()
            except OSError:
                continue
            observed = True
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit() and int(value) > 0:
                    killed = True
    return {"oom_killed": killed, "memory_observed": observed}


def destroy(dirs: list[str], timeout_s: float = 15.0) -> None:
    """Kill every process in the run's cgroups, then remove them."""
    paths = [Path(d) for d in dirs]
    for path in paths:
        if (path / "cgroup.kill").exists():
            try:
                (path / "cgroup.kill").write_text("1")
            except OSError:
                pass
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = set()
        for path in paths:
            try:
                pids.update(int(p) for p in (path / "cgroup.procs").read_text().split())
            except OSError:
                pass
        if not pids:
            break
        for pid in pids:  # v1 fallback: pids.max bounds the refill, so repeated rounds converge
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    for path in paths:
        try:
            path.rmdir()
        except OSError:
            pass
