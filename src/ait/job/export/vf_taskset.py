"""A verifiers (v1 API, verifiers 0.4) taskset that serves an ait job: its dataset, tools and rewards.

`ait job export` copies this file verbatim into the exported package as `taskset.py`, next to
`ait_job.json` (the job's settings) and `job/` (a copy of the workspace: env.py, task.json, data/).
ait never imports it: it needs verifiers, and the exported package never imports ait.

What it does, and the ait rule each part reproduces:

- Dataset: `build_dataset(dataset_size, seed)` from env.py, one task per row, with the job's
  SYSTEM_PROMPT as the system prompt, `str(prompt)` as the user prompt, `str(answer)` as the answer
  and the row's info kept as JSON text (`json.dumps(row.get("info") or {})`), exactly as ait's
  trainer builds its rows (ait.train.request.build_rows).
- task_tools.py: the workspace's read-only tool-interface module travels in `job/` and is loaded as
  `task_tools` before env.py, so env.py's `import task_tools` works as it does under ait.
- Tools: every public method of env.py's `Environment` (ait.job.env_loader.env_tools' rule) is an
  MCP tool of a task-scoped toolset, so verifiers launches one server, hence one `Environment`,
  per rollout; `reset(info)` is called with the row's info before the first call. A tool's result
  is its text, or `json.dumps(result, default=str)`; a raising tool answers
  `error: <Type>: <message>`; either is cut at 4000 characters (ait.train.rollouts.run_tool).
  Arguments reach the method as the model wrote them: the schema advertises the type hints, but
  nothing is coerced on the way in.
- Rewards: one `@vf.reward` per function of REWARD_FUNCS, weighted by REWARD_WEIGHTS (1.0 each
  when absent, as ait's trainers do). Each is called with the arguments it declares among
  `completion` (the last assistant message's text; "" when it has none), `answer`, `info` (a fresh
  `json.loads` of the row's info) and `messages` (the completion as chat dicts), or all of them
  with **kwargs; a raise or a non-finite value scores 0, and every value is clipped to [0, 1]
  (ait.train.request.safe_reward). verifiers adds score x weight over the rewards in
  REWARD_FUNCS order, which is ait's total.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Callable

from pydantic import Field, TypeAdapter, WithJsonSchema

import verifiers.v1 as vf


def _load_task_tools() -> None:
    """env.py imports the workspace's read-only tool interface by its plain name (`import task_tools`),
    as ait's loader makes it importable (ait.job.env_loader.import_task_tools): load job/task_tools.py,
    the copy beside env.py, under that name before env.py is imported."""
    path = Path(__file__).with_name("job") / "task_tools.py"
    if not path.is_file():
        return
    spec = importlib.util.spec_from_file_location("task_tools", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["task_tools"] = module
    spec.loader.exec_module(module)


_load_task_tools()
from .job import env as job_env  # noqa: E402  (after task_tools is importable)

SETTINGS: dict[str, Any] = json.loads(Path(__file__).with_name("ait_job.json").read_text())
TOOL_RESULT_CHARS = 4000
REWARD_ARGS = ("completion", "answer", "info", "messages")


# ------------------------------------------------------------------ env.py's surface


def _env_tools(env_class: type) -> dict[str, Callable[..., Any]]:
    """Public functions of the Environment class, as ait exposes them as tools."""
    return {
        name: fn
        for name, fn in inspect.getmembers(env_class, predicate=inspect.isfunction)
        if not name.startswith("_") and name not in ("reset", "get_reward")
    }


SYSTEM_PROMPT: str = job_env.SYSTEM_PROMPT
ENVIRONMENT: type = job_env.Environment
TOOLS = _env_tools(ENVIRONMENT)
REWARD_FUNCS: list[Callable[..., Any]] = list(job_env.REWARD_FUNCS)
_weights = getattr(job_env, "REWARD_WEIGHTS", None)
REWARD_WEIGHTS: list[float] = (
    [float(w) for w in _weights] if _weights is not None else [1.0] * len(REWARD_FUNCS)
)
if len(REWARD_WEIGHTS) != len(REWARD_FUNCS):
    raise ValueError(
        f"REWARD_WEIGHTS has {len(REWARD_WEIGHTS)} numbers for {len(REWARD_FUNCS)} reward functions"
    )


# ------------------------------------------------------------------ rewards, as ait computes them


def call_reward(fn: Callable[..., Any], completion: str, answer: str, info: dict, messages: list[dict]) -> Any:
    available = {"completion": completion, "answer": answer, "info": info, "messages": messages}
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(**available)
    return fn(**{k: v for k, v in available.items() if k in params})


def safe_reward(fn: Callable[..., Any], completion: str, answer: str, info_json: str, messages: list[dict]) -> float:
    try:
        value = float(call_reward(fn, completion, answer, json.loads(info_json), messages))
        if not math.isfinite(value):
            raise ValueError("non-finite reward")
    except Exception:
        value = 0.0
    return min(1.0, max(0.0, value))


def _text(content: Any) -> str:
    """Message content as text: a string as is, text parts joined with newlines, None as ""."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(getattr(part, "text", "") for part in content if getattr(part, "type", "") == "text")


