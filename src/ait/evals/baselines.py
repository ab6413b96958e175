"""Frozen untrained scores per (family, base weights, hidden set, scoring setup): what best_pre is made of.

The store is a JSON file in AIT_HOME (outside every workspace). An entry is keyed by the
weights' content hash, not the model's name: re-pointing an alias (or a directory) at other
weights never meets a stale score. It is keyed by the scoring setup too (`scoring_setup`: the
scoring code, the spec's eval format, the libraries, the model's tokenizer files): a changed
scorer, system prompt or max_new_tokens is another eval, and its score is measured afresh. Once frozen it is not replaced unless asked (`ait
baselines seed --force`), so every episode of a family is scored against the same
untrained references. `ait.evals.best_pre` turns them into an episode's best_pre.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, Field

from ait.home import baselines_path

MAX_TOKENIZER_FILE = 64 << 20  # tokenizer.json is a few MB; a stray large file is not part of the template


def scoring_setup(spec, model_path: str | Path, code: str | None = None) -> str:
    """A digest of everything besides the weights and the hidden set that decides an untrained
    score: the scoring code (`scoring_code_digest`: the eval, the family's generator, tools and
    scorer, the chat-format helpers), the spec's eval format (system prompt, max_new_tokens,
    turns), the libraries' versions, and the model directory's non-weight files (tokenizer, chat
    template, config; a GGUF's own are inside its weights hash). `code`: the code digest, when the
    caller computes it once for several models."""
    import hashlib

    from ait.evals.hidden_eval import library_versions, scoring_code_digest

    files = hashlib.sha256()
    root = Path(model_path)
    for f in sorted(root.iterdir()) if root.is_dir() else []:
        if f.is_file() and not f.is_symlink() and f.suffix != ".safetensors" \
                and f.stat().st_size <= MAX_TOKENIZER_FILE:
            files.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    key = json.dumps({"code": code or scoring_code_digest(), "format": spec.eval_format.model_dump(mode="json"),
                      "libraries": library_versions(), "model_files": files.hexdigest()}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class Baseline(BaseModel):
    family: str
    """Task family."""
    base_model: str
    """Base model name as job.toml spelled it when measured (for people; not part of the key)."""
    weights_sha256: str | None = None
    """Content hash of the weights scored (ait.train.models.ResolvedModel.sha256): the key. Entries
    from before it existed (None) are never matched."""
    fingerprint: str
    """Which hidden set (secret, difficulty, n) the score is on."""
    setup: str | None = None
    """How it was scored (`scoring_setup`): part of the key. Entries from before it existed (None)
    are never matched."""
    best_pre: float
    """Best untrained hidden-eval score measured."""
    n: int
    """Hidden examples scored."""
    measured_at: float = Field(default_factory=time.time)
    """Unix time of the measurement."""


class BaselineStore:
    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else baselines_path()

    def all(self) -> list[Baseline]:
        if not self.path.exists():
            return []
        try:
            data = json.loads(self.path.read_text())
            return [Baseline.model_validate(b) for b in data.get("baselines", [])]
        except (ValueError, AttributeError) as e:
            raise ValueError(f"baselines store {self.path} is corrupt ({e}); fix or delete it and run "
                             "`ait baselines seed` again") from None

    def get(self, family: str, weights_sha256: str, fingerprint: str, setup: str) -> Baseline | None:
        for b in self.all():
            if b.weights_sha256 is not None and b.setup is not None and \
                    key_of(b) == (family, weights_sha256, fingerprint, setup):
                return b
        return None

    def freeze(self, entry: Baseline, force: bool = False) -> Baseline:
        """Store `entry` unless one is frozen for its key (then return that one)."""
        if entry.weights_sha256 is None or entry.setup is None:
            raise ValueError("a baseline is frozen for the weights it scored and how: weights_sha256 and setup "
                             "are required")
        with self._locked():
            entries = self.all()
            key = key_of(entry)
            for i, b in enumerate(entries):
                if key_of(b) == key:
                    if not force:
                        return b
                    entries[i] = entry
                    break
            else:
                entries.append(entry)
            self._write(entries)
            return entry

    @contextmanager
    def measuring(self):
        """Held while a missing baseline is measured: one eval at a time per store, across threads and
        processes (a second flock on its own file; writes take `_locked`, so readers never wait on it)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".measuring.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    @contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _write(self, entries: list[Baseline]) -> None:
        data = {"baselines": [b.model_dump() for b in sorted(entries, key=lambda b: (b.family, b.base_model,
                                                                                   b.fingerprint, b.setup or ""))]}
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".baselines-")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
        os.replace(tmp, self.path)


def key_of(b: Baseline) -> tuple:
    return b.family, b.weights_sha256, b.fingerprint, b.setup
