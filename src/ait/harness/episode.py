"""One episode: the agent writes a job through tools, submits, the job runs, reward is computed.

    run_episode  ─ seed workspace ─ turn loop (budget and deadline checks → policy.act → meter → tools)
                 ─ submit_job → probe → job (up to max_jobs, dev score shown) ─ best job
                 ─ reward ─ artifacts in runs/<run_id>/, spend in runs/costs.jsonl

With EpisodeConfig.timeout_s the episode has a wall-clock deadline: past it no further turn
is taken, a running job is killed, and the episode ends as `timeout`, scored as it stood. The time a
job waits for a slot other jobs hold moves the deadline (up to EpisodeConfig.slot_wait_s).

Why an episode ended is decided in one method, Episode.decide, asked at each point of a turn
where it may end (At) and once more when it is scored; it sets Episode.stop. Tools only record
what happened (a job not run for its cost, a job stopped at the deadline); decide reads that.
"""

from __future__ import annotations

import shutil
import time
import tomllib
from enum import Enum
from importlib.resources import files
from pathlib import Path
from typing import Callable

from ait.compute.executors import Executor, cancel_job, make_executor
from ait.evals.baselines import BaselineStore
from ait.evals.best_pre import BestPre, best_pre
from ait.harness import jobs as jobs_
from ait.harness.tools import TOOL_SCHEMAS, EpisodeTools
from ait.harness.types import (EpisodeConfig, EpisodeResult, JobRecord, Message, PolicyStop, Stop, StopReason,
                               Submission)
from ait.harness.workspace_tools import WorkspaceTools
from ait.job import task_tools
from ait.job.types import FailReason, Job, JobResult, storable
from ait.metering import Ledger, Meter, load_prices
from ait.policy.base import Policy
from ait.probe.runner import probe_workspace
from ait.probe.types import ProbeReport
from ait.reward import compute_reward, died
from ait.runs import RunDir, new_run_id, runs_root, versions
from ait.sandbox import require_isolation
from ait.spec import TaskSpec

READ_ONLY = ("INSTRUCTIONS.md", "task.json", task_tools.MODULE)
SYSTEM = ("You are an ML engineer. Your workspace holds INSTRUCTIONS.md and task.json. Write job.toml and env.py "
          "so that GRPO training makes the base model better at the task, then call submit_job. Use the tools.")
NUDGE = ("You have not submitted a job yet. Write job.toml and env.py as INSTRUCTIONS.md describes, then call "
         "submit_job; an episode without a submission scores -0.1.")


def seed_workspace(workspace: Path, spec: TaskSpec) -> None:
    """Template files, task.json and the family's task_tools.py; the instructions, the task and the
    tool interface are read-only."""
    workspace.mkdir(parents=True, exist_ok=True)
    template = files("ait") / "job" / "template"
    for name in ("INSTRUCTIONS.md", "job.toml", "env.py"):
        (workspace / name).write_text((template / name).read_text())
    (workspace / "task.json").write_text(spec.model_dump_json(indent=2) + "\n")
    task_tools.install(workspace, spec.family)
    for name in READ_ONLY:
        if (workspace / name).exists():
            (workspace / name).chmod(0o444)


def invalid_job_text(report: ProbeReport, attempt: int, left: int) -> str:
    """What submit_job answers for a job the probe rejected."""
    return f"invalid job (attempt {attempt}, {left} left):\n{report.summary()}"


def opening_messages(spec: TaskSpec, job_gpu_memory_gib: float | None = None) -> list[Message]:
    """The system prompt and the task: how every episode's conversation starts. A machine's limit on a
    job's GPU memory is said here, since the probe holds the job to it."""
    memory = "" if job_gpu_memory_gib is None else \
        f"\nOn this machine a job may use at most {job_gpu_memory_gib:.1f} GiB of GPU memory (its estimated peak)."
    return [Message(role="system", content=SYSTEM),
            Message(role="user", content=f"Task: {spec.description}\nRead INSTRUCTIONS.md and task.json.{memory}")]


