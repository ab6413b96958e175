"""`ait report`: a synthetic metrics.jsonl becomes a self-contained HTML page with its plots and
summary numbers; missing and null values are tolerated; bad input is a clear error."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys

import pytest

try:
    import matplotlib  # noqa: F401
    HAVE_MPL = True
except ImportError:
    HAVE_MPL = False
needs_matplotlib = pytest.mark.skipif(not HAVE_MPL, reason="the report's plots need matplotlib: pip install 'ait[report]'")

from typer.testing import CliRunner

from ait.cli import app
from ait.report import MetricsError, ReportError, load_metrics, summarize, write_report

if HAVE_MPL:
    from ait.report.plots import render_plots, style

PNG = b"\x89PNG\r\n\x1a\n"


def rows() -> list[dict]:
    out = []
    for step in range(1, 7):
        row = {"step": step, "time": 1000.0 + 60 * step, "seconds": 60.0, "reward_mean": 0.1 * step,
               "reward_std": 0.05, "validation": 0.5 + 0.05 * step, "job_quality": 0.05 * step, "speed": 0.4,
               "post_mean": 0.3 + 0.02 * step, "uplift_mean": 0.01 * step, "valid_rate": 0.5 + 0.05 * step,
               "base_model_share": {"Qwen/Qwen3-0.6B": 1 - 0.1 * step, "Qwen/Qwen3-1.7B": 0.1 * step},
               "hparam_use": {"lora": 0.5, "beta": 0.1 * step}, "staleness_mean": 0.5, "staleness_max": 1,
               "resampled_groups": 0, "timed_out": 1 if step == 3 else 0, "policy_tokens": 1000,
               "train_tokens": 800, "loss": -0.01, "usd": 1.25}
        if step % 3 == 0:
            row.update(heldout_reward=0.2 + 0.05 * step, heldout_n=20)
        out.append(row)
    out[1]["reward_mean"] = None  # a step whose reward was not computed
    del out[4]["usd"]             # a step that did not report its cost
    out[5]["reward_mean"] = 0.45  # best is step 5 (0.5)
    out[4]["stop_share"] = {"job_done": 0.5, "stuck": 0.5}  # rows from before the key have none
    out[5]["stop_share"] = {"job_done": 0.75, "turn_cap": 0.25}
    return out


def write(run_dir, lines: list[str], trailing_newline: bool = True) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + ("\n" if trailing_newline else ""))


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run-1"
    write(d, [json.dumps(r) for r in rows()])
    return d


def test_summary_numbers(run_dir) -> None:
    summary = summarize(load_metrics(run_dir / "metrics.jsonl"))
    assert summary["steps"] == 6 and summary["first_step"] == 1 and summary["last_step"] == 6
    assert summary["reward_first"] == pytest.approx(0.1) and summary["reward_last"] == pytest.approx(0.45)
    assert summary["reward_best"] == pytest.approx(0.5) and summary["reward_best_step"] == 5
    assert summary["heldout_first"] == pytest.approx(0.35) and summary["heldout_last"] == pytest.approx(0.5)
    assert summary["heldout_evals"] == 2
    assert summary["usd_total"] == pytest.approx(1.25 * 5)  # the step without usd counts as unknown, not 0
    assert summary["policy_tokens"] == 6000 and summary["train_tokens"] == 4800 and summary["timed_out"] == 1
    assert summary["base_model_share_last"] == pytest.approx({"Qwen/Qwen3-0.6B": 0.4, "Qwen/Qwen3-1.7B": 0.6})
    assert summary["stop_share_last"] == {"job_done": 0.75, "turn_cap": 0.25}


@needs_matplotlib
def test_html_report_embeds_plots_and_writes_pngs(run_dir, tmp_path) -> None:
    path, _ = write_report(run_dir, tmp_path / "out" / "report.html")
    html = path.read_text()
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html)
    names = ["reward", "heldout", "outcomes", "base_models", "hparams", "cost", "staleness"]
    assert len(images) == len(names)
    assert all(base64.b64decode(i).startswith(PNG) for i in images)
    for name in names:
        png = tmp_path / "out" / f"report-{name}.png"
        assert png.read_bytes().startswith(PNG)
        assert base64.b64encode(png.read_bytes()).decode() in images  # the same image, embedded
    for text in ("Reward and its components", "Held-out reward", "Base-model choice", "Cost", "Staleness",
                 "$6.25", "0.100", "0.450", "0.500", "6,000", "4,800", "Qwen/Qwen3-1.7B 60%"):
        assert text in html, text
    assert "Nothing to plot" not in html
    assert "http://" not in html and "https://" not in html and "<script" not in html  # opens offline


@needs_matplotlib
def test_default_output_is_outside_the_run_dir(run_dir, tmp_path, monkeypatch) -> None:
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    path, _ = write_report(run_dir)
    assert path == elsewhere / "report-run-1.html" and path.is_file()
    assert (elsewhere / "report-run-1-reward.png").is_file()
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before  # nothing added to the run
    # From inside the run, the default would land in it: refused, and still nothing added.
    monkeypatch.chdir(run_dir)
    with pytest.raises(ReportError, match="inside"):
        write_report(".")
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before
    # --out pointing into the run is the one way to write there; a directory gets report-<run>.html.
    path, _ = write_report(run_dir, run_dir)
    assert path == run_dir / "report-run-1.html" and path.is_file()


@needs_matplotlib
def test_sparse_rows_still_report(tmp_path) -> None:
    d = tmp_path / "sparse"
    write(d, [json.dumps({"step": 0, "reward_mean": 0.1}), "", json.dumps({"reward_mean": None, "usd": None}),
              json.dumps({"reward_mean": float("nan"), "base_model_share": None})])
    path, summary = write_report(d, tmp_path / "elsewhere" / "r.html")
    assert summary["steps"] == 3 and summary["reward_last"] == 0.1 and summary["usd_total"] is None
    assert [r["step"] for r in load_metrics(d / "metrics.jsonl")] == [0, 1, 2]  # missing steps are numbered on
    html = path.read_text()
    assert html.count("data:image/png;base64,") == 1  # only the reward plot has data
    assert (tmp_path / "elsewhere" / "r-reward.png").is_file() and not (d / "report.html").exists()
    assert html.count("Nothing to plot:") == 6


@needs_matplotlib
def test_empty_series_are_not_drawn_and_the_html_says_so(tmp_path) -> None:
    out = []
    for r in rows():
        r = {k: v for k, v in r.items() if not k.startswith("heldout")}  # no held-out evaluation at all
        r.update(usd=None, post_mean=None)                                # cost and post: null on every step
        out.append(r)
    d = tmp_path / "run"
    write(d, [json.dumps(r) for r in out])
    path, _ = write_report(d, tmp_path / "r.html")
    html = path.read_text()
    assert "Nothing to plot: no held-out evaluation in this run." in html
    assert "Nothing to plot: no step recorded its cost." in html
    assert html.count("data:image/png;base64,") == 5
    assert not (tmp_path / "r-heldout.png").exists() and not (tmp_path / "r-cost.png").exists()
    # Within a plot, a key with no value on any step gets no line, and the caption names it.
    outcomes = {p.name: p for p in render_plots(load_metrics(d / "metrics.jsonl"))}["outcomes"]
    labels = [line.get_label() for line in outcomes.figure.axes[0].get_lines()]
    assert not any(label.startswith("post") for label in labels) and any("valid" in label for label in labels)
    assert "Not drawn, no value on any step: post (hidden-eval score)." in html
    # All zero where zero is the whole story (no cost, no staleness) is a sentence, not a flat chart.
    for r in out:
        r.update(usd=0.0, staleness_mean=0.0, staleness_max=0)
    write(d, [json.dumps(r) for r in out])
    html = write_report(d, tmp_path / "z.html")[0].read_text()
    assert "Nothing to plot: every step recorded USD 0.00 (6 steps)" in html
    assert "Nothing to plot: every group was trained on-policy" in html


def many_keys_rows(keys: int = 20, steps: int = 8) -> list[dict]:
    """A run whose jobs set many job.toml keys: some always, some sometimes, some never."""
    out = []
    for step in range(1, steps + 1):
        use = {f"key_{k:02d}": (1.0 if k < 6 else 0.0 if k >= keys - 4 else ((step + k) % 4) / 3) for k in range(keys)}
        out.append({"step": step, "reward_mean": 0.1, "hparam_use": use,
                    "base_model_share": {f"model-{m:02d}": 1 / 12 for m in range(12)}})
    return out


@needs_matplotlib
def test_hparam_surface_is_a_heatmap_with_one_row_per_key() -> None:
    rows_ = many_keys_rows()
    plot = {p.name: p for p in render_plots(rows_)}["hparams"]
    ax = plot.figure.axes[0]
    images = ax.get_images()
    assert len(images) == 1
    grid = images[0].get_array()
    ever = [f"key_{k:02d}" for k in range(16)]        # keys 16..19 are never set
    assert grid.shape == (len(ever), len(rows_))      # one row per key set on some step, one column per step
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert sorted(labels) == ever and len(set(labels)) == len(labels)
    assert labels[:6] == [f"key_{k:02d}" for k in range(6)]  # always set: on top, by name
    assert not ax.get_legend() and not plot.figure.legends
    assert any("key_16, key_17, key_18 and key_19" in n for n in plot.notes)  # never set: named in the note
    assert ax.get_ylabel() and ax.get_xlabel() == "outer step"


def _overlaps(fig) -> list[str]:
    """Legends (axes' or the figure's) that overlap an axes' drawing area, in display pixels."""
    renderer = fig.canvas.get_renderer()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    bad = []
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            if box.overlaps(ax.get_window_extent(renderer)):
                bad.append(f"legend {[t.get_text() for t in legend.get_texts()]} over axes {ax.get_label()!r}")
    return bad


