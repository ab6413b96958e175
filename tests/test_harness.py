"""The episode harness with scripted policies: nudges, caps, confinement, broken calls, submissions,
reward wiring, artifacts. No real training: the executor is replaced by one returning canned results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
from fakes import setup_of, weights_of

import ait.harness.episode as episode_mod
from ait.evals.baselines import Baseline, BaselineStore
from ait.evals.hidden import eval_fingerprint
from ait.harness.episode import NUDGE, run_episode
from ait.harness.types import EpisodeConfig, EpisodeResult, Message, StopReason, ToolCallRequest
from ait.job.types import FailReason, Job, JobResult
from ait.policy.reference import ReferencePolicy
from ait.spec import TaskSpec, load_spec

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "examples" / "tasks" / "calc_chain.json"


# ---- scripted policies ------------------------------------------------------------------


def call(name: str, arguments: dict[str, Any] | str | None = None, i: int = 0) -> ToolCallRequest:
    return ToolCallRequest(id=f"c{i}", name=name, arguments={} if arguments is None else arguments)


class Silent:
    """Never calls a tool."""

    name = "silent"

    def reset(self, spec: TaskSpec) -> None:
        self.acts = 0

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        self.acts += 1
        return Message(role="assistant", content="I am thinking.")


class Scripted:
    """Plays one list of tool calls per turn, then (optionally) keeps repeating the last turn."""

    name = "scripted"

    def __init__(self, turns: list[list[ToolCallRequest]], repeat_last: bool = False):
        self.turns, self.repeat_last = turns, repeat_last

    def reset(self, spec: TaskSpec) -> None:
        self.step = 0
        self.seen: list[list[Message]] = []

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        self.seen.append(list(messages))
        self.step += 1
        if self.step <= len(self.turns):
            calls = self.turns[self.step - 1]
        elif self.repeat_last:
            calls = self.turns[-1]
        else:
            return Message(role="assistant", content="done")
        calls = [c.model_copy(update={"id": f"t{self.step}-{j}"}) for j, c in enumerate(calls)]
        return Message(role="assistant", tool_calls=calls)


class Exploding:
    name = "exploding"

    def __init__(self, after: int = 0):
        self.after = after

    def reset(self, spec: TaskSpec) -> None:
        self.step = 0

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        self.step += 1
        if self.step > self.after:
            raise RuntimeError("API down")
        return Message(role="assistant", tool_calls=[call("list_files", i=self.step)])


# ---- fixtures -----------------------------------------------------------------------------


class FakeExecutor:
    """Trains nothing: each job gets `make(job)` and is appended to `jobs`."""

    def __init__(self, make: Callable[[Job], JobResult], jobs: list[Job]):
        self.make, self.jobs = make, jobs

    def run(self, job: Job, on_event: Callable[[str], None] | None = None) -> JobResult:
        self.jobs.append(job)
        return self.make(job)

    def started(self, job: Job) -> bool:
        return True

    def cancel(self, job: Job) -> None:
        pass

    def close(self) -> None:
        pass


def ok_result(pre: float = 0.3, post: float = 0.6, train_seconds: float = 150.0) -> Callable[[Job], JobResult]:
    return lambda job: JobResult(job_id=job.job_id, ok=True, base_model=job.config.job.base_model, pre=pre,
                                 base_model_sha256=weights_of(job.config.job.base_model),
                                 post=post, eval_n=job.eval_size or 200, train_seconds=train_seconds,
                                 total_seconds=train_seconds + 5)  # scored on the set the job was given, as run_job is


def crash_result(job: Job) -> JobResult:
    return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.crash, error="boom",
                     base_model=job.config.job.base_model, train_seconds=12.0)


@pytest.fixture
def spec() -> TaskSpec:
    return load_spec(TASK)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Private AIT_HOME, runs dir, baseline store, and a fake executor recording every job it got."""
    monkeypatch.setenv("AIT_HOME", str(tmp_path / "home"))
    jobs: list[Job] = []
    state: dict[str, Any] = {"make": ok_result()}

    store = BaselineStore(tmp_path / "b.json")

    class Env:
        runs = tmp_path / "runs"
        baselines = store

        @staticmethod
        def set_result(make: Callable[[Job], JobResult]) -> None:
            state["make"] = make

        executed = jobs

        @staticmethod
        def run(policy, config: EpisodeConfig | None = None, spec_: TaskSpec | None = None) -> EpisodeResult:
            return run_episode(spec_ or load_spec(TASK), TASK, policy, config=config, runs_dir=tmp_path / "runs",
                               baselines=store, executor=FakeExecutor(state["make"], jobs))

    return Env


