"""`ait eval`: N episodes per task, means with error bars checked against the run directories, a
scripted agent on loopback whose episodes end every way (valid, invalid, timed out), a resume
after SIGKILL that runs only what was unfinished, and `ait eval compare`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ait.agent_eval.stats import stat
from ait.sandbox.detect import cached_capabilities

pytestmark = pytest.mark.skipif(not cached_capabilities().isolating, reason="needs the sandbox")
ROOT = Path(__file__).resolve().parents[1]


def ait(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ait.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def episodes_of(out: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/episode.json"))}


@pytest.mark.slow  # four full episodes (~60 s); the scripted-agent test below runs `ait eval` by default
def test_reference_eval_over_two_tasks_matches_its_run_dirs(tmp_path):
    out = tmp_path / "eval"
    proc = ait("eval", "--policy", "reference", "--tasks", "calc_chain_fast", "dispatch", "--episodes", "2",
               "--concurrency", "2", "--eval-size", "8", "--out", str(out), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout)
    runs = episodes_of(out)
    assert sorted(runs) == ["calc_chain_fast-000", "calc_chain_fast-001", "dispatch-000", "dispatch-001"]
    for task in ("calc_chain_fast", "dispatch"):
        rewards = [e["reward"]["total"] for name, e in runs.items() if name.startswith(task + "-")]
        summary = results["per_task"][task]
        expected = stat(rewards)
        assert summary["reward"]["n"] == 2 and summary["reward"]["mean"] == pytest.approx(expected.mean)
        assert summary["reward"]["se2"] == pytest.approx(expected.se2)
        assert summary["valid_rate"]["mean"] == 1.0 and summary["stop_reasons"] == {"job_done": 2}
    assert results["overall"]["episodes"] == 4 and results["stopped"] is None
    assert (out / "report.html").stat().st_size > 10_000 and (out / "results.json").exists()


class ScriptedAgent:
    """An OpenAI-compatible server that plays episode k by script k: a valid job, three invalid
    submissions, or replies too slow for the episode's time limit. A new episode is a request
    that holds only the two opening messages."""

    def __init__(self):
        from test_openai_policy import ChatServer, completion

        from ait.policy.reference import reference_job

        self.server, self.completion = ChatServer(), completion
        self.job = reference_job("calc_chain")
        self.episode, self.turn = -1, 0
        self.slow_s = 2.0
        agent = self

        class Replies(list):
            """The server's script, computed from the request it just received."""

            def __bool__(self) -> bool:
                return True

            def pop(self, index: int = -1) -> dict:
                return agent.next_reply(agent.server.requests[-1]["body"]["messages"])

        self.server.script = Replies()
        self.url = self.server.url

    def next_reply(self, messages: list[dict]) -> dict:
        if len(messages) == 2:
            self.episode, self.turn = self.episode + 1, 0
        self.turn += 1
        c = self.completion
        if self.episode == 0:  # a valid job at the first attempt
            plan = [[("write_file", {"path": "job.toml", "content": self.job["job.toml"]}),
                     ("write_file", {"path": "env.py", "content": self.job["env.py"]})], [("submit_job", {})]]
        elif self.episode == 1:  # never valid: the template as it is, submitted three times
            plan = [[("submit_job", {})]] * 3
        else:  # too slow: replies that take longer than the episode may
            return {"body": c([], content="thinking...", turn=self.turn), "delay": self.slow_s}
        if self.turn <= len(plan):
            return {"body": c(plan[self.turn - 1], turn=self.turn)}
        return {"body": c([], content="done", turn=self.turn)}


