"""The outer loop's report: `RUN_DIR/metrics.jsonl` → plots and one self-contained HTML page.

    load_metrics(path)       the rows, checked (one JSON object per outer step)
    summarize(rows)          steps, first / last / best reward, held-out, USD, tokens; family_rows, one per
                             (step, family) trained on
    write_report(run_dir)    ./report-<run name>.html (plots embedded as base64 PNGs) and the PNGs beside it,
                             outside the run directory unless `out` points into it

Any key may be missing or null on a row (held-out reward exists only on evaluation steps).
A line that is not a JSON object is an error naming its line number: the loop writes whole
lines, so a bad one means a wrong or damaged file, and a report that skipped it would
silently misstate the run. The one exception is a last line with no newline that does not
parse: a run still writing (or killed mid-write) leaves exactly that, so it is skipped with
a warning.

Reading and summarising the rows lives in ait.report.metrics, the package's leaf: the plots
(ait.report.plots) read rows through it too, so nothing imports this package back.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ait.report.metrics import METRICS_FILE, MetricsError, family_rows, load_metrics, metrics_path, summarize


class ReportError(ValueError):
    """The report cannot be written where it was asked to be (or where it would go by default)."""


def default_out(run_dir: str | Path) -> Path:
    """`./report-<run name>.html` in the current directory: never inside the run directory, so
    rendering a committed run (docs/outer-*) adds no files to it."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(run_dir).resolve().name).strip("._") or "run"
    return Path.cwd() / f"report-{name}.html"


def _inside(path: Path, directory: Path) -> bool:
    try:
        path.resolve().relative_to(directory.resolve())
        return True
    except ValueError:
        return False


def _check_run_dir(run_dir: Path) -> None:
    if not run_dir.exists():
        raise MetricsError(f"{run_dir} does not exist: pass a run directory written by `ait train`")
    if not run_dir.is_dir():
        raise MetricsError(f"{run_dir} is not a directory: pass a run directory written by `ait train`")
    if not metrics_path(run_dir).is_file():
        held = sorted(p.name for p in run_dir.iterdir())
        what = f"it holds {', '.join(held[:5])}{' …' if len(held) > 5 else ''}" if held else "it is empty"
        raise MetricsError(f"{run_dir} has no {METRICS_FILE} ({what}): pass a run directory written by `ait train`")


def write_report(run_dir: str | Path, out: str | Path | None = None,
                 warnings: list[str] | None = None) -> tuple[Path, dict[str, Any]]:
    """Write the HTML report and its PNGs beside it, named `<stem>-<plot>.png`; returns the HTML
    path and the summary. `out` is the HTML file, or a directory to write `report-<run name>.html`
    into; by default `default_out(run_dir)` (the current directory). The default never writes into
    the run directory: when the current directory is inside it, that is a ReportError asking for
    `out`. Raises MetricsError for a missing or empty run, ReportError / OSError when it cannot write."""
    from ait.report.html import render_html
    from ait.report.plots import render_plots

    run_dir = Path(run_dir)
    _check_run_dir(run_dir)
    rows = load_metrics(metrics_path(run_dir), warnings)
    if not rows:
        raise MetricsError(f"{metrics_path(run_dir)} has no rows yet (the run has not finished a step)")
    if out is None:
        out = default_out(run_dir)
        if _inside(out, run_dir):
            raise ReportError(f"the current directory is inside {run_dir.resolve()}, and by default the report is "
                              f"not written into the run: run it from elsewhere or pass --out FILE")
    out = Path(out)
    if out.is_dir():
        out = out / default_out(run_dir).name
    existing = next((p for p in out.parents if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ReportError(f"cannot write {out}: {existing} is a file, not a directory")
    summary = summarize(rows)
    plots = render_plots(rows)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        for plot in plots:
            if plot.png is not None:
                (out.parent / f"{out.stem}-{plot.name}.png").write_bytes(plot.png)
        out.write_text(render_html(run_dir, rows, summary, plots, warnings or []), encoding="utf-8")
    except OSError as e:
        raise ReportError(f"cannot write {out}: {e.strerror or e}") from None
    return out, summary
