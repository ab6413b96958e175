"""Export an ait job (a workspace: job.toml + env.py) to the tools users already train with.

    export_job(WORKSPACE, "verifiers", OUT_DIR)   an installable verifiers environment package
    export_job(WORKSPACE, "prime-rl", OUT_DIR)    a prime-rl config (rl.toml) + that package in OUT_DIR/environment

The package never imports ait (ait.job.export.vf_taskset is its adapter, copied verbatim). How
every job.toml setting carries over: ait.job.export.mapping, docs/export.md, and NOTES.md in
every export. `scripts/check_verifiers_export.py` checks the exports against verifiers and
prime-rl themselves.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ait.job.export.mapping import PrimeRLPlan, Row, prime_rl_plan, verifiers_rows
from ait.job.export.prime_rl import PACKAGE_KEYS, notes_markdown, rl_toml
from ait.job.export.verifiers_pkg import VERIFIERS_REQUIREMENT, package_names, write_package
from ait.job.export.workspace import ExportError, Workspace, load_workspace

TARGETS = ("verifiers", "prime-rl")
MARKER = "ait_export.json"
"""Written at the top of every export; an OUT_DIR holding it may be replaced (force=True)."""
ENV_DIR = "environment"
"""Where a prime-rl export puts the environment package."""

__all__ = ["ExportError", "ExportResult", "TARGETS", "export_job", "load_workspace"]


@dataclass
class ExportResult:
    out_dir: Path
    target: str
    env_id: str
    """The verifiers taskset id (= the package's distribution name)."""
    module: str
    """The package's import name."""
    package_dir: Path
    """The directory to `pip install`."""
    rows: list[Row]
    """Every job.toml setting and how it carries over to the target."""
    files: list[str] = field(default_factory=list)
    """Files written, relative to out_dir."""
    model: str | None = None
    """prime-rl: the model name written."""
    third_party_imports: list[str] = field(default_factory=list)

    @property
    def unmapped(self) -> list[Row]:
        return [r for r in self.rows if r.status == "unmapped"]

    def manifest(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "env_id": self.env_id,
            "module": self.module,
            "package_dir": str(self.package_dir.relative_to(self.out_dir)) if self.package_dir != self.out_dir else ".",
            "verifiers": VERIFIERS_REQUIREMENT,
            "model": self.model,
            "files": self.files,
            "third_party_imports": self.third_party_imports,
            "settings": [r.as_dict() for r in self.rows],
            "unmapped": [r.key for r in self.unmapped],
        }


HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
"""A Hugging Face repo id, ORG/NAME (what prime-rl's model.name loads)."""


def export_job(workspace: str | Path, target: str, out_dir: str | Path, *, model: str | None = None,
               name: str | None = None, force: bool = False) -> ExportResult:
    """Export the workspace's job to `target` under `out_dir` (created; an existing non-empty directory
    is refused unless it holds an earlier export and force is set, in which case it is replaced)."""
    if target not in TARGETS:
        raise ExportError(f"unknown target {target!r}: choose one of {', '.join(TARGETS)}")
    if model is not None and target != "prime-rl":
        raise ExportError("--model applies to --to prime-rl (a verifiers environment does not name a model)")
    if model is not None and not HUB_ID.fullmatch(model):
        raise ExportError(f"--model {model!r} is not a Hugging Face model id: pass ORG/NAME, e.g. Qwen/Qwen2.5-0.5B")
    ws = load_workspace(workspace)
    dist, module = package_names(ws, name)
    out = Path(out_dir)
    _check_out_dir(out, Path(workspace), force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        result = _write(ws, target, tmp, dist, module, model)
        if out.exists():
            shutil.rmtree(out) if any(out.iterdir()) else out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    result.out_dir = out
    result.package_dir = out / result.package_dir.relative_to(tmp)
    return result


def _check_out_dir(out: Path, workspace: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a directory")
    resolved, ws = out.resolve(), workspace.resolve()
    if resolved == ws or ws in resolved.parents or resolved in ws.parents:
        raise ExportError(f"{out} overlaps the workspace {workspace}: export to a directory outside it")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise ExportError(f"{out} exists and is not empty: export to a new or empty directory")
        if not force:
            raise ExportError(f"{out} holds an earlier export: pass --force to replace it")


def _write(ws: Workspace, target: str, root: Path, dist: str, module: str, model: str | None) -> ExportResult:
    if target == "verifiers":
        files = write_package(ws, root, dist, module)
        result = ExportResult(out_dir=root, target=target, env_id=dist, module=module, package_dir=root,
                              rows=verifiers_rows(ws.config), files=files,
                              third_party_imports=ws.third_party_imports)
    else:
        files = [f"{ENV_DIR}/{f}" for f in write_package(ws, root / ENV_DIR, dist, module)]
        plan = prime_rl_plan(ws.config, dist, model)
        check_prime_rl_keys(plan)
        (root / "rl.toml").write_text(rl_toml(plan, ws.slug, ENV_DIR))
        (root / "NOTES.md").write_text(prime_rl_notes(ws, plan, dist))
        files += ["rl.toml", "NOTES.md"]
        result = ExportResult(out_dir=root, target=target, env_id=dist, module=module, package_dir=root / ENV_DIR,
                              rows=plan.rows, files=files, model=plan.model,
                              third_party_imports=ws.third_party_imports)
    result.files.append(MARKER)
    (root / MARKER).write_text(json.dumps(result.manifest(), indent=2, default=str) + "\n")
    return result


def prime_rl_notes(ws: Workspace, plan: PrimeRLPlan, dist: str) -> str:
    intro = (f"`rl.toml` trains the ait job `{ws.slug}` with prime-rl on the environment `{dist}` "
             f"(the package in `{ENV_DIR}/`: install it where prime-rl runs). Each row is one job.toml setting, "
             "whether the job set it or left ait's default.")
    return notes_markdown(f"{dist}: job.toml -> prime-rl", plan.rows, intro, "prime-rl field")


def check_prime_rl_keys(plan: PrimeRLPlan) -> None:
    """Every key the export writes exists in prime-rl's config models (the extract in prime_rl_schema)."""
    from ait.job.export.prime_rl_schema import KEYS

    unknown = sorted(k for k in plan.values if k not in KEYS and k not in PACKAGE_KEYS)
    if unknown:
        raise ExportError(f"internal error: prime-rl has no config key {', '.join(unknown)} "
                          "(ait.job.export.prime_rl_schema)")
