"""Metering: the price table, the ledger, job GPU-seconds, and budgets that stop episodes cleanly."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from fakes import TASK, Priced, call, fake_executor, memo_probe, ok_result, quick

from ait.evals.baselines import BaselineStore
from ait.harness.episode import run_episode
from ait.harness.types import EpisodeResult, StopReason
from ait.metering import (DEFAULT_PRICES, Ledger, PriceError, Usage, gpu_hour_usd, job_cost, llm_price, load_prices,
                          price_usage)
from ait.policy.reference import reference_job
from ait.spec import load_spec

CENT = Usage(model="any", prompt_tokens=100, completion_tokens=10, usd=0.01, usd_source="provider", latency_s=0.1)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("AIT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AIT_PRICES", raising=False)
    memo_probe(monkeypatch)
    return tmp_path / "home"


def run(tmp_path: Path, policy, config, executor=None) -> EpisodeResult:
    return run_episode(load_spec(TASK), TASK, policy, config, runs_dir=tmp_path / "runs",
                       baselines=BaselineStore(tmp_path / "b.json"), executor=executor)


def events(result: EpisodeResult, kind: str) -> list[dict]:
    lines = (Path(result.run_dir) / "trajectory.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["kind"] == kind]


def test_price_lookup_and_pricing() -> None:
    mini = DEFAULT_PRICES.llm["gpt-4o-mini"]
    assert llm_price(DEFAULT_PRICES, "openai/gpt-4o-mini") == mini
    assert llm_price(DEFAULT_PRICES, "gpt-4o-mini-2024-07-18") == mini  # longest prefix, not gpt-4o
    assert llm_price(DEFAULT_PRICES, "mystery-model") is None
    priced = price_usage(Usage(model="gpt-4o-mini", prompt_tokens=1_000_000, completion_tokens=500_000,
                               cached_tokens=400_000), DEFAULT_PRICES)
    assert priced.usd == pytest.approx(0.6 * mini.prompt + 0.4 * mini.cached_prompt + 0.5 * mini.completion)
    assert priced.usd_source == "price_table"
    assert price_usage(CENT, DEFAULT_PRICES).usd == 0.01  # the provider's figure is kept
    unknown = price_usage(Usage(model="mystery-model", prompt_tokens=10), DEFAULT_PRICES)
    assert (unknown.usd, unknown.usd_source) == (0.0, "unpriced")
    assert gpu_hour_usd(DEFAULT_PRICES, "NVIDIA L40S") == DEFAULT_PRICES.gpu_hour["L40S"]  # not L4
    assert gpu_hour_usd(DEFAULT_PRICES, "Some New Accelerator") == DEFAULT_PRICES.gpu_hour["default"]


def test_user_price_files_extend_and_override(home: Path, tmp_path: Path, monkeypatch) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "prices.toml").write_text('cpu_hour = 0.1\n[llm."my-model"]\nprompt = 1.0\ncompletion = 2.0\n'
                                      '[gpu_hour]\nH100 = 9.0\n')
    table = load_prices()
    assert table.llm["my-model"].completion == 2.0 and table.gpu_hour["H100"] == 9.0 and table.cpu_hour == 0.1
    assert table.llm["gpt-4o"] == DEFAULT_PRICES.llm["gpt-4o"]  # defaults kept
    extra = tmp_path / "team.toml"
    extra.write_text('[gpu_hour]\nH100 = 4.0\n')
    assert load_prices(extra).gpu_hour["H100"] == 4.0  # the explicit file wins over AIT_HOME
    monkeypatch.setenv("AIT_PRICES", str(extra))
    assert load_prices().gpu_hour["H100"] == 4.0
    extra.write_text('[llm."x"]\nprompt = 1\ncompletion = 1\ncached = 1\n')
    with pytest.raises(PriceError, match="cached"):
        load_prices(extra)
    with pytest.raises(PriceError, match="not found"):
        load_prices(tmp_path / "missing.toml")


def test_ledger_concurrent_appends_and_totals(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "costs.jsonl")

    def write(group: str) -> None:
        for _ in range(50):
            ledger.append({"kind": "llm", "group": group, "usd": 0.5, "pad": "x" * 3000})

    threads = [threading.Thread(target=write, args=(g,)) for g in "aabbcc"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(ledger.path, "a") as f:
        f.write('{"kind": "llm", "usd": 1')  # a line torn by a crash
    assert len(ledger.entries()) == 300 and all(e["t"] > 0 for e in ledger.entries())
    assert ledger.total_usd("a") == pytest.approx(50.0) and ledger.total_usd() == pytest.approx(150.0)


def test_job_cost() -> None:
    cpu = job_cost(120.0, 0.0, None, DEFAULT_PRICES)
    assert (cpu.cpu_seconds, cpu.gpu_seconds, cpu.usd) == (120.0, 0.0, 0.0)
    gpu = job_cost(3600.0, 0.5, "NVIDIA H100 80GB HBM3", DEFAULT_PRICES)
    assert gpu.gpu_seconds == 1800.0 and gpu.cpu_seconds == 0.0
    assert gpu.usd == pytest.approx(0.5 * DEFAULT_PRICES.gpu_hour["H100"])


def test_jobs_are_metered_into_the_ledger(tmp_path: Path) -> None:
    job = reference_job("calc_chain")
    turns = [[call("write_file", {"path": "job.toml", "content": job["job.toml"]}),
              call("write_file", {"path": "env.py", "content": job["env.py"]})], [call("submit_job")]]
    executor = fake_executor(ok_result(train_seconds=100.0, gpus=2.0))
    result = run(tmp_path, Priced(turns, CENT), quick(gpu_type="A100", run_group="sweep-1"), executor)
    assert result.stop_reason is StopReason.job_done
    wall = 100.0 + 20.0
    assert result.cost.gpu_seconds == 2 * wall
    assert result.cost.job_usd == pytest.approx(2 * wall / 3600 * DEFAULT_PRICES.gpu_hour["A100"])
    assert result.jobs[0].cost.gpus == 2.0 and result.jobs[0].cost.gpu_type == "A100"
    lines = Ledger(tmp_path / "runs" / "costs.jsonl").entries()
    assert [e["kind"] for e in lines] == ["llm", "llm", "job"]
    assert all(e["run_id"] == result.run_id and e["group"] == "sweep-1" for e in lines)
    assert lines[2]["gpu_seconds"] == 2 * wall and lines[2]["job_id"] == result.job.job_id
    assert result.cost.total_usd == pytest.approx(0.02 + result.cost.job_usd)
    end = events(result, "episode_end")[0]
    assert end["cost/usd"] == pytest.approx(result.cost.total_usd) and end["time/gpu_s"] == 2 * wall


def test_cpu_job_records_cpu_seconds(tmp_path: Path) -> None:
    job = reference_job("calc_chain")
    turns = [[call("write_file", {"path": "job.toml", "content": job["job.toml"]}),
              call("write_file", {"path": "env.py", "content": job["env.py"]}), call("submit_job")]]
    executor = fake_executor(ok_result(train_seconds=30.0, gpus=0.0))
    result = run(tmp_path, Priced(turns, CENT), quick(), executor)
    assert result.cost.cpu_seconds == 50.0 and result.cost.gpu_seconds == 0.0 and result.cost.job_usd == 0.0


def test_budget_stops_before_the_call_that_would_exceed(tmp_path: Path) -> None:
    policy = Priced([[call("list_files")]] * 10, CENT)
    result = run(tmp_path, policy, quick(budget_usd=0.025))
    assert result.stop_reason is StopReason.budget
    assert policy.step == 2 and result.turns == 2  # 0.02 spent; a third cent would pass 0.025
    assert result.cost.total_usd == pytest.approx(0.02) and result.cost.total_usd <= 0.025
    assert "budget_usd" in result.error
    assert result.reward.total == -0.1  # reward on what exists: nothing was submitted
    assert len(events(result, "budget_stop")) == 1
    assert json.loads((Path(result.run_dir) / "episode.json").read_text())["stop_reason"] == "budget"


def test_budget_stops_right_after_a_call_that_passed_it(tmp_path: Path) -> None:
    pricey = CENT.model_copy(update={"usd": 0.05})
    policy = Priced([[call("write_file", {"path": "notes.txt", "content": "x"})]], pricey)
    result = run(tmp_path, policy, quick(budget_usd=0.03))
    assert result.stop_reason is StopReason.budget and result.turns == 1
    assert not (Path(result.run_dir) / "workspace" / "notes.txt").exists()  # its tool call never ran
    assert events(result, "tool_result") == []


def test_budget_stop_after_a_job_keeps_its_reward(tmp_path: Path) -> None:
    job = reference_job("calc_chain")
    turns = [[call("write_file", {"path": "job.toml", "content": job["job.toml"]}),
              call("write_file", {"path": "env.py", "content": job["env.py"]}), call("submit_job")],
             [call("read_file", {"path": "job.toml"})], [call("read_file", {"path": "env.py"})]]
    executor = fake_executor(ok_result(pre=0.3, post=0.6, gpus=0.0))
    expensive = [CENT, CENT.model_copy(update={"usd": 1.0}), CENT]
    result = run(tmp_path, Priced(turns, expensive), quick(budget_usd=0.5, max_jobs=2), executor)
    assert result.stop_reason is StopReason.budget and result.turns == 2
    assert result.job is not None and result.job.post == 0.6
    assert result.reward.validation == 1.0
    assert result.reward.job_quality == pytest.approx(0.25 * 0.6 + 0.75 * (0.6 - 0.3) / 0.7)


def test_job_is_not_run_when_its_estimate_passes_the_budget(tmp_path: Path) -> None:
    job = reference_job("calc_chain")
    turns = [[call("write_file", {"path": "job.toml", "content": job["job.toml"]}),
              call("write_file", {"path": "env.py", "content": job["env.py"]}), call("submit_job")]]
    executor = fake_executor(ok_result())
    # 600 s of training on one GPU at the default $2/h is about $0.33.
    result = run(tmp_path, Priced(turns, CENT), quick(budget_usd=0.2, job_gpus=1.0), executor)
    assert executor.ran == [] and result.job is None
    assert result.stop_reason is StopReason.budget and "job not run" in result.error
    assert result.reward.validation == 1.0 and result.reward.job_quality == 0.0
    assert "not run" in events(result, "tool_result")[-1]["content"]


def test_run_budget_spans_episodes_of_one_group(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "runs" / "costs.jsonl")
    ledger.append({"kind": "llm", "group": "other-sweep", "usd": 100.0})  # not this group's money
    first = run(tmp_path, Priced([[call("list_files")]] * 2, CENT), quick(run_group="sweep", run_budget_usd=0.045))
    assert first.stop_reason is StopReason.no_submission and first.cost.llm_calls == 3  # 0.03 spent
    second = run(tmp_path, Priced([[call("list_files")]] * 5, CENT), quick(run_group="sweep", run_budget_usd=0.045))
    assert second.stop_reason is StopReason.budget and second.cost.llm_calls == 1  # 0.04; one more passes 0.045
    assert "group 'sweep'" in second.error
    assert ledger.total_usd("sweep") == pytest.approx(0.04)
    whole = run(tmp_path, Priced([[call("list_files")]], CENT), quick(run_budget_usd=50.0))
    assert whole.stop_reason is StopReason.budget and whole.turns == 0  # no group: the whole ledger counts


def test_unpriced_calls_are_counted(tmp_path: Path) -> None:
    mystery = Usage(model="mystery-model", prompt_tokens=10, completion_tokens=5)
    result = run(tmp_path, Priced([], mystery), quick())
    assert result.cost.unpriced_calls == 1 and result.cost.llm_usd == 0.0 and result.cost.prompt_tokens == 10
    line = Ledger(tmp_path / "runs" / "costs.jsonl").entries()[0]
    assert line["usd_source"] == "unpriced" and line["model"] == "mystery-model"
