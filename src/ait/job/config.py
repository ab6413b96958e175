"""Load and validate an agent's job.toml against a task's constraints."""

from __future__ import annotations

import tomllib
from pathlib import Path

from pydantic import ValidationError

from ait.job.types import JobConfig
from ait.spec import Constraints, format_validation_error


class JobConfigError(ValueError):
    """job.toml is missing, not TOML, or violates the contract; the message names the key."""


def parse_job_config(text: str, constraints: Constraints | None = None, source: str = "job.toml") -> JobConfig:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise JobConfigError(f"{source} is not valid TOML: {e}") from None
    try:
        return JobConfig.model_validate(data, context={"constraints": constraints})
    except ValidationError as e:
        raise JobConfigError(f"{source}: {format_validation_error(e)}") from None


def load_job_config(path: str | Path, constraints: Constraints | None = None) -> JobConfig:
    path = Path(path)
    if not path.is_file():
        raise JobConfigError(f"{path} not found: the workspace must contain job.toml with [job] and [train]")
    return parse_job_config(path.read_text(errors="replace"), constraints, source=path.name)
