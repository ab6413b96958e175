"""The report as one self-contained HTML page: inline CSS, plots as base64 PNGs, no scripts and
nothing fetched, so it opens offline and can be mailed or attached as a single file."""

from __future__ import annotations

import base64
import time
from html import escape
from pathlib import Path
from typing import Any

from ait.report.goal import goal_line
from ait.report.metrics import choices_label
from ait.report.plots import Plot

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, Segoe UI, sans-serif; margin: 2rem auto; max-width: 60rem;
       padding: 0 1rem; color: #222; }
h1 { font-size: 1.5rem; margin-bottom: 0.2rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
.muted { color: #666; } .warn { color: #a15c00; }
table { border-collapse: collapse; margin: 0.5rem 0; }
th, td { padding: 0.2rem 0.7rem; border-bottom: 1px solid #ddd; text-align: right; }
th:first-child, td:first-child { text-align: left; }
figure { margin: 1.5rem 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9rem; }
p.nothing { color: #666; font-style: italic; margin: 0.4rem 0 1.2rem; }
details table { font-size: 0.8rem; }
"""

FAMILY_COLUMNS = (("step", "step"), ("family", "family"), ("episodes", "episodes"), ("valid_rate", "valid rate"),
                  ("job_quality_mean", "job quality"), ("job_quality_std", "± std"),
                  ("distinct_configs", "distinct configs"), ("shaped_share", "shaped reward"))
"""Per-family table: (key of ait.report.metrics.family_rows, header); the jobs' choices follow."""

STEP_COLUMNS = ("step", "reward_mean", "validation", "job_quality", "speed", "valid_rate", "post_mean",
                "uplift_mean", "heldout_reward", "staleness_mean", "loss", "policy_tokens", "train_tokens", "usd")


def fmt(value: Any, key: str = "") -> str:
    """Numbers as a reader wants them: USD with cents, counts with separators, rates with 3 decimals."""
    if value is None:
        return "–"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v:.0%}" for k, v in sorted(value.items(), key=lambda kv: -kv[1])) or "–"
    if key.startswith("usd"):
        return f"${value:,.2f}"
    if key.endswith("tokens") or key in ("steps", "step", "first_step", "last_step", "reward_best_step",
                                         "heldout_evals", "timed_out", "resampled_groups", "infra_errors",
                                         "episodes", "distinct_configs"):
        return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"
    if key.startswith("seconds"):
        return f"{value / 3600:.2f} h" if value >= 3600 else f"{value:,.0f} s"
    return f"{value:.3f}"


SUMMARY_ROWS = [("steps", "outer steps"), ("reward_first", "reward, first step"), ("reward_last", "reward, last step"),
                ("reward_best", "reward, best step"), ("reward_best_step", "best step"),
                ("heldout_first", "held-out reward, first eval"), ("heldout_last", "held-out reward, last eval"),
                ("heldout_start", "held-out reward, starting policy (step 0)"),
                ("heldout_vs_start", "held-out transfer: last eval − start, paired"),
                ("heldout_vs_start_se2", "  its two standard errors"),
                ("usd_total", "total USD"), ("policy_tokens", "agent tokens sampled"),
                ("train_tokens", "tokens trained on"), ("seconds_span", "wall time, first step's start to last step's end"),
                ("seconds_total", "time in steps (sum; setup and pauses between machines not in it)"),
                ("timed_out", "episodes timed out"), ("resampled_groups", "groups re-sampled (too stale)"),
                ("infra_errors", "episodes lost to infra errors"),
                ("base_model_share_last", "base models, last step"),
                ("stop_share_last", "how episodes ended, last step")]


def render_html(run_dir: Path, rows: list[dict[str, Any]], summary: dict[str, Any], plots: list[Plot],
                warnings: list[str]) -> str:
    name = escape(Path(run_dir).resolve().name)
    steps = f"{summary['steps']} step{'' if summary['steps'] == 1 else 's'}"
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>ait report: {name}</title>",
             f"<style>{STYLE}</style></head><body>",
             f"<h1>Outer-loop run <code>{name}</code></h1>",
             (f"<p class='muted'>{escape(str(run_dir))} · {steps} · report written "
              f"{time.strftime('%Y-%m-%d %H:%M', time.localtime())}</p>")]
    parts += [f"<p class='warn'>{escape(w)}</p>" for w in warnings]
    parts.append("<h2>Summary</h2><table>")
    parts += [f"<tr><td>{escape(label)}</td><td>{escape(fmt(summary.get(key), key))}</td></tr>"
              for key, label in SUMMARY_ROWS]
    parts.append("</table>")
    for plot in plots:
        parts.append(f"<h2>{escape(plot.title)}</h2>")
        if plot.png is None:
            parts.append(f"<p class='nothing'>Nothing to plot: {escape(plot.empty)}.</p>")
            continue
        data = base64.b64encode(plot.png).decode("ascii")
        caption = " ".join([plot.caption, *plot.notes])
        parts.append(f"<figure><img alt='{escape(plot.title)}' src='data:image/png;base64,{data}'>"
                     f"<figcaption>{escape(caption)}</figcaption></figure>")
    parts += family_table(summary.get("family_rows") or [])
    parts += goal_table(summary.get("goal"))
    parts += phase_table(rows)
    parts.append("<h2>Per step</h2><details><summary>every row of metrics.jsonl</summary><table><tr>")
    parts += [f"<th>{escape(c)}</th>" for c in STEP_COLUMNS]
    parts.append("</tr>")
    for row in rows:
        parts.append("<tr>" + "".join(f"<td>{escape(fmt(row.get(c), c))}</td>" for c in STEP_COLUMNS) + "</tr>")
    parts.append("</table></details></body></html>")
    return "\n".join(parts)


def family_table(rows: list[dict[str, Any]]) -> list[str]:
    """Each step's families: how many episodes, how often valid, job quality and its spread within the
    family, and which (base model, learning rate, max steps) the jobs chose. Nothing for runs from before
    metrics.jsonl had `families`."""
    if not rows:
        return []
    parts = ["<h2>Per family</h2><p class='muted'>job quality ± its population standard deviation over the "
             "family's episodes of the step; the jobs' (base model, learning rate, max steps), most used first</p>"
             "<table><tr>", *(f"<th>{escape(h)}</th>" for _, h in FAMILY_COLUMNS), "<th>jobs chose</th></tr>"]
    for row in rows:
        cells = [escape(str(row[k])) if k == "family" else escape(fmt(row.get(k), k)) for k, _ in FAMILY_COLUMNS]
        choices = choices_label(row)
        parts.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + f"<td>{escape(choices)}</td></tr>")
    parts.append("</table>")
    return parts


def goal_table(goal: dict[str, Any] | None) -> list[str]:
    """The last steps' job quality against the first steps', per family and matched (ait.report.goal);
    nothing before the run has two windows of steps."""
    if goal is None:
        return []
    parts = [f"<h2>Last {goal['window']} steps against the first {goal['window']}</h2>",
             f"<p>{escape(goal_line(goal) or '')}</p>",
             "<p class='muted'>steps " + escape(", ".join(str(s) for s in goal["early_steps"])) + " against "
             + escape(", ".join(str(s) for s in goal["late_steps"])) + "; each family's episodes in both windows, "
             "2 SE from their spread</p><table><tr><th>family</th><th>first: n</th><th>first: job quality</th>"
             "<th>last: n</th><th>last: job quality</th><th>difference ± 2 SE</th></tr>"]
    for family, f in goal["families"].items():
        parts.append(f"<tr><td>{escape(family)}</td><td>{f['early_n']:.0f}</td><td>{f['early_mean']:+.3f}</td>"
                     f"<td>{f['late_n']:.0f}</td><td>{f['late_mean']:+.3f}</td><td>{f['diff']:+.3f} ± {f['se2']:.3f}</td></tr>")
    parts.append("</table>")
    return parts


STEP_SPLITS = [("train: forward+backward", "trainer/seconds_forward_backward"),
               ("train: optimizer", "trainer/seconds_optimizer"),
               ("train: sampler refresh", "trainer/seconds_refresh")]
PREFILLED, REUSED = "trainer/sampler_prefill_tokens", "trainer/sampler_prefix_tokens_reused"


def number(value: Any) -> float | None:
    """A finite number from a row's unchecked key, else None (shown as –)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf")
    return float(value) if ok else None


def phase_table(rows: list[dict[str, Any]]) -> list[str]:
    """Each step's seconds split by the loop's phases (seconds_by_phase: waiting for the groups' episodes,
    the agent's training step, held-out, the previous bundle). Nothing for runs from before the key."""
    timed = [r for r in rows if r.get("seconds_by_phase")]
    if not timed:
        return []
    names = list(dict.fromkeys(k for r in timed for k in r["seconds_by_phase"]))
    # The agent's training step by part, and the sampler's prompt tokens served from stored prefixes, where
    # the rows carry them (the local backend's, since 2026-12-07).
    splits = [(label, key) for label, key in STEP_SPLITS if any(number(r.get(key)) is not None for r in timed)]
    reuse = any(number(r.get(PREFILLED)) for r in timed)
    parts = ["<h2>Seconds by phase</h2><p class='muted'>where each step's wall time went; "
             "bench/episode_phases.py splits the episodes' own time (sampling, probes, jobs, their queue)</p>"
             "<table><tr><th>step</th><th>seconds</th>", *(f"<th>{escape(n)}</th>" for n in names),
             *(f"<th>{escape(label)}</th>" for label, _ in splits), "<th>prompt tokens reused</th>" if reuse else "",
             "</tr>"]
    for r in timed:
        cells = [fmt(r.get("step"), "step"), fmt(r.get("seconds"), "seconds"),
                 *(fmt(r["seconds_by_phase"].get(n), "seconds") for n in names),
                 *(fmt(number(r.get(key)), "seconds") for _, key in splits)]
        if reuse:
            fed, reused = number(r.get(PREFILLED)), number(r.get(REUSED)) or 0.0
            cells.append(f"{reused / (fed + reused):.0%}" if fed else "–")
        parts.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    parts.append("</table>")
    return parts