class At(Enum):
    """The points of an episode where it may end: Episode.decide is asked at each."""

    before_call = "before_call"      # a turn is about to call the policy
    policy_raised = "policy_raised"  # the call raised instead of replying
    after_call = "after_call"        # the policy replied
    no_tool_call = "no_tool_call"    # ... and called no tool
    tool_call = "tool_call"          # a tool call was answered
    turns_used = "turns_used"        # every one of max_turns turns was taken
    interrupted = "interrupted"      # Ctrl-C
    scored = "scored"                # the loop is over and the baseline is known: the verdict


class Episode:
    """State of one episode; `run_loop` is the loop, `decide` says when and why it ends."""

    def __init__(self, spec: TaskSpec, task_path: Path, policy: Policy, config: EpisodeConfig,
                 run: RunDir, baselines: BaselineStore, meter: Meter, executor: Executor,
                 on_event: Callable[[str], None] | None = None):
        self.spec, self.task_path, self.policy, self.config, self.run = spec, task_path, policy, config, run
        self.executor = executor  # its owner's (shared with the episodes beside this one): never closed here
        self.on_event = on_event or (lambda _msg: None)
        self.baselines, self.meter = baselines, meter
        self.submissions: list[Submission] = []
        self.jobs: list[JobRecord] = []
        self.valid_attempt: int | None = None
        self.deadline = None if config.timeout_s is None else time.monotonic() + config.timeout_s
        self.chosen: int | None = None  # the job the agent chose with select_job (an index into jobs)
        self.turns = 0  # policy turns started
        self.nudges = 0  # reminders to submit sent
        # What the tools saw, for decide: a valid job not run because it would pass a budget (why), and
        # a job stopped because the deadline passed while it ran or waited for a slot.
        self.job_not_run: str | None = None
        self.job_cut_at_deadline = False
        self.stop: Stop | None = None  # how the episode ended: set by decide, nowhere else
        seed_workspace(run.workspace, spec)
        files_ = WorkspaceTools(run.workspace, read_only=READ_ONLY)
        self.tools = EpisodeTools(files_, spec, submit=self.submit_job, select=self.select_job, baselines=baselines,
                                  eval_size=config.eval_size)

    @property
    def scored(self) -> int | None:
        """Index of the scored job: the agent's choice, else the best by dev score (never by hidden score)."""
        return jobs_.scored_job(self.jobs, self.chosen)

    @property
    def job_result(self) -> JobResult | None:
        """The scored job's result."""
        return None if self.scored is None else self.jobs[self.scored].result

    def select_job(self, job: int) -> str:
        """The select_job tool: the agent names the job (1-based, in the order they ran) it is scored on."""
        if self.config.max_jobs < 2:
            return "error: this episode runs one job; it is the one scored"
        if not isinstance(job, int) or isinstance(job, bool) or not 1 <= job <= len(self.jobs):
            return (f"error: job must be the number of a job that ran (1..{len(self.jobs)})" if self.jobs
                    else "error: no job has run yet; submit_job first")
        self.chosen = job - 1
        self.run.log("select_job", job=job)
        return f"job {job} is the one this episode is scored on"

    def run_loop(self) -> Stop:
        """The turns: the policy replies, its tool calls are answered, until decide ends the episode."""
        messages = opening_messages(self.spec, self.config.job_gpu_memory_gib)
        for m in messages:
            self.run.log("message", **m.model_dump())
        self.policy.reset(self.spec)
        for turn in range(1, self.config.max_turns + 1):
            self.turns = turn
            if stop := self.decide(At.before_call, turn):
                return stop
            t0 = time.monotonic()
            try:
                reply = self.policy.act(messages, TOOL_SCHEMAS)
            except Exception as e:  # a call that never answered is metered, then the episode ends
                return self.decide(At.policy_raised, turn, error=e, retries=self.failed_call(e))
            if reply.usage is not None:
                reply = reply.model_copy(update={"usage": self.meter.record_llm(reply.usage, self.policy.name)})
            messages.append(reply)
            self.run.log("message", turn=turn, seconds=round(time.monotonic() - t0, 3), **reply.model_dump())
            if stop := self.decide(At.after_call, turn):
                return stop
            if not reply.tool_calls:
                if stop := self.decide(At.no_tool_call, turn):
                    return stop
                self.nudges += 1
                messages.append(Message(role="user", content=self.nudge()))
                self.run.log("message", turn=turn, nudge=True, **messages[-1].model_dump())
                continue
            for call in reply.tool_calls:
                self.on_event(f"turn {turn}: {call.name}")
                t0 = time.monotonic()
                result = self.tools.dispatch(call, reply.content)
                messages.append(Message(role="tool", content=result, tool_call_id=call.id, name=call.name))
                self.run.log("tool_result", turn=turn, tool=call.name, call_id=call.id, content=result,
                             seconds=round(time.monotonic() - t0, 3), malformed_total=self.tools.malformed)
                if stop := self.decide(At.tool_call, turn, tool=call.name):
                    return stop
        return self.decide(At.turns_used, self.config.max_turns)

    def decide(self, at: At, turn: int = 0, *, error: Exception | None = None, retries: list[dict] | None = None,
               tool: str = "", baseline: BestPre | None = None, note: str | None = None) -> Stop | None:
        """Whether the episode ends at point `at` of turn `turn`, and why: the one place an episode's end
        is decided. A stop is recorded (self.stop, and the trajectory's event for it) and returned;
        None: the episode goes on. At.scored, once the baseline is known, gives the final verdict on
        the stop the loop (or Ctrl-C) ended with."""
        stop = None
        if at in (At.before_call, At.after_call):
            taken = turn - 1 if at is At.before_call else turn
            # Before the call: would it pass a budget (estimated at the last call's price)? After it: did
            # it pass one? Either way nothing more is acted on; nor is a reply that came too late.
            if why := self.meter.over_budget(self.meter.last_call_usd if at is At.before_call else 0.0):
                self.run.log("budget_stop", reason=why, **self.meter.summary.metrics())
                stop = Stop(reason=StopReason.budget, turns=taken, error=why)
            elif self.past_deadline():
                stop = self.timeout(taken)
        elif at is At.policy_raised:
            if isinstance(error, PolicyStop):  # a known reason: its context is full, the outer run is stopping
                self.run.log("policy_stop", reason=error.reason.value, error=str(error), retries=retries)
                stop = Stop(reason=error.reason, turns=turn, error=str(error))
            else:
                why = f"{type(error).__name__}: {error}"
                self.run.log("policy_error", error=why, retries=retries)
                stop = Stop(reason=StopReason.policy_error, turns=turn, error=why)
        elif at is At.no_tool_call:  # the agent stopped talking: done, or nudged to submit until nudges run out
            if self.jobs:  # done refining
                stop = Stop(reason=StopReason.job_done, turns=turn)
            elif self.nudges >= self.config.max_nudges:
                reason = StopReason.agent_stopped if self.submissions else StopReason.no_submission
                stop = Stop(reason=reason, turns=turn)
        elif at is At.tool_call:  # what the call did (submit_job ran a job, or did not) may end the episode
            if self.job_cut_at_deadline:  # its job was killed, or cancelled still waiting, at the deadline
                stop = self.timeout(turn)
            elif self.job_not_run:  # its job was valid but would have passed a budget
                stop = Stop(reason=StopReason.budget, turns=turn, error=self.job_not_run)
            elif len(self.jobs) >= self.config.max_jobs and self.config.max_jobs == 1:
                # With several jobs the agent may still select_job: it stops by replying.
                stop = Stop(reason=StopReason.job_done, turns=turn)
            elif self.invalid_attempts() >= self.spec.max_submission_attempts:
                stop = Stop(reason=StopReason.job_done if self.jobs else StopReason.attempts_exhausted, turns=turn)
            elif self.past_deadline():
                stop = self.timeout(turn)
            elif 0 < self.config.max_repeated_errors <= self.tools.repeated_errors:
                why = f"the same {tool} call failed the same way {self.tools.repeated_errors} times in a row"
                self.run.log("stuck", reason=why, turn=turn)
                stop = Stop(reason=StopReason.stuck, turns=turn, error=why)
        elif at is At.turns_used:
            stop = Stop(reason=StopReason.turn_cap, turns=turn)
        elif at is At.interrupted:
            self.run.log("interrupted", turns=turn)
            stop = Stop(reason=StopReason.interrupted, turns=turn, error="interrupted (Ctrl-C)")
        elif at is At.scored:
            assert self.stop is not None, "scored before the loop ended"
            # A scored job that failed for a reason outside the agent's code, or a best_pre that could not be
            # measured, makes the episode infra_error: recorded, but no verdict on the agent (the outer loop
            # leaves it out). Otherwise it ends as it stopped, with the policy's note (e.g. tool calls
            # written as text the whole episode) beside the error.
            if why := infra_failure(self.job_result, baseline):
                stop = Stop(reason=StopReason.infra_error, turns=self.stop.turns, error=why)
            elif note:
                error_ = f"{self.stop.error}; {note}" if self.stop.error else note
                stop = self.stop.model_copy(update={"error": error_})
            else:
                stop = self.stop
        if stop is not None:
            self.stop = stop
        return stop

    def timeout(self, turns: int) -> Stop:
        why = f"the episode's wall-clock limit of {self.config.timeout_s:g}s passed"
        self.run.log("timeout", reason=why, turns=turns)
        return Stop(reason=StopReason.timeout, turns=turns, error=why)

    def failed_call(self, error: BaseException) -> list[dict]:
        """A call that never answered still took time (attempts, backoff waits): metered as a failed
        call (llm_seconds, failed_llm_calls; nothing billed). Returns its retries, for the record."""
        usage = getattr(error, "usage", None)
        if usage is not None:
            self.meter.record_llm_failure(usage, self.policy.name)
        retries = getattr(error, "retries", None) or (getattr(usage, "retries", None) if usage else None) or []
        return [r.model_dump() if hasattr(r, "model_dump") else r for r in retries]

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def invalid_attempts(self) -> int:
        return sum(not s.report.valid for s in self.submissions)

    def nudge(self) -> str:
        if not self.submissions:
            return NUDGE
        left = self.spec.max_submission_attempts - self.invalid_attempts()
        return (f"Your last submission was invalid. Fix the errors it listed and call submit_job again "
                f"({left} attempt(s) left).")

    def submit_job(self) -> str:
        """The submit_job tool: freeze the workspace, probe it, run it if valid (and affordable)."""
        K = self.spec.max_submission_attempts
        if self.invalid_attempts() >= K:
            return "error: no submission attempts left"
        if len(self.jobs) >= self.config.max_jobs:
            return (f"error: all {self.config.max_jobs} jobs have run; choose the scored one with select_job(job) "
                    "or stop")
        attempt = len(self.submissions) + 1
        snapshot = self.run.submission_dir(attempt) / "workspace"
        shutil.copytree(self.run.workspace, snapshot, symlinks=True)
        task_tools.install(snapshot, self.spec.family)  # the trusted interface, whatever the agent left there
        self.on_event(f"probing submission {attempt}")
        left = self.seconds_left()
        probe_timeout = self.config.probe_timeout_s if left is None else max(1.0, min(self.config.probe_timeout_s, left))
        report = probe_workspace(snapshot, self.spec, timeout_s=probe_timeout,
                                 gpu_memory_gib=self.config.job_gpu_memory_gib)
        self.run.write_json(f"submissions/{attempt}/probe.json", report)
        self.submissions.append(Submission(attempt=attempt, parseable=job_toml_parses(snapshot), report=report))
        self.run.log("probe", attempt=attempt, valid=report.valid, errors=[e.model_dump() for e in report.errors],
                     seconds=round(report.seconds, 3))
        if not report.valid:
            return invalid_job_text(report, attempt, K - self.invalid_attempts())
        self.valid_attempt = self.valid_attempt or attempt
        task_tools.install(snapshot, self.spec.family)  # and again after the probe ran the agent's code in it
        index = len(self.jobs) + 1
        job = Job(job_id=f"{self.run.path.name}-{attempt}", run_dir=str(jobs_.job_run_dir(self.run.path, index)),
                  workspace=str(snapshot), task_path=str(self.task_path), config=report.config,
                  time_budget_s=self.spec.constraints.time_budget_s, kill_factor=self.config.kill_factor,
                  eval_size=self.config.eval_size, trainer=self.config.trainer)
        estimate = jobs_.estimate_job_usd(self.config, job.time_budget_s, self.meter.prices)
        if why := self.meter.over_budget(estimate):
            self.job_not_run = f"job not run: {why}"
            self.run.log("budget_stop", reason=self.job_not_run, attempt=attempt, **self.meter.summary.metrics())
            return f"job valid (attempt {attempt}) but not run: it would pass the episode's budget"
        self.on_event(f"training and evaluating ({report.config.job.base_model})")
        result = self.run_job(job)
        return self.record_job(attempt, job, result)

    def run_job(self, job: Job) -> JobResult:
        """The executor's result; with a deadline, a job still running when it passes is killed and
        recorded as failed (timeout), and the episode ends as timed out. The deadline first moves by
        the job's wait for a slot, up to slot_wait_s (other episodes' jobs held it up, not the agent).
        Interrupted (Ctrl-C), the job is stopped (its processes killed, its queue entry cancelled) and
        recorded as killed, with the seconds it ran in the ledger, before the interrupt goes on."""
        executor = self.executor
        start = time.monotonic()
        try:
            left = self.seconds_left()
            if left is None:
                result = executor.run(job, on_event=self.on_event)
            else:
                result, excused = jobs_.run_until(executor, job, left, self.on_event, self.config.slot_wait_s)
                if excused > 0 and self.deadline is not None:  # other jobs held the slot: not the agent's time
                    self.deadline += excused
                    self.run.log("slot_wait", job_id=job.job_id, excused_s=round(excused, 3))
        except KeyboardInterrupt:
            cancel_job(executor, job)
            spent = time.monotonic() - start
            self.run.log("job_interrupted", job_id=job.job_id, seconds=round(spent, 3))
            self.record_job(self.submissions[-1].attempt, job, JobResult(
                job_id=job.job_id, ok=False, fail_reason=FailReason.killed, base_model=job.config.job.base_model,
                total_seconds=spent, error="interrupted (Ctrl-C): the job was stopped"))
            raise
        if result is None and not executor.started(job):
            # Still waiting for a slot or a GPU when the time ran out: other work held it up, so this
            # is not the agent's timeout. It is cancelled (it never starts) and the episode is infra.
            cancel_job(executor, job)
            self.job_cut_at_deadline = True
            self.run.log("job_never_started", job_id=job.job_id, waited_s=round(time.monotonic() - start, 3))
            return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.infra,
                             base_model=job.config.job.base_model, total_seconds=0.0,
                             error=f"the episode's wall-clock limit passed after {time.monotonic() - start:.0f}s "
                                   f"while the job still waited for a slot (executor {self.config.executor}): it never ran")
        if result is None:
            self.job_cut_at_deadline = True
            self.run.log("job_timeout", job_id=job.job_id, seconds_left=0.0)
            return JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.timeout,
                             base_model=job.config.job.base_model,
                             error="the episode's wall-clock limit passed while the job ran; it was killed")
        return result

    def record_job(self, attempt: int, job: Job, result: JobResult) -> str:
        """Dev score, cost, ledger, artifacts; the agent's feedback (dev only, never hidden)."""
        result = storable(result)  # job_result.json and episode.json must read back (`ait eval --resume`)
        left = self.config.max_jobs - len(self.jobs) - 1
        iterative = self.config.max_jobs > 1
        dev, dev_note, dev_seconds = jobs_.dev_score(job, result, iterative)
        if not self.config.keep_checkpoints:  # scored (hidden and dev): the weights and scratch are no longer needed
            jobs_.discard_job_files(job, result)
        record = jobs_.make_record(attempt, job, result, dev, self.config, self.meter.prices, dev_seconds)
        self.meter.record_job(job.job_id, record.cost)
        self.jobs.append(record)
        self.run.write_json(f"submissions/{attempt}/job_result.json", result)
        self.run.write_json("job_result.json", self.job_result)
        self.run.log("job", index=len(self.jobs), attempt=attempt, job_id=job.job_id, ok=result.ok,
                     fail_reason=result.fail_reason, dev=dev, hidden_pre=result.pre, hidden_post=result.post,
                     cost=record.cost.model_dump(), scored=self.scored)
        return jobs_.feedback(record, dev_note, left, iterative=iterative, number=len(self.jobs))

    def baseline(self) -> BestPre | None:
        """The untrained score the scored job must beat: the best frozen score among the task's
        allowed base models on its hidden set (ait.evals.best_pre), seeded where missing. A job that
        died needs one only under dead_job = "untrained" (it is then scored from its model's pre)."""
        job = self.job_result
        if job is not None and died(job) and self.config.reward.dead_job == "untrained":
            # A dead job reports no eval_n: the set it would have been scored on is the config's size.
            return best_pre(self.spec, job.eval_n or self.config.eval_size or self.spec.hidden_eval_size,
                            self.baselines, own=job)
        if job is None or not job.ok or job.eval_n is None:
            return None
        return best_pre(self.spec, job.eval_n, self.baselines, own=job)


