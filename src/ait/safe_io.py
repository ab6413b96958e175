"""Reading and writing files in directories that sandboxed code could write (a job's directory,
a probe's scratch, an eval's output), from trusted code.

The sandboxed code may have planted a link, a FIFO or a device at any name there, or a file
far larger than expected: opened naively, the trusted reader would read the worker's
/proc/self/environ or AIT_HOME's secret in its stead, hang on a FIFO, or write through a link
into a file outside (a confused deputy). So: no links are followed, only regular files are
read, sizes are capped, and an error never quotes the file's content.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class UnsafeFile(ValueError):
    """The file is missing, not a regular file, a link, too large, or not what was expected.
    The message names the file and the problem, never its content."""


def read_regular_file(path: str | Path, limit: int) -> bytes:
    """The bytes of `path`, refusing links (at the last component), FIFOs, devices and files over `limit`."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise UnsafeFile(f"{path.name} cannot be opened as a plain file ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{path.name} is not a regular file")
        if st.st_size > limit:
            raise UnsafeFile(f"{path.name} is {st.st_size} bytes, over the {limit}-byte limit")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise UnsafeFile(f"{path.name} grew past the {limit}-byte limit while being read")
        return data
    finally:
        os.close(fd)


def describe_errors(e: ValidationError, limit: int = 5) -> str:
    """A pydantic error as field locations and messages only (pydantic's own text quotes the input)."""
    parts = [f"{'.'.join(str(x) for x in err['loc']) or '(top level)'}: {err['msg']}"
             for err in e.errors(include_input=False, include_url=False, include_context=False)[:limit]]
    more = e.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def read_json_model(path: str | Path, model: type[M], limit: int) -> M:
    """`model` validated from the JSON file at `path` (read as `read_regular_file` does)."""
    data = read_regular_file(path, limit)
    name = Path(path).name
    try:
        return model.model_validate_json(data)
    except ValidationError as e:
        raise UnsafeFile(f"{name} is not a valid {model.__name__}: {describe_errors(e)}") from None
    except (ValueError, UnicodeError):
        raise UnsafeFile(f"{name} is not valid JSON") from None


def drop_nonfinite(value: Any) -> tuple[Any, list[str]]:
    """Parsed JSON without its NaN and ±Infinity numbers (at any depth in dicts and lists), and where
    each one was ("metrics.train/loss", "a[2]"). Python's json reads NaN, Infinity and 1e999 as
    floats, pydantic accepts them, and its JSON writes them as null, which then fails validation:
    one such number would make a stored result unreadable."""
    dropped: list[str] = []

    def bad(x: Any) -> bool:
        return isinstance(x, float) and not math.isfinite(x)

    def walk(v: Any, at: str) -> Any:
        if isinstance(v, dict):
            out = {}
            for k, x in v.items():
                where = f"{at}.{k}" if at else str(k)
                if bad(x):
                    dropped.append(where)
                else:
                    out[k] = walk(x, where)
            return out
        if isinstance(v, list):
            kept = []
            for i, x in enumerate(v):
                if bad(x):
                    dropped.append(f"{at}[{i}]")
                else:
                    kept.append(walk(x, f"{at}[{i}]"))
            return kept
        return v

    return walk(value, ""), dropped


def read_finite_json_model(path: str | Path, model: type[M], limit: int) -> tuple[M, list[str]]:
    """`model` validated from the JSON file at `path` (read as `read_regular_file` does) once its
    non-finite numbers are dropped (`drop_nonfinite`), and the places they were dropped from."""
    data = read_regular_file(path, limit)
    name = Path(path).name
    try:
        parsed, dropped = drop_nonfinite(json.loads(data))
    except (ValueError, UnicodeError, RecursionError):
        raise UnsafeFile(f"{name} is not valid JSON") from None
    try:
        return model.model_validate(parsed), dropped
    except ValidationError as e:
        note = f" ({len(dropped)} NaN or infinite number(s) were dropped from it first)" if dropped else ""
        raise UnsafeFile(f"{name} is not a valid {model.__name__}: {describe_errors(e)}{note}") from None


def write_new_file(path: str | Path, data: str | bytes, mode: int = 0o644) -> None:
    """Create `path` afresh (whatever was there, a planted link included, is removed first; the
    new file is opened exclusively and never through a link)."""
    path = Path(path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        raise UnsafeFile(f"{path.name} is a directory") from None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)

