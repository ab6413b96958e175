"""Iterative episodes (max_jobs > 1): the agent runs several jobs, sees only dev scores between them,
and the episode is scored on the job it chose (select_job), else the best by dev score: the hidden
set never picks the job (that would select on the test set), it only scores the one picked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fakes import TASK, Canned, fake_executor, memo_probe, ok_result

from ait.evals.baselines import BaselineStore
from ait.harness.episode import run_episode
from ait.harness.types import EpisodeConfig, EpisodeResult, StopReason
from ait.job.types import FailReason, Job, JobResult
from ait.policy.reference import ReferencePolicy
from ait.spec import load_spec
from ait.train.tiny import tiny_model_path

# Hidden numbers chosen so that any rendering of them ("0.4123", "0.412", "41.2") is unmistakable.
LOW, HIGH, PRE = 0.4123, 0.5871, 0.1357


class Watching(ReferencePolicy):
    """The reference policy, recording every conversation it was shown."""

    def reset(self, spec):
        super().reset(spec)
        self.seen: list[str] = []

    def act(self, messages, tools):
        self.seen.extend(m.content for m in messages)
        return super().act(messages, tools)


@pytest.fixture(autouse=True)
def _probe_once(monkeypatch) -> None:
    memo_probe(monkeypatch)


def run(tmp_path: Path, policy, config: EpisodeConfig, executor: Canned, task: Path = TASK) -> EpisodeResult:
    return run_episode(load_spec(task), task, policy, config, runs_dir=tmp_path / "runs",
                       baselines=BaselineStore(tmp_path / "b.json"), executor=executor)


def assert_hidden_never_shown(seen: list[str]) -> None:
    text = "\n".join(seen)
    for x in (LOW, HIGH, PRE):
        for shown in (f"{x}", f"{x:.3f}", f"{x:.2f}", f"{100 * x:.1f}"):
            assert shown not in text, f"hidden score {x} reached the agent as {shown!r}"


@pytest.mark.parametrize("first,second,best", [
    ((LOW, 0.25), (HIGH, 0.50), 1),   # the refined job is better on dev: it is scored
    ((HIGH, 0.25), (LOW, 0.75), 1),   # dev prefers the second, hidden the first: dev decides, never hidden
], ids=["second-better", "second-better-on-dev-only"])
def test_reference_policy_runs_two_jobs_and_the_best_is_scored(tmp_path, first, second, best) -> None:
    executor = fake_executor(ok_result(post=first[0], dev=first[1], pre=PRE),
                             ok_result(post=second[0], dev=second[1], pre=PRE))
    ran = executor.ran
    policy = Watching()
    result = run(tmp_path, policy, EpisodeConfig(max_jobs=2), executor)

    assert result.stop_reason is StopReason.job_done
    assert len(ran) == 2 and [r.attempt for r in result.jobs] == [1, 2]
    assert ran[1].config.train.max_steps == 2 * ran[0].config.train.max_steps  # the refinement
    assert Path(ran[0].run_dir) == Path(result.run_dir) and Path(ran[1].run_dir) == Path(result.run_dir) / "jobs" / "2"
    assert result.scored_job == best and result.job == result.jobs[best].result and result.chosen_job is None
    post = result.jobs[best].result.post
    assert result.reward.post == post and result.reward.valid_attempt == 1 and result.reward.validation == 1.0
    assert result.reward.uplift_term == pytest.approx((post - PRE) / (1 - PRE))
    assert [r.dev for r in result.jobs] == [first[1], second[1]]

    # The agent saw each dev score, and no hidden one.
    assert f"dev score {first[1]:.3f}" in "\n".join(policy.seen)
    assert "1 more job(s) allowed" in "\n".join(policy.seen)
    assert_hidden_never_shown(policy.seen)
    assert_hidden_never_shown([(Path(result.run_dir) / "workspace" / f).read_text() for f in ("job.toml", "env.py")])

    # The record: both jobs in the trajectory, the kept one at the top of the run directory.
    run_dir = Path(result.run_dir)
    jobs = [json.loads(x) for x in (run_dir / "trajectory.jsonl").read_text().splitlines()]
    jobs = [e for e in jobs if e["kind"] == "job"]
    assert [(e["attempt"], e["dev"], e["hidden_post"]) for e in jobs] == [(1, first[1], first[0]), (2, second[1], second[0])]
    assert json.loads((run_dir / "job_result.json").read_text())["post"] == post
    assert json.loads((run_dir / "submissions" / "2" / "job_result.json").read_text())["post"] == second[0]
    assert json.loads((run_dir / "episode.json").read_text())["scored_job"] == best


def test_one_job_by_default(tmp_path) -> None:
    executor = fake_executor(ok_result(post=LOW, dev=0.3))
    policy = Watching()  # would refine if the harness allowed it
    result = run(tmp_path, policy, EpisodeConfig(), executor)
    assert len(executor.ran) == 1 and result.stop_reason is StopReason.job_done and result.scored_job == 0
    assert not any("dev score 0." in s or "more job(s) allowed" in s for s in policy.seen)


def test_a_failed_job_then_a_good_one(tmp_path) -> None:
    def crash(job: Job) -> JobResult:
        return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.oom, base_model="tiny", train_seconds=5.0)

    executor = fake_executor(crash, ok_result(post=LOW, dev=0.2, pre=PRE))
    policy = Watching()
    result = run(tmp_path, policy, EpisodeConfig(max_jobs=3), executor)
    assert [r.result.ok for r in result.jobs] == [False, True] and result.scored_job == 1
    assert result.reward.post == LOW and result.reward.job_quality > 0
    assert "failed: oom" in "\n".join(policy.seen)
    assert result.stop_reason is StopReason.job_done  # the agent stopped after its second job


class Choosing(Watching):
    """The reference policy that, after its jobs, names job `choice` with select_job."""

    def __init__(self, choice: int):
        super().__init__()
        self.choice, self.asked = choice, False

    def act(self, messages, tools):
        from ait.harness.types import Message, ToolCallRequest

        reply = super().act(messages, tools)
        if not reply.tool_calls and not self.asked:  # the reference agent is done: choose before stopping
            self.asked = True
            return Message(role="assistant", content="", tool_calls=[
                ToolCallRequest(id="c1", name="select_job", arguments={"job": self.choice})])
        return reply


def test_the_agents_choice_is_scored_whatever_the_scores(tmp_path) -> None:
    executor = fake_executor(ok_result(post=LOW, dev=0.25, pre=PRE), ok_result(post=HIGH, dev=0.75, pre=PRE))
    policy = Choosing(1)
    result = run(tmp_path, policy, EpisodeConfig(max_jobs=2), executor)
    assert result.chosen_job == 0 and result.scored_job == 0 and result.reward.post == LOW
    assert "job 1 is the one this episode is scored on" in "\n".join(policy.seen)
    assert json.loads((Path(result.run_dir) / "job_result.json").read_text())["post"] == LOW


@pytest.mark.parametrize("choice", [0, 3, -1, True])
def test_a_choice_that_names_no_job_is_refused(tmp_path, choice) -> None:
    executor = fake_executor(ok_result(post=LOW, dev=0.25, pre=PRE), ok_result(post=HIGH, dev=0.75, pre=PRE))
    policy = Choosing(choice)
    result = run(tmp_path, policy, EpisodeConfig(max_jobs=2), executor)
    assert result.chosen_job is None and result.scored_job == 1  # the default: best by dev
    assert "error: job must be the number of a job that ran (1..2)" in "\n".join(policy.seen)


def test_selection_never_reads_hidden_scores() -> None:
    """scored_job on records whose hidden scores are poisoned: reading one would raise."""
    from ait.harness.jobs import scored_job

    class Poisoned(JobResult):
        def __getattribute__(self, name):
            if name in ("post", "pre"):
                raise AssertionError(f"selection read the hidden {name}")
            return super().__getattribute__(name)

    def record(dev, ok=True):
        from ait.harness.types import JobRecord
        from ait.metering import JobCost

        return JobRecord.model_construct(attempt=1, job_id="j", dev=dev, cost=None,
                                         result=Poisoned(job_id="j", ok=ok, post=0.9 if ok else None))

    assert scored_job([record(0.2), record(0.6), record(0.6)]) == 1  # best dev, earliest on ties
    assert scored_job([record(0.2), record(0.6)], chosen=0) == 0
    assert scored_job([record(None), record(None, ok=False)]) == 0  # no dev score: the last that finished
    assert scored_job([record(None, ok=False), record(None, ok=False)]) == 1
    assert scored_job([]) is None


@pytest.mark.slow  # 13 s on 2 shared cores: in CI's `pytest -m slow` pass
def test_dev_eval_runs_when_the_job_reports_none(tmp_path) -> None:
    """The real dev eval process scores the checkpoint on the spec's dev examples, never the hidden set."""
    def trained(job: Job) -> JobResult:
        ckpt = Path(job.run_dir) / "job" / "checkpoint"
        ckpt.mkdir(parents=True, exist_ok=True)
        shutil.copy(tiny_model_path() / "model.safetensors", ckpt)
        return JobResult(job_id=job.job_id, ok=True, base_model="tiny", pre=PRE, post=HIGH, eval_n=8,
                         train_seconds=1.0, total_seconds=2.0, checkpoint=str(ckpt))

    # A smaller copy of the task (two dev examples, short replies) keeps the real eval process quick.
    data = json.loads(TASK.read_text())
    data["dev_examples"] = data["dev_examples"][:2]
    data["eval_format"]["max_new_tokens"] = 16
    task = tmp_path / "calc_chain_small.json"
    task.write_text(json.dumps(data))
    spec = load_spec(task)
    policy = Watching(jobs=1)
    result = run(tmp_path, policy, EpisodeConfig(max_jobs=2), fake_executor(trained), task)
    record = result.jobs[0]
    assert record.dev is not None and 0.0 <= record.dev <= 1.0
    assert f"on {len(spec.dev_examples)} public dev examples" in "\n".join(policy.seen)
    report = json.loads((Path(result.run_dir) / "dev_eval" / "eval.json").read_text())
    assert report["dev"] == record.dev and report["dev_n"] == len(spec.dev_examples)
    assert report["n"] == 0 and report["pre"] is None and report["post"] is None and "samples" not in report
    assert record.cost.wall_s > 2.0  # the dev eval's time is charged to the job
    assert_hidden_never_shown(policy.seen)
