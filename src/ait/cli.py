"""The `ait` command."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="ait — AI Trains AI: an agent writes an RL job; it is scored by the trained model's uplift.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
tasks_app = typer.Typer(help="List and inspect task specs.", no_args_is_help=True)
job_app = typer.Typer(help="Work with job workspaces (job.toml + env.py).", no_args_is_help=True)
baselines_app = typer.Typer(help="Frozen untrained scores (best_pre) per family and base model.", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")
app.add_typer(job_app, name="job")
app.add_typer(baselines_app, name="baselines")
console = Console()
err = Console(stderr=True)


def fail(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def tasks_dirs() -> list[Path]:
    dirs = [Path(os.environ["AIT_TASKS_DIR"])] if os.environ.get("AIT_TASKS_DIR") else []
    dirs.append(Path("examples/tasks"))
    dirs.append(Path(__file__).resolve().parents[2] / "examples" / "tasks")  # a source checkout
    return [d for d in dirs if d.is_dir()]


def find_task(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    for d in tasks_dirs():
        if (d / f"{name_or_path}.json").is_file():
            return d / f"{name_or_path}.json"
    fail(f"task {name_or_path!r} not found: pass a TaskSpec JSON path or a name from `ait tasks list`")


def load_task(name_or_path: str):
    from ait.spec import SpecError, load_spec

    path = find_task(name_or_path)
    try:
        return load_spec(path), path
    except SpecError as e:
        fail(str(e))


@tasks_app.command("list")
def tasks_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the shipped task specs."""
    from ait.families import FAMILIES
    from ait.spec import load_spec

    seen, rows = set(), []
    for d in tasks_dirs():
        for p in sorted(d.glob("*.json")):
            if p.stem in seen:
                continue
            seen.add(p.stem)
            s = load_spec(p)
            rows.append({"name": p.stem, "family": s.family, "held_out": FAMILIES[s.family].held_out,
                         "path": str(p), "models": s.constraints.allowed_base_models})
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table("name", "family", "held out", "base models", "path")
    for r in rows:
        table.add_row(r["name"], r["family"], "yes" if r["held_out"] else "", ", ".join(r["models"]), r["path"])
    console.print(table)


@tasks_app.command("show")
def tasks_show(name: str, as_json: bool = typer.Option(False, "--json", help="Print the TaskSpec JSON.")) -> None:
    """Show one task spec: description, eval format, constraints, dev examples."""
    spec, path = load_task(name)
    if as_json:
        print(spec.model_dump_json(indent=2))
        return
    console.print(f"[bold]{spec.id}[/] ({spec.family}) — {path}\n{spec.description}\n")
    console.print(f"[bold]difficulty[/] {spec.difficulty}")
    console.print(f"[bold]system prompt[/] {spec.eval_format.system_prompt}")
    for t in spec.eval_format.tools:
        params = ", ".join(f"{p.name}: {p.type}" for p in t.parameters)
        console.print(f"[bold]tool[/] {t.name}({params}) — {t.description}")
    console.print(f"[bold]answer format[/] {spec.eval_format.answer_format}")
    console.print(f"[bold]constraints[/] {spec.constraints.model_dump()}")
    for ex in spec.dev_examples:
        console.print(f"[dim]dev[/] {ex.prompt} → {ex.answer}")


@tasks_app.command("sample")
def tasks_sample(family: str = typer.Argument(..., help="Family name (see `ait tasks list`)."),
                 n: int = typer.Option(3, "--n", min=1, max=100, help="How many examples."),
                 seed: int = typer.Option(0, help="Generator seed (public; never the hidden one)."),
                 as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Print generated examples with their gold tool trace (each call and what the tool returned)."""
    import random

    from ait.families import get_family

    try:
        fam = get_family(family)
    except KeyError as e:
        fail(str(e.args[0]))
    rng, d = random.Random(seed), fam.difficulty()
    samples = []
    for _ in range(n):
        ex = fam.example(rng, d)
        trace = [{"tool": c.name, "arguments": c.arguments, "result": fam.call_tool(ex.world, c)}
                 for c in fam.gold_trace(ex)]
        samples.append({"prompt": ex.prompt, "answer": ex.answer, "trace": trace})
    if as_json:
        print(json.dumps(samples, indent=2))
        return
    for i, s in enumerate(samples, 1):
        console.print(f"[bold]#{i}[/] {s['prompt']}", highlight=False)
        for step in s["trace"]:
            args = ", ".join(f"{k}={v!r}" for k, v in step["arguments"].items())
            console.print(f"   {step['tool']}({args}) → {step['result']}", highlight=False)
        console.print(f"   [green]Answer: {s['answer']}[/]\n", highlight=False)


@job_app.command("validate")
def job_validate(workspace: Path = typer.Argument(..., help="Workspace with job.toml and env.py."),
                 task: str = typer.Option(..., "--task", help="TaskSpec path or name."),
                 timeout: float = typer.Option(60.0, help="Probe time limit in seconds."),
                 as_json: bool = typer.Option(False, "--json", help="Print the ProbeReport as JSON.")) -> None:
    """Run the validation probe on a workspace; exit status 1 when the job is invalid."""
    from ait.probe.runner import probe_workspace

    spec, _ = load_task(task)
    if not workspace.is_dir():
        fail(f"workspace {workspace} is not a directory")
    report = probe_workspace(workspace, spec, timeout_s=timeout)
    if as_json:
        print(report.model_dump_json(indent=2))
    elif report.valid:
        console.print(f"[green]valid[/] ({report.seconds:.2f}s)")
    else:
        console.print(f"[red]invalid[/] ({report.seconds:.2f}s)\n{report.summary()}", highlight=False)
    raise typer.Exit(0 if report.valid else 1)


@app.command()
def episode(task: str = typer.Option("calc_chain", "--task", help="TaskSpec path or name."),
            policy: str = typer.Option("reference", help="Agent policy: reference."),
            executor: Optional[str] = typer.Option(None, help="inline (default) or queue (needs `ait worker`)."),
            config: Optional[Path] = typer.Option(None, help="EpisodeConfig TOML."),
            eval_size: Optional[int] = typer.Option(None, help="Hidden examples to score (default: the spec's)."),
            runs_dir: Optional[Path] = typer.Option(None, help="Where runs/<id>/ goes (default ./runs or AIT_RUNS)."),
            as_json: bool = typer.Option(False, "--json", help="Print the EpisodeResult as JSON.")) -> None:
    """Run one episode end to end: the agent writes a job, it is probed, trained, evaluated, rewarded."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ait.configs import ConfigError, load_config
    from ait.harness.episode import run_episode
    from ait.harness.types import EpisodeConfig
    from ait.policy.base import make_policy

    spec, path = load_task(task)
    try:
        cfg = load_config(config, EpisodeConfig) if config else EpisodeConfig()
        overrides = {k: v for k, v in {"executor": executor, "eval_size": eval_size}.items() if v is not None}
        cfg = EpisodeConfig.model_validate({**cfg.model_dump(), **overrides})
        agent = make_policy(policy)
    except (ConfigError, ValueError) as e:
        fail(str(e))
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                  transient=True, disable=as_json) as progress:
        bar = progress.add_task(f"episode on {spec.id}", total=None)
        result = run_episode(spec, path, agent, cfg, runs_dir=runs_dir,
                             on_event=lambda msg: progress.update(bar, description=msg))
    if as_json:
        print(result.model_dump_json(indent=2))
        return
    print_episode(result)


