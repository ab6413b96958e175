"""The installable verifiers environment package an ait job exports to."""

from __future__ import annotations

import json
import re
import shutil
from importlib.resources import files
from pathlib import Path

from ait.job.export.mapping import VERIFIERS_ENV_ROWS, verifiers_rows
from ait.job.export.prime_rl import notes_markdown, toml_string
from ait.job.export.workspace import ExportError, Workspace

VERIFIERS_REQUIREMENT = "verifiers>=0.4,<0.5"
"""The verifiers API the adapter is written against (the v1 stack: Taskset, Task, Toolset, @vf.reward)."""
NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


def package_names(ws: Workspace, name: str | None = None) -> tuple[str, str]:
    """(distribution = environment id, import name) for the exported package."""
    dist = name if name is not None else f"ait-job-{ws.slug}"
    if not NAME.match(dist):
        raise ExportError(f"environment name {dist!r}: use lower-case letters, digits and single '-' "
                          "(it is the package's name and verifiers' taskset id), starting with a letter")
    module = dist.replace("-", "_")
    if module == "ait" or module.startswith("verifiers"):
        raise ExportError(f"environment name {dist!r} would shadow the {module.split('_')[0]!r} package")
    return dist, module


def adapter_source() -> str:
    return (files("ait.job.export") / "vf_taskset.py").read_text()


def write_package(ws: Workspace, root: Path, dist: str, module: str) -> list[str]:
    """Write the package under `root` (which must exist); return the files written, relative to it."""
    written: list[str] = []

    def put(rel: str, text: str) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(rel)

    put("pyproject.toml", pyproject(ws, dist, module))
    put(f"{module}/__init__.py", f'"""The ait job {ws.slug!r} as a verifiers environment (`ait job export`)."""\n\n'
                                 f"from {module}.taskset import AitJobTaskset\n\n"
                                 '__all__ = ["AitJobTaskset"]\n')
    put(f"{module}/taskset.py", adapter_source())
    settings = {
        "dataset_size": ws.config.train.dataset_size,
        "seed": ws.config.train.seed,
        "job_toml": ws.job_toml,
        "env_py_sha256": ws.sha256("env.py"),
    }
    put(f"{module}/ait_job.json", json.dumps(settings, indent=2) + "\n")
    job_dir = root / module / "job"
    for rel in ws.files:
        target = job_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ws.path / rel, target)
        written.append(f"{module}/job/{rel.as_posix()}")
    if not (job_dir / "__init__.py").exists():
        put(f"{module}/job/__init__.py", '"""A copy of the ait job\'s workspace: env.py and the files it reads."""\n')
    put("README.md", readme(ws, dist, module))
    put("NOTES.md", verifiers_notes(ws, dist))
    return written


def pyproject(ws: Workspace, dist: str, module: str) -> str:
    extra = ""
    if ws.third_party_imports:
        extra = ("# env.py imports " + ", ".join(ws.third_party_imports) + ": add the packages that provide "
                 "them to dependencies.\n")
    return (
        "[project]\n"
        f"name = {toml_string(dist)}\n"
        'version = "0.1.0"\n'
        f"description = {toml_string(f'The ait job {ws.slug} as a verifiers environment (exported by ait job export)')}\n"
        'requires-python = ">=3.11"\n'
        f"{extra}"
        f"dependencies = [{toml_string(VERIFIERS_REQUIREMENT)}]\n\n"
        "[build-system]\n"
        'requires = ["hatchling"]\n'
        'build-backend = "hatchling.build"\n\n'
        "[tool.hatch.build.targets.wheel]\n"
        f"packages = [{toml_string(module)}]\n"
    )


def eval_args(ws: Workspace, dist: str, model: str = "MODEL") -> list[str]:
    """`vf-eval` arguments that run the environment as the job's rollouts ran (the README's command)."""
    t = ws.config.train
    return [dist, "-m", model, "-n", "10", "--no-push",
            "--env.agent.harness.id", "null", "--env.agent.runtime.type", "subprocess",
            "--env.agent.max-turns", str(t.max_tool_calling_iterations + 1),
            "--env.agent.max-output-tokens", str(t.max_completion_length),
            "--sampling.temperature", str(t.temperature)]


def readme(ws: Workspace, dist: str, module: str) -> str:
    t = ws.config.train
    args = eval_args(ws, dist)
    command = "vf-eval " + " ".join(args[:6]) + " \\\n  " + " ".join(args[6:10]) + " \\\n  " + \
        " ".join(args[10:14]) + " \\\n  " + " ".join(args[14:])
    return f"""# {dist}

The ait job `{ws.slug}` (its env.py: dataset, tools, rewards) as a [verifiers](https://github.com/PrimeIntellect-ai/verifiers)
environment, written by `ait job export`. It needs verifiers 0.4 (`{VERIFIERS_REQUIREMENT}`), not ait.

```bash
pip install .                      # or: uv pip install .
```

verifiers finds it by its id, `{dist}`: the package exports `AitJobTaskset` (a `vf.Taskset`). The job
was trained with a plain chat loop over its tools; verifiers' `null` harness is that loop:

```bash
{command}
```

(`--client.base-url URL/v1` points it at your own OpenAI-compatible server.)

- `{module}/job/` is a copy of the workspace (env.py and the files it reads: task.json, data/).
- `{module}/taskset.py` is the adapter: dataset from `build_dataset({t.dataset_size}, {t.seed})`
  (`--env.taskset.dataset-size`, `--env.taskset.seed` change them), the Environment's tools as a
  per-rollout tool server, REWARD_FUNCS as weighted `@vf.reward`s computed exactly as ait computes them.
- NOTES.md says how each job.toml setting carries over. For training, `ait job export --to prime-rl`
  writes the matching prime-rl config.
"""


def verifiers_notes(ws: Workspace, dist: str) -> str:
    body = notes_markdown(
        f"{dist}: what carries over from the ait job",
        verifiers_rows(ws.config),
        "The environment package carries env.py's surface; job.toml's training settings belong to the trainer "
        "(`ait job export --to prime-rl`) or to the command that runs the environment.",
        "verifiers",
    )
    env_lines = ["", "## env.py", "", "| env.py | verifiers | status | note |", "|---|---|---|---|"]
    env_lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in VERIFIERS_ENV_ROWS]
    if ws.third_party_imports:
        env_lines += ["", f"env.py imports {', '.join(ws.third_party_imports)}: pyproject.toml lists only "
                          "verifiers, add what provides them."]
    return body + "\n".join(env_lines) + "\n"
