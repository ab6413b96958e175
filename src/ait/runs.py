"""Run directories: everything an episode leaves behind, under runs/<run_id>/.

    manifest.json       versions, seeds, resolved config, task
    trajectory.jsonl    one line per message / tool call / tool result / event
    workspace/          the agent's workspace as it ended
    submissions/N/      each submission: a frozen copy of the workspace and probe.json
    job/                the training job's files (logs, checkpoint, eval)
    job_result.json     JobResult
    reward.json         RewardBreakdown
    episode.json        EpisodeResult
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pydantic import BaseModel


def runs_root() -> Path:
    return Path(os.environ.get("AIT_RUNS") or "runs")


def new_run_id(prefix: str = "ep") -> str:
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for pkg in ("ait", "torch", "transformers", "trl", "peft", "datasets", "pydantic"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path).resolve()
        self.path.mkdir(parents=True, exist_ok=True)

    @property
    def workspace(self) -> Path:
        return self.path / "workspace"

    def submission_dir(self, attempt: int) -> Path:
        return self.path / "submissions" / str(attempt)

    def write_json(self, name: str, obj: BaseModel | dict[str, Any]) -> Path:
        path = self.path / name
        text = obj.model_dump_json(indent=2) if isinstance(obj, BaseModel) else json.dumps(obj, indent=2, default=str)
        path.write_text(text + "\n")
        return path

    def log(self, kind: str, **fields: Any) -> None:
        """Append one event to trajectory.jsonl (every message, tool call, result, usage, timing)."""
        with open(self.path / "trajectory.jsonl", "a") as f:
            f.write(json.dumps({"t": time.time(), "kind": kind, **fields}, default=str) + "\n")
