"""The report's plots, rendered off-screen (matplotlib's Agg canvas, no pyplot state) to PNG bytes.

Each plot reads the rows (ait.report.metrics.load_metrics) and returns either a figure or, when there is
nothing worth drawing, one sentence saying why (`Plot.empty`); the HTML prints that sentence in
place of the chart. "Nothing worth drawing" means: every value of the plot's keys is missing or
null, or every value is 0 where 0 is the whole story (cost, staleness, a valid-job rate of 0
with no job scored).

Legibility rules every plot follows, because the report is read as a PNG with no hover or zoom:
  - a legend is never inside the axes: it sits outside, right of the plot (`add_legend`), so it
    can never cover data, however many series there are (the held-out plot, one series named
    by its title and y label, has none);
  - series get distinct styles from `style(i)`: the ten colours of the qualitative `tab10`
    palette, then the same colours again with another line style (bars: another hatch), so two
    series never look alike (unique up to 40 series); marker shapes vary too;
  - the hyperparameter surface, with ~20 keys, is a heatmap with one labelled row per key
    (see `hparams` for why);
  - series with identical values on every step are drawn once, labelled "a = b", instead of
    hiding one under the other;
  - the x axis is the outer step with integer ticks only (a one-step run gets one tick, not
    0.945 … 1.050); y labels name the quantity and its unit.
Missing values leave gaps; values that exist only on some steps (held-out reward) are drawn as
points joined in step order.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ait.report.metrics import series

Rows = list[dict[str, Any]]

TAB10 = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
         "#17becf")
"""matplotlib's qualitative `tab10` palette (spelled out so the styles do not depend on rcParams)."""
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v")
HATCHES = ("", "//", "..", "xx")


