"""Read a job workspace for export: job.toml parsed and checked, env.py checked without running it,
and the files the exported package carries.

Nothing here imports the job's env.py: the export runs in the user's own ait process, and env.py
is agent-written code that ait only ever runs in its sandbox. The checks are static (the file is
UTF-8 Python that defines the surface's names at top level); the exported package fails loudly at
import if the surface is wrong in a way only running it can show.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ait.job.config import JobConfigError, load_job_config
from ait.job.types import JobConfig

MAX_FILES_BYTES = 64 * 2**20
"""Most bytes of workspace files one export carries (env.py, task.json, data/ and the rest)."""
LEFT_OUT = {"job.toml", "INSTRUCTIONS.md", "__pycache__"}
"""Workspace entries the export does not copy: the job's settings are mapped, not copied, and the
instructions are for the agent that wrote the job."""
REQUIRED_NAMES = ("SYSTEM_PROMPT", "Environment", "build_dataset", "REWARD_FUNCS")


class ExportError(ValueError):
    """The workspace cannot be exported; the message says what to fix."""


@dataclass
class Workspace:
    path: Path
    config: JobConfig
    job_toml: str
    env_py: str
    task: dict | None
    """task.json's content, when the workspace has one."""
    files: list[Path] = field(default_factory=list)
    """Workspace files to carry (relative paths), env.py first."""
    third_party_imports: list[str] = field(default_factory=list)
    """Top-level modules env.py imports that are neither the standard library nor its own files."""

    @property
    def slug(self) -> str:
        """A short name for the job: task.json's id, else the workspace directory's name."""
        raw = str((self.task or {}).get("id") or self.path.resolve().name)
        return re.sub(r"[^a-z0-9]+", "-", raw.lower()).strip("-") or "job"

    def sha256(self, name: str) -> str:
        return hashlib.sha256((self.path / name).read_bytes()).hexdigest()


def load_workspace(path: str | Path) -> Workspace:
    """The workspace, or an ExportError naming the first thing that stops an export."""
    path = Path(path)
    if not path.is_dir():
        raise ExportError(f"workspace {path} is not a directory (it must hold job.toml and env.py)")
    try:
        config = load_job_config(path / "job.toml")
    except JobConfigError as e:
        raise ExportError(str(e)) from None
    env = path / "env.py"
    if not env.is_file():
        raise ExportError(f"env.py not found in {path}: the workspace must hold the job's env.py")
    try:
        env_py = env.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ExportError(f"env.py is not UTF-8 text (byte {e.start})") from None
    try:
        tree = ast.parse(env_py, filename="env.py")
    except SyntaxError as e:
        raise ExportError(f"env.py has a SyntaxError: {e.msg} (line {e.lineno})") from None
    missing = [name for name in REQUIRED_NAMES if name not in top_level_names(tree)]
    if missing:
        raise ExportError(f"env.py does not define {', '.join(missing)} at top level "
                          "(the surface: SYSTEM_PROMPT, class Environment, build_dataset, REWARD_FUNCS)")
    imports = imported_modules(tree)
    if "ait" in imports:
        raise ExportError("env.py imports ait: the exported package must run without ait installed")
    task = None
    if (path / "task.json").is_file():
        try:
            task = json.loads((path / "task.json").read_text())
        except (OSError, ValueError) as e:
            raise ExportError(f"task.json is not valid JSON: {e}") from None
        if not isinstance(task, dict):
            raise ExportError("task.json must hold a JSON object")
    files = carried_files(path)
    own = {p.parts[0].removesuffix(".py") for p in files}
    third_party = sorted(m for m in imports if m not in sys.stdlib_module_names and m not in own)
    return Workspace(path=path, config=config, job_toml=(path / "job.toml").read_text(), env_py=env_py,
                     task=task, files=files, third_party_imports=third_party)


def top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.If, ast.Try)):  # names bound in a top-level if/try count too
            for block in ("body", "orelse", "finalbody"):
                names |= top_level_names(ast.Module(body=getattr(node, block, []), type_ignores=[]))
            for handler in getattr(node, "handlers", []):
                names |= top_level_names(ast.Module(body=handler.body, type_ignores=[]))
    return names


def imported_modules(tree: ast.Module) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
    return modules


def carried_files(path: Path) -> list[Path]:
    """Regular files under the workspace the exported package carries (relative paths, env.py first):
    everything but job.toml, INSTRUCTIONS.md, hidden entries, caches and links."""
    out: list[Path] = []
    total = 0

    def walk(directory: Path) -> None:
        nonlocal total
        for entry in sorted(directory.iterdir()):
            rel = entry.relative_to(path)
            if entry.name.startswith(".") or entry.name in LEFT_OUT or entry.suffix == ".pyc" or entry.is_symlink():
                continue
            if entry.is_dir():
                walk(entry)
            elif entry.is_file():
                total += entry.stat().st_size
                if total > MAX_FILES_BYTES:
                    raise ExportError(f"the workspace's files pass {MAX_FILES_BYTES // 2**20} MiB: "
                                      "the export carries env.py's files, not a data set that size")
                out.append(rel)

    walk(path)
    out.sort(key=lambda p: (p != Path("env.py"), p.as_posix()))
    return out
