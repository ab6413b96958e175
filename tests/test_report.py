"""`ait report`: a synthetic metrics.jsonl becomes a self-contained HTML page with its plots and
summary numbers; missing and null values are tolerated; bad input is a clear error."""

from __future__ import annotations

import base64
import json
import re

import pytest

try:
    import matplotlib  # noqa: F401
    HAVE_MPL = True
except ImportError:
    HAVE_MPL = False
needs_matplotlib = pytest.mark.skipif(not HAVE_MPL, reason="the report's plots need matplotlib: pip install 'ait[report]'")

from typer.testing import CliRunner

from ait.cli import app
from ait.report import MetricsError, load_metrics, summarize, write_report

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


@needs_matplotlib
def test_html_report_embeds_plots_and_writes_pngs(run_dir) -> None:
    path, _ = write_report(run_dir)
    assert path == run_dir / "report.html"
    html = path.read_text()
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html)
    names = ["reward", "heldout", "outcomes", "base_models", "hparams", "cost", "staleness"]
    assert len(images) == len(names)
    assert all(base64.b64decode(i).startswith(PNG) for i in images)
    for name in names:
        png = run_dir / f"report-{name}.png"
        assert png.read_bytes().startswith(PNG)
        assert base64.b64encode(png.read_bytes()).decode() in images  # the same image, embedded
    for text in ("Reward and its components", "Held-out reward", "Base-model choice", "Cost", "Staleness",
                 "$6.25", "0.100", "0.450", "0.500", "6,000", "4,800", "Qwen/Qwen3-1.7B 60%"):
        assert text in html, text
    assert "http://" not in html and "https://" not in html and "<script" not in html  # opens offline


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
def test_cli(run_dir, tmp_path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["report", str(run_dir), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["steps"] == 6 and summary["report"] == str(run_dir / "report.html")
    result = runner.invoke(app, ["report", str(run_dir), "--out", str(tmp_path / "x.html")])
    assert result.exit_code == 0 and "6 steps" in result.stdout and (tmp_path / "x.html").is_file()
    result = runner.invoke(app, ["report", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "metrics.jsonl not found" in result.output
