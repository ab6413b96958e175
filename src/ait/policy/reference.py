"""The reference policy: a scripted agent that writes a known-good job for its family.

It works only through the harness tools, as any agent must: it reads the instructions
and task.json, checks the baselines, reads the family's task_tools.py (the module env.py
imports), writes job.toml and env.py from the reference job for the task's family (with
`variant`, that job with one knob turned: ait.policy.job_variants.agent_job), submits, and
stops. When the harness allows more jobs (EpisodeConfig.max_jobs > 1) it refines up to `jobs` times: each time it doubles
max_steps (within the task's bound) and submits again. It is the default policy with no
API key, the demo, a test fixture and a baseline for trained agents.

With `slip=N` its first env.py calls a task_tools helper by a name the module lacks (one
call, `plant_slip`), as agents that write from memory do; it reads the probe's error, fixes
that line with edit_file and submits again. The warm start distils such recoveries (without
the slip itself): the 1.5B agent never recovered from a probe error before (docs/outer.md).

It writes env.py as a small agent should write a long file: the whole file in a ```python
block in its message, then write_file with only the path (the harness writes the message's
last fenced block), rather than as one JSON-escaped string. Short job.toml goes as
`content`. The outer loop's warm start distils these transcripts, so a trained agent
starts out with both styles.
"""

from __future__ import annotations

import json
import re
from importlib.resources import files
from typing import Any

from ait.chat.types import ToolCall
from ait.harness.fenced import fenced
from ait.harness.types import Message
from ait.policy.job_variants import VARIANTS, agent_job, task_job
from ait.spec import Constraints, TaskSpec


def reference_job(family: str) -> dict[str, str] | None:
    """{"job.toml": text, "env.py": text} for a family, or None if none is shipped."""
    root = files("ait") / "policy" / "reference_jobs" / family
    if not root.is_dir():
        return None
    return {name: (root / name).read_text() for name in ("job.toml", "env.py")}


def unavailable_models(messages: list[Message]) -> set[str]:
    """The base models get_baseline_scores said this install cannot load (its `left_out_here`)."""
    for m in reversed(messages):
        if m.role == "tool" and m.name == "get_baseline_scores":
            try:
                left_out = json.loads(m.content).get("left_out_here") or {}
            except (ValueError, AttributeError):
                return set()
            return set(left_out) if isinstance(left_out, dict) else set()
    return set()


MORE_JOBS = "more job(s) allowed"  # what the harness says when another job may run
TOOL_MODULE = "task_tools.py"  # the family's tool interface, read-only in the workspace
FENCED = {"env.py": "python"}  # files written as a fenced block in the message (info string), not as content


TT_CALL = re.compile(r"\btt\.([a-z_]\w*)\(")
MISNAMINGS = ("{}s", "get_{}", "find_{}")
"""How the slip misnames a helper (cycled): names a model might remember from elsewhere."""


def plant_slip(env_py: str, which: int = 0) -> tuple[str, str, str, str, str] | None:
    """(env.py with one task_tools call misnamed, the wrong line, the right line, the wrong name, the
    right name), or None when env.py calls no helper. Of the calls `tt.NAME(` on lines that occur once,
    the `which`-th (cycling) is renamed by MISNAMINGS[which], to a helper the module lacks."""
    lines = env_py.splitlines(keepends=True)
    spots = [(i, m) for i, line in enumerate(lines) if not line.lstrip().startswith("#")
             and env_py.count(line) == 1 and (m := TT_CALL.search(line))]
    if not spots:
        return None
    i, match = spots[which % len(spots)]
    right = match.group(1)
    wrong = MISNAMINGS[which % len(MISNAMINGS)].format(right)
    line = lines[i]
    bad = line[:match.start(1)] + wrong + line[match.end(1):]
    return "".join(lines[:i] + [bad] + lines[i + 1:]), bad.rstrip("\n"), line.rstrip("\n"), wrong, right


def more_steps(job_toml: str, cap: int) -> str | None:
    """job.toml with max_steps doubled (at most `cap`), or None when it cannot grow."""
    match = re.search(r"^max_steps\s*=\s*(\d+)", job_toml, re.MULTILINE)
    if not match or int(match.group(1)) >= cap:
        return None
    steps = min(2 * int(match.group(1)), cap)
    return job_toml[:match.start()] + f"max_steps = {steps}" + job_toml[match.end():]


