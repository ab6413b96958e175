"""One episode: the agent writes a job through tools, submits, the job runs, reward is computed.

    run_episode  ─ seed workspace ─ turn loop (policy.act → tools) ─ submit_job → probe → job
                 ─ reward ─ artifacts in runs/<run_id>/
"""

from __future__ import annotations

import shutil
import time
import tomllib
from importlib.resources import files
from pathlib import Path
from typing import Callable

from ait.compute.executors import make_executor
from ait.evals.baselines import Baseline, BaselineStore
from ait.evals.hidden import eval_fingerprint
from ait.harness.tools import TOOL_SCHEMAS, EpisodeTools
from ait.harness.types import EpisodeConfig, EpisodeResult, Message, StopReason, Submission
from ait.harness.workspace_tools import WorkspaceTools
from ait.job.types import Job, JobResult
from ait.policy.base import Policy
from ait.probe.runner import probe_workspace
from ait.reward import compute_reward
from ait.runs import RunDir, new_run_id, runs_root, versions
from ait.spec import TaskSpec

READ_ONLY = ("INSTRUCTIONS.md", "task.json")
SYSTEM = ("You are an ML engineer. Your workspace holds INSTRUCTIONS.md and task.json. Write job.toml and env.py "
          "so that GRPO training makes the base model better at the task, then call submit_job. Use the tools.")
NUDGE = ("You have not submitted a job yet. Write job.toml and env.py as INSTRUCTIONS.md describes, then call "
         "submit_job; an episode without a submission scores -0.1.")


def seed_workspace(workspace: Path, spec: TaskSpec) -> None:
    """Template files plus task.json; the instructions and the task are read-only."""
    workspace.mkdir(parents=True, exist_ok=True)
    template = files("ait") / "job" / "template"
    for name in ("INSTRUCTIONS.md", "job.toml", "env.py"):
        (workspace / name).write_text((template / name).read_text())
    (workspace / "task.json").write_text(spec.model_dump_json(indent=2) + "\n")
    for name in READ_ONLY:
        (workspace / name).chmod(0o444)


