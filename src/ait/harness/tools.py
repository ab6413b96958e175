"""The tools an agent has during an episode: workspace files, baselines, submit.

Every call returns text for the agent; a mistaken call (bad arguments, unknown tool,
path outside the workspace) returns an error text, never an exception. Malformed calls
(unknown tool, arguments that are not a JSON object, wrong argument names, a write_file
with no content and no fenced block) are also counted: an LLM agent's rate of them is
worth watching. Arguments encoded twice (a JSON string holding the object) or wrapped as a
whole call ({"name": ..., "arguments": {...}}) are unwrapped, not counted (`as_arguments`).

`write_file` may omit `content`: the file's text is then the last fenced code block
(```python ... ```) of the same assistant message's text (`ait.harness.fenced` has the
rules), so a long file need not be JSON-escaped inside the call. `content`, when given
(even empty), wins; `"content": null` counts as omitted.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Callable

from ait.chat.types import ToolCall
from ait.evals.baselines import BaselineStore
from ait.harness.fenced import last_fenced_block
from ait.harness.workspace_tools import ToolError, WorkspaceTools
from ait.spec import TaskSpec


def _schema(name: str, description: str, params: dict[str, str],
            optional: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {p: {"type": "string", "description": d}
                                                        for p, d in params.items()},
                       "required": [p for p in params if p not in optional]}}}


TOOL_SCHEMAS = [
    _schema("list_files", "List the files in your workspace with their sizes.", {}),
    _schema("read_file", "Read a text file from your workspace.", {"path": "path relative to the workspace"}),
    _schema("write_file", "Create or overwrite a text file in your workspace. For a long file such as env.py "
            "(recommended), omit content and put the whole file in a fenced code block (```python ... ```) "
            "in your message just before this call: the last fenced block of the message is written as is.",
            {"path": "path relative to the workspace",
             "content": "the whole file's text; omit it to write the fenced block before the call"},
            optional=("content",)),
    _schema("edit_file", "Replace exactly one occurrence of `old` with `new` in a file.",
            {"path": "path relative to the workspace", "old": "text to find (must occur once)",
             "new": "replacement text"}),
    _schema("get_baseline_scores", "Untrained hidden-eval score of each allowed base model, and best_pre: the "
            "highest of them, which your trained model must beat whichever base model you train.", {}),
    _schema("select_job", "With several jobs allowed: choose which of your jobs (1 = the first that ran) the "
            "episode is scored on; without a choice, the one with the best dev score is.",
            {"job": "the job's number, 1-based, in the order they ran"}),
    _schema("submit_job", "Validate and run the job in your workspace (job.toml + env.py). "
            "Attempts are limited; errors come back if it is invalid.", {}),
]


class EpisodeTools:
    def __init__(self, files: WorkspaceTools, spec: TaskSpec, submit: Callable[[], str],
                 baselines: BaselineStore | None = None, select: Callable[[int], str] | None = None,
                 eval_size: int | None = None):
        self.files, self.spec, self.submit = files, spec, submit
        self.eval_n = eval_size or spec.hidden_eval_size
        """The size of the hidden set the job will be scored on (an episode's eval_size override wins)."""
        self.select = select or (lambda job: "error: this episode runs one job; it is the one scored")
        self.baselines = baselines or BaselineStore()
        self.malformed = 0
        """Malformed calls so far."""
        self.repeats = RepeatedErrors()

    def get_baseline_scores(self) -> str:
        """Frozen untrained scores on the hidden set the job will be scored on (its size included: a
        baseline is frozen per set), read only (a model not measured yet is measured when the episode is scored)."""
        from ait.evals.best_pre import best_pre

        made = best_pre(self.spec, self.eval_n, self.baselines, measure=False)
        out: dict = {model: round(made.scores[model], 4) if model in made.scores
                     else made.excluded.get(model, "not measured yet")
                     for model in self.spec.constraints.allowed_base_models}
        return json.dumps({"untrained_scores": out,
                           "best_pre": None if made.value is None else round(made.value, 4),
                           "rule": "uplift is measured against best_pre, the highest untrained score among the "
                                   "allowed base models available here (a model not measured yet is measured "
                                   "when the episode is scored), whichever model you train",
                           "hidden_eval": {"n": self.eval_n, "fingerprint": made.fingerprint},
                           # What this install cannot load is not in best_pre: elsewhere it may be higher.
                           "left_out_here": {m: why for m, why in made.excluded.items()
                                             if why.startswith("not available")}})

    def write_file(self, path: str, content: str | None, message: str) -> str:
        """write_file as the agent calls it: `content`, or else the last fenced block of `message`."""
        if content is None:
            content = last_fenced_block(message)
            if content is None:
                self.malformed += 1
                raise ToolError(
                    "write_file got no content, and your message has no fenced code block before the call. "
                    "Put the whole file in a ```python ... ``` block in your message, then call write_file "
                    "with just the path; or pass the file's text as content.")
        return self.files.write_file(path, content)

    def dispatch(self, call: ToolCall, message: str = "") -> str:
        """Run one tool call; `message` is the text of the assistant message that made it (where
        write_file finds a fenced block when it is given no content). Counts repeats of one failing call."""
        result = self._dispatch(call, message)
        self.repeats.record(call.name, call.arguments, result)
        return result

    @property
    def repeated_errors(self) -> int:
        return self.repeats.count

    def _dispatch(self, call: ToolCall, message: str) -> str:

        def write_file(path: str, content: str | None = None) -> str:  # the signature the agent sees
            return self.write_file(path, content, message)

        handlers: dict[str, Callable[..., str]] = {
            "list_files": self.files.list_files, "read_file": self.files.read_file,
            "write_file": write_file, "edit_file": self.files.edit_file,
            "get_baseline_scores": self.get_baseline_scores, "submit_job": self.submit,
            "select_job": self.select,
        }
        handler = handlers.get(call.name)
        if handler is None:
            self.malformed += 1
            return f"error: unknown tool {call.name!r}; available: {', '.join(handlers)}"
        arguments = as_arguments(call.name, call.arguments)
        if not isinstance(arguments, dict):
            self.malformed += 1
            params = ", ".join(f'"{p}": ...' for p in inspect.signature(handler).parameters)
            return (f"error: arguments for {call.name} are not a JSON object ({arguments}); send them as "
                    f"{{{params}}}, with quotes and newlines inside strings escaped (\\\" and \\n). For a long "
                    f"file, write_file without content writes the fenced block of your message instead.")
        try:
            inspect.signature(handler).bind(**arguments)
        except TypeError as e:
            self.malformed += 1
            return f"error: bad arguments for {call.name}: {e}"
        try:
            return handler(**arguments)
        except ToolError as e:
            return f"error: {e}"
        except (OSError, UnicodeError, ValueError) as e:  # e.g. a 300-character name, a lone surrogate
            return f"error: {call.name} failed: {type(e).__name__}: {str(e)[:200]}"


class RepeatedErrors:
    """How many calls in a row were one call (same tool, same arguments) answered by one error: the
    sign of an agent stuck in a loop (EpisodeConfig.max_repeated_errors)."""

    def __init__(self) -> None:
        self.count = 0
        self._last: tuple[str, Any, str] | None = None  # (tool, arguments as JSON, result)

    def record(self, name: str, arguments: Any, result: str) -> int:
        try:
            args = arguments if isinstance(arguments, str) else json.dumps(arguments, sort_keys=True)
        except (ValueError, TypeError, RecursionError):  # not JSON-able as it stands: no repeat can be told
            args = object()
        key = (name, args, result)
        if not result.startswith("error"):
            self.count, self._last = 0, None
        elif key == self._last:
            self.count += 1
        else:
            self.count, self._last = 1, key
        return self.count


def as_arguments(name: str, arguments: Any) -> dict[str, Any] | str:
    """A call's arguments as a dict, or why they are not one. Small models often encode the object
    twice (a JSON string holding the object) or wrap the whole call ({"name": ..., "arguments": {...}}
    as the arguments): both are unwrapped, since what they mean is not in doubt; anything else is not
    guessed at."""
    for _ in range(3):  # at most: a string, a wrapper, a string inside the wrapper
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments, strict=False)
            except (ValueError, RecursionError) as e:  # RecursionError: nested past the parser's depth
                return f"a string that is not valid JSON: {str(e)[:200]}; it begins {arguments[:120]!r}"
        elif (isinstance(arguments, dict) and set(arguments) == {"name", "arguments"}
              and arguments["name"] == name):
            arguments = arguments["arguments"]
        else:
            break
    if isinstance(arguments, dict):
        return arguments
    try:
        shown = repr(arguments)[:120]
    except RecursionError:
        shown = "(nested too deep to show)"
    return f"a {type(arguments).__name__}: {shown}"
