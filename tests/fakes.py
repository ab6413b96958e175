"""Shared fixtures for episode tests that must not train: an executor with canned JobResults,
and a scripted policy that reports usage like an LLM would."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

import ait.harness.episode as episode_mod
from ait.harness.types import EpisodeConfig, Message, ToolCallRequest
from ait.job.types import Job, JobResult
from ait.metering import Usage
from ait.spec import TaskSpec

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "examples" / "tasks" / "calc_chain.json"


def setup_of(spec, name: str = "tiny") -> str:
    """The scoring setup a baseline of this base model is frozen under (only the tiny model resolves here)."""
    from ait.evals.baselines import scoring_setup
    from ait.train.models import resolve_base_model

    return scoring_setup(spec, resolve_base_model(name).path)


def weights_of(name: str) -> str:
    """The content hash a job on this base model reports (the tiny model's is real; others made up)."""
    from ait.train.models import resolve_base_model

    return resolve_base_model("tiny").sha256 if name == "tiny" else f"sha-of-{name}"


def ok_result(post: float = 0.6, pre: float = 0.3, dev: float | None = None, train_seconds: float = 100.0,
              gpus: float | None = None) -> Callable[[Job], JobResult]:
    return lambda job: JobResult(job_id=job.job_id, ok=True, base_model=job.config.job.base_model, pre=pre, post=post,
                                 base_model_sha256=weights_of(job.config.job.base_model),
                                 dev=dev, eval_n=200, train_seconds=train_seconds, total_seconds=train_seconds + 20,
                                 gpus=gpus, checkpoint=str(Path(job.run_dir) / "job" / "checkpoint"))


class Canned:
    """An executor with canned results: the n-th job gets the n-th maker's result (the last one
    repeats); `ran` lists every job it was given. Pass it to run_episode as `executor=`."""

    def __init__(self, *makers: Callable[[Job], JobResult]):
        self.makers = makers
        self.ran: list[Job] = []

    def run(self, job: Job, on_event: Callable[[str], None] | None = None) -> JobResult:
        self.ran.append(job)
        return self.makers[min(len(self.ran), len(self.makers)) - 1](job)

    def started(self, job: Job) -> bool:
        return True

    def cancel(self, job: Job) -> None:
        pass

    def close(self) -> None:
        pass


def fake_executor(*makers: Callable[[Job], JobResult]) -> Canned:
    """An executor that trains nothing: the n-th job gets the n-th maker's result."""
    return Canned(*makers)


_PROBES: dict[tuple[str, str, float | None], Any] = {}


def memo_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the real probe once per distinct (job.toml, env.py) in the session: these tests submit the
    same reference job many times and are about what happens after the verdict, not the verdict."""
    real = episode_mod.probe_workspace

    def probe(workspace: Path, spec: TaskSpec, timeout_s: float, gpu_memory_gib: float | None = None):
        key = ((workspace / "job.toml").read_text(), (workspace / "env.py").read_text(), gpu_memory_gib)
        if key not in _PROBES:
            _PROBES[key] = real(workspace, spec, timeout_s=timeout_s, gpu_memory_gib=gpu_memory_gib)
        return _PROBES[key]

    monkeypatch.setattr(episode_mod, "probe_workspace", probe)


def call(name: str, arguments: dict[str, Any] | str | None = None) -> ToolCallRequest:
    return ToolCallRequest(id="x", name=name, arguments={} if arguments is None else arguments)


class Priced:
    """Plays one list of tool calls per turn, each reply carrying `usage` (then stops talking);
    records every conversation it was shown."""

    name = "priced"

    def __init__(self, turns: list[list[ToolCallRequest]], usage: Usage | list[Usage]):
        self.turns, self.usage = turns, usage

    def reset(self, spec: TaskSpec) -> None:
        self.step = 0
        self.seen: list[list[Message]] = []

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        self.seen.append(list(messages))
        self.step += 1
        usage = self.usage[self.step - 1] if isinstance(self.usage, list) else self.usage
        if self.step > len(self.turns):
            return Message(role="assistant", content="done", usage=usage)
        calls = [c.model_copy(update={"id": f"t{self.step}-{j}"}) for j, c in enumerate(self.turns[self.step - 1])]
        return Message(role="assistant", tool_calls=calls, usage=usage)


def quick(**kw: Any) -> EpisodeConfig:
    return EpisodeConfig(max_nudges=0, **kw)