class Episode:
    """State of one episode; `run` is the loop."""

    def __init__(self, spec: TaskSpec, task_path: Path, policy: Policy, config: EpisodeConfig,
                 run: RunDir, baselines: BaselineStore, on_event: Callable[[str], None] | None = None):
        self.spec, self.task_path, self.policy, self.config, self.run = spec, task_path, policy, config, run
        self.on_event = on_event or (lambda _msg: None)
        self.baselines = baselines
        self.submissions: list[Submission] = []
        self.job_result: JobResult | None = None
        self.valid_attempt: int | None = None
        seed_workspace(run.workspace, spec)
        files_ = WorkspaceTools(run.workspace, read_only=READ_ONLY)
        self.tools = EpisodeTools(files_, spec, submit=self.submit_job, baselines=baselines)

    def run_loop(self) -> tuple[StopReason, int, str | None]:
        messages = [Message(role="system", content=SYSTEM),
                    Message(role="user", content=f"Task: {self.spec.description}\nRead INSTRUCTIONS.md and task.json.")]
        for m in messages:
            self.run.log("message", **m.model_dump())
        self.policy.reset(self.spec)
        nudges = 0
        for turn in range(1, self.config.max_turns + 1):
            try:
                reply = self.policy.act(messages, TOOL_SCHEMAS)
            except Exception as e:
                self.run.log("policy_error", error=f"{type(e).__name__}: {e}")
                return StopReason.policy_error, turn, f"{type(e).__name__}: {e}"
            messages.append(reply)
            self.run.log("message", turn=turn, **reply.model_dump())
            if not reply.tool_calls:
                if nudges >= self.config.max_nudges:
                    return (StopReason.agent_stopped if self.submissions else StopReason.no_submission), turn, None
                nudges += 1
                messages.append(Message(role="user", content=self.nudge()))
                self.run.log("message", turn=turn, nudge=True, **messages[-1].model_dump())
                continue
            for call in reply.tool_calls:
                self.on_event(f"turn {turn}: {call.name}")
                t0 = time.monotonic()
                result = self.tools.dispatch(call)
                messages.append(Message(role="tool", content=result, tool_call_id=call.id, name=call.name))
                self.run.log("tool_result", turn=turn, tool=call.name, call_id=call.id, content=result,
                             seconds=round(time.monotonic() - t0, 3))
                if self.job_result is not None:
                    return StopReason.job_done, turn, None
                if len(self.submissions) >= self.spec.max_submission_attempts and self.valid_attempt is None:
                    return StopReason.attempts_exhausted, turn, None
        return StopReason.turn_cap, self.config.max_turns, None

    def nudge(self) -> str:
        if not self.submissions:
            return NUDGE
        left = self.spec.max_submission_attempts - len(self.submissions)
        return (f"Your last submission was invalid. Fix the errors it listed and call submit_job again "
                f"({left} attempt(s) left).")

    def submit_job(self) -> str:
        """The submit_job tool: freeze the workspace, probe it, run it if valid."""
        attempt = len(self.submissions) + 1
        if attempt > self.spec.max_submission_attempts:
            return "error: no submission attempts left"
        snapshot = self.run.submission_dir(attempt) / "workspace"
        shutil.copytree(self.run.workspace, snapshot, symlinks=True)
        self.on_event(f"probing submission {attempt}")
        report = probe_workspace(snapshot, self.spec, timeout_s=self.config.probe_timeout_s)
        self.run.write_json(f"submissions/{attempt}/probe.json", report)
        self.submissions.append(Submission(attempt=attempt, parseable=job_toml_parses(snapshot), report=report))
        self.run.log("probe", attempt=attempt, valid=report.valid, errors=[e.model_dump() for e in report.errors],
                     seconds=round(report.seconds, 3))
        left = self.spec.max_submission_attempts - attempt
        if not report.valid:
            return f"invalid job (attempt {attempt}, {left} left):\n{report.summary()}"
        self.valid_attempt = attempt
        job = Job(job_id=f"{self.run.path.name}-{attempt}", run_dir=str(self.run.path), workspace=str(snapshot),
                  task_path=str(self.task_path), config=report.config, time_budget_s=self.spec.constraints.time_budget_s,
                  kill_factor=self.config.kill_factor, eval_size=self.config.eval_size)
        self.on_event(f"training and evaluating ({report.config.job.base_model})")
        self.job_result = make_executor(self.config).run(job)
        self.run.write_json("job_result.json", self.job_result)
        if not self.job_result.ok:
            return f"job valid (attempt {attempt}) but it failed: {self.job_result.fail_reason.value}"
        return f"job valid (attempt {attempt}); training finished in {self.job_result.train_seconds:.0f}s"

    def best_pre(self) -> float | None:
        """The frozen baseline for the job's model; the job's own pre freezes it if none exists."""
        job = self.job_result
        if job is None or not job.ok:
            return None
        fingerprint = eval_fingerprint(self.spec, job.eval_n)
        entry = self.baselines.get(self.spec.family, job.base_model, fingerprint)
        if entry is None and job.pre is not None:
            entry = self.baselines.freeze(Baseline(family=self.spec.family, base_model=job.base_model,
                                                   fingerprint=fingerprint, best_pre=job.pre, n=job.eval_n))
        return entry.best_pre if entry else None


def job_toml_parses(workspace: Path) -> bool:
    try:
        tomllib.loads((workspace / "job.toml").read_text(errors="replace"))
        return True
    except (OSError, tomllib.TOMLDecodeError):
        return False


def run_episode(spec: TaskSpec, task_path: str | Path, policy: Policy, config: EpisodeConfig | None = None,
                runs_dir: str | Path | None = None, baselines: BaselineStore | None = None,
                run_id: str | None = None, on_event: Callable[[str], None] | None = None) -> EpisodeResult:
    config = config or EpisodeConfig()
    start = time.monotonic()
    run_id = run_id or new_run_id()
    run = RunDir(Path(runs_dir or runs_root()) / run_id)
    run.write_json("manifest.json", {"run_id": run_id, "task": spec.id, "task_path": str(Path(task_path).resolve()),
                                     "policy": policy.name, "config": config.model_dump(), "versions": versions(),
                                     "started_at": time.time()})
    episode = Episode(spec, Path(task_path).resolve(), policy, config, run, baselines or BaselineStore(), on_event)
    stop, turns, error = episode.run_loop()
    reward = compute_reward(
        parseable_submission=any(s.parseable for s in episode.submissions),
        valid_attempt=episode.valid_attempt, max_attempts=spec.max_submission_attempts,
        job=episode.job_result, best_pre=episode.best_pre(), time_budget_s=spec.constraints.time_budget_s,
        weights=config.reward)
    run.write_json("reward.json", reward)
    result = EpisodeResult(run_id=run_id, run_dir=str(run.path), task_id=spec.id, policy=policy.name,
                           stop_reason=stop, turns=turns, submissions=episode.submissions, job=episode.job_result,
                           reward=reward, wall_seconds=time.monotonic() - start, error=error)
    run.write_json("episode.json", result)
    run.log("episode_end", stop_reason=stop.value, **reward.metrics())
    return result
