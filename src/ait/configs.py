"""Loading entry-point configs (pydantic models) from TOML, with errors that name the key."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from ait.spec import format_validation_error

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config file that is missing, not TOML, or has a wrong, out-of-bounds or unknown key."""


def load_config(path: str | Path, model: type[M]) -> M:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory, not a TOML file") from None
    except OSError as e:
        raise ConfigError(f"config file {path} cannot be read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML: {e}") from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{path}: {format_validation_error(e)}") from None