class ReferencePolicy:
    name = "reference"

    def __init__(self, jobs: int = 2, base_model: str | None = None, slip: int | None = None,
                 variant: str | None = None):
        if variant is not None and variant not in VARIANTS:
            raise ValueError(f"unknown job variant {variant!r}; one of {sorted(VARIANTS)}")
        self.jobs = jobs
        """Most jobs to run when the harness allows several (1 = never refine)."""
        self.base_model = base_model
        """Base model to write into job.toml (None: the reference job's, or the task's first allowed); a
        variant that names its own model overrides it."""
        self.slip = slip
        """When set: write a first env.py with one misnamed task_tools call (plant_slip's `which`), then fix
        it from the probe's error."""
        self.variant = variant
        """Which job to write: a name in ait.policy.job_variants.VARIANTS (None: the reference job)."""
        self.written: tuple[str, str] | None = None
        """(variant, base model) of the job last planned, after any fallback (agent_job)."""
        self.settings = {"jobs": jobs, **({"base_model": base_model} if base_model else {}),
                         **({"slip": slip} if slip is not None else {}),
                         **({"variant": variant} if variant is not None else {})}

    def reset(self, spec: TaskSpec) -> None:
        self.step = 0
        self.submitted = 0
        self.resubmit: str | None = None  # the message of a submit_job call due next
        self.fix: tuple[str, str, str, str] | None = None  # (wrong line, right line, names) while unfixed
        self.own_job = False  # writing the task's own job (job_variants.task_job), not its family's

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        self.step += 1
        plan = [
            lambda: self._call("list_files", {}),
            lambda: self._call("read_file", {"path": "INSTRUCTIONS.md"}),
            lambda: self._call("read_file", {"path": "task.json"}),
            lambda: self._read_task(messages[-1].content),
            lambda: self._read_tools(messages),
            lambda: self._write("job.toml"),
            lambda: self._write("env.py"),
            lambda: self._call("submit_job", {}),
        ]
        if self.step <= len(plan):
            return plan[self.step - 1]()
        return self._refine(messages[-1])

    def _refine(self, last: Message) -> Message:
        """After a job: write a longer-trained job.toml, then submit it, while jobs are allowed. After
        the probe rejected the slip: fix its line, then submit again."""
        if self.fix is not None and last.role == "tool" and last.name == "submit_job" and "invalid" in last.content:
            wrong, right, wrong_name, right_name = self.fix
            self.fix, self.resubmit = None, "Submitting the fixed job."
            return self._call("edit_file", {"path": "env.py", "old": wrong, "new": right},
                              content=f"task_tools has no {wrong_name}: the helper is {right_name}. Fixing that line.")
        if self.resubmit is not None:
            content, self.resubmit = self.resubmit, None
            return self._call("submit_job", {}, content=content)
        after_job = last.role == "tool" and last.name == "submit_job" and MORE_JOBS in last.content
        if self.submitted < self.jobs and after_job:
            longer = more_steps(self.job["job.toml"], self.max_steps)
            if longer is not None:
                self.job["job.toml"] = longer
                self.resubmit = "Submitting the longer run."
                return self._write("job.toml")
        return Message(role="assistant", content="I submitted the reference job for this task.")

    def _call(self, name: str, arguments: dict[str, Any], content: str = "") -> Message:
        self.submitted += name == "submit_job"
        call = ToolCall(id=f"call_{self.step}", name=name, arguments=arguments)
        return Message(role="assistant", content=content, tool_calls=[call])

    def _read_task(self, task_json: str) -> Message:
        task = json.loads(task_json)
        if reference_job(task["family"]) is None:
            self.step = 10_000  # nothing to write: stop, and let the harness record it
            return Message(role="assistant", content=f"I have no reference job for family {task['family']!r}.")
        constraints = Constraints.model_validate(task["constraints"])
        # A task with a job of its own (the default episode's, sized for a laptop's CPU) gets it; otherwise on
        # `tiny` the shipped CPU job (or a variant of it), on a pretrained model the GPU reference job (or a
        # variant): the tiny job's learning rate (1e-3) would wreck a pretrained model (docs/gpu.md).
        self.family, self.constraints = task["family"], constraints
        variant, model, self.job = agent_job(task["family"], constraints, self.variant, self.base_model,
                                             task_id=task.get("id"))
        self.own_job = task_job(task["family"], task.get("id")) == self.job
        self.written = (variant, model)
        self.max_steps = constraints.max_steps
        if self.slip is not None and (planted := plant_slip(self.job["env.py"], self.slip)) is not None:
            self.job["env.py"], self.fix = planted[0], planted[1:]
        return self._call("get_baseline_scores", {}, content=f"Family {task['family']}: writing the reference job.")

    def _read_tools(self, messages: list[Message]) -> Message:
        """Read the family's tool module before writing an env.py that imports it (when the workspace has
        one): what the job may call is there, not in memory. A warm start distilled from transcripts
        without this step wrote held-out triage jobs that called functions triage's module does not
        have (H200, 2026-12-02: docs/outer.md).

        First, when the task's own job trains a model the baselines say this install cannot load (the
        default episode's SmolLM2 without its package), the family's job is written instead: a job the
        probe would refuse helps no one."""
        if self.own_job and self.written[1] in unavailable_models(messages):
            variant, model, self.job = agent_job(self.family, self.constraints, self.variant, self.base_model)
            self.written, self.own_job, self.fix = (variant, model), False, None
            if self.slip is not None and (planted := plant_slip(self.job["env.py"], self.slip)) is not None:
                self.job["env.py"], self.fix = planted[0], planted[1:]
        listing = next((m.content for m in messages if m.role == "tool" and m.name == "list_files"), "")
        if TOOL_MODULE not in listing:
            self.step += 1
            return self._write("job.toml")
        return self._call("read_file", {"path": TOOL_MODULE},
                          content=f"env.py imports {TOOL_MODULE}: reading the functions it may call.")

    def _write(self, name: str) -> Message:
        if name in FENCED:
            return self._call("write_file", {"path": name}, content=f"{name}:\n{fenced(self.job[name], FENCED[name])}")
        return self._call("write_file", {"path": name, "content": self.job[name]})
