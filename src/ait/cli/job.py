"""`ait job`: start a workspace, validate it with the probe, export it to verifiers or prime-rl."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from ait.cli.common import console, fail, load_task
from ait.cli.export import job_export

app = typer.Typer(help="Work with job workspaces (job.toml + env.py).", no_args_is_help=True)
app.command("export")(job_export)


@app.command("init")
def job_init(workspace: Path = typer.Argument(..., help="Directory to create (must not exist, or be empty)."),
             task: str = typer.Option(..., "--task", help="TaskSpec path or name (`ait tasks list`).")) -> None:
    """Start a workspace as an episode's agent gets it: INSTRUCTIONS.md, task.json (read-only), and the
    job.toml and env.py templates to fill in."""
    from ait.harness.episode import seed_workspace

    spec, _ = load_task(task)
    if workspace.exists() and (not workspace.is_dir() or any(workspace.iterdir())):
        fail(f"{workspace} exists and is not an empty directory: pick a new one")
    try:
        seed_workspace(workspace, spec)
    except OSError as e:
        fail(f"cannot write {workspace}: {e.strerror}")
    console.print(f"workspace for {escape(spec.id)} in {escape(str(workspace))}: edit job.toml and env.py "
                  f"(INSTRUCTIONS.md says how), then `ait job validate {escape(str(workspace))} --task {escape(task)}`",
                  highlight=False)


@app.command("validate")
def job_validate(workspace: Path = typer.Argument(..., help="Workspace with job.toml and env.py."),
                 task: Optional[str] = typer.Option(None, "--task", help="TaskSpec path or name "
                                                    "(default: the workspace's task.json, as `ait job init` writes it)."),
                 timeout: float = typer.Option(60.0, min=1.0, max=3600.0, help="Probe time limit in seconds."),
                 as_json: bool = typer.Option(False, "--json", help="Print the ProbeReport as JSON.")) -> None:
    """Validate a workspace; exit status 1 when the job is invalid. Static checks (job.toml, env.py's
    syntax) answer at once; only when they pass does the sandboxed probe run env.py."""
    from ait.probe.runner import probe_workspace, static_errors
    from ait.probe.types import ProbeReport

    if not workspace.is_dir():
        fail(f"workspace {workspace} is not a directory (start one with `ait job init DIR --task T`)")
    if task is None:
        if not (workspace / "task.json").is_file():
            fail(f"workspace {workspace} has no task.json: pass --task (a TaskSpec path or a name from `ait tasks list`)")
        task = str(workspace / "task.json")
    spec, _ = load_task(task)
    with tempfile.TemporaryDirectory(prefix="ait-validate-") as tmp:
        if not (workspace / "task.json").is_file():
            # task_tools.py reads its knobs (e.g. calc_chain's calculator: false) from task.json beside it, as
            # in an episode: probe a copy that has the task's, leaving the user's workspace untouched
            copy = Path(tmp) / "workspace"
            try:
                shutil.copytree(workspace, copy, symlinks=False)
            except (OSError, shutil.Error) as e:
                fail(f"cannot copy {workspace} to probe it with {spec.id}'s task.json ({e}); "
                     f"or write the task into the workspace: `ait job init` does")
            (copy / "task.json").write_text(spec.model_dump_json(indent=2) + "\n")
            workspace = copy
        errors = static_errors(workspace, spec)
        if errors:
            report, note = ProbeReport(valid=False, errors=errors), " (static checks; fix these, then the probe runs)"
        else:
            report, note = probe_workspace(workspace, spec, timeout_s=timeout), ""
    if as_json:
        print(report.model_dump_json(indent=2))
    elif report.valid:
        console.print(f"[green]valid[/] ({report.seconds:.2f}s)")
    else:
        console.print(f"[red]invalid[/] ({report.seconds:.2f}s){escape(note)}\n{escape(report.summary())}",
                      highlight=False)
    raise typer.Exit(0 if report.valid else 1)
