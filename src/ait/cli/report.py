"""`ait report`: an outer-loop run's metrics as an HTML report with plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

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
    choice, hyperparameter use, cost, staleness, and a per-family table of each step (valid rate,
    job quality and its spread, the jobs' choices). Writes one self-contained HTML file (plots
    embedded, opens offline) plus the PNGs beside it; a chart with no data is replaced by one line
    saying why. Nothing is written into RUN_DIR unless --out points there."""
    from ait.report import MetricsError, ReportError, write_report
    from ait.report.goal import goal_line

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
    if summary["family_rows"]:
        console.print(family_table(summary["family_rows"]))
    if line := goal_line(summary.get("goal")):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print(f"report: {path}", highlight=False, markup=False, soft_wrap=True)


TERMINAL_STEPS = 10
"""Steps of the per-family table printed (the last ones); the HTML report and --json carry every step."""


def family_table(rows: list[dict]) -> Table:
    """The last TERMINAL_STEPS steps' families, one section per step."""
    from ait.report.metrics import choices_label

    steps = sorted({r["step"] for r in rows})
    shown = set(steps[-TERMINAL_STEPS:])
    title = "per family" + (f" (last {len(shown)} of {len(steps)} steps)" if len(shown) < len(steps) else "")
    table = Table("step", "family", "episodes", "valid", "job quality", "± std", "distinct", "shaped", "jobs chose",
                  title=title, title_justify="left")
    last = None
    for r in rows:
        if r["step"] not in shown:
            continue
        if last is not None and r["step"] != last:
            table.add_section()
        last = r["step"]
        table.add_row(str(r["step"]), escape(str(r["family"])), _n(r.get("episodes")), _f(r.get("valid_rate")),
                      _f(r.get("job_quality_mean")), _f(r.get("job_quality_std")), _n(r.get("distinct_configs")),
                      _f(r.get("shaped_share")),
                      escape(choices_label(r)))
    return table


def _n(value: float | None) -> str:
    return "–" if value is None else f"{value:g}"


def _f(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"
