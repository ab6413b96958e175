"""`ait eval compare`'s statistics: paired by episode slot where both evals played it, a floor under
every standard error, and a warning when A and B are one evaluation. Results are built by hand."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ait.agent_eval.compare import compare
from ait.agent_eval.stats import stat, summarize
from ait.agent_eval.types import EpisodeRow, EvalPlan, EvalResults


def results(rewards: list[float], ids: list[int] | None = None, task: str = "t") -> EvalResults:
    ids = list(range(len(rewards))) if ids is None else ids
    rows = [EpisodeRow(task_id=task, run_id=f"{task}-{i:03d}", stop_reason="job_done", infra_error=False, reward=r,
                       validation=1.0, job_quality=r, uplift_term=0.0, train_speed=0.5, valid=True, job_ran=True,
                       job_failed=False, base_model="tiny") for i, r in zip(ids, rewards)]
    return EvalResults(plan=EvalPlan(policy="p", tasks=[task], episodes=len(rows)), per_task={task: summarize(rows)},
                       overall=summarize(rows), episodes=rows, planned=len(rows))


def reward_row(diffs, task: str = "t"):
    return next(d for d in diffs if d.task == task and d.key == "reward")


def floor2(n: int) -> float:
    p = 1 / (2 * n)
    return 2 * math.sqrt(p * (1 - p) / n)


# Each slot (seed) has its own difficulty, shared by both sides; B is 0.1 better on every one.
N = 50
OFFSET = [i / N for i in range(N)]
A = [o + 0.01 * ((i * 7) % 3 - 1) for i, o in enumerate(OFFSET)]
B = [o + 0.1 + 0.01 * ((i * 5) % 3 - 1) for i, o in enumerate(OFFSET)]


def test_a_shared_per_seed_offset_cancels_when_paired():
    d = reward_row(compare(results(A), results(B)))
    # The differences barely spread: their 2 SE is the floor, far below the 0.1 found.
    assert d.verdict == "b better" and d.noise == pytest.approx(floor2(N))
    assert d.delta == pytest.approx(sum(B) / N - sum(A) / N)
    assert d.paired and d.pairs == N and d.left_out == 0
    # The same rewards in slots the other side never played: independent samples, and the slots'
    # spread swamps the 0.1.
    u = reward_row(compare(results(A), results(B, ids=list(range(N, 2 * N)))))
    assert not u.paired and u.pairs == 0
    assert u.noise == pytest.approx(math.sqrt(stat(A).se2 ** 2 + stat(B).se2 ** 2)) and u.noise > 0.1
    assert u.verdict == "within noise"


def test_partial_overlap_pairs_what_both_played_and_counts_the_rest():
    a = results(A)
    b = results(B[:40])  # B stopped early: slots 40-49 only on A's side
    a.episodes[0] = a.episodes[0].model_copy(update={"infra_error": True})  # B's slot 0 loses its partner
    d = reward_row(compare(a, b))
    assert d.delta == pytest.approx(sum(B[1:40]) / 39 - sum(A[1:40]) / 39)
    assert d.paired and d.pairs == 39 and d.left_out == 10 + 1
    assert d.delta == pytest.approx(d.b - d.a)


def test_a_sample_without_spread_still_has_noise():
    s = stat([0.5] * 4)
    assert s.se2 == pytest.approx(floor2(4)) and s.se2 > 0 and s.se2_raw == 0
    assert summarize(results([0.5] * 4).episodes).reward.se2 == pytest.approx(floor2(4))  # what the report prints
    same_slots = reward_row(compare(results([0.5] * 4), results([0.6] * 4)))  # every paired difference 0.1
    assert same_slots.verdict == "within noise" and same_slots.noise == pytest.approx(floor2(4))
    assert same_slots.paired
    apart = reward_row(compare(results([0.5] * 4), results([0.6] * 4, ids=[4, 5, 6, 7])))
    assert apart.verdict == "within noise" and apart.noise == pytest.approx(math.sqrt(2) * floor2(4))
    assert not apart.paired


def ait(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ait.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def write(out: Path, r: EvalResults) -> Path:
    out.mkdir(parents=True)
    (out / "results.json").write_text(r.model_dump_json(indent=2))
    return out


def test_compare_of_an_eval_with_itself_warns(tmp_path):
    a = write(tmp_path / "a", results(A))
    shutil.copytree(a, tmp_path / "copy")
    b = write(tmp_path / "b", results(B))
    for other in ("a", "copy"):
        proc = ait("eval", "compare", "a", other, "--json", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "warning:" in proc.stderr and "by construction" in " ".join(proc.stderr.split()), proc.stderr
        out = json.loads(proc.stdout)
        assert len(out["warnings"]) == 1 and "evaluation" in out["warnings"][0], out["warnings"]
        text = ait("eval", "compare", "a", other, cwd=tmp_path)
        assert text.returncode == 0 and "warning:" in text.stderr, text.stderr
    proc = ait("eval", "compare", str(a), str(b), "--json", cwd=tmp_path)
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["warnings"] == [] and "warning" not in proc.stderr
    overall = next(d for d in out["differences"] if d["task"] == "all tasks" and d["key"] == "reward")
    assert overall["paired"] is True and overall["pairs"] == N and overall["verdict"] == "b better"
    text = ait("eval", "compare", str(a), str(b), cwd=tmp_path)
    assert f"paired by episode (task, run id) over {N} pairs" in " ".join(text.stdout.split()), text.stdout


def with_best_pre(r: EvalResults, models: list[str], left_out: dict[str, str]) -> EvalResults:
    rows = [row.model_copy(update={"best_pre_models": models, "best_pre_left_out": left_out}) for row in r.episodes]
    return r.model_copy(update={"episodes": rows, "overall": summarize(rows), "per_task": {"t": summarize(rows)}})


def test_compare_refuses_results_whose_best_pre_was_over_other_models(tmp_path):
    """An install without a strong model scores every job against a lower best_pre: its rewards are
    on another scale, so comparing them with an install that has it is refused, naming why."""
    full = with_best_pre(results(A), ["qwen2.5-coder-0.5b", "tiny"], {})
    lacking = with_best_pre(results(B), ["tiny"], {"qwen2.5-coder-0.5b": "not available on this install: no GGUF"})
    write(tmp_path / "full", full)
    write(tmp_path / "lacking", lacking)
    write(tmp_path / "same", with_best_pre(results(B), ["qwen2.5-coder-0.5b", "tiny"], {}))
    proc = ait("eval", "compare", "full", "lacking", "--json", cwd=tmp_path)
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and proc.stdout == "" and "cannot compare" in said, proc.stderr
    assert "qwen2.5-coder-0.5b" in said and "no GGUF" in said and "Traceback" not in proc.stderr
    assert lacking.overall.best_pre_left_out == {"qwen2.5-coder-0.5b": "not available on this install: no GGUF"}
    proc = ait("eval", "compare", "full", "same", "--json", cwd=tmp_path)
    assert proc.returncode == 0 and json.loads(proc.stdout)["differences"], proc.stderr