class EpisodeInterrupted(KeyboardInterrupt):
    """Ctrl-C ended the episode; it was recorded first (episode.json, stop reason `interrupted`)."""

    def __init__(self, result: EpisodeResult):
        super().__init__(f"episode {result.run_id} interrupted")
        self.result = result


def stop_probe() -> None:
    """A probe the interrupt cut short must not run on: the warm interpreter goes, taking its child."""
    from ait.probe.runner import probe_zygote

    zygote = probe_zygote()
    if zygote is not None:
        zygote.close()
    probe_zygote.cache_clear()


def infra_failure(job: JobResult | None, baseline: BestPre | None) -> str | None:
    """What failed outside the agent's code, if anything: the scored job's eval or worker (or its base
    model stopped resolving), or the measurement of best_pre. Episode.decide ends such an episode as
    infra_error."""
    if job is not None and job.fail_reason is FailReason.infra:
        return f"infrastructure: {(job.error or '').splitlines()[0][:300]}"
    if baseline is not None and not baseline.complete:
        return "infrastructure: " + "; ".join(f"{name}: {why}" for name, why in baseline.failed.items())
    return None


def job_toml_parses(workspace: Path) -> bool:
    try:
        tomllib.loads((workspace / "job.toml").read_text(errors="replace"))
        return True
    except (OSError, tomllib.TOMLDecodeError):
        return False


