"""A watchdog on every sandboxed run: its task count, its disk use and, where no cgroup bounds it, its memory.

A fork bomb meets the pids cgroup (or RLIMIT_NPROC) and stops growing, but not churning: copies
that fail to fork die and are replaced, each a training process with torch loaded, until the
memory cgroup's OOM killer ends the run (measured here: 127 processes for 40 s on both cores, then
an OOM verdict). Without a memory cgroup nothing bounds the run's memory as a whole: RLIMIT_AS
bounds each process, not 128 copies.

The watchdog polls the run's session (every process ait starts for agent code leads a new one,
and the sandbox refuses setsid inside it) and kills the whole group when
- its tasks (processes and threads) sit within 10% of the policy's `processes` for
  `STUCK_AT_LIMIT_S`: a run at its task limit cannot start a thread, so a real job there is
  failing already, while a fork bomb stays there as long as its copies replace each other; or
- (no memory cgroup) its memory, counted as PSS (shared pages split between their users, so
  forked copies are not counted twice), passes the policy's `memory_bytes`; or
- its writable directories hold more than `disk_bytes` (allocated blocks, so a sparse file costs
  what it uses) or `disk_files` entries: RLIMIT_FSIZE bounds one file, and a job that writes
  4 GiB files in a loop would otherwise fill the worker's disk for every job after it. Where the
  run writes to a file system of its own (ait.sandbox.diskfs) the kernel bounds it first (ENOSPC)
  and this walk finds its host directory near empty; elsewhere the walk is the bound, and a fast
  writer passes it by what it writes in 2 s.
The verdict is the watchdog's own observation, as a memory cgroup's OOM event would be.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

from ait.sandbox.process import kill_group_pid
from ait.sandbox.types import SandboxPolicy

POLL_S = 0.5
DISK_EVERY = 4  # polls between disk walks (2 s): a walk costs more than a /proc scan
STUCK_AT_LIMIT_S = 2.0
PAGE = os.sysconf("SC_PAGE_SIZE")


def size(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def proc_stats() -> list[tuple[int, int, int]]:
    """(pid, session, threads) of every process, from /proc/PID/stat."""
    stats = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2:].split()  # after "(comm)", which may hold spaces
        # fields[0] is the state (stat's field 3): session is field 6, num_threads field 20.
        if len(fields) > 17:
            stats.append((int(entry), int(fields[3]), int(fields[17])))
    return stats


def session_members(sid: int) -> list[tuple[int, int]]:
    """(pid, threads) of every process in session `sid`."""
    return [(pid, threads) for pid, session, threads in proc_stats() if session == sid]


def _private_bytes(pid: int) -> int:
    """Resident minus file-backed/shared pages: cheap, and an overestimate for forked copies."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            _, resident, shared, *_ = f.read().split()
        return (int(resident) - int(shared)) * PAGE
    except (OSError, ValueError):
        return 0


def _pss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def memory_bytes(pids: list[int], limit: int) -> int:
    """The run's memory; the exact PSS sum (costlier: the kernel walks page tables) only once the
    cheap overestimate passes `limit`."""
    rough = sum(_private_bytes(p) for p in pids)
    return rough if rough <= limit else sum(_pss_bytes(p) for p in pids)


def disk_usage(paths: list[str], byte_limit: int | None, entry_limit: int | None) -> tuple[int, int]:
    """(allocated bytes, entries) under `paths`, links not followed; stops counting once either
    passes its limit, so a directory of millions of files costs one limit's worth of walking."""
    used = entries = 0
    stack = list(paths)
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    entries += 1
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    used += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    if (byte_limit and used > byte_limit) or (entry_limit and entries > entry_limit):
                        return used, entries
        except OSError:
            continue
    return used, entries


def held_deleted_bytes(pids: list[int], seen: set[tuple[int, int]] | None = None) -> int:
    """Allocated bytes of files the processes hold open after unlinking them: no directory walk
    finds them, yet they fill the disk until the last descriptor closes (2 GiB held against a
    1 GiB limit was seen). Each inode is counted once (`seen`: inodes counted already)."""
    seen = set() if seen is None else seen
    used = 0
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            path = f"/proc/{pid}/fd/{fd}"
            try:
                if not os.readlink(path).endswith(" (deleted)"):
                    continue
                st = os.stat(path)  # the open file itself, through the descriptor's link
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                used += st.st_blocks * 512
    return used


