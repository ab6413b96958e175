"""`ait report`: an outer-loop run's metrics as an HTML report with plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from ait.cli.common import console, err, fail


def report(run_dir: Path = typer.Argument(..., help="A run directory of `ait train` (holds metrics.jsonl)."),
           out: Optional[Path] = typer.Option(None, "--out", help="HTML file to write (default RUN_DIR/report.html)."),
           as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON.")) -> None:
    """Plot an outer-loop run: reward and its components, held-out reward, base-model share, cost,
    staleness. Writes one self-contained HTML file (plots embedded) and the PNGs beside it."""
    from ait.report import MetricsError, write_report

    warnings: list[str] = []
    try:
        path, summary = write_report(run_dir, out, warnings)
    except (MetricsError, RuntimeError) as e:
        fail(str(e))
    for w in warnings:
        err.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)
    if as_json:
        print(json.dumps({**summary, "report": str(path)}, indent=2))
        return
    console.print(f"{summary['steps']} steps · reward {_f(summary['reward_first'])} → {_f(summary['reward_last'])} "
                  f"(best {_f(summary['reward_best'])}) · ${summary['usd_total'] or 0:,.2f}", highlight=False)
    console.print(f"report: {path}", highlight=False, markup=False)


def _f(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"