def run_episode(spec: TaskSpec, task_path: str | Path, policy: Policy, config: EpisodeConfig | None = None,
                runs_dir: str | Path | None = None, baselines: BaselineStore | None = None,
                run_id: str | None = None, on_event: Callable[[str], None] | None = None,
                executor: Executor | None = None) -> EpisodeResult:
    """One episode. `executor` runs its jobs: its owner's, shared with the episodes beside this one
    (ait.compute.executors); without one, the episode builds its own from `config` and closes it."""
    config = config or EpisodeConfig()
    sandbox = require_isolation()  # before anything is written: no episode without a sandbox (or the override)
    if executor is None:  # nobody shares one with this episode: it owns one
        owned = make_executor(config)
        try:
            return run_episode(spec, task_path, policy, config, runs_dir, baselines, run_id, on_event, owned)
        finally:
            owned.close()
    start = time.monotonic()
    run_id = run_id or new_run_id()
    root = Path(runs_dir or runs_root())
    meter = Meter(Ledger(config.ledger_path or root / "costs.jsonl"), run_id, load_prices(config.prices_path),
                  group=config.run_group, budget_usd=config.budget_usd, run_budget_usd=config.run_budget_usd)
    run = RunDir(root / run_id)
    run.write_json("manifest.json", {"run_id": run_id, "task": spec.id, "task_path": str(Path(task_path).resolve()),
                                     "policy": policy.name, "policy_settings": getattr(policy, "settings", {}),
                                     "config": config.model_dump(), "versions": versions(), "sandbox": sandbox,
                                     "started_at": time.time()})
    episode = Episode(spec, Path(task_path).resolve(), policy, config, run, baselines or BaselineStore(), meter,
                      executor, on_event)
    interrupted = False
    try:
        episode.run_loop()
    except KeyboardInterrupt:  # recorded, then passed on: the caller still sees the interrupt
        interrupted = True
        stop_probe()
        episode.decide(At.interrupted, episode.turns)
    if episode.jobs:  # the agent's choice, if it made one after its last job, is in by now
        run.write_json("job_result.json", episode.job_result)
    note = None
    if (diagnostics := getattr(policy, "diagnostics", None)) is not None:
        found = diagnostics()  # e.g. tool calls written as text the whole episode: say so in the result
        run.log("policy_diagnostics", **found)
        note = found.get("note")
    scoring_started = time.monotonic()
    baseline = None if interrupted else episode.baseline()  # no baseline eval is started after Ctrl-C
    if baseline is not None:  # seconds spent here are the baseline evals (or the wait for another's)
        run.log("baseline", seconds=round(time.monotonic() - scoring_started, 3), best_pre=baseline.value,
                scores=baseline.scores, failed=sorted(baseline.failed), fingerprint=baseline.fingerprint)
    stop = episode.decide(At.scored, baseline=baseline, note=note)
    reward = compute_reward(
        parseable_submission=any(s.parseable for s in episode.submissions),
        valid_attempt=episode.valid_attempt, max_attempts=spec.max_submission_attempts,
        job=episode.job_result, best_pre=baseline.value if baseline else None,
        time_budget_s=spec.constraints.time_budget_s, weights=config.reward,
        base_pre=baseline.scores.get(episode.job_result.base_model) if baseline and episode.job_result else None)
    if baseline is not None:  # which models best_pre is over depends on the install: say so in the record
        reward = reward.model_copy(update={"best_pre_models": sorted(baseline.scores),
                                           "best_pre_left_out": dict(baseline.excluded)})
    run.write_json("reward.json", reward)
    result = EpisodeResult(run_id=run_id, run_dir=str(run.path), task_id=spec.id, policy=policy.name,
                           stop_reason=stop.reason, turns=stop.turns, error=stop.error, submissions=episode.submissions,
                           job=episode.job_result, jobs=episode.jobs, scored_job=episode.scored,
                           chosen_job=episode.chosen, baseline=baseline, reward=reward,
                           wall_seconds=time.monotonic() - start, cost=meter.summary,
                           malformed_tool_calls=episode.tools.malformed)
    run.write_json("episode.json", result)
    run.log("episode_end", stop_reason=stop.reason.value, scored_job=result.scored_job,
            malformed_tool_calls=result.malformed_tool_calls, **reward.metrics(), **meter.summary.metrics())
    if interrupted:
        raise EpisodeInterrupted(result)
    return result