def style(i: int) -> dict[str, Any]:
    """The i-th series' colour, line style, marker and size: tab10's ten colours, then the ten
    again with the next line style (colour + line style distinct for the first 40 series); the
    marker shape also changes with i (for readers who do not tell the colours apart), and each
    series is drawn a little thinner and smaller than the one before, so where two meet the
    earlier one still shows round the later (concentric markers, a wider line beneath)."""
    cycle = (i // len(TAB10)) % len(LINESTYLES)
    return {"color": TAB10[i % len(TAB10)], "linestyle": LINESTYLES[cycle], "marker": MARKERS[i % len(MARKERS)],
            "markersize": max(3.5, 7.0 - 1.5 * i), "linewidth": max(1.2, 2.2 - 0.4 * i)}


@dataclass
class Plot:
    name: str
    """File-name part: <stem>-<name>.png."""
    title: str
    caption: str
    png: bytes | None = None
    """None when there was nothing to plot (see `empty`)."""
    empty: str = ""
    """Why nothing was drawn, as one sentence for the HTML; "" when drawn."""
    notes: list[str] = field(default_factory=list)
    """Sentences added under the caption (series left out for lack of data, merged identical series, ...)."""
    figure: Any = field(default=None, repr=False, compare=False)
    """The matplotlib Figure the PNG was rendered from (tests inspect where its legends are)."""


class Nothing(Exception):
    """Raised by a draw function when the run has nothing for that plot; the message says why."""


def new_figure(height: float = 3.4):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise RuntimeError("the report's plots need matplotlib (a base dependency): pip install 'matplotlib>=3.8'") from e
    fig = Figure(figsize=(8.6, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.grid(True, alpha=0.3)
    return fig, ax


def _step_axis(ax, steps: list[float]) -> None:
    """x = outer step, integer ticks only; every step is a tick when there are at most 16."""
    from matplotlib.ticker import FixedLocator, MaxNLocator

    ax.set_xlabel("outer step")
    unique = sorted(set(steps))
    if not unique:
        return
    pad = 1.0 if len(unique) == 1 else 0.6
    ax.set_xlim(unique[0] - pad, unique[-1] + pad)
    if len(unique) <= 16 and all(float(s).is_integer() for s in unique):
        ax.xaxis.set_major_locator(FixedLocator(unique))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def add_legend(fig, ax, handles=None, labels=None) -> None:
    """The legend outside the axes, right of the plot (constrained layout makes room for it); also
    for one series, whose label may name several merged ones (mean = max)."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right upper", fontsize=8, frameon=False)


def to_png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _values(rows: Rows, key: str) -> list[float]:
    """One value per row, NaN where the key is missing or null."""
    return [math.nan if row.get(key) is None else float(row[key]) for row in rows]


def _same(a: list[float], b: list[float]) -> bool:
    return all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b))


def _lines(ax, rows: Rows, keys: list[tuple[str, str]], notes: list[str]) -> list[list[float]]:
    """Draw each key as a line, NaN gaps where a row lacks it; keys with no value at all are left
    out (and named in `notes`); keys whose values are identical on every step become one line
    labelled "a = b". Returns the drawn y values."""
    xs = [row["step"] for row in rows]
    groups: list[tuple[list[str], list[float]]] = []
    missing = []
    for key, label in keys:
        ys = _values(rows, key)
        if all(math.isnan(y) for y in ys):
            missing.append(label)
            continue
        for group in groups:
            if _same(group[1], ys):
                group[0].append(label)
                break
        else:
            groups.append(([label], ys))
    for i, (labels, ys) in enumerate(groups):
        s = style(i)
        count = sum(not math.isnan(y) for y in ys)
        ax.plot(xs, ys, label="\n= ".join(labels), color=s["color"], linestyle=s["linestyle"],
                marker=s["marker"] if count < 40 else None, markersize=s["markersize"] * (1 if count <= 12 else 0.65),
                linewidth=s["linewidth"])
        if len(labels) > 1:
            notes.append(f"{_upper(_and(labels))} have the same value on every step: drawn as one line.")
    if missing:
        notes.append(f"Not drawn, no value on any step: {_and(missing)}.")
    return [ys for _, ys in groups]


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _upper(text: str) -> str:
    return text[:1].upper() + text[1:]


def _steps(n: int) -> str:
    return f"{n} step{'' if n == 1 else 's'}"


def _all_zero(rows: Rows, keys: tuple[str, ...]) -> bool:
    values = [v for key in keys for _, v in series(rows, key)]
    return bool(values) and all(v == 0 for v in values)


def _has(rows: Rows, keys: tuple[str, ...]) -> bool:
    return any(series(rows, key) for key in keys)


def reward(rows: Rows, notes: list[str]):
    if not _has(rows, ("reward_mean", "validation", "job_quality", "speed")):
        raise Nothing("no step recorded a reward")
    fig, ax = new_figure()
    xs = [row["step"] for row in rows]
    mean, std = _values(rows, "reward_mean"), _values(rows, "reward_std")
    if not all(math.isnan(m) for m in mean):
        count = sum(not math.isnan(m) for m in mean)
        ax.plot(xs, mean, label="reward (mean)", color="black", linewidth=2.4, marker="o" if count < 40 else None,
                markersize=4, zorder=3)
        if count == 1:  # a band needs two steps: one step gets an error bar
            step, m, s = next((x, m, s) for x, m, s in zip(xs, mean, std) if not math.isnan(m))
            if not math.isnan(s):
                ax.errorbar([step], [m], yerr=[s], color="black", alpha=0.4, capsize=6, linewidth=0,
                            elinewidth=6, label="reward ± 1 std (episodes)")
        elif any(not math.isnan(m) and not math.isnan(s) for m, s in zip(mean, std)):
            ax.fill_between(xs, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                            color="black", alpha=0.1, linewidth=0, label="reward ± 1 std (episodes)")
    _lines(ax, rows, [("validation", "validation"), ("job_quality", "job quality"), ("speed", "train speed")],
           notes)
    ax.axhline(0, color="grey", linewidth=0.8, zorder=1)
    ax.set_ylabel("reward (unitless)")
    _step_axis(ax, xs)
    add_legend(fig, ax)
    return fig


def heldout(rows: Rows, notes: list[str]):
    points = series(rows, "heldout_reward")
    if not points:
        raise Nothing("no held-out evaluation in this run")
    fig, ax = new_figure()
    # The starting policy's evaluation (step 0) is what transfer is measured against: draw it too.
    start = next((row["heldout_start_reward"] for row in reversed(rows) if row.get("heldout_start_reward") is not None), None)
    if start is not None and all(x != 0 for x, _ in points):
        points = [(0, start), *points]
    xs, ys = zip(*points)
    ax.plot(xs, ys, marker="o", color=TAB10[4], linewidth=1.6)
    if start is not None:
        ax.scatter([0], [start], marker="s", s=60, facecolor="white", edgecolor=TAB10[4], zorder=3,
                   label="starting policy (step 0)")
        add_legend(fig, ax)
    sizes = {int(row["heldout_n"]) for row in rows
             if row.get("heldout_reward") is not None and row.get("heldout_n") is not None}
    if len(sizes) == 1:
        n = sizes.pop()
        notes.append(f"Each evaluation ran {n} held-out episode{'s' if n != 1 else ''}.")
    elif len(points) <= 20:  # sizes differ: say so at each point
        for row in rows:
            if row.get("heldout_reward") is not None and row.get("heldout_n") is not None:
                ax.annotate(f"n={int(row['heldout_n'])}", (row["step"], row["heldout_reward"]),
                            textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    ax.margins(y=0.2)
    ax.set_ylabel("mean held-out reward")
    _step_axis(ax, ([0] if start is not None else []) + [row["step"] for row in rows])  # the run's steps (and step 0)
    return fig


def outcomes(rows: Rows, notes: list[str]):
    keys = ("valid_rate", "post_mean", "uplift_mean")
    if not _has(rows, keys):
        raise Nothing("no job outcome recorded")
    if _all_zero(rows, ("valid_rate",)) and not _has(rows, ("post_mean", "uplift_mean")):
        raise Nothing("no episode submitted a valid job on any step (valid rate 0), so no job was scored")
    fig, ax = new_figure()
    _lines(ax, rows, [("valid_rate", "valid-job rate"), ("post_mean", "post (hidden-eval score)"),
                      ("uplift_mean", "uplift (post − best untrained)")], notes)
    ax.axhline(0, color="grey", linewidth=0.8, zorder=1)
    ax.set_ylabel("fraction / score (0–1)")
    _step_axis(ax, [row["step"] for row in rows])
    add_legend(fig, ax)
    return fig


def base_models(rows: Rows, notes: list[str]):
    """Stacked bars, one per step: discrete steps drawn as steps (a stacked area would
    interpolate between them and smear the first and last step)."""
    shares = [(row["step"], row["base_model_share"]) for row in rows if row.get("base_model_share")]
    if not shares:
        raise Nothing("no scored job in this run, so no base-model choice")
    fig, ax = new_figure()
    models = sorted({m for _, share in shares for m in share},
                    key=lambda m: (-sum(s.get(m, 0.0) for _, s in shares), m))
    xs = [step for step, _ in shares]
    many = len(xs) > 40  # bars touch, without white edges that would stripe the plot
    bottom = [0.0] * len(xs)
    for i, model in enumerate(models):
        ys = [share.get(model, 0.0) for _, share in shares]
        s = style(i)
        ax.bar(xs, ys, bottom=bottom, width=1.0 if many else 0.8, color=s["color"], alpha=0.9, label=model,
               hatch=HATCHES[(i // len(TAB10)) % len(HATCHES)], edgecolor="white", linewidth=0 if many else 0.5)
        bottom = [b + y for b, y in zip(bottom, ys)]
    skipped = [row["step"] for row in rows if not row.get("base_model_share")]
    if skipped:
        notes.append(f"No scored job on step{'s' if len(skipped) > 1 else ''} "
                     f"{', '.join(f'{s:g}' for s in skipped)}: no bar.")
    ax.set_ylim(0, max(1.0, max(bottom)))
    ax.set_ylabel("fraction of scored jobs")
    _step_axis(ax, [row["step"] for row in rows])
    if len(models) == 1:
        notes.append(f"Every scored job used {models[0]}.")
    add_legend(fig, ax)
    return fig


def hparams(rows: Rows, notes: list[str]):
    """A heatmap, one labelled row per job.toml key, one column per outer step, the cell's shade
    (and, for up to 16 steps, its printed percentage) the fraction of that step's jobs that set
    the key beyond the template default.

    Why a heatmap and not lines: the runs have ~20 keys whose fractions sit mostly at exactly
    0 or 1, so lines stack on top of each other at 0 and 1 and need a legend taller than the
    plot, with colours that repeat after ten. A heatmap gives every key its own row, named on
    the axis (no colour matching), and shows a change as a change of shade in that row.
    Rows are sorted by mean use over the run, most used first (ties by name), so the keys the
    agent always sets sit together on top and the ones it varies stand out below them. Keys no
    job set on any step are not given a row (a block of empty rows says less than a list): the
    note under the plot names them. A step with no job run is a grey column."""
    used = [(row["step"], row["hparam_use"]) for row in rows if row.get("hparam_use")]
    if not used:
        raise Nothing("no job ran in this run, so no job.toml keys to count")
    keys = sorted({k for _, use in used for k in use})
    never = [k for k in keys if all(use.get(k, 0.0) == 0 for _, use in used)]
    keys = [k for k in keys if k not in never]
    if not keys:
        raise Nothing(f"no job set any optional job.toml key beyond the template default ({len(never)} keys counted)")
    steps = [row["step"] for row in rows]
    nan = math.nan
    grid = {k: [nan if not row.get("hparam_use") else row["hparam_use"].get(k, 0.0) for row in rows] for k in keys}

    def mean_use(k: str) -> float:
        values = [v for v in grid[k] if not math.isnan(v)]
        return sum(values) / len(values)

    keys.sort(key=lambda k: (-mean_use(k), k))
    from matplotlib.colors import LinearSegmentedColormap

    fig, ax = new_figure(height=max(2.2, 1.1 + 0.27 * len(keys)))
    ax.grid(False)
    cmap = LinearSegmentedColormap.from_list("use", ["#f7fbff", "#08519c"]).with_extremes(bad="#d9d9d9")
    data = [grid[k] for k in keys]
    image = ax.imshow(data, aspect="auto", cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.set_yticks(range(len(keys)), keys, fontsize=8)
    ax.set_ylabel("job.toml key (most used first)")
    ax.set_xlabel("outer step")
    every = max(1, math.ceil(len(steps) / 16))
    ticks = list(range(0, len(steps), every))
    ax.set_xticks(ticks, [f"{steps[i]:g}" for i in ticks])
    ax.tick_params(length=0)
    if len(steps) <= 40:  # white lines between cells (more columns than that would be stripes)
        ax.set_xticks([i + 0.5 for i in range(len(steps) - 1)], minor=True)
    ax.set_yticks([i + 0.5 for i in range(len(keys) - 1)], minor=True)
    ax.grid(True, which="minor", color="white", linewidth=1)
    ax.tick_params(which="minor", length=0)
    if len(steps) <= 16:
        for r, k in enumerate(keys):
            for c, v in enumerate(grid[k]):
                if not math.isnan(v):
                    ax.text(c, r, f"{v:.0%}", ha="center", va="center", fontsize=7,
                            color="white" if v > 0.55 else "black")
    bar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    bar.set_label("fraction of the step's jobs setting the key", fontsize=8)
    bar.ax.yaxis.set_major_formatter(_percent())
    if never:
        notes.append(f"Set by no job on any step ({len(never)}): {_and(never)}.")
    if any(math.isnan(v) for v in grid[keys[0]]):
        notes.append("Grey: no job ran that step.")
    return fig


def _percent():
    from matplotlib.ticker import PercentFormatter

    return PercentFormatter(xmax=1.0, decimals=0)


def cost(rows: Rows, notes: list[str]):
    points = series(rows, "usd")
    if not points:
        raise Nothing("no step recorded its cost")
    if all(y == 0 for _, y in points):
        raise Nothing(f"every step recorded USD 0.00 ({_steps(len(points))}): nothing in this run was priced")
    fig, ax = new_figure()
    xs, ys = zip(*points)
    ax.bar(xs, ys, color=TAB10[1], alpha=0.75, width=0.8, label="USD per step (bars, left axis)")
    ax.set_ylabel("USD per step")
    twin = ax.twinx()
    running, cumulative = 0.0, []
    for y in ys:
        running += y
        cumulative.append(running)
    twin.plot(xs, cumulative, color=TAB10[3], marker="o" if len(xs) < 40 else None, markersize=4,
              label="cumulative USD (line, right axis)")
    twin.set_ylabel("cumulative USD")
    ax.set_ylim(bottom=0)
    twin.set_ylim(bottom=0)
    _step_axis(ax, [row["step"] for row in rows])
    handles, labels = ax.get_legend_handles_labels()
    more, more_labels = twin.get_legend_handles_labels()
    add_legend(fig, ax, handles + more, labels + more_labels)
    return fig


def staleness(rows: Rows, notes: list[str]):
    keys = ("staleness_mean", "staleness_max")
    if not _has(rows, keys):
        raise Nothing("no step recorded staleness")
    if _all_zero(rows, keys):
        raise Nothing("every group was trained on-policy (staleness 0 on every step)")
    fig, ax = new_figure()
    _lines(ax, rows, [("staleness_mean", "mean over groups"), ("staleness_max", "max over groups")], notes)
    ax.set_ylabel("optimizer steps off-policy")
    _step_axis(ax, [row["step"] for row in rows])
    add_legend(fig, ax)
    return fig


PLOTS: list[tuple[str, str, str, Callable[[Rows, list[str]], Any]]] = [
    ("reward", "Reward and its components",
     ("Mean episode reward per outer step (band: ± one standard deviation across episodes) with the unweighted "
      "means of its terms: validation, job quality and train speed."), reward),
    ("heldout", "Held-out reward",
     "Mean reward on the held-out family (never trained on), on the steps it was evaluated.", heldout),
    ("outcomes", "Job outcomes", ("Fraction of episodes whose job was valid; mean hidden-eval post score and "
                                  "uplift (post − best untrained score) of the scored jobs."), outcomes),
    ("base_models", "Base-model choice", "Fraction of each step's scored jobs per base model the agent chose.",
     base_models),
    ("hparams", "Hyperparameter surface",
     "Fraction of each step's jobs that set each optional job.toml key beyond the template default.", hparams),
    ("cost", "Cost", "USD spent per outer step (agent sampling, inner jobs, training) and the running total.",
     cost),
    ("staleness", "Staleness", ("How many optimizer steps behind the trained policy the groups of a step were "
                                "sampled."), staleness),
]


def render_plots(rows: Rows) -> list[Plot]:
    """Every plot, in report order: those with data as PNG bytes, the others with `empty` saying why."""
    out = []
    for name, title, caption, draw in PLOTS:
        notes: list[str] = []
        try:
            fig = draw(rows, notes)
        except Nothing as e:
            out.append(Plot(name=name, title=title, caption=caption, empty=str(e)))
            continue
        fig.axes[0].set_title(title, fontsize=11)
        out.append(Plot(name=name, title=title, caption=caption, png=to_png(fig), notes=notes, figure=fig))
    return out
