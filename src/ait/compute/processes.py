"""The process groups each running job has started in this process (its training and its eval),
so a job can be killed whole from another thread: the episode's deadline, a worker's drain.

A job that is killed stays marked: a process it starts afterwards (the eval, after training was
killed while still starting) is killed as soon as it is tracked.
"""

from __future__ import annotations

import threading

from ait.sandbox import kill_group_pid

_lock = threading.Lock()
_groups: dict[str, set[int]] = {}
_killed: set[str] = set()


def track(job_id: str, pgid: int) -> None:
    """Record a process group started for `job_id` (killed at once if the job was killed)."""
    with _lock:
        _groups.setdefault(job_id, set()).add(pgid)
        dead = job_id in _killed
    if dead:
        kill_group_pid(pgid)


def kill(job_id: str) -> int:
    """SIGKILL every process group of `job_id`; later ones die as they are tracked. Returns how many."""
    with _lock:
        _killed.add(job_id)
        groups = list(_groups.get(job_id, ()))
    for pgid in groups:
        kill_group_pid(pgid)
    return len(groups)


def forget(job_id: str) -> None:
    """The job's function returned: nothing of it runs any more."""
    with _lock:
        _groups.pop(job_id, None)
        _killed.discard(job_id)


def running(job_id: str) -> set[int]:
    with _lock:
        return set(_groups.get(job_id, ()))


def kill_all() -> int:
    """Kill every tracked job (an eval interrupted with episodes in flight)."""
    with _lock:
        jobs = list(_groups)
    return sum(kill(job_id) for job_id in jobs)