def trajectory(result: EpisodeResult) -> list[dict[str, Any]]:
    lines = (Path(result.run_dir) / "trajectory.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def tool_results(result: EpisodeResult, tool: str | None = None) -> list[str]:
    return [e["content"] for e in trajectory(result) if e["kind"] == "tool_result" and (tool is None or e["tool"] == tool)]


# ---- no submission ------------------------------------------------------------------------


@pytest.mark.parametrize("max_nudges", [0, 2, 3])
def test_silent_policy_is_nudged_then_stopped(env, max_nudges: int) -> None:
    policy = Silent()
    result = env.run(policy, EpisodeConfig(max_nudges=max_nudges))
    assert result.stop_reason is StopReason.no_submission
    assert policy.acts == max_nudges + 1
    assert result.turns == max_nudges + 1
    events = trajectory(result)
    nudges = [e for e in events if e["kind"] == "message" and e.get("nudge")]
    assert len(nudges) == max_nudges
    assert all(e["role"] == "user" and e["content"] == NUDGE for e in nudges)
    assert result.submissions == [] and result.job is None
    assert result.reward.total == -0.1
    assert result.reward.parseable_submission is False
    assert env.executed == []


def test_nudge_is_shown_to_the_policy(env) -> None:
    class Recorder(Silent):
        def act(self, messages, tools):
            self.last = list(messages)
            return super().act(messages, tools)

    policy = Recorder()
    env.run(policy, EpisodeConfig(max_nudges=1))
    assert policy.last[-1].role == "user" and policy.last[-1].content == NUDGE
    assert policy.last[0].role == "system"


def test_endless_reader_hits_turn_cap(env) -> None:
    policy = Scripted([[call("read_file", {"path": "INSTRUCTIONS.md"})]], repeat_last=True)
    result = env.run(policy, EpisodeConfig(max_turns=5))
    assert result.stop_reason is StopReason.turn_cap
    assert result.turns == 5 and policy.step == 5
    assert result.reward.total == -0.1
    reads = tool_results(result, "read_file")
    assert len(reads) == 5 and all(not r.startswith("error:") and "job.toml" in r for r in reads)


def test_an_agent_repeating_one_failing_call_is_stopped_as_stuck(env) -> None:
    # The 1.5B agent's held-out episodes on 2026-12-02: one broken edit_file, sent again to the turn cap.
    broken = call("edit_file", '{"path": "env.py", "old": "x = """doc"""", "new": "y"}')
    policy = Scripted([[call("read_file", {"path": "nope.txt"})], [broken]], repeat_last=True)
    result = env.run(policy, EpisodeConfig(max_turns=20, max_repeated_errors=3))
    assert result.stop_reason is StopReason.stuck and result.turns == 4  # 1 other error, then 3 repeats
    assert "edit_file" in result.error and "3 times" in result.error
    assert result.reward.total == -0.1  # scored as it stood: nothing submitted
    assert [e["kind"] for e in trajectory(result)].count("stuck") == 1


def test_the_replay_of_a_recorded_loop_stops_where_the_live_rule_does(env, tmp_path: Path) -> None:
    """bench/replay_stuck.py (which docs/outer.md's replayed held-out figures come from) agrees with the harness."""
    import importlib.util

    spec_ = importlib.util.spec_from_file_location("replay_stuck", ROOT / "bench" / "replay_stuck.py")
    replay_mod = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(replay_mod)
    broken = call("edit_file", '{"path": "env.py", "old": "x = """doc"""", "new": "y"}')
    turns = [[call("read_file", {"path": "nope.txt"})], [broken], [call("list_files")], [broken]]
    unchecked = env.run(Scripted(turns, repeat_last=True), EpisodeConfig(max_turns=9, max_repeated_errors=0))
    live = env.run(Scripted(turns, repeat_last=True), EpisodeConfig(max_turns=9, max_repeated_errors=3))
    assert (unchecked.stop_reason, live.stop_reason, live.turns) == (StopReason.turn_cap, StopReason.stuck, 6)
    (ep,) = [e for e in replay_mod.extract(Path(unchecked.run_dir).parent) if e["run"] == Path(unchecked.run_dir).name]
    assert len(ep["turns"]) == 9 and [c["name"] for c in ep["calls"]][:4] == ["read_file", "edit_file", "list_files",
                                                                          "edit_file"]
    out = replay_mod.replay([ep], 3)
    (row,) = out["episodes"]
    assert (row["stuck_at_turn"], row["replayed_turns"], row["turns"]) == (live.turns, 6, 9)
    assert replay_mod.replay([ep], 0)["episodes"][0]["stuck_at_turn"] is None


def test_repeats_that_change_or_succeed_are_not_stuck(env) -> None:
    failing = call("read_file", {"path": "nope.txt"})
    # Alternating two different failing calls, and a failing call broken up by one that works: never stuck.
    turns = [[failing], [call("read_file", {"path": "nope2.txt"})]] * 3
    turns += [[failing], [failing], [call("read_file", {"path": "job.toml"})], [failing], [failing]]
    result = env.run(Scripted(turns), EpisodeConfig(max_turns=len(turns), max_repeated_errors=3, max_nudges=0))
    assert result.stop_reason is StopReason.turn_cap and result.turns == len(turns)
    # 0 turns the check off: the same failing call runs to the turn cap.
    result = env.run(Scripted([[failing]], repeat_last=True), EpisodeConfig(max_turns=6, max_repeated_errors=0))
    assert result.stop_reason is StopReason.turn_cap and result.turns == 6


@pytest.mark.parametrize("arguments", [
    '{"path": "job.toml"}',                                              # the object, as a JSON string
    {"name": "read_file", "arguments": {"path": "job.toml"}},            # the whole call as the arguments
    '{"name": "read_file", "arguments": "{\\"path\\": \\"job.toml\\"}"}',  # both, nested
], ids=["string", "wrapped", "wrapped-string"])
def test_arguments_encoded_twice_or_wrapped_are_unwrapped(env, arguments) -> None:
    result = env.run(Scripted([[call("read_file", arguments)]]), EpisodeConfig(max_nudges=0))
    (read,) = tool_results(result)
    assert "[train]" in read and result.malformed_tool_calls == 0


@pytest.mark.parametrize("arguments", [
    '["job.toml"]',                                             # valid JSON, not an object
    '{"path": "env.py", "old": "x = """doc""""}',               # a docstring's quotes left unescaped
])
def test_arguments_that_are_not_an_object_say_how_to_send_them(env, arguments) -> None:
    result = env.run(Scripted([[call("read_file", arguments)]]), EpisodeConfig(max_nudges=0))
    (text,) = tool_results(result)
    assert text.startswith("error: arguments for read_file are not a JSON object") and result.malformed_tool_calls == 1
    assert '{"path": ...}' in text  # the form they should take


def test_a_wrapped_call_of_another_tool_is_not_unwrapped(env) -> None:
    wrapped = {"name": "write_file", "arguments": {"path": "job.toml", "content": "x"}}
    result = env.run(Scripted([[call("read_file", wrapped)]]), EpisodeConfig(max_nudges=0))
    (text,) = tool_results(result)
    assert text.startswith("error: bad arguments for read_file") and result.malformed_tool_calls == 1
    assert "[train]" in (Path(result.run_dir) / "workspace" / "job.toml").read_text()  # nothing was written


# ---- confinement and broken calls ------------------------------------------------------------


def test_path_traversal_through_the_harness(env, tmp_path: Path, spec: TaskSpec) -> None:
    absolute = tmp_path / "abs-escape.txt"
    policy = Scripted([
        [call("read_file", {"path": "../manifest.json"})],
        [call("read_file", {"path": "/etc/passwd"})],
        [call("write_file", {"path": "../escape.txt", "content": "x"})],
        [call("write_file", {"path": "task.json", "content": "{}"})],
        [call("edit_file", {"path": "INSTRUCTIONS.md", "old": "job", "new": "JOB"})],
        [call("write_file", {"path": str(absolute), "content": "x"})],
    ])
    result = env.run(policy, EpisodeConfig(max_nudges=0))
    ws = Path(result.run_dir) / "workspace"
    results = tool_results(result)
    assert len(results) == 6
    assert all(r.startswith("error:") for r in results), results
    assert not (Path(result.run_dir) / "escape.txt").exists()
    assert not list(tmp_path.rglob("escape.txt"))
    assert not absolute.exists()
    assert "root:" not in results[1]
    assert '"run_id"' not in results[0]
    # The read-only files still hold what the harness seeded.
    assert ws.joinpath("task.json").read_text() == spec.model_dump_json(indent=2) + "\n"
    template = Path(episode_mod.__file__).parents[1] / "job" / "template" / "INSTRUCTIONS.md"
    assert ws.joinpath("INSTRUCTIONS.md").read_text() == template.read_text()
    assert result.stop_reason is StopReason.no_submission


@pytest.mark.parametrize("bad", [
    call("launch_missiles", {}),
    call("read_file", '{"path": "env.py"'),
    call("read_file", "not json at all"),
    call("read_file", {}),
    call("write_file", {"path": "x.py"}),
    call("read_file", {"path": "env.py", "mode": "rb"}),
    call("submit_job", {"force": True}),
    call("read_file", {"path": 5}),
    call("read_file", "[" * 100_000 + "]" * 100_000),               # nested past the JSON parser's depth
    call("read_file", json.dumps(json.dumps({"path": ["x"] * 3}))),  # encoded twice, then a path not a string
    call("read_file", '{"name": "read_file", "arguments": "' + "[" * 5000 + '"}'),
])
def test_broken_tool_calls_return_errors_and_the_episode_goes_on(env, bad: ToolCallRequest) -> None:
    policy = Scripted([[bad], [call("read_file", {"path": "job.toml"})]])
    result = env.run(policy, EpisodeConfig(max_nudges=0))
    results = tool_results(result)
    assert len(results) == 2
    assert results[0].startswith("error: ")
    assert len(results[0]) > len("error: ") + 5
    assert "[train]" in results[1]  # the next call worked
    assert result.turns == 3 and result.stop_reason is StopReason.no_submission
    assert result.submissions == []  # a malformed submit_job is not an attempt
    assert not (Path(result.run_dir) / "workspace" / "x.py").exists()


def test_broken_call_errors_name_the_problem(env) -> None:
    policy = Scripted([[call("launch_missiles", {}, 1), call("read_file", "nope", 2), call("read_file", {}, 3),
                        call("read_file", {"path": "env.py", "extra": 1}, 4)]])
    result = env.run(policy, EpisodeConfig(max_nudges=0))
    unknown, not_json, missing, extra = tool_results(result)
    assert "launch_missiles" in unknown and "submit_job" in unknown
    assert "JSON" in not_json
    assert "path" in missing
    assert "extra" in extra
    # Each result answers its call.
    ids = [e["call_id"] for e in trajectory(result) if e["kind"] == "tool_result"]
    assert ids == ["t1-0", "t1-1", "t1-2", "t1-3"]



# A 300-character name (ENAMETOOLONG) or a lone surrogate (valid JSON from an LLM) must come back
# as error text, never crash the episode.
@pytest.mark.parametrize("bad", [
    call("write_file", {"path": "a" * 300, "content": "x"}),
    call("edit_file", {"path": "a" * 300, "old": "x", "new": "y"}),
    call("write_file", {"path": "notes.txt", "content": json.loads('"\\ud800"')}),
    call("read_file", {"path": json.loads('"\\ud800.txt"')}),
], ids=["long-name-write", "long-name-edit", "surrogate-content", "surrogate-path"])
def test_os_level_tool_failures_are_error_texts(env, bad: ToolCallRequest) -> None:
    policy = Scripted([[bad], [call("read_file", {"path": "job.toml"})]])
    result = env.run(policy, EpisodeConfig(max_nudges=0))
    first, second = tool_results(result)
    assert first.startswith("error: ")
    assert "[train]" in second


# ---- submissions ------------------------------------------------------------------------------


def test_invalid_submissions_are_capped(env, spec: TaskSpec) -> None:
    K = spec.max_submission_attempts
    policy = Scripted([[call("submit_job")]], repeat_last=True)
    result = env.run(policy, EpisodeConfig(max_turns=20))
    assert result.stop_reason is StopReason.attempts_exhausted
    assert len(result.submissions) == K and result.turns == K
    assert [s.attempt for s in result.submissions] == list(range(1, K + 1))
    assert all(s.parseable and not s.report.valid for s in result.submissions)
    assert result.job is None and env.executed == []
    assert result.reward.validation == 0.0
    assert result.reward.total == 0.0
    assert result.reward.parseable_submission is True
    submits = tool_results(result, "submit_job")
    assert len(submits) == K
    for attempt, text in enumerate(submits, start=1):
        assert f"attempt {attempt}, {K - attempt} left" in text
        assert "[config]" in text and "base_model" in text
        assert "[surface]" in text
    probes = [e for e in trajectory(result) if e["kind"] == "probe"]
    assert [p["attempt"] for p in probes] == list(range(1, K + 1))
    assert all(p["valid"] is False and p["errors"] for p in probes)


def test_unparseable_submissions_score_minus_point_one(env, spec: TaskSpec) -> None:
    policy = Scripted([[call("write_file", {"path": "job.toml", "content": "[job\nbase_model = "})],
                       [call("submit_job")]], repeat_last=True)
    result = env.run(policy, EpisodeConfig(max_turns=10))
    assert result.stop_reason is StopReason.attempts_exhausted
    assert len(result.submissions) == spec.max_submission_attempts
    assert not any(s.parseable for s in result.submissions)
    assert result.reward.total == -0.1


def test_reference_policy_with_fake_executor(env, spec: TaskSpec) -> None:
    env.set_result(ok_result(pre=0.3, post=0.6, train_seconds=150.0))
    first = env.run(ReferencePolicy())
    assert first.stop_reason is StopReason.job_done
    assert len(first.submissions) == 1 and first.submissions[0].report.valid
    assert first.reward.valid_attempt == 1 and first.reward.validation == 1.0
    assert len(env.executed) == 1
    job = env.executed[0]
    assert job.config.job.base_model in spec.constraints.allowed_base_models
    assert Path(job.workspace) == Path(first.run_dir) / "submissions" / "1" / "workspace"
    assert job.time_budget_s == spec.constraints.time_budget_s
    assert first.job is not None and first.job.post == 0.6

    # best_pre frozen from the job's own pre, keyed by the weights it trained: the store now holds it.
    fingerprint = eval_fingerprint(spec, 200)
    frozen = env.baselines.get(spec.family, weights_of(job.config.job.base_model), fingerprint, setup_of(spec))
    assert frozen is not None and frozen.best_pre == 0.3 and frozen.n == 200 and frozen.base_model == "tiny"
    # The other allowed models are not available on this install: left out of best_pre, and named,
    # in the episode's baseline, its reward record and what the agent was shown.
    assert set(first.baseline.scores) == {"tiny"} and set(first.baseline.excluded) == \
        set(spec.constraints.allowed_base_models) - {"tiny"}
    recorded = json.loads((Path(first.run_dir) / "reward.json").read_text())
    assert recorded["best_pre_models"] == ["tiny"] and set(recorded["best_pre_left_out"]) == \
        set(spec.constraints.allowed_base_models) - {"tiny"}
    assert all(why.startswith("not available") for why in recorded["best_pre_left_out"].values())
    uplift = (0.6 - 0.3) / (1 - 0.3)
    quality = 0.25 * 0.6 + 0.75 * uplift
    speed = 1 - 150.0 / spec.constraints.time_budget_s
    assert first.reward.best_pre == 0.3
    assert first.reward.uplift_term == pytest.approx(uplift, abs=1e-9)
    assert first.reward.job_quality == pytest.approx(quality, abs=1e-9)
    assert first.reward.train_speed == pytest.approx(speed, abs=1e-9)
    assert first.reward.total == pytest.approx(0.35 + 0.60 * quality + 0.05 * speed, abs=1e-9)
    baseline_text = json.loads(tool_results(first, "get_baseline_scores")[0])
    assert baseline_text["untrained_scores"][job.config.job.base_model].startswith("not measured yet")
    assert baseline_text["best_pre"] is None and "highest untrained score" in baseline_text["rule"]
    assert set(baseline_text["left_out_here"]) == set(spec.constraints.allowed_base_models) - {"tiny"}

    # A second episode scores against the frozen 0.3 though its own pre is 0.33 (within noise at n = 200) ...
    env.set_result(ok_result(pre=0.33, post=0.6, train_seconds=150.0))
    second = env.run(ReferencePolicy())
    assert second.stop_reason is StopReason.job_done
    assert second.run_id != first.run_id
    assert second.reward.best_pre == 0.3
    assert second.reward.uplift_term == pytest.approx(uplift, abs=1e-9)
    assert env.baselines.get(spec.family, weights_of(job.config.job.base_model), fingerprint, setup_of(spec)).best_pre == 0.3
    assert len(env.baselines.all()) == 1
    # ... and get_baseline_scores now serves it to the agent.
    served = json.loads(tool_results(second, "get_baseline_scores")[0])
    assert served["untrained_scores"][job.config.job.base_model] == 0.3 and served["best_pre"] == 0.3
    # ... but a pre of 0.5 on the same weights and set means the eval changed under the store: no reward.
    env.set_result(ok_result(pre=0.5, post=0.6, train_seconds=150.0))
    third = env.run(ReferencePolicy())
    assert third.stop_reason is StopReason.infra_error and "disagrees with the frozen baseline 0.3000" in third.error
    assert env.baselines.get(spec.family, weights_of("tiny"), fingerprint, setup_of(spec)).best_pre == 0.3


def test_preseeded_baseline_is_used(env, spec: TaskSpec) -> None:
    env.baselines.freeze(Baseline(family=spec.family, base_model="tiny", weights_sha256=weights_of("tiny"), setup=setup_of(spec),
                                  fingerprint=eval_fingerprint(spec, 200), best_pre=0.5, n=200))
    env.set_result(ok_result(pre=0.45, post=0.75, train_seconds=0.0))  # its own pre agrees within noise
    result = env.run(ReferencePolicy())
    assert env.executed[0].config.job.base_model == "tiny"
    assert result.reward.best_pre == 0.5
    assert result.reward.uplift_term == pytest.approx(0.5, abs=1e-9)
    assert result.reward.train_speed == 1.0


def test_valid_job_that_crashes_still_completes(env) -> None:
    env.set_result(crash_result)
    result = env.run(ReferencePolicy())
    assert result.stop_reason is StopReason.job_done
    assert result.job is not None and result.job.ok is False and result.job.fail_reason is FailReason.crash
    assert result.reward.validation == 1.0
    assert result.reward.job_quality == 0.0
    assert result.reward.train_speed == 0.0
    assert result.reward.total == pytest.approx(0.35, abs=1e-9)
    assert env.baselines.all() == []  # a dead job freezes nothing
    assert "failed: crash" in tool_results(result, "submit_job")[0]
    assert json.loads((Path(result.run_dir) / "job_result.json").read_text())["fail_reason"] == "crash"


def test_valid_after_an_invalid_attempt(env, spec: TaskSpec) -> None:
    """Submit the template first (invalid), then the reference job (valid at attempt 2)."""
    from ait.policy.reference import reference_job

    job = reference_job("calc_chain")
    policy = Scripted([[call("submit_job")],
                       [call("write_file", {"path": "job.toml", "content": job["job.toml"]}),
                        call("write_file", {"path": "env.py", "content": job["env.py"]})],
                       [call("submit_job")]])
    env.set_result(ok_result(pre=0.2, post=0.2, train_seconds=spec.constraints.time_budget_s * 2))
    result = env.run(policy)
    assert result.stop_reason is StopReason.job_done
    assert [s.report.valid for s in result.submissions] == [False, True]
    K = spec.max_submission_attempts
    assert result.reward.valid_attempt == 2
    assert result.reward.validation == pytest.approx(1 - 1 / K, abs=1e-9)
    assert result.reward.train_speed == 0.0 and result.reward.uplift_term == 0.0
    assert result.reward.total == pytest.approx(0.35 * (1 - 1 / K) + 0.60 * 0.25 * 0.2, abs=1e-9)
    assert "left" in tool_results(result, "submit_job")[0]


# ---- artifacts ------------------------------------------------------------------------------


def test_run_directory_artifacts(env) -> None:
    result = env.run(ReferencePolicy(), EpisodeConfig(max_turns=30, max_nudges=1))
    run = Path(result.run_dir)
    assert run.parent == env.runs.resolve() and run.name == result.run_id
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["run_id"] == result.run_id and manifest["policy"] == "reference"
    assert manifest["config"]["max_turns"] == 30 and manifest["config"]["max_nudges"] == 1
    assert manifest["config"]["reward"]["validation"] == 0.35
    assert manifest["versions"]["python"] and "pydantic" in manifest["versions"]

    events = trajectory(result)  # every line parses
    kinds = {e["kind"] for e in events}
    assert {"message", "tool_result", "probe", "episode_end"} <= kinds
    assert events[-1]["kind"] == "episode_end" and events[-1]["reward/total"] == result.reward.total

    assert (run / "workspace").is_dir()
    assert (run / "workspace" / "env.py").read_text() == (run / "submissions" / "1" / "workspace" / "env.py").read_text()
    probe = json.loads((run / "submissions" / "1" / "probe.json").read_text())
    assert probe["valid"] is True
    reward = json.loads((run / "reward.json").read_text())
    assert reward["total"] == result.reward.total and reward["validation"] == 1.0
    episode = json.loads((run / "episode.json").read_text())
    assert episode["stop_reason"] == "job_done" and episode["run_id"] == result.run_id
    job_result = json.loads((run / "job_result.json").read_text())
    assert job_result["ok"] is True and job_result["post"] == 0.6


def test_no_job_result_without_a_job(env) -> None:
    result = env.run(Silent(), EpisodeConfig(max_nudges=0))
    run = Path(result.run_dir)
    assert not (run / "job_result.json").exists()
    assert not (run / "submissions").exists()
    for name in ("manifest.json", "reward.json", "episode.json", "trajectory.jsonl"):
        assert (run / name).is_file(), name
    assert json.loads((run / "reward.json").read_text())["total"] == -0.1


# ---- policy errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("after", [0, 2])
def test_policy_exception_is_recorded(env, after: int) -> None:
    result = env.run(Exploding(after=after))
    assert result.stop_reason is StopReason.policy_error
    assert result.error == "RuntimeError: API down"
    assert result.turns == after + 1
    assert result.reward.total == -0.1
    errors = [e for e in trajectory(result) if e["kind"] == "policy_error"]
    assert len(errors) == 1 and "API down" in errors[0]["error"]
    episode = json.loads((Path(result.run_dir) / "episode.json").read_text())
    assert episode["stop_reason"] == "policy_error" and "API down" in episode["error"]


def test_a_job_that_failed_outside_the_agents_code_ends_the_episode_as_infra_error(env) -> None:
    env.set_result(lambda job: JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.infra,
                                         error="hidden eval: the eval exited with status 1\ntraceback...",
                                         base_model=job.config.job.base_model))
    result = env.run(ReferencePolicy())
    assert result.stop_reason is StopReason.infra_error and "the eval exited with status 1" in result.error
    assert result.reward.validation == 1.0 and result.reward.job_quality == 0.0  # recorded as it stood
    assert json.loads((Path(result.run_dir) / "episode.json").read_text())["stop_reason"] == "infra_error"


