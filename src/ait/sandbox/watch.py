"""A watchdog on every sandboxed run: its task count and, where no cgroup bounds it, its memory.

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
  forked copies are not counted twice), passes the policy's `memory_bytes`.
The verdict is the watchdog's own observation, as a memory cgroup's OOM event would be.
"""

from __future__ import annotations

import os
import threading
import time

from ait.sandbox.process import kill_group_pid

POLL_S = 0.5
STUCK_AT_LIMIT_S = 2.0
PAGE = os.sysconf("SC_PAGE_SIZE")


def session_members(sid: int) -> list[tuple[int, int]]:
    """(pid, threads) of every process in session `sid`, from /proc/PID/stat."""
    members = []
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
        if len(fields) > 17 and int(fields[3]) == sid:
            members.append((int(entry), int(fields[17])))
    return members


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


def start_watchdog(sid: int, limits, cgroups: list[str]) -> Watchdog:
    """The run's watchdog: the task rule always (a pids cgroup, like RLIMIT_NPROC, refuses new
    tasks but lets a fork bomb churn until its memory runs out: 40 s of every core, measured), the
    memory rule only where no memory cgroup bounds the run."""
    from pathlib import Path

    has_memory = any((Path(g) / name).exists() for g in cgroups for name in ("memory.max", "memory.limit_in_bytes"))
    return Watchdog(sid, memory_limit=None if has_memory else limits.memory_bytes, task_limit=limits.processes)


class Watchdog:
    """Watches session `sid` from a daemon thread until `stop()`; `verdict` says why it killed it."""

    def __init__(self, sid: int, *, memory_limit: int | None, task_limit: int | None):
        if sid == os.getsid(0):
            raise ValueError("a watchdog on its own session would kill the process that runs it")
        self.sid, self.memory_limit, self.task_limit = sid, memory_limit, task_limit
        self.verdict: str | None = None
        self.peak_memory = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ait-watch-{sid}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        at_limit_since = None
        while not self._stop.wait(POLL_S):
            members = session_members(self.sid)
            if not members:
                continue
            if self.memory_limit:
                used = memory_bytes([pid for pid, _ in members], self.memory_limit)
                self.peak_memory = max(self.peak_memory, used)
                if used > self.memory_limit:
                    self._kill(f"the run used {used / 2**30:.1f} GiB of memory across {len(members)} processes, "
                               f"over its limit of {self.memory_limit / 2**30:.1f} GiB")
                    return
            tasks = sum(threads for _, threads in members)
            if self.task_limit and tasks >= 0.9 * self.task_limit:
                at_limit_since = at_limit_since or time.monotonic()
                if time.monotonic() - at_limit_since >= STUCK_AT_LIMIT_S:
                    self._kill(f"the run held {len(members)} processes ({tasks} tasks) at its limit of "
                               f"{self.task_limit} for {STUCK_AT_LIMIT_S:.0f} s: a fork bomb, or a job that starts too many threads")
                    return
            else:
                at_limit_since = None

    def _kill(self, verdict: str) -> None:
        self.verdict = verdict
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
    memory = watchdog.verdict.startswith("the run used")
    return {"watchdog": watchdog.verdict, **({"oom_killed": True, "memory_observed": True} if memory else {})}