def test_a_scripted_agent_on_loopback_every_way_an_episode_ends(tmp_path):
    """Episode 0 writes a valid job, 1 never a valid one, 2 is too slow for its time limit (run as an
    eval of its own with a short limit, so the valid job's training is not on that clock)."""
    agent = ScriptedAgent()
    try:
        out = tmp_path / "eval"
        proc = ait("eval", "--policy", "openai:scripted", "--base-url", agent.url, "--tasks", "calc_chain_fast",
                   "--episodes", "2", "--eval-size", "8", "--max-turns", "12", "--out", str(out), "--json",
                   "--max-tokens", "777", "--request-timeout", "60", "--salvage-tool-calls", cwd=tmp_path)
        chats = [r["body"] for r in agent.server.requests if "messages" in (r.get("body") or {})]
        assert chats and all(b.get("max_tokens") == 777 for b in chats)  # ait episode's flags reach the policy
        slow = tmp_path / "slow"
        late = ait("eval", "--policy", "openai:scripted", "--base-url", agent.url, "--tasks", "calc_chain_fast",
                   "--episodes", "1", "--episode-timeout", "3", "--out", str(slow), "--json", cwd=tmp_path)
    finally:
        agent.server.httpd.shutdown()
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout)
    runs = episodes_of(out)
    stops = [runs[f"calc_chain_fast-00{i}"]["stop_reason"] for i in range(2)]
    assert stops == ["job_done", "attempts_exhausted"], stops
    summary = results["per_task"]["calc_chain_fast"]
    assert summary["valid_rate"]["mean"] == pytest.approx(1 / 2)
    assert summary["stop_reasons"] == {"attempts_exhausted": 1, "job_done": 1}
    assert summary["reward"]["mean"] == pytest.approx(sum(e["reward"]["total"] for e in runs.values()) / 2)
    assert summary["reward"]["se2"] > 0
    assert late.returncode == 0, late.stderr[-2000:]
    timed = json.loads(late.stdout)["per_task"]["calc_chain_fast"]
    assert timed["stop_reasons"] == {"timeout": 1} and timed["reward"]["mean"] == -0.1


