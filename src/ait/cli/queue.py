"""`ait queue`: look at the job queue and fix it up (ls, show, retry, purge)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from ait.cli.common import console, fail

app = typer.Typer(help="Inspect and manage the SQLite job queue.", no_args_is_help=True)

QUEUE_OPTION = typer.Option(Path("runs/queue.sqlite"), "--queue", help="SQLite queue file.")
FINAL = ["done", "failed", "dead"]


def open_queue(path: Path):
    """The queue at `path`; a clear one-line error when it is missing or not a queue
    (never a new empty queue created by a typo)."""
    from ait.queue import JobQueue, QueueError

    if not path.is_file():
        fail(f"no queue at {path}: pass --queue PATH "
                    "(the file `ait worker` and `ait episode --executor queue` use)")
    try:
        return JobQueue(path)
    except QueueError as e:
        fail(str(e))


def _entry_or_fail(q, job_id: str):
    entry = q.get(job_id)
    if entry is None:
        fail(f"no job {job_id!r} in {q.path} (see `ait queue ls`)")
    return entry


def _age(ts: float) -> str:
    s = max(time.time() - ts, 0)
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h"


def _states(values: list[str] | None) -> list[str]:
    from ait.queue import JobState

    try:
        return [JobState(v).value for v in values or []]
    except ValueError:
        fail(f"unknown state in {values}; states are {[s.value for s in JobState]}")


@app.command("ls")
def ls(state: str | None = typer.Option(None, help="Only jobs in this state (queued, running, done, failed, dead)."),
       limit: int | None = typer.Option(None, help="Only the last N jobs."),
       as_json: bool = typer.Option(False, "--json", help="Print the entries as JSON."),
       queue: Path = QUEUE_OPTION) -> None:
    """List jobs in enqueue order, with their state, attempts and worker."""
    q = open_queue(queue)
    wanted = _states([state])[0] if state else None
    entries = q.list(wanted)
    if limit is not None:
        entries = entries[-limit:] if limit > 0 else []
    if as_json:
        print(json.dumps([e.model_dump(mode="json") for e in entries], indent=2))
        return
    counts = "  ".join(f"{k} {v}" for k, v in q.counts().items())
    table = Table("job", "state", "attempts", "worker", "updated", "error", title=f"{q.path}: {counts}",
                  title_justify="left")
    colors = {"done": "green", "failed": "red", "dead": "red", "running": "cyan", "queued": "white"}
    for e in entries:
        error = (e.error or "").strip().splitlines()
        table.add_row(escape(e.job_id), f"[{colors[e.state.value]}]{e.state.value}[/]", str(e.attempts),
                      escape(e.worker_id or "-"), _age(e.updated_at), escape(error[0][:80]) if error else "")
    console.print(table)


@app.command()
def show(job_id: str = typer.Argument(..., help="The job's id."),
         as_json: bool = typer.Option(False, "--json", help="Print the entry as JSON."),
         queue: Path = QUEUE_OPTION) -> None:
    """Show one job: its state, attempts, lease, result or error, and its worker log."""
    q = open_queue(queue)
    entry = _entry_or_fail(q, job_id)
    if as_json:
        print(entry.model_dump_json(indent=2))
        return
    table = Table("field", "value", title=f"job {escape(entry.job_id)}", title_justify="left", show_header=False)
    table.add_row("state", entry.state.value)
    table.add_row("attempts", f"{entry.attempts} (worker {escape(entry.worker_id or '-')})")
    table.add_row("enqueued", f"{_age(entry.created_at)} ago; updated {_age(entry.updated_at)} ago")
    if entry.lease_expires_at is not None:
        table.add_row("lease", f"expires in {entry.lease_expires_at - time.time():.0f}s")
    table.add_row("run dir", escape(entry.job.run_dir))
    r = entry.result
    if r is not None:
        outcome = "ok" if r.ok else f"failed: {r.fail_reason.value if r.fail_reason else '-'}"
        table.add_row("result", f"{outcome}; pre {r.pre} post {r.post} (n={r.eval_n}); "
                                f"train {r.train_seconds or 0:.1f}s total {r.total_seconds or 0:.1f}s")
    if entry.error:
        table.add_row("error", escape(entry.error.strip()[-1500:]))
    log_file = q.log_path(entry.job_id)
    if log_file.is_file():
        table.add_row("worker log", f"{log_file}\n" + escape("".join(log_file.read_text().splitlines(True)[-8:])))
    console.print(table)


@app.command()
def retry(job_id: str = typer.Argument(..., help="A failed or dead job's id."), queue: Path = QUEUE_OPTION) -> None:
    """Put a failed or dead job back in the queue with its attempts reset."""
    q = open_queue(queue)
    entry = _entry_or_fail(q, job_id)
    if not q.retry(job_id):
        fail(f"job {job_id!r} is {entry.state.value}; only failed or dead jobs can be retried")
    console.print(f"job {escape(job_id)} queued again (attempts reset)")


@app.command()
def purge(state: list[str] | None = typer.Option(None, help=f"States to delete (repeatable; default: {', '.join(FINAL)})."),
          queue: Path = QUEUE_OPTION) -> None:
    """Delete jobs in the given states (by default every finished job)."""
    q = open_queue(queue)
    states = _states(state) if state else FINAL
    n = q.purge(states)
    console.print(f"purged {n} job(s) in state(s) {', '.join(states)}; left: "
                  + " ".join(f"{k}={v}" for k, v in q.counts().items()), highlight=False)
