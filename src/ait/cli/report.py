"""`ait report`: an outer-loop run's metrics as an HTML report with plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from ait.cli.common import console, err, fail


def report(run_dir: Path = typer.Argument(..., metavar="RUN_DIR",
                                          help="A run directory of `ait train` (holds metrics.jsonl); only read."),
           out: Optional[Path] = typer.Option(
               None, "--out", metavar="FILE",
               help=("HTML file to write (its PNGs go beside it, named <FILE's stem>-<plot>.png), or a directory "
                     "to write report-<run name>.html into. Default: ./report-<run name>.html in the current "
                     "directory; never inside RUN_DIR unless --out points there.")),
           as_json: bool = typer.Option(False, "--json", help="Print the summary (and the report's path) as JSON.")
           ) -> None:
    """Plot an outer-loop run: reward and its components, held-out reward, job outcomes, base-model
    choice, hyperparameter use, cost, staleness. Writes one self-contained HTML file (plots
    embedded, opens offline) plus the PNGs beside it; a chart with no data is replaced by one line
    saying why. Nothing is written into RUN_DIR unless --out points there."""
    from ait.report import MetricsError, ReportError, write_report

    warnings: list[str] = []
    try:
        path, summary = write_report(run_dir, out, warnings)
    except (MetricsError, ReportError, RuntimeError, OSError) as e:
        fail(str(e))
    for w in warnings:
        err.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)
    if as_json:
        print(json.dumps({**summary, "report": str(path)}, indent=2))
        return
    steps = f"{summary['steps']} step{'' if summary['steps'] == 1 else 's'}"
    console.print(f"{steps} · reward {_f(summary['reward_first'])} → {_f(summary['reward_last'])} "
                  f"(best {_f(summary['reward_best'])}) · ${summary['usd_total'] or 0:,.2f}", highlight=False)
    console.print(f"report: {path}", highlight=False, markup=False, soft_wrap=True)


def _f(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"
