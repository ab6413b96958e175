"""Base-model resolution: a name in job.toml -> a local directory of safetensors weights.

`tiny` is built on the fly; a local directory is used as is; anything shaped like
`org/name` is a Hugging Face id, downloaded (safetensors and tokenizer files only,
never pickled weights or remote code) into the HF cache.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

WEIGHT_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "tokenizer*"]


class ResolvedModel(BaseModel):
    name: str
    """The name as written in job.toml."""
    path: str
    """Local directory with config, tokenizer and *.safetensors."""
    source: str
    """tiny | local | huggingface."""


class ModelResolutionError(ValueError):
    """A base model name that cannot be turned into local weights."""


def resolve_base_model(name: str) -> ResolvedModel:
    if name == "tiny":
        from ait.train.tiny import tiny_model_path

        return ResolvedModel(name=name, path=str(tiny_model_path()), source="tiny")
    local = Path(name).expanduser()
    if local.is_dir():
        if not list(local.glob("*.safetensors")):
            raise ModelResolutionError(f"{local} has no *.safetensors weights (pickled weights are never loaded)")
        return ResolvedModel(name=name, path=str(local.resolve()), source="local")
    if name.count("/") == 1 and not name.startswith((".", "/")):
        return ResolvedModel(name=name, path=_download(name), source="huggingface")
    raise ModelResolutionError(
        f"unknown base model {name!r}: use 'tiny', a local directory of safetensors weights, or a Hugging Face id like 'Qwen/Qwen3-0.6B'"
    )


def _download(repo_id: str) -> str:
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, allow_patterns=WEIGHT_PATTERNS)
    except Exception as e:  # offline, gated, missing: say which and how to work around it
        raise ModelResolutionError(
            f"cannot fetch {repo_id!r} from the Hugging Face hub ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
            "download it elsewhere and pass its local directory instead"
        ) from None

