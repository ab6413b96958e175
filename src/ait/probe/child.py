"""The probe's child process: run the agent's env.py and record what it does.

This process runs untrusted code, so it decides nothing: it writes plain observations
(what imported, what the tools and rewards returned, what the dataset looks like) and
the trusted parent (`ait.probe.checks`) turns them into a verdict. Forging an
observation is no better than writing code that behaves that way.

    python -m ait.probe.child WORKSPACE REQUEST_JSON OBSERVATIONS_JSON
"""

from __future__ import annotations

import inspect
import json
import math
import sys
from pathlib import Path
from typing import Any

from ait.job.env_loader import EnvLoadError, call_reward, describe_exception, import_env, read_surface
from ait.probe.types import Observations, ProbeRequest, RewardObservation, ToolObservation

MAX_TEXT = 300


def short(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "..."


def observe_tools(surface, req: ProbeRequest, info: dict, obs: Observations, env_path: Path) -> None:
    from transformers.utils import get_json_schema

    obs.tool_names = sorted(surface.tools)
    for tool in req.tools:
        fn = surface.tools.get(tool.name)
        if fn is None:
            continue
        t = ToolObservation(name=tool.name)
        params = list(inspect.signature(fn).parameters)
        t.parameters = params[1:] if params and params[0] == "self" else params
        try:
            get_json_schema(fn)
        except Exception as e:
            t.schema_error = short(f"{type(e).__name__}: {e}")
        try:
            env = surface.env_class()
            if hasattr(env, "reset"):
                env.reset(info)
            result = getattr(env, tool.name)(**tool.example)
            t.result_type = type(result).__name__
            t.result = short(result)
        except BaseException as e:
            t.error = short(describe_exception(e, env_path))
        obs.tools.append(t)


def observe_dataset(surface, req: ProbeRequest, obs: Observations, env_path: Path) -> list[dict]:
    try:
        rows = surface.build_dataset(req.dataset_size, req.seed)
    except BaseException as e:
        obs.dataset_error = short(describe_exception(e, env_path))
        return []
    if not isinstance(rows, list):
        obs.dataset_error = f"build_dataset returned {type(rows).__name__}, expected a list of dicts"
        return []
    obs.dataset_count = len(rows)
    good, prompts = [], set()
    for i, row in enumerate(rows):
        problem = row_problem(row)
        if problem:
            if len(obs.dataset_malformed) < 3:
                obs.dataset_malformed.append(f"row {i}: {problem}")
            continue
        prompts.add(row["prompt"])
        good.append(row)
    obs.dataset_wellformed = len(good)
    obs.dataset_distinct = len(prompts)
    obs.dataset_samples = [{k: short(v) for k, v in r.items()} for r in good[:3]]
    return good


def row_problem(row: Any) -> str | None:
    if not isinstance(row, dict):
        return f"is a {type(row).__name__}, expected a dict with prompt, answer, info"
    extra = set(row) - {"prompt", "answer", "info"}
    if extra:
        return f"unknown keys {sorted(extra)}; rows have only prompt, answer, info"
    if not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
        return "prompt must be a non-empty string"
    if not isinstance(row.get("answer"), (str, int, float)) or isinstance(row.get("answer"), bool):
        return "answer must be a string (or a number)"
    info = row.get("info", {})
    if not isinstance(info, dict):
        return "info must be a dict"
    try:
        json.dumps(info)
    except (TypeError, ValueError) as e:
        return f"info is not JSON-serialisable ({e})"
    return None


def sample_completions(answer: str) -> list[str]:
    """Varied completions: right and wrong answers, formats, empty text."""
    wrong = "0" if answer.strip() != "0" else "1"
    return [f"Answer: {answer}", f"The result is {answer}.", f"Answer: {wrong}", "", "I am not sure.",
            f"Let me think step by step.\nAnswer: {wrong}{wrong}"]


def observe_rewards(surface, rows: list[dict], obs: Observations, env_path: Path) -> None:
    weights = surface.reward_weights or [1.0] * len(surface.reward_funcs)
    for fn, weight in zip(surface.reward_funcs, weights):
        r = RewardObservation(name=short(str(getattr(fn, "__name__", "reward"))), weight=weight)
        for row in rows[:4]:
            answer = str(row["answer"])
            for completion in sample_completions(answer):
                messages = [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": completion}]
                try:
                    value = call_reward(fn, completion, answer, row.get("info") or {}, messages)
                except BaseException as e:
                    r.errors.append(short(describe_exception(e, env_path)))
                    continue
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    r.bad_values.append(f"returned {type(value).__name__} {short(value)}")
                elif not math.isfinite(value) or not 0.0 <= value <= 1.0:
                    r.bad_values.append(f"returned {value} (must be finite and in [0, 1])")
                else:
                    r.values.append(float(value))
        obs.rewards.append(r)


def observe(workspace: Path, req: ProbeRequest) -> Observations:
    obs = Observations()
    env_path = workspace / "env.py"
    sys.path.insert(0, str(workspace))  # env.py may import helpers it wrote next to it
    try:
        module = import_env(env_path)
    except EnvLoadError as e:
        obs.import_error = short(str(e))
        return obs
    surface, problems = read_surface(module)
    obs.surface_errors = problems
    if surface is None:
        return obs
    obs.system_prompt = short(surface.system_prompt)
    rows = observe_dataset(surface, req, obs, env_path)
    observe_tools(surface, req, rows[0].get("info") or {} if rows else {}, obs, env_path)
    if rows:
        observe_rewards(surface, rows, obs, env_path)
    if rows and req.dry_run_model:
        from ait.probe.dry_run import dry_run

        result = dry_run(surface, rows, req.dry_run_model, env_path)
        obs.dry_run_error, obs.dry_run_sample = short(result["error"]) if result["error"] else None, result["sample"]
    return obs


def main(argv: list[str]) -> int:
    workspace, req_path, out_path = Path(argv[0]), Path(argv[1]), Path(argv[2])
    req = ProbeRequest.model_validate_json(req_path.read_text())
    obs = observe(workspace, req)
    out_path.write_text(obs.model_dump_json())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
