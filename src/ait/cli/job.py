"""`ait job`: validate a workspace with the probe."""

from __future__ import annotations

from pathlib import Path

import typer

from ait.cli.common import console, fail, load_task

app = typer.Typer(help="Work with job workspaces (job.toml + env.py).", no_args_is_help=True)


@app.command("validate")
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