def print_episode(result) -> None:
    r, job = result.reward, result.job
    table = Table("component", "value", title=f"episode {result.run_id}", title_justify="left")
    table.add_row("[bold]reward[/]", f"[bold]{r.total:+.4f}[/]")
    table.add_row("validation", f"{r.validation:.4f}  (valid at attempt {r.valid_attempt or '-'} of {r.max_attempts})")
    table.add_row("job_quality", f"{r.job_quality:.4f}")
    table.add_row("  uplift_term", f"{r.uplift_term:+.4f}")
    table.add_row("train_speed", f"{r.train_speed:.4f}")
    if job is not None:
        pre = "-" if job.pre is None else f"{job.pre:.4f}"
        post = "-" if job.post is None else f"{job.post:.4f}"
        best = "-" if r.best_pre is None else f"{r.best_pre:.4f}"
        table.add_row("hidden eval", f"pre {pre}  post {post}  best_pre {best}  (n={job.eval_n or '-'})")
        status = "ok" if job.ok else f"failed: {job.fail_reason.value}"
        table.add_row("job", f"{status}, base model {job.base_model}, train {job.train_seconds or 0:.1f}s, "
                      f"total {job.total_seconds or 0:.1f}s")
    table.add_row("stop reason", f"{result.stop_reason.value} after {result.turns} turns")
    table.add_row("wall time", f"{result.wall_seconds:.1f}s")
    table.add_row("run dir", result.run_dir)
    console.print(table)


@app.command()
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


@baselines_app.command("seed")
def baselines_seed(task: list[str] = typer.Option(..., "--task", help="TaskSpec path or name (repeatable)."),
                   model: list[str] = typer.Option(None, "--model", help="Base model (repeatable; default: all allowed)."),
                   eval_size: Optional[int] = typer.Option(None, help="Hidden examples (default: the spec's)."),
                   force: bool = typer.Option(False, "--force", help="Re-measure and replace frozen entries.")) -> None:
    """Measure and freeze best_pre for every task × base model given."""
    from rich.progress import Progress

    from ait.evals.baselines import Baseline, BaselineStore, measure_pre
    from ait.evals.hidden import eval_fingerprint

    store = BaselineStore()
    pairs = []
    for t in task:
        spec, path = load_task(t)
        for m in model or spec.constraints.allowed_base_models:
            pairs.append((spec, path, m))
    with Progress(console=err) as progress:
        bar = progress.add_task("seeding baselines", total=len(pairs))
        for spec, path, m in pairs:
            n = eval_size or spec.hidden_eval_size
            fingerprint = eval_fingerprint(spec, n)
            frozen = store.get(spec.family, m, fingerprint)
            if frozen and not force:
                console.print(f"{spec.family} × {m}: frozen at {frozen.best_pre:.4f} (n={frozen.n}); --force re-measures")
            else:
                try:
                    report = measure_pre(path, m, n)
                except Exception as e:
                    err.print(f"[red]{spec.family} × {m}: {str(e).strip().splitlines()[-1]}[/]", highlight=False)
                    progress.advance(bar)
                    continue
                b = store.freeze(Baseline(family=spec.family, base_model=m, fingerprint=fingerprint,
                                          best_pre=report.pre, n=n), force=force)
                console.print(f"{spec.family} × {m}: best_pre {b.best_pre:.4f} (n={n}) frozen")
            progress.advance(bar)


@baselines_app.command("show")
def baselines_show(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show the frozen baselines table."""
    from ait.evals.baselines import BaselineStore

    store = BaselineStore()
    try:
        entries = store.all()
    except ValueError as e:
        fail(str(e))
    if as_json:
        print(json.dumps([b.model_dump() for b in entries], indent=2))
        return
    table = Table("family", "base model", "best_pre", "n", "hidden set", title=str(store.path))
    for b in entries:
        table.add_row(b.family, b.base_model, f"{b.best_pre:.4f}", str(b.n), b.fingerprint)
    console.print(table)


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
