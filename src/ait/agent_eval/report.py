"""The eval's offline HTML page: the per-task table with error bars, and every episode's reward
(failures as well as peaks), drawn with the outer-loop report's plotting rules (ait.report.plots).

    write_eval_report(results, path)   one self-contained HTML file (plots embedded)
"""

from __future__ import annotations

import base64
import zlib
from html import escape
from pathlib import Path

from ait.agent_eval.types import EvalResults, Stat
from ait.report.html import STYLE
from ait.report.plots import new_figure, add_legend, to_png, style

COMPONENTS = (("reward", "reward"), ("validation", "validation"), ("job_quality", "job quality"),
              ("uplift_term", "uplift term"), ("train_speed", "speed"))


def fmt(s: Stat) -> str:
    """`+0.398±0.003`: the mean and two standard errors (no ± below two episodes)."""
    if s.mean is None:
        return "-"
    return f"{s.mean:+.3f}" + (f"±{s.se2:.3f}" if s.se2 is not None else "")


def components_plot(results: EvalResults) -> bytes | None:
    """Per task: the mean of the reward and each component, with two standard errors."""
    tasks = [t for t, s in results.per_task.items() if s.reward.n]
    if not tasks:
        return None
    fig, ax = new_figure(height=3.6)
    width = 0.8 / len(COMPONENTS)
    for i, (key, label) in enumerate(COMPONENTS):
        stats = [getattr(results.per_task[t], key) for t in tasks]
        xs = [j + (i - (len(COMPONENTS) - 1) / 2) * width for j in range(len(tasks))]
        means = [s.mean or 0.0 for s in stats]
        errors = [s.se2 or 0.0 for s in stats]
        ax.bar(xs, means, width=width, yerr=errors, capsize=2, color=style(i)["color"], label=label)
    ax.axhline(0.0, color="#444", linewidth=0.8)
    ax.set_xticks(range(len(tasks)), tasks, rotation=15)
    ax.set_ylabel("mean over episodes (± 2 SE)")
    ax.set_title("Reward and its components per task")
    add_legend(fig, ax)
    return to_png(fig)


def episodes_plot(results: EvalResults) -> bytes | None:
    """Every episode's reward by task, coloured by how it ended: the failures show, not only the mean."""
    rows = results.episodes
    if not rows:
        return None
    tasks = list(results.per_task)
    reasons = sorted({r.stop_reason for r in rows})
    fig, ax = new_figure(height=3.4)
    for i, reason in enumerate(reasons):
        mine = [r for r in rows if r.stop_reason == reason]
        xs = [tasks.index(r.task_id) + 0.25 * ((zlib.crc32(r.run_id.encode()) % 100) / 100 - 0.5) for r in mine]
        ax.scatter(xs, [r.reward for r in mine], color=style(i)["color"], marker=style(i)["marker"], s=28,
                   label=f"{reason} ({len(mine)})", alpha=0.85)
    ax.axhline(0.0, color="#444", linewidth=0.8)
    ax.set_xticks(range(len(tasks)), tasks, rotation=15)
    ax.set_ylabel("episode reward")
    ax.set_title("Every episode (jittered within its task)")
    add_legend(fig, ax)
    return to_png(fig)


def write_eval_report(results: EvalResults, path: Path) -> Path:
    plan = results.plan
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>ait eval: {escape(plan.policy)}"
             f"</title><style>{STYLE}</style></head><body>",
             f"<h1>Agent eval: <code>{escape(plan.policy)}</code></h1>",
             f"<p class='muted'>{len(results.episodes)} of {results.planned} episodes · {plan.episodes} per task · "
             f"executor {escape(plan.episode_config().executor)}" + (f" · stopped: {escape(results.stopped)}" if results.stopped else "")
             + "</p>", "<h2>Per task (mean ± 2 standard errors, never below the binomial 2 SE at p = 1/(2n); "
             "infra errors left out)</h2><table><tr>"]
    cols = ["task", "n", "infra", "reward", "validation", "job quality", "uplift", "speed", "valid rate",
            "job failures", "USD"]
    parts += [f"<th>{c}</th>" for c in cols] + ["</tr>"]
    for name, s in [*results.per_task.items(), ("all tasks", results.overall)]:
        cells = [name, str(s.episodes), str(s.infra_errors), fmt(s.reward), fmt(s.validation), fmt(s.job_quality),
                 fmt(s.uplift_term), fmt(s.train_speed), fmt(s.valid_rate), fmt(s.job_failure_rate), f"{s.usd:.4f}"]
        parts.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    parts.append("</table>")
    for title, png, caption in (("Components", components_plot(results), "Bars: means per task; whiskers: two "
                                 "standard errors."),
                                ("Episodes", episodes_plot(results), "Each point is one episode; colour and marker "
                                 "say how it ended.")):
        parts.append(f"<h2>{title}</h2>")
        if png is None:
            parts.append("<p class='nothing'>Nothing to plot: no episode finished.</p>")
        else:
            data = base64.b64encode(png).decode("ascii")
            parts.append(f"<figure><img alt='{title}' src='data:image/png;base64,{data}'>"
                         f"<figcaption>{escape(caption)}</figcaption></figure>")
    parts.append("</body></html>")
    path.write_text("\n".join(parts))
    return path