@needs_matplotlib
def test_legends_lie_outside_the_axes_and_styles_are_distinct(run_dir) -> None:
    plots = render_plots(load_metrics(run_dir / "metrics.jsonl")) + render_plots(many_keys_rows())
    with_legend = 0
    for plot in plots:
        if plot.figure is None:
            continue
        plot.figure.canvas.draw()
        assert _overlaps(plot.figure) == [], plot.name
        with_legend += bool(plot.figure.legends)
        assert plot.figure.axes[0].get_xlabel() == "outer step" and plot.figure.axes[0].get_ylabel(), plot.name
    assert with_legend >= 5  # reward, outcomes, base models (twice), cost, staleness
    # Series never share a look: 40 distinct (colour, line style), the first ten colours all different.
    looks = [(s["color"], s["linestyle"]) for s in map(style, range(40))]
    assert len(set(looks)) == 40 and len({s["color"] for s in map(style, range(10))}) == 10
    # Twelve base models, more than the palette's ten colours: still twelve distinct bar looks.
    bars = {p.name: p for p in plots[-7:]}["base_models"].figure.axes[0].containers
    assert len({(c.patches[0].get_facecolor(), c.patches[0].get_hatch()) for c in bars}) == 12


@needs_matplotlib
def test_identical_series_are_drawn_once_and_one_step_has_integer_ticks(tmp_path) -> None:
    rows_ = [{"step": 1, "reward_mean": -0.1, "reward_std": 0.0, "validation": 0.0, "job_quality": 0.0, "speed": 0.0,
              "staleness_mean": 1.0, "staleness_max": 1}]
    plots = {p.name: p for p in render_plots(rows_)}
    labels = [line.get_label() for line in plots["staleness"].figure.axes[0].get_lines()]
    assert labels == ["mean over groups\n= max over groups"]
    reward_labels = [line.get_label() for line in plots["reward"].figure.axes[0].get_lines()]
    assert "validation\n= job quality\n= train speed" in reward_labels
    ticks = plots["reward"].figure.axes[0].get_xticks()
    assert list(ticks) == [1.0]  # not 0.945 … 1.050


