"""The report's plots, rendered off-screen (matplotlib's Agg canvas, no pyplot state) to PNG bytes.

Each plot reads the rows (ait.report.load_metrics) and is left out when none of its keys has
a value. Missing values leave gaps; values that exist only on some steps (held-out reward)
are drawn as points joined in step order.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ait.report import series

Rows = list[dict[str, Any]]


@dataclass
class Plot:
    name: str
    """File-name part: <stem>-<name>.png."""
    title: str
    caption: str
    png: bytes


def _figure():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as e:
        raise RuntimeError("the report's plots need matplotlib: pip install 'ait[report]'") from e
    fig = Figure(figsize=(7.2, 3.4), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.grid(True, alpha=0.3)
    ax.set_xlabel("outer step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig, ax


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _line(ax, rows: Rows, key: str, label: str, **style) -> bool:
    points = series(rows, key)
    if not points:
        return False
    # Rows without the key become gaps (NaN) rather than being bridged.
    by_step = dict(points)
    xs = [row["step"] for row in rows]
    ys = [by_step.get(x, float("nan")) for x in xs]
    ax.plot(xs, ys, label=label, marker="o" if len(points) < 40 else None, markersize=3, **style)
    return True


def reward(rows: Rows):
    fig, ax = _figure()
    drawn = _line(ax, rows, "reward_mean", "reward (mean)", linewidth=2.2, color="black")
    if any(r.get("reward_mean") is not None and r.get("reward_std") is not None for r in rows):
        nan = float("nan")
        mean = [nan if r.get("reward_mean") is None else r["reward_mean"] for r in rows]
        std = [nan if r.get("reward_std") is None else r["reward_std"] for r in rows]
        ax.fill_between([r["step"] for r in rows], [m - s for m, s in zip(mean, std)],
                        [m + s for m, s in zip(mean, std)], color="black", alpha=0.1, label="± std")
    for key, color in (("validation", "tab:blue"), ("job_quality", "tab:green"), ("speed", "tab:orange")):
        drawn |= _line(ax, rows, key, key, color=color, linewidth=1.2)
    ax.set_ylabel("reward / component")
    return fig, ax, drawn


def heldout(rows: Rows):
    fig, ax = _figure()
    points = series(rows, "heldout_reward")
    if points:
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker="o", color="tab:purple", label="held-out reward (triage)")
        for row in rows:
            if row.get("heldout_reward") is not None and row.get("heldout_n") is not None:
                ax.annotate(f"n={int(row['heldout_n'])}", (row["step"], row["heldout_reward"]),
                            textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    ax.margins(y=0.2)
    ax.set_ylabel("mean reward")
    return fig, ax, bool(points)


def outcomes(rows: Rows):
    fig, ax = _figure()
    drawn = False
    for key, label, color in (("valid_rate", "valid job rate", "tab:blue"), ("post_mean", "post (hidden eval)",
                              "tab:green"), ("uplift_mean", "uplift term", "tab:red")):
        drawn |= _line(ax, rows, key, label, color=color)
    ax.axhline(0, color="grey", linewidth=0.8)
    return fig, ax, drawn


def base_models(rows: Rows):
    fig, ax = _figure()
    shares = [(row["step"], row["base_model_share"]) for row in rows if row.get("base_model_share")]
    if not shares:
        return fig, ax, False
    models = sorted({m for _, share in shares for m in share})
    xs = [step for step, _ in shares]
    ax.stackplot(xs, *[[share.get(m, 0.0) for _, share in shares] for m in models], labels=models, alpha=0.85,
                 step="mid" if len(xs) > 1 else None)
    ax.set_ylim(0, max(1.0, max(sum(s.values()) for _, s in shares)))
    ax.set_ylabel("share of scored jobs")
    return fig, ax, True


def hparams(rows: Rows):
    fig, ax = _figure()
    keys = sorted({k for row in rows for k in (row.get("hparam_use") or {})})
    drawn = False
    for key in keys:
        points = [(row["step"], row["hparam_use"].get(key, 0.0)) for row in rows if row.get("hparam_use")]
        xs, ys = zip(*points)
        ax.plot(xs, ys, label=key, marker="o" if len(points) < 40 else None, markersize=3)
        drawn = True
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("share of jobs setting it")
    return fig, ax, drawn


def cost(rows: Rows):
    fig, ax = _figure()
    points = series(rows, "usd")
    if not points:
        return fig, ax, False
    xs, ys = zip(*points)
    ax.bar(xs, ys, color="tab:orange", alpha=0.7, label="USD per step")
    ax.set_ylabel("USD per step")
    twin = ax.twinx()
    running, cumulative = 0.0, []
    for y in ys:
        running += y
        cumulative.append(running)
    twin.plot(xs, cumulative, color="tab:red", label="cumulative USD")
    twin.set_ylabel("cumulative USD")
    ax.set_ylim(bottom=0)
    twin.set_ylim(bottom=0)
    handles, labels = ax.get_legend_handles_labels()
    more, more_labels = twin.get_legend_handles_labels()
    ax.legend(handles + more, labels + more_labels, loc="upper left", fontsize=8)
    return fig, ax, True


def staleness(rows: Rows):
    fig, ax = _figure()
    drawn = _line(ax, rows, "staleness_mean", "mean", color="tab:blue")
    drawn |= _line(ax, rows, "staleness_max", "max", color="tab:red", linestyle="--")
    ax.set_ylabel("steps off-policy")
    return fig, ax, drawn


PLOTS: list[tuple[str, str, str, Callable[[Rows], Any]]] = [
    ("reward", "Reward and its components",
     ("Mean episode reward per outer step (band: ± one standard deviation across episodes) with the unweighted "
      "means of its components: validation, job quality and train speed."), reward),
    ("heldout", "Held-out reward",
     "Mean reward on the held-out family (never trained on), on the steps it was evaluated.", heldout),
    ("outcomes", "Job outcomes", ("Share of episodes whose job was valid; mean hidden-eval post score and "
                                  "uplift term of the scored jobs."), outcomes),
    ("base_models", "Base-model choice", "Share of scored jobs per base model the agent chose.", base_models),
    ("hparams", "Hyperparameter surface", "Share of jobs that set each optional job.toml key.", hparams),
    ("cost", "Cost", "USD spent per outer step (agent sampling, inner jobs, training) and the running total.",
     cost),
    ("staleness", "Staleness", ("How many optimizer steps behind the trained policy the groups of a step were "
                                "sampled."), staleness),
]


def render_plots(rows: Rows) -> list[Plot]:
    """Every plot that has data, as PNG bytes."""
    out = []
    for name, title, caption, draw in PLOTS:
        fig, ax, drawn = draw(rows)
        if not drawn:
            continue
        ax.set_title(title, fontsize=11)
        if name != "cost" and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best")
        out.append(Plot(name=name, title=title, caption=caption, png=_png(fig)))
    return out