def start_watchdog(sid: int, policy: SandboxPolicy, cgroups: list[str]) -> Watchdog:
    """The run's watchdog: the task and disk rules always (a pids cgroup, like RLIMIT_NPROC, refuses
    new tasks but lets a fork bomb churn until its memory runs out: 40 s of every core, measured;
    no cgroup bounds disk), the memory rule only where no memory cgroup bounds the run."""
    limits = policy.limits
    has_memory = any((Path(g) / name).exists() for g in cgroups for name in ("memory.max", "memory.limit_in_bytes"))
    return Watchdog(sid, memory_limit=None if has_memory else limits.memory_bytes, task_limit=limits.processes,
                    write_paths=list(policy.write), disk_limit=limits.disk_bytes, file_limit=limits.disk_files)


class Watchdog:
    """Watches session `sid` from a daemon thread until `stop()`; `verdict` says why it killed it."""

    def __init__(self, sid: int, *, memory_limit: int | None, task_limit: int | None,
                 write_paths: list[str] | None = None, disk_limit: int | None = None, file_limit: int | None = None):
        if sid == os.getsid(0):
            raise ValueError("a watchdog on its own session would kill the process that runs it")
        self.sid, self.memory_limit, self.task_limit = sid, memory_limit, task_limit
        self.write_paths, self.disk_limit, self.file_limit = write_paths or [], disk_limit, file_limit
        self.verdict: str | None = None
        self.rule: str | None = None  # "tasks", "memory" or "disk": which limit the verdict is about
        self.peak_memory = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ait-watch-{sid}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        at_limit_since, polls = None, 0
        while not self._stop.wait(POLL_S):
            members = session_members(self.sid)
            if not members:
                continue
            polls += 1
            if self.write_paths and (self.disk_limit or self.file_limit) and polls % DISK_EVERY == 0:
                used, entries = disk_usage(self.write_paths, self.disk_limit, self.file_limit)
                used += held_deleted_bytes([pid for pid, _ in members])
                if self.disk_limit and used > self.disk_limit:
                    self._kill("disk", f"the run wrote more than {size(self.disk_limit)} to disk "
                               f"({size(used)} counted), over its disk limit")
                    return
                if self.file_limit and entries > self.file_limit:
                    self._kill("disk", f"the run created more than {self.file_limit:,} files, over its limit")
                    return
            if self.memory_limit:
                used = memory_bytes([pid for pid, _ in members], self.memory_limit)
                self.peak_memory = max(self.peak_memory, used)
                if used > self.memory_limit:
                    self._kill("memory", f"the run used {size(used)} of memory across {len(members)} processes, "
                               f"over its limit of {size(self.memory_limit)}")
                    return
            tasks = sum(threads for _, threads in members)
            if self.task_limit and tasks >= 0.9 * self.task_limit:
                at_limit_since = at_limit_since or time.monotonic()
                if time.monotonic() - at_limit_since >= STUCK_AT_LIMIT_S:
                    self._kill("tasks", f"the run held {len(members)} processes ({tasks} tasks) at its limit of "
                               f"{self.task_limit} for {STUCK_AT_LIMIT_S:.0f} s: a fork bomb, or a job that starts too many threads")
                    return
            else:
                at_limit_since = None

    def _kill(self, rule: str, verdict: str) -> None:
        self.rule, self.verdict = rule, verdict
        kill_group_pid(self.sid)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def finish_watch(watchdog: Watchdog | None) -> dict:
    """Stop `watchdog`; what it saw, as RunOutcome fields: a memory kill is an observed OOM."""
    if watchdog is None:
        return {}
    watchdog.stop()
    if watchdog.verdict is None:
        return {}
    memory = {"oom_killed": True, "memory_observed": True} if watchdog.rule == "memory" else {}
    return {"watchdog": watchdog.verdict, "watchdog_rule": watchdog.rule, **memory}
