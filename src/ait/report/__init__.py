"""The outer loop's report: `RUN_DIR/metrics.jsonl` → plots and one self-contained HTML page.

    load_metrics(path)       the rows, checked (one JSON object per outer step)
    summarize(rows)          steps, first / last / best reward, held-out, USD, tokens
    write_report(run_dir)    ./report-<run name>.html (plots embedded as base64 PNGs) and the PNGs beside it,
                             outside the run directory unless `out` points into it

Any key may be missing or null on a row (held-out reward exists only on evaluation steps).
A line that is not a JSON object is an error naming its line number: the loop writes whole
lines, so a bad one means a wrong or damaged file, and a report that skipped it would
silently misstate the run. The one exception is a last line with no newline that does not
parse: a run still writing (or killed mid-write) leaves exactly that, so it is skipped with
a warning.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"

NUMBER_KEYS = ("step", "time", "seconds", "reward_mean", "reward_std", "validation", "job_quality", "speed",
               "post_mean", "uplift_mean", "valid_rate", "staleness_mean", "staleness_max", "resampled_groups",
               "timed_out", "infra_errors", "policy_tokens", "train_tokens", "loss", "usd", "heldout_reward",
               "heldout_n")
"""Keys read as numbers (int or float; null = missing)."""
SHARE_KEYS = ("base_model_share", "hparam_use")
"""Keys read as {name: fraction} (null = missing)."""


class MetricsError(ValueError):
    """metrics.jsonl is missing or has a line that is not a metrics row."""


class ReportError(ValueError):
    """The report cannot be written where it was asked to be (or where it would go by default)."""


def metrics_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / METRICS_FILE


def load_metrics(path: str | Path, warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl, each with a numeric `step` (its position when the row has none).
    Raises MetricsError naming the line on a malformed one; appends to `warnings` what it skipped."""
    path = Path(path)
    if not path.is_file():
        raise MetricsError(f"{path} not found: pass a run directory written by `ait train`")
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines) and not text.endswith("\n"):  # a half-written last line
                if warnings is not None:
                    warnings.append(f"{path}:{number}: incomplete last line skipped (a run still writing?)")
                continue
            raise MetricsError(f"{path}:{number}: not JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict):
            raise MetricsError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        rows.append(_checked(row, f"{path}:{number}", default_step=rows[-1]["step"] + 1 if rows else 0))
    return rows


def _checked(row: dict[str, Any], where: str, default_step: float) -> dict[str, Any]:
    """The row with NaN / infinity read as missing; a wrong type is an error."""
    row = dict(row)
    for key in NUMBER_KEYS:
        value = row.get(key)
        if value is not None and not _is_number(value):
            raise MetricsError(f"{where}: {key} should be a number or null, got {json.dumps(value)[:60]}")
        if value is not None and not math.isfinite(value):
            row[key] = None
    for key in SHARE_KEYS:
        value = row.get(key)
        if value is None:
            continue
        if not isinstance(value, dict) or not all(v is None or _is_number(v) for v in value.values()):
            raise MetricsError(f"{where}: {key} should be an object of numbers, got {json.dumps(value)[:60]}")
        row[key] = {k: v for k, v in value.items() if v is not None and math.isfinite(v)}
    if row.get("step") is None:
        row["step"] = default_step
    return row


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def series(rows: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    """(step, value) for the rows where `key` is present and not null."""
    return [(row["step"], float(row[key])) for row in rows if row.get(key) is not None]


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What a reader wants first: how long, how good at the start, the end and at best, what it cost."""
    reward = series(rows, "reward_mean")
    heldout = series(rows, "heldout_reward")
    best = max(reward, key=lambda p: p[1]) if reward else None
    shares = [row["base_model_share"] for row in rows if row.get("base_model_share")]

    def total(key: str) -> float | None:
        values = [v for _, v in series(rows, key)]
        return sum(values) if values else None

    return {
        "steps": len(rows),
        "first_step": rows[0]["step"] if rows else None,
        "last_step": rows[-1]["step"] if rows else None,
        "reward_first": reward[0][1] if reward else None,
        "reward_last": reward[-1][1] if reward else None,
        "reward_best": best[1] if best else None,
        "reward_best_step": best[0] if best else None,
        "heldout_first": heldout[0][1] if heldout else None,
        "heldout_last": heldout[-1][1] if heldout else None,
        "heldout_evals": len(heldout),
        "usd_total": total("usd"),
        "policy_tokens": total("policy_tokens"),
        "train_tokens": total("train_tokens"),
        "seconds_total": total("seconds"),
        "timed_out": total("timed_out"),
        "resampled_groups": total("resampled_groups"),
        "infra_errors": total("infra_errors"),
        "base_model_share_last": shares[-1] if shares else None,
    }


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