def test_bad_input_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(MetricsError, match="metrics.jsonl not found"):
        load_metrics(tmp_path / "none" / "metrics.jsonl")
    good = json.dumps({"step": 1, "reward_mean": 0.1})
    cases = {"not-json": ([good, "{oops", good], r"metrics.jsonl:2: not JSON"),
             "list": ([good, good, "[1, 2]"], r"metrics.jsonl:3: expected a JSON object, got list"),
             "type": ([json.dumps({"step": 1, "usd": "1.00"})], r"metrics.jsonl:1: usd should be a number"),
             "share": ([json.dumps({"base_model_share": ["a"]})], r"metrics.jsonl:1: base_model_share should be")}
    for name, (lines, message) in cases.items():
        write(tmp_path / name, lines)
        with pytest.raises(MetricsError, match=message):
            load_metrics(tmp_path / name / "metrics.jsonl")
    # A run still writing leaves a half line at the end, without its newline: skipped with a warning.
    write(tmp_path / "writing", [good, '{"step": 2, "rew'], trailing_newline=False)
    warnings: list[str] = []
    assert len(load_metrics(tmp_path / "writing" / "metrics.jsonl", warnings)) == 1
    assert len(warnings) == 1 and ":2: incomplete last line" in warnings[0]


@needs_matplotlib
def test_cli(run_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["report", str(run_dir), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["steps"] == 6 and summary["report"] == str(tmp_path / "report-run-1.html")
    assert not (run_dir / "report.html").exists()
    result = runner.invoke(app, ["report", str(run_dir), "--out", str(tmp_path / "x.html")])
    assert result.exit_code == 0 and "6 steps" in result.stdout and (tmp_path / "x.html").is_file()


def ait_report(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ait.cli", "report", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "COLUMNS": "80"}, timeout=120)


@needs_matplotlib
def test_cli_errors_are_one_line_without_a_traceback(run_dir, tmp_path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    (tmp_path / "empty-run").mkdir()
    write(tmp_path / "no-rows", [])
    (tmp_path / "episodes-only").mkdir()
    (tmp_path / "episodes-only" / "episodes.json").write_text("{}")
    deep = "very-long-directory-name-" * 4
    cases = {
        "unwritable --out": ([str(run_dir), "--out", str(a_file / deep / "r.html")], "is a file, not a directory"),
        "missing run": ([str(tmp_path / "missing")], "does not exist"),
        "empty run dir": ([str(tmp_path / "empty-run")], "has no metrics.jsonl (it is empty)"),
        "no metrics": ([str(tmp_path / "episodes-only")], "has no metrics.jsonl (it holds episodes.json)"),
        "no rows": ([str(tmp_path / "no-rows")], "has no rows yet"),
        "run dir is cwd": ([str(run_dir)], "inside"),
    }
    before = sorted(run_dir.rglob("*"))
    for name, (args, message) in cases.items():
        proc = ait_report(*args, cwd=run_dir if name == "run dir is cwd" else tmp_path)
        assert proc.returncode == 2, (name, proc.returncode, proc.stderr)  # through `fail`, not a crash
        assert "Traceback" not in proc.stderr and "AIT_DEBUG" not in proc.stderr, (name, proc.stderr)
        assert proc.stderr.startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1, (name, proc.stderr)
        assert message in proc.stderr, (name, proc.stderr)
    assert sorted(run_dir.rglob("*")) == before


def family_run(tmp_path, steps: int = 2):
    """A run whose rows carry `families` (ait.outer.metrics.family_figures), two families a step."""
    out = []
    for step in range(1, steps + 1):
        families = {
            "ledger": {"episodes": 4, "valid_rate": 0.75, "job_quality_mean": 0.3, "job_quality_std": 0.2236,
                       "configs": [{"base_model": "tiny", "learning_rate": 1e-05, "max_steps": 1, "count": 2},
                                   {"base_model": "Qwen/Qwen3-0.6B", "learning_rate": 3e-06, "max_steps": 50,
                                    "count": 1}],
                       "distinct_configs": 2},
            "dispatch" if step % 2 else "multi_hop": {"episodes": 2, "valid_rate": 0.0, "job_quality_mean": 0.0,
                                                      "job_quality_std": float("nan"), "configs": [],
                                                      "distinct_configs": 0},
        }
        out.append({"step": step, "reward_mean": 0.1 * step, "usd": 0.5, "families": families})
    write(tmp_path / "fam-run", [json.dumps(r) for r in out])  # json writes NaN: read as missing
    return tmp_path / "fam-run"


def test_per_family_rows_and_html_section(tmp_path) -> None:
    from ait.report.html import render_html
    from ait.report.metrics import family_rows

    loaded = load_metrics(family_run(tmp_path) / "metrics.jsonl")
    fam = family_rows(loaded)
    assert [(r["step"], r["family"]) for r in fam] == [(1, "dispatch"), (1, "ledger"), (2, "ledger"), (2, "multi_hop")]
    assert fam[1]["valid_rate"] == 0.75 and fam[1]["distinct_configs"] == 2 and fam[0]["job_quality_std"] is None
    summary = summarize(loaded)
    assert summary["family_rows"] == fam
    html = render_html(tmp_path / "fam-run", loaded, summary, [], [])
    section = html[html.index("<h2>Per family</h2>"):html.index("<h2>Per step</h2>")]
    assert section.count("<tr>") == 1 + 4  # the header and one row per (step, family)
    assert "<td>ledger</td><td>4</td><td>0.750</td><td>0.300</td><td>0.224</td><td>2</td>" in section
    assert "tiny lr 1e-05 1 steps ×2; Qwen/Qwen3-0.6B lr 3e-06 50 steps ×1" in section
    # A run from before `families` has no such section, and no rows.
    old = load_metrics(tmp_path / "fam-run" / "metrics.jsonl")
    for row in old:
        del row["families"]
    assert summarize(old)["family_rows"] == []
    assert "Per family" not in render_html(tmp_path / "fam-run", old, summarize(old), [], [])
    write(tmp_path / "bad", [json.dumps({"step": 1, "families": {"ledger": {"valid_rate": "high"}}})])
    with pytest.raises(MetricsError, match="families.ledger.valid_rate should be a number"):
        load_metrics(tmp_path / "bad" / "metrics.jsonl")
    write(tmp_path / "bad2", [json.dumps({"step": 1, "families": {"ledger": {"configs": "tiny"}}})])
    with pytest.raises(MetricsError, match="families.ledger.configs should be a list"):
        load_metrics(tmp_path / "bad2" / "metrics.jsonl")


@needs_matplotlib
def test_cli_shows_the_per_family_table(tmp_path, monkeypatch) -> None:
    run = family_run(tmp_path, steps=12)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(app, ["report", str(run), "--json"])
    assert result.exit_code == 0, result.output
    rows_ = json.loads(result.stdout)["family_rows"]
    assert len(rows_) == 24 and rows_[0] == {"step": 1, "family": "dispatch", "episodes": 2, "valid_rate": 0.0,
                                             "job_quality_mean": 0.0, "job_quality_std": None, "configs": [],
                                             "distinct_configs": 0}
    from ait.cli import report as report_cli
    from ait.cli.common import console

    with console.capture() as captured:
        console.width = 200
        console.print(report_cli.family_table(rows_))
    text = captured.get()
    assert "per family (last 10 of 12 steps)" in text
    lines = [line for line in text.splitlines() if "ledger" in line]
    assert len(lines) == 10 and all("0.750" in line and "tiny lr 1e-05 1 steps ×2" in line for line in lines)
    assert not any(line.split("│")[1].strip() in ("1", "2") for line in lines)  # steps 1-2 left to the HTML
    result = CliRunner().invoke(app, ["report", str(run), "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 0 and "per family" in result.stdout and "multi_hop" in result.stdout
    assert "Per family" in (tmp_path / "r.html").read_text()


def test_cli_help_explains_where_it_writes(tmp_path) -> None:
    proc = ait_report("--help", cwd=tmp_path)
    text = " ".join(proc.stdout.replace("│", " ").split())
    assert proc.returncode == 0
    for phrase in ("--out", "--json", "./report-<run name>.html in the current directory",
                   "never inside RUN_DIR unless --out points there"):
        assert phrase in text, phrase


def test_wall_time_is_the_runs_span_not_the_sum_of_its_steps() -> None:
    """Steps of 10 s each, 60 s apart (agent sampling, a machine's restart between them): the run took
    from the first step's start to the last one's end, 10 + 2 * 60 = 130 s, not 30 s."""
    steps = [{"step": i, "time": 1000.0 + 60 * i, "seconds": 10.0, "reward_mean": 0.0} for i in range(3)]
    summary = summarize(steps)
    assert summary["seconds_total"] == 30.0 and summary["seconds_span"] == 130.0
    assert summarize([{"step": 0, "reward_mean": 0.0}])["seconds_span"] is None


def test_heldout_plot_draws_the_starting_policy_at_step_0() -> None:
    """Transfer is measured against the step-0 evaluation: the held-out chart must show it, not only the
    summary table (before, a run evaluated at steps 0 and 2 drew one lone point at step 2)."""
    from ait.report import plots

    rows = [{"step": 1, "heldout_start_reward": 0.25},
            {"step": 2, "heldout_reward": 0.4, "heldout_n": 16, "heldout_start_reward": 0.25}]
    fig = plots.heldout(rows, [])
    line = fig.axes[0].lines[0]
    assert list(line.get_xdata()) == [0, 2] and list(line.get_ydata()) == [0.25, 0.4]


def test_seconds_by_phase_table_and_bad_phases(tmp_path) -> None:
    from ait.report.html import render_html

    write(tmp_path / "run", [json.dumps({"step": 1, "seconds": 300.0, "seconds_by_phase": {
        "checkpoint": 0.0, "wait_groups": 250.0, "train_step": 40.4, "heldout": 0.0}}),
        json.dumps({"step": 2, "seconds": 200.0, "seconds_by_phase": {
            "checkpoint": 3.25, "wait_groups": 150.0, "train_step": 41.0, "heldout": 0.0}})])
    rows = load_metrics(tmp_path / "run" / "metrics.jsonl")
    html = render_html(tmp_path / "run", rows, summarize(rows), [], [])
    section = html[html.index("<h2>Seconds by phase</h2>"):html.index("<h2>Per step</h2>")]
    assert section.count("<tr>") == 1 + 2
    assert section.index("<th>wait_groups</th>") < section.index("<th>train_step</th>")
    assert "<td>1</td><td>300 s</td><td>0 s</td><td>250 s</td><td>40 s</td><td>0 s</td>" in section
    assert "train: sampler refresh" not in section and "reused" not in section  # rows without them
    rows[0].update({"trainer/seconds_forward_backward": 30.2, "trainer/seconds_refresh": 9.6,
                    "trainer/sampler_prefill_tokens": 100.0, "trainer/sampler_prefix_tokens_reused": 300.0})
    rows[1].update({"trainer/seconds_forward_backward": "slow", "trainer/sampler_prefill_tokens": 0.0})
    html = render_html(tmp_path / "run", rows, summarize(rows), [], [])
    section = html[html.index("<h2>Seconds by phase</h2>"):html.index("<h2>Per step</h2>")]
    heads = ["<th>heldout</th>", "<th>train: forward+backward</th>", "<th>train: sampler refresh</th>",
             "<th>prompt tokens reused</th>"]
    assert [section.index(h) for h in heads] == sorted(section.index(h) for h in heads)
    assert "train: optimizer" not in section  # no row has it
    assert "<td>40 s</td><td>0 s</td><td>30 s</td><td>10 s</td><td>75%</td></tr>" in section
    assert "<td>41 s</td><td>0 s</td><td>–</td><td>–</td><td>–</td></tr>" in section  # not a number: shown as –
    del rows[0]["seconds_by_phase"], rows[1]["seconds_by_phase"]
    assert "Seconds by phase" not in render_html(tmp_path / "run", rows, summarize(rows), [], [])
    write(tmp_path / "bad", [json.dumps({"step": 1, "seconds_by_phase": {"train_step": "slow"}})])
    with pytest.raises(MetricsError, match="seconds_by_phase should be an object of numbers"):
        load_metrics(tmp_path / "bad" / "metrics.jsonl")


def test_a_family_row_names_its_jobs_by_the_surface_when_it_can() -> None:
    from ait.report.metrics import choices_label

    triples = [{"base_model": "tiny", "learning_rate": 1e-05, "max_steps": 1, "count": 2}]
    assert choices_label({"configs": triples}) == "tiny lr 1e-05 1 steps ×2"  # a run from before `variants`
    assert choices_label({"configs": triples, "variants": {"model_qwen15+lr_3e-6": 3, "reference": 1}}) == \
        "model_qwen15+lr_3e-6 ×3; reference ×1"
    assert choices_label({"configs": [], "variants": {}}) == "–"
