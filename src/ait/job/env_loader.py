"""Load an agent's env.py and read its documented surface.

This module imports agent code: call it only inside the probe's child process or the
training job, never in the episode harness or the hidden eval.

The surface (INSTRUCTIONS.md documents it for the agent):
    SYSTEM_PROMPT: str
    class Environment:            one instance per rollout
        def reset(self, info: dict) -> None     optional; receives the row's info
        def <tool>(self, ...) -> str            every public method is a tool
    def build_dataset(n: int, seed: int) -> list[dict]    rows {prompt, answer, info}
    REWARD_FUNCS: list of fn(completion: str, answer: str, info: dict) -> float in [0, 1]
    REWARD_WEIGHTS: optional list[float], one per reward function
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

REWARD_ARGS = ("completion", "answer", "info", "messages")


class EnvLoadError(Exception):
    """env.py could not be imported or lacks part of its surface."""

    out_of_memory: bool = False
    """The import ran out of memory (a MemoryError under the sandbox's address-space limit)."""


@dataclass
class EnvSurface:
    system_prompt: str
    env_class: type
    tools: dict[str, Callable[..., Any]]  # name -> unbound method of env_class
    build_dataset: Callable[..., list[dict]]
    reward_funcs: list[Callable[..., float]]
    reward_weights: list[float] | None


def import_env(path: str | Path) -> ModuleType:
    """Import env.py as a fresh module; any exception becomes an EnvLoadError with the line."""
    path = Path(path)
    if path.is_dir():
        raise EnvLoadError(f"{path.name} is a directory: it must be a Python file")
    if not path.is_file():
        raise EnvLoadError(f"{path.name} not found in the workspace")
    import_task_tools(path.parent)
    name = f"ait_agent_env_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as e:  # SystemExit and KeyboardInterrupt from agent code included
        sys.modules.pop(name, None)
        error = EnvLoadError(f"importing env.py raised {describe_exception(e, path)}")
        error.out_of_memory = isinstance(e, MemoryError)
        raise error from None
    return module


TASK_TOOLS = "task_tools"
"""The workspace's read-only tool-interface module (ait.job.task_tools): env.py imports it by this name."""


def import_task_tools(workspace: Path) -> None:
    """Make the workspace's task_tools.py what `import task_tools` gives env.py: loaded fresh from
    this workspace (never a module cached from another workspace in the same process), or dropped
    from sys.modules when the workspace has none."""
    sys.modules.pop(TASK_TOOLS, None)
    path = workspace / f"{TASK_TOOLS}.py"
    if not path.is_file():
        return
    spec = importlib.util.spec_from_file_location(TASK_TOOLS, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[TASK_TOOLS] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        sys.modules.pop(TASK_TOOLS, None)
        error = EnvLoadError(f"importing {path.name} raised {describe_exception(e, path)}")
        error.out_of_memory = isinstance(e, MemoryError)
        raise error from None


def describe_exception(e: BaseException, path: Path | None = None) -> str:
    """`ValueError: boom (env.py line 12)`: the type, message and the agent file's line."""
    where = ""
    tb = e.__traceback__
    while tb is not None:
        if path is not None and Path(tb.tb_frame.f_code.co_filename).resolve() == path.resolve():
            where = f" ({path.name} line {tb.tb_lineno})"
        tb = tb.tb_next
    if isinstance(e, SyntaxError) and e.lineno:
        where = f" ({path.name if path else 'env.py'} line {e.lineno})"
        return f"SyntaxError: {e.msg}{where}"
    return f"{type(e).__name__}: {e}{where}{missing_name_hint(e)}"


def missing_name_hint(e: BaseException) -> str:
    """What to use instead of a name that does not exist: the module's public names closest to it (an
    agent that writes env.py from memory calls helpers its task's tool module does not have), or the
    import a standard-library name lacks. Reads the module's __dict__ only: no hook of the agent's runs."""
    import difflib

    name = getattr(e, "name", None)
    if not isinstance(name, str):
        return ""
    if isinstance(e, AttributeError) and type(getattr(e, "obj", None)) is ModuleType:
        try:
            namespace = dict(vars(e.obj))
            module = str(namespace.get("__name__", "the module"))[:60]
            names = sorted(n for n in namespace if isinstance(n, str) and not n.startswith("_"))
            # Its own functions and classes first: what env.py is meant to call (not its imports, constants).
            own = [n for n in names if (inspect.isfunction(namespace[n]) or inspect.isclass(namespace[n]))
                   and getattr(namespace[n], "__module__", None) == module]
        except Exception:  # noqa: BLE001 - a hint is never worth an error of its own
            return ""
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        shown = close or own[:8] or names[:8]
        more = "" if close or len(own or names) <= len(shown) else ", ..."
        return f"; {module} has {', '.join(shown)}{more} (read its source)" if shown else ""
    if isinstance(e, NameError) and not isinstance(e, UnboundLocalError) and name in sys.stdlib_module_names:
        return f"; add `import {name}` at the top of the file"
    return ""


def env_tools(env_class: type) -> dict[str, Callable[..., Any]]:
    """Public functions defined on the class (what TRL's environment_factory exposes as tools)."""
    return {
        name: fn
        for name, fn in inspect.getmembers(env_class, predicate=inspect.isfunction)
        if not name.startswith("_") and name not in ("reset", "get_reward")
    }


def read_surface(module: ModuleType) -> tuple[EnvSurface | None, list[str]]:
    """Collect the surface; return (surface or None, list of specific problems)."""
    errors: list[str] = []
    system_prompt = getattr(module, "SYSTEM_PROMPT", None)
    if not isinstance(system_prompt, str) or not system_prompt.strip():
        errors.append("SYSTEM_PROMPT must be a non-empty string")
    env_class = getattr(module, "Environment", None)
    if not inspect.isclass(env_class):
        errors.append("env.py must define `class Environment` whose public methods are the tools")
        env_class = None
    elif "reset" in vars(env_class) and not callable(env_class.reset):
        errors.append("Environment.reset must be a method reset(self, info: dict)")
    build = getattr(module, "build_dataset", None)
    if not callable(build):
        errors.append("env.py must define build_dataset(n: int, seed: int) -> list[dict]")
    rewards = getattr(module, "REWARD_FUNCS", None)
    if not isinstance(rewards, (list, tuple)) or not rewards or not all(callable(f) for f in rewards):
        errors.append("REWARD_FUNCS must be a non-empty list of functions fn(completion, answer, info) -> float")
        rewards = []
    for fn in rewards:
        errors += _check_reward_signature(fn)
    weights = getattr(module, "REWARD_WEIGHTS", None)
    if weights is not None:
        ok = isinstance(weights, (list, tuple)) and all(isinstance(w, (int, float)) for w in weights)
        if not ok or len(weights) != len(rewards):
            errors.append(f"REWARD_WEIGHTS must be a list of {len(rewards)} numbers, one per reward function")
    if errors:
        return None, errors
    surface = EnvSurface(
        system_prompt=system_prompt,
        env_class=env_class,
        tools=env_tools(env_class),
        build_dataset=build,
        reward_funcs=list(rewards),
        reward_weights=[float(w) for w in weights] if weights is not None else None,
    )
    return surface, []


def _check_reward_signature(fn: Callable[..., Any]) -> list[str]:
    name = getattr(fn, "__name__", repr(fn))
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return [f"reward function {name}: cannot read its signature"]
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return []
    unknown = [p for p in params if p not in REWARD_ARGS]
    if unknown:
        return [f"reward function {name} takes unknown argument(s) {unknown}; allowed: {list(REWARD_ARGS)} or **kwargs"]
    return []


def call_reward(fn: Callable[..., Any], completion: str, answer: str, info: dict, messages: list[dict]) -> Any:
    """Call a reward function with the arguments it declares (or all of them with **kwargs)."""
    available = {"completion": completion, "answer": answer, "info": info, "messages": messages}
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(**available)
    return fn(**{k: v for k, v in available.items() if k in params})
