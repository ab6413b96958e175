"""The tools an agent has during an episode: workspace files, baselines, submit.

Every call returns text for the agent; a mistaken call (bad arguments, unknown tool,
path outside the workspace) returns an error text, never an exception. Malformed calls
(unknown tool, arguments that are not a JSON object, wrong argument names) are also
counted: an LLM agent's rate of them is worth watching.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Callable

from ait.evals.baselines import BaselineStore
from ait.evals.hidden import eval_fingerprint
from ait.harness.types import ToolCallRequest
from ait.harness.workspace_tools import ToolError, WorkspaceTools
from ait.spec import TaskSpec


def _schema(name: str, description: str, params: dict[str, str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {p: {"type": "string", "description": d}
                                                        for p, d in params.items()},
                       "required": list(params)}}}


TOOL_SCHEMAS = [
    _schema("list_files", "List the files in your workspace with their sizes.", {}),
    _schema("read_file", "Read a text file from your workspace.", {"path": "path relative to the workspace"}),
    _schema("write_file", "Create or overwrite a text file in your workspace.",
            {"path": "path relative to the workspace", "content": "the whole file's text"}),
    _schema("edit_file", "Replace exactly one occurrence of `old` with `new` in a file.",
            {"path": "path relative to the workspace", "old": "text to find (must occur once)",
             "new": "replacement text"}),
    _schema("get_baseline_scores", "Untrained hidden-eval score of each allowed base model.", {}),
    _schema("submit_job", "Validate and run the job in your workspace (job.toml + env.py). "
            "Attempts are limited; errors come back if it is invalid.", {}),
]


class EpisodeTools:
    def __init__(self, files: WorkspaceTools, spec: TaskSpec, submit: Callable[[], str],
                 baselines: BaselineStore | None = None):
        self.files, self.spec, self.submit = files, spec, submit
        self.baselines = baselines or BaselineStore()
        self.malformed = 0
        """Malformed calls so far."""

    def get_baseline_scores(self) -> str:
        fingerprint = eval_fingerprint(self.spec)
        out = {}
        for model in self.spec.constraints.allowed_base_models:
            b = self.baselines.get(self.spec.family, model, fingerprint)
            out[model] = round(b.best_pre, 4) if b else "not measured yet"
        return json.dumps(out)

    def dispatch(self, call: ToolCallRequest) -> str:
        handlers: dict[str, Callable[..., str]] = {
            "list_files": self.files.list_files, "read_file": self.files.read_file,
            "write_file": self.files.write_file, "edit_file": self.files.edit_file,
            "get_baseline_scores": self.get_baseline_scores, "submit_job": self.submit,
        }
        handler = handlers.get(call.name)
        if handler is None:
            self.malformed += 1
            return f"error: unknown tool {call.name!r}; available: {', '.join(handlers)}"
        if not isinstance(call.arguments, dict):
            self.malformed += 1
            return f"error: arguments for {call.name} are not a JSON object: {str(call.arguments)[:200]}"
        try:
            inspect.signature(handler).bind(**call.arguments)
        except TypeError as e:
            self.malformed += 1
            return f"error: bad arguments for {call.name}: {e}"
        try:
            return handler(**call.arguments)
        except ToolError as e:
            return f"error: {e}"
        except (OSError, UnicodeError, ValueError) as e:  # e.g. a 300-character name, a lone surrogate
            return f"error: {call.name} failed: {type(e).__name__}: {str(e)[:200]}"