def test_the_reference_with_a_slip_recovers_in_a_real_episode(env, spec: TaskSpec) -> None:
    """ReferencePolicy(slip=...) through the harness: the probe rejects the misnamed helper, the policy's
    edit_file fixes it, the second submission is valid and runs (validation 1 - 1/K)."""
    result = env.run(ReferencePolicy(jobs=1, slip=1), EpisodeConfig())
    assert [s.report.valid for s in result.submissions] == [False, True] and len(env.executed) == 1
    assert result.stop_reason is StopReason.job_done and result.malformed_tool_calls == 0
    assert result.reward.validation == pytest.approx(1 - 1 / spec.max_submission_attempts)
    edits = tool_results(result, "edit_file")
    assert len(edits) == 1 and edits[0].startswith("edited env.py")


def test_baseline_scores_name_the_set_the_job_is_scored_on(env, spec: TaskSpec) -> None:
    """An episode whose eval_size overrides the spec's is scored on that smaller set: get_baseline_scores
    shows that set's frozen baseline (and its size and fingerprint), not the spec-size set's."""
    for n, value in ((spec.hidden_eval_size, 0.5), (20, 0.2)):
        env.baselines.freeze(Baseline(family=spec.family, base_model="tiny", weights_sha256=weights_of("tiny"), setup=setup_of(spec),
                                      fingerprint=eval_fingerprint(spec, n), best_pre=value, n=n))
    env.set_result(ok_result(pre=0.2, post=0.6, train_seconds=10.0))
    small = env.run(ReferencePolicy(), EpisodeConfig(eval_size=20))
    served = json.loads(tool_results(small, "get_baseline_scores")[0])
    assert served["untrained_scores"]["tiny"] == 0.2 and served["best_pre"] == 0.2
    assert served["hidden_eval"] == {"n": 20, "fingerprint": eval_fingerprint(spec, 20)}
    assert small.reward.best_pre == 0.2  # what it was shown is what it was scored against
    # ... and the scoring's best_pre is an event of its own, with its seconds (bench/episode_phases.py's baseline_s)
    scored = [e for e in trajectory(small) if e["kind"] == "baseline"]
    assert len(scored) == 1 and scored[0]["best_pre"] == 0.2 and scored[0]["seconds"] >= 0.0
    assert scored[0]["fingerprint"] == eval_fingerprint(spec, 20) and scored[0]["failed"] == []
    full = env.run(ReferencePolicy())
    served = json.loads(tool_results(full, "get_baseline_scores")[0])
    assert served["best_pre"] == 0.5 and served["hidden_eval"]["n"] == spec.hidden_eval_size
