"""`ait worker`: serve jobs from the queue."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ait.cli.common import console, err, fail


def worker(queue: Path = typer.Option(Path("runs/queue.sqlite"), help="SQLite queue file."),
           once: bool = typer.Option(False, "--once", help="Drain the queued jobs, then exit."),
           idle_exit: Optional[float] = typer.Option(None, help="Exit after this many idle seconds."),
           lease: float = typer.Option(60.0, help="Lease length in seconds (heartbeats renew it).")) -> None:
    """Serve jobs from the queue: train, evaluate, report results."""
    from ait.compute.worker import run_worker
    from ait.queue import JobQueue, QueueError

    try:
        q = JobQueue(queue, lease_s=lease)
    except QueueError as e:
        fail(str(e))
    with err.status("waiting for jobs") as status:
        n = run_worker(q, once=once, idle_exit_s=idle_exit,
                       on_job=lambda jid: status.update(f"finished {jid}; waiting for jobs"))
    console.print(f"worker ran {n} job(s); queue: {q.counts()}")