@pytest.mark.slow  # 37 s on 2 shared cores: in CI's `pytest -m slow` pass
def test_a_killed_eval_resumes_without_rerunning_finished_episodes(tmp_path):
    out = tmp_path / "eval"
    proc = subprocess.Popen([sys.executable, "-m", "ait.cli", "eval", "--policy", "reference", "--tasks",
                             "calc_chain_fast", "--episodes", "2", "--eval-size", "8", "--out", str(out)],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not episodes_of(out) and time.monotonic() < deadline:
        assert proc.poll() is None, "the eval ended before it could be killed"
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    first = episodes_of(out)
    assert len(first) == 1
    stamps = {name: (out / "runs" / name / "episode.json").stat().st_mtime_ns for name in first}
    resumed = ait("eval", "--resume", str(out), "--json", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming: " in resumed.stderr
    after = episodes_of(out)
    assert sorted(after) == ["calc_chain_fast-000", "calc_chain_fast-001"]
    for name, stamp in stamps.items():  # finished episodes were not run again
        assert (out / "runs" / name / "episode.json").stat().st_mtime_ns == stamp
    assert json.loads(resumed.stdout)["overall"]["episodes"] == 2


def test_compare_states_differences_with_noise(tmp_path):
    from ait.agent_eval.compare import compare
    from ait.agent_eval.stats import summarize
    from ait.agent_eval.types import EpisodeRow, EvalPlan, EvalResults

    def results(rewards: list[float]) -> EvalResults:
        rows = [EpisodeRow(task_id="t", run_id=f"t-{i}", stop_reason="job_done", infra_error=False, reward=r,
                           validation=1.0, job_quality=r, uplift_term=r, train_speed=0.5, valid=True, job_ran=True,
                           job_failed=False, base_model="tiny") for i, r in enumerate(rewards)]
        return EvalResults(plan=EvalPlan(policy="p", tasks=["t"], episodes=len(rows)), per_task={"t": summarize(rows)},
                           overall=summarize(rows), episodes=rows, planned=len(rows))

    low, high, noisy = results([0.1, 0.12, 0.11, 0.09]), results([0.5, 0.52, 0.49, 0.51]), results([0.0, 1.0, 0.0, 1.0])
    verdicts = {(d.task, d.key): d.verdict for d in compare(low, high)}
    assert verdicts[("t", "reward")] == "b better" and verdicts[("t", "validation")] == "within noise"
    assert {d.verdict for d in compare(high, low) if d.key == "reward"} == {"a better"}
    assert {d.verdict for d in compare(low, noisy) if d.key == "reward"} == {"within noise"}
    for d in compare(low, high):
        if d.key == "reward":
            assert d.delta == pytest.approx(0.505 - 0.105) and d.noise is not None and d.noise > 0


def test_a_local_model_is_loaded_once_and_shared_by_concurrent_episodes(monkeypatch):
    """Loading from several threads at once races on torch's default dtype (seen on an H200)."""
    from ait.agent_eval.types import EvalPlan
    from ait.cli import eval as eval_cli
    from ait.policy import hf_policy

    loads = []
    real = hf_policy.HFPolicy.__init__

    def counting(self, model, **kwargs):
        if kwargs.get("loaded") is None:
            loads.append(model)
        real(self, model, **kwargs)

    monkeypatch.setattr(hf_policy.HFPolicy, "__init__", counting)
    new, close = eval_cli.policy_factory(EvalPlan(policy="hf:tiny", tasks=["calc_chain_fast"], episodes=4,
                                                   concurrency=4))
    policies = [new() for _ in range(4)]
    assert loads == ["tiny"] and len({id(p.model) for p in policies}) == 1
    # ... and one sampling engine, made by the first policy and handed to the rest, stopped by `close`
    engine = policies[0].engine
    assert engine is not None and all(p.engine is engine and not p.owns_engine for p in policies)
    close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.sample([1, 2], 1.0, 4, None)


def test_paired_difference_matches_episodes_and_leaves_out_infra_errors():
    from ait.agent_eval.stats import paired_difference
    from ait.agent_eval.types import EpisodeRow

    def row(run_id: str, reward: float, infra: bool = False, task: str = "triage") -> EpisodeRow:
        return EpisodeRow(task_id=task, run_id=run_id, stop_reason="job_done", infra_error=infra, reward=reward,
                          validation=0, job_quality=0, uplift_term=0, train_speed=0, valid=True, job_ran=True,
                          job_failed=False, base_model=None)

    a = [row("t-000", 0.1), row("t-001", 0.5), row("t-002", 0.2), row("t-003", 0.3, infra=True)]
    b = [row("t-001", 0.7), row("t-000", 0.2), row("t-002", 0.2, infra=True), row("t-003", 0.9),
         row("t-000", 9.0, task="other")]  # another task's t-000 has no partner
    d = paired_difference(a, b)
    assert d.n == 2 and d.mean == pytest.approx(0.15)  # (0.2 - 0.1) and (0.7 - 0.5)
    # Paired: the spread of the differences (0.1, 0.2), not of the rewards themselves.
    assert d.se2 == pytest.approx(2 * (0.005 ** 0.5) / (2 ** 0.5))


@pytest.mark.slow  # one whole episode in a subprocess (~40 s alone on 2 cores)
def test_eval_without_plots_names_no_report_it_did_not_write(tmp_path):
    """When the report cannot be drawn (matplotlib made unimportable here), `ait eval` still exits 0
    with its table and results.json, says there is no report.html, and never claims one."""
    blocker = tmp_path / "block"
    (blocker / "matplotlib").mkdir(parents=True)
    (blocker / "matplotlib" / "__init__.py").write_text("raise ImportError('matplotlib blocked by the test')\n")
    out = tmp_path / "eval"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "ait.cli", "eval", "--policy", "reference", "--tasks",
                           "calc_chain_fast", "--episodes", "1", "--eval-size", "8", "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = " ".join((proc.stdout + proc.stderr).split())
    assert (out / "results.json").is_file() and not (out / "report.html").exists()
    assert "no report.html" in text and "report in" not in text, text[-1500:]


def test_eval_and_episode_share_the_policy_settings_and_the_episode_config(tmp_path):
    """One settings model for both commands' policy flags; `ait eval --config` is an EpisodeConfig
    TOML under the flags, kept in the plan so a resume runs the same episodes."""
    from ait.agent_eval.types import EvalPlan
    from ait.harness.types import EpisodeConfig
    from ait.policy.base import PolicySettings

    shared = set(PolicySettings.model_fields)
    assert shared <= set(EvalPlan.model_fields) and {"max_tokens", "request_timeout_s", "salvage_tool_calls"} <= shared
    cfg = EpisodeConfig(max_turns=9, max_nudges=1, eval_size=50)
    plan = EvalPlan(policy="reference", tasks=["calc_chain_fast"], episodes=1, episode=cfg, eval_size=8)
    ep = plan.episode_config()
    assert (ep.max_turns, ep.max_nudges, ep.eval_size, ep.run_group) == (9, 1, 8, "eval")
    assert EvalPlan.model_validate_json(plan.model_dump_json()) == plan
    bad = tmp_path / "bad.toml"
    bad.write_text("max_turns = 0\nnot_a_key = 1\n")
    proc = ait("eval", "--policy", "reference", "--tasks", "calc_chain_fast", "--config", str(bad),
               "--out", str(tmp_path / "o"), cwd=tmp_path, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and "not_a_key" in proc.stderr, proc.stderr
