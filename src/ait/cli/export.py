"""`ait job export WORKSPACE --to verifiers|prime-rl OUT_DIR`: the job where users already train.

Registered on `ait job` by src/ait/cli/job.py (`app.command("export")(job_export)`).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape

from ait.cli.common import console, fail

def job_export(workspace: Path = typer.Argument(..., help="Workspace with job.toml and env.py."),
               to: str = typer.Option(..., "--to", help="verifiers | prime-rl"),
               out_dir: Path = typer.Argument(..., help="Directory to create (new, or empty)."),
               model: str | None = typer.Option(None, "--model",
                                                help="prime-rl: the Hugging Face model to train (ORG/NAME), for a "
                                                     "base model ait resolves locally (tiny, a GGUF, an alias)."),
               name: str | None = typer.Option(None, "--name", help="Environment id / package name "
                                                                    "(default: ait-job-<task id>)."),
               force: bool = typer.Option(False, "--force", help="Replace OUT_DIR when it holds an earlier export."),
               as_json: bool = typer.Option(False, "--json", help="Print the export's manifest as JSON.")) -> None:
    """Export a job to verifiers (an installable environment package) or prime-rl (an rl.toml plus that
    package in OUT_DIR/environment). NOTES.md in OUT_DIR says how each job.toml setting carries over and
    which have no counterpart; docs/export.md has the whole mapping."""
    from ait.job.export import ExportError, export_job

    try:
        result = export_job(workspace, to, out_dir, model=model, name=name, force=force)
    except ExportError as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot write {out_dir}: {e.strerror or e}")
    if as_json:
        print(json.dumps(result.manifest(), indent=2, default=str))
        return
    pkg = escape(str(result.package_dir))
    console.print(f"exported {escape(str(workspace))} to {escape(str(result.out_dir))} "
                  f"(environment {escape(result.env_id)})", highlight=False, soft_wrap=True)
    if result.target == "verifiers":
        console.print(f"install: pip install {pkg}  (needs verifiers 0.4, in its own venv); "
                      f"run: see {escape(str(result.out_dir / 'README.md'))}", highlight=False, soft_wrap=True)
    else:
        console.print(f"model: {escape(result.model or '')}; install: uv pip install {pkg}; "
                      f"train: uv run rl @ {escape(str(result.out_dir / 'rl.toml'))} (in a checkout of prime-rl, "
                      "github.com/PrimeIntellect-ai/prime-rl)", highlight=False, soft_wrap=True)
    if result.third_party_imports:
        console.print(f"[yellow]note:[/] env.py imports {escape(', '.join(result.third_party_imports))}: add what "
                      f"provides them to {pkg}/pyproject.toml", highlight=False, soft_wrap=True)
    unmapped = result.unmapped
    if unmapped:
        console.print(f"[yellow]{len(unmapped)} job.toml setting(s) with no {escape(result.target)} counterpart[/] "
                      f"(NOTES.md):", highlight=False)
        for row in unmapped:
            console.print(f"  {escape(row.key)} = {escape(json.dumps(row.value))}: {escape(row.note)}",
                          highlight=False, soft_wrap=True)
