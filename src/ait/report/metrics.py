"""The outer loop's metrics rows: `RUN_DIR/metrics.jsonl` read, checked and summarised.

The leaf of ait.report: the package's `write_report` and its plots (ait.report.plots) both read
rows through here, and this module imports neither, so the plots never import the package that
imports them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ait.report.goal import arc_goal

METRICS_FILE = "metrics.jsonl"

NUMBER_KEYS = ("step", "time", "seconds", "reward_mean", "reward_std", "validation", "job_quality", "speed",
               "post_mean", "uplift_mean", "valid_rate", "staleness_mean", "staleness_max", "resampled_groups",
               "timed_out", "infra_errors", "policy_tokens", "train_tokens", "loss", "usd", "heldout_reward",
               "heldout_n")
"""Keys read as numbers (int or float; null = missing)."""
SHARE_KEYS = ("base_model_share", "hparam_use", "stop_share", "seconds_by_phase")
"""Keys read as {name: number} (fractions; seconds for seconds_by_phase; null = missing)."""
FAMILY_NUMBER_KEYS = ("episodes", "valid_rate", "job_quality_mean", "job_quality_std", "distinct_configs",
                      "shaped_share", "finished", "job_quality_finished_mean", "job_quality_finished_std")
"""Numbers of each family's object under `families` (ait.outer.metrics.FAMILY_KEYS); rows written before
the key have no `families` and so no per-family rows."""


class MetricsError(ValueError):
    """metrics.jsonl is missing or has a line that is not a metrics row."""


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
    if warnings is not None:
        warnings.extend(step_gaps(rows, path))
    return rows


def step_gaps(rows: list[dict[str, Any]], where: str | Path = "metrics") -> list[str]:
    """What breaks one arc: a step that appears twice, a step missing between the first and the last
    (a run continued from a bundle carries its earlier steps, so neither should happen)."""
    steps = [row["step"] for row in rows if isinstance(row.get("step"), int)]
    out = []
    seen = {s for s in steps if steps.count(s) > 1}
    if seen:
        out.append(f"{where}: step(s) {', '.join(map(str, sorted(seen)[:5]))} appear more than once")
    if steps:
        missing = sorted(set(range(min(steps), max(steps) + 1)) - set(steps))
        if missing:
            out.append(f"{where}: step(s) {', '.join(map(str, missing[:5]))} missing between {min(steps)} and "
                       f"{max(steps)}")
    return out


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
    if row.get("families") is not None:
        row["families"] = _checked_families(row["families"], where)
    if row.get("step") is None:
        row["step"] = default_step
    return row


def _checked_families(value: Any, where: str) -> dict[str, dict[str, Any]]:
    """{family: figures} with the figures' numbers checked as a row's (NaN read as missing)."""
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise MetricsError(f"{where}: families should be an object of objects, got {json.dumps(value)[:60]}")
    out = {}
    for name, figures in value.items():
        figures = dict(figures)
        for key in FAMILY_NUMBER_KEYS:
            number = figures.get(key)
            if number is not None and not _is_number(number):
                raise MetricsError(f"{where}: families.{name}.{key} should be a number or null, "
                                   f"got {json.dumps(number)[:60]}")
            if number is not None and not math.isfinite(number):
                figures[key] = None
        configs = figures.get("configs")
        if configs is not None and not (isinstance(configs, list) and all(isinstance(c, dict) for c in configs)):
            raise MetricsError(f"{where}: families.{name}.configs should be a list of objects, "
                               f"got {json.dumps(configs)[:60]}")
        out[name] = figures
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def series(rows: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    """(step, value) for the rows where `key` is present and not null."""
    return [(row["step"], float(row[key])) for row in rows if row.get(key) is not None]


def family_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One flat row per (step, family) trained on: {step, family, episodes, valid_rate, job_quality_mean,
    job_quality_std, configs, distinct_configs, shaped_share}, in step order, families sorted within a step."""
    return [{"step": row["step"], "family": name, **figures}
            for row in rows for name, figures in sorted((row.get("families") or {}).items())]


def choices_label(row: dict[str, Any]) -> str:
    """A family row's jobs as a reader scans them: by the surface's names when the row has them
    ("model_qwen15 ×2; reference ×1"), else by (base model, learning rate, steps) triples (older runs)."""
    variants = row.get("variants")
    if isinstance(variants, dict) and variants:
        return "; ".join(f"{name} ×{count}" for name, count in variants.items())
    return "; ".join(config_label(c) for c in row.get("configs") or []) or "–"


def config_label(config: dict[str, Any]) -> str:
    """One job choice as a reader scans it: `Qwen/Qwen3-0.6B lr 3e-06 50 steps ×2`."""
    lr, steps = config.get("learning_rate"), config.get("max_steps", "?")
    lr_text = f"{lr:g}" if _is_number(lr) else "?"
    return f"{config.get('base_model', '?')} lr {lr_text} {steps} steps ×{config.get('count', 1)}"


def span(rows: list[dict[str, Any]]) -> float | None:
    """Wall seconds from the first step's start (its row's time less its seconds) to the last row's
    time: what a reader means by how long the run took, where the sum of step times leaves out the
    waits between them."""
    timed = [r for r in rows if _is_number(r.get("time"))]
    if not timed or not _is_number(timed[0].get("seconds")):
        return None
    return max(r["time"] for r in timed) - (timed[0]["time"] - timed[0]["seconds"])


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What a reader wants first: how long, how good at the start, the end and at best, what it cost."""
    reward = series(rows, "reward_mean")
    heldout = series(rows, "heldout_reward")
    best = max(reward, key=lambda p: p[1]) if reward else None
    shares = [row["base_model_share"] for row in rows if row.get("base_model_share")]
    stops = [row["stop_share"] for row in rows if row.get("stop_share")]

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
        # held-out transfer: the last evaluation against the starting policy's, paired by episode
        "heldout_start": next((r["heldout_start_reward"] for r in reversed(rows)
                               if r.get("heldout_start_reward") is not None), None),
        "heldout_vs_start": next((r["heldout_vs_start"] for r in reversed(rows)
                                  if r.get("heldout_vs_start") is not None), None),
        "heldout_vs_start_se2": next((r["heldout_vs_start_se2"] for r in reversed(rows)
                                      if r.get("heldout_vs_start") is not None and r.get("heldout_vs_start_se2") is not None), None),
        "usd_total": total("usd"),
        "policy_tokens": total("policy_tokens"),
        "train_tokens": total("train_tokens"),
        "seconds_total": total("seconds"),
        "seconds_span": span(rows),
        "timed_out": total("timed_out"),
        "resampled_groups": total("resampled_groups"),
        "infra_errors": total("infra_errors"),
        "base_model_share_last": shares[-1] if shares else None,
        "stop_share_last": stops[-1] if stops else None,
        "family_rows": family_rows(rows),
        "goal": arc_goal(rows),  # the last steps' job quality against the first steps', family-matched
    }