def _arguments(raw: str) -> Any:
    try:
        parsed = json.loads(raw)
    except (TypeError, ValueError):
        return raw
    return parsed if isinstance(parsed, dict) else raw


def completion_messages(trace: vf.Trace) -> list[dict[str, Any]]:
    """The rollout after its prompt (from the first model-sampled message of the final branch on),
    as chat dicts shaped like ait's: assistant {role, content, tool_calls: [{type, function:
    {name, arguments}}]}, tool {role, name, content}."""
    branches = trace.branches
    nodes = branches[-1].nodes if branches else []
    start = next((i for i, node in enumerate(nodes) if node.sampled), len(nodes))
    names: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for node in nodes[start:]:
        msg = node.message
        if msg.role == "assistant":
            item: dict[str, Any] = {"role": "assistant", "content": _text(msg.content)}
            if msg.tool_calls:
                item["tool_calls"] = [
                    {"type": "function", "function": {"name": call.name, "arguments": _arguments(call.arguments)}}
                    for call in msg.tool_calls
                ]
                names.update({call.id: call.name for call in msg.tool_calls})
            out.append(item)
        elif msg.role == "tool":
            out.append({"role": "tool", "name": msg.name or names.get(msg.tool_call_id, ""),
                        "content": _text(msg.content)})
        else:
            out.append({"role": msg.role, "content": _text(msg.content)})
    return out


def final_text(messages: list[dict[str, Any]]) -> str:
    """The last assistant message's text ("" when there is none or it has no text)."""
    for msg in reversed(messages):
        if msg["role"] == "assistant":
            return msg["content"]
    return ""


# ------------------------------------------------------------------ task data and tools


class AitJobData(vf.TaskData):
    answer: str
    """The row's answer, as text."""
    info: str
    """The row's info as JSON text (what reset() and the rewards receive, parsed)."""


def _google_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {arg: description}) from a Google-style docstring."""
    lines = inspect.cleandoc(doc or "").splitlines()
    description: list[str] = []
    args: dict[str, str] = {}
    section, current = None, None
    for line in lines:
        header = re.match(r"^(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):\s*$", line.strip())
        if header and not line.startswith((" ", "\t")):
            section, current = header.group(1), None
            continue
        if section is None:
            description.append(line)
        elif section in ("Args", "Arguments", "Parameters"):
            m = re.match(r"^\s+(\*{0,2}\w+)(?:\s*\([^)]*\))?\s*:\s*(.*)$", line)
            if m and len(line) - len(line.lstrip()) <= 8:
                current = m.group(1).lstrip("*")
                args[current] = m.group(2).strip()
            elif current and line.strip():
                args[current] = (args[current] + " " + line.strip()).strip()
    return "\n".join(description).strip(), args


def _annotation_schema(annotation: Any) -> dict[str, Any]:
    if annotation is inspect.Parameter.empty:
        return {"type": "string"}
    try:
        return TypeAdapter(annotation).json_schema()
    except Exception:
        return {}


def tool_signature(name: str) -> tuple[inspect.Signature, str]:
    """The tool's signature for MCP (self dropped; each parameter advertises its type hint's
    schema and its docstring line but accepts any value) and its description."""
    method = TOOLS[name]
    try:
        sig = inspect.signature(method, eval_str=True)
    except Exception:
        sig = inspect.signature(method)
    description, arg_docs = _google_docstring(method.__doc__)
    params = []
    for p in list(sig.parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        schema = _annotation_schema(p.annotation)
        if p.name in arg_docs:
            schema = {**schema, "description": arg_docs[p.name]}
        params.append(p.replace(kind=p.KEYWORD_ONLY, annotation=Annotated[Any, WithJsonSchema(schema)]))
    return sig.replace(parameters=params, return_annotation=str), description


def run_tool(env: Any, name: str, arguments: dict[str, Any]) -> str:
    try:
        result = getattr(env, name)(**arguments)
    except Exception as e:  # the job's code: any failure becomes the tool's answer
        return f"error: {type(e).__name__}: {e}"[:TOOL_RESULT_CHARS]
    text = result if isinstance(result, str) else json.dumps(result, default=str)
    return text[:TOOL_RESULT_CHARS]


class AitJobToolset(vf.Toolset[vf.ToolsetConfig]):
    """The Environment's tools, one server (and one Environment) per rollout."""

    TOOL_PREFIX = None  # the model sees the tools' own names, as in ait

    env: Any = None

    async def setup_task(self, task: AitJobData) -> None:
        self.env = self.new_env(task.info)

    @staticmethod
    def new_env(info_json: str | None) -> Any:
        env = ENVIRONMENT()
        if hasattr(env, "reset") and info_json is not None:
            env.reset(json.loads(info_json))
        return env

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        if self.env is None:  # no task was handed to this server: a bare Environment, as ait never does
            self.env = self.new_env(None)
        return run_tool(self.env, name, arguments)

    def register(self, mcp: Any) -> None:
        for name in TOOLS:
            mcp.add_tool(self._with_state(self._bound(name)), name=name,
                         description=tool_signature(name)[1] or None, structured_output=False)

    def _bound(self, name: str) -> Callable[..., str]:
        def tool(**arguments: Any) -> str:
            return self.call(name, arguments)

        tool.__name__ = name
        tool.__signature__ = tool_signature(name)[0]  # type: ignore[attr-defined]
        return tool


class AitJobTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()
    """Where the per-rollout tool server runs (a host subprocess by default)."""


class AitJobTask(vf.Task[AitJobData, vf.State, AitJobTaskConfig]):
    """One dataset row; its rewards are the job's REWARD_FUNCS (added below)."""

    @classmethod
    def toolsets(cls, config: AitJobTaskConfig) -> list[vf.Toolset]:
        return [AitJobToolset(config.tools)] if TOOLS else []


def reward_names() -> list[str]:
    """A unique method name per reward function: its __name__ unless that is taken."""
    names: list[str] = []
    for i, fn in enumerate(REWARD_FUNCS):
        name = re.sub(r"\W", "_", getattr(fn, "__name__", "") or "") or f"reward_{i}"
        if name[0].isdigit():
            name = f"reward_{name}"
        while name in names or hasattr(AitJobTask, name):
            name = f"{name}_{i}"
        names.append(name)
    return names


def _reward_method(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    async def reward(self: AitJobTask, trace: vf.Trace) -> float:
        messages = completion_messages(trace)
        return safe_reward(fn, final_text(messages), self.data.answer, self.data.info, messages)

    reward.__name__ = reward.__qualname__ = name
    reward.__doc__ = (getattr(fn, "__doc__", None) or "").strip() or f"env.py's {name}"
    return reward


REWARD_NAMES = reward_names()
for _i, (_fn, _name, _weight) in enumerate(zip(REWARD_FUNCS, REWARD_NAMES, REWARD_WEIGHTS)):
    # priority: verifiers runs (and adds) rewards by descending priority; this keeps REWARD_FUNCS order.
    setattr(AitJobTask, _name, vf.reward(weight=_weight, priority=len(REWARD_FUNCS) - _i)(_reward_method(_fn, _name)))


# ------------------------------------------------------------------ the taskset


class AitJobTasksetConfig(vf.TasksetConfig):
    dataset_size: int = Field(SETTINGS["dataset_size"], ge=1)
    """Rows asked of env.py's build_dataset (job.toml's train.dataset_size)."""
    seed: int = Field(SETTINGS["seed"], ge=0)
    """Seed handed to build_dataset (job.toml's train.seed)."""
    task: AitJobTaskConfig = AitJobTaskConfig()


class AitJobTaskset(vf.Taskset[AitJobTask, AitJobTasksetConfig]):
    """The job's dataset: build_dataset(dataset_size, seed), one task per row."""

    def load(self) -> list[AitJobTask]:
        rows = job_env.build_dataset(self.config.dataset_size, self.config.seed)
        return [
            AitJobTask(
                AitJobData(
                    idx=i,
                    prompt=str(row["prompt"]),
                    system_prompt=SYSTEM_PROMPT,
                    answer=str(row["answer"]),
                    info=json.dumps(row.get("info") or {}),
                ),
                self.config.task,
            )
            for i, row in enumerate(rows)
        ]


if __name__ == "__main__":  # verifiers launches the per-rollout tool server as `python -m <package>.taskset`
    AitJobToolset.run()
