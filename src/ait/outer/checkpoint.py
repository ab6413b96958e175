"""Outer-loop checkpoints: RUN_DIR/checkpoints/step_N/, each a self-contained bundle.

    step_N/backend/       the backend's own checkpoint (local: adapter/adapter_model.safetensors,
                          adapter/adapter_config.json, optimizer.safetensors, backend.json;
                          tinker: tinker.json, its service path)
    step_N/state.json     the loop's state: step, config digest, task-sampling rng, seed counters, spend
    step_N/metrics.jsonl  the run's metrics rows up to step N (the arc so far, earlier runs included)
    step_N/heldout_start.json  the step-0 held-out results (ait.outer.heldout), once they exist: later
                          held-out evaluations on any machine are compared with them
    step_N/bundle.json    what makes the directory portable: format, the resolved config, the step,
                          every file's size and sha256, the runs it continues (lineage)

A checkpoint is written under step_N.tmp and renamed into place, so a directory named step_N
is always complete; `latest` returns the highest complete one. A run with held-out tasks writes
step_0 before its first step (after the step-0 held-out evaluation, if any): a machine lost during
step 1 keeps the warm start, and the arc's end compares its final adapter with that one.

A preemptible machine: copy step_N (at most MAX_FILES files; at most `checkpoint_max_mib`, 64 MiB
by default, the local backend choosing its tensors' encoding to fit, ait.outer.state_codec) to the
next machine and `ait train --resume-from step_N --run-dir NEW` continues the arc there from that
alone: `import_bundle` checks it (one-line BundleError when it is damaged or does not fit the
config), copies it to NEW/checkpoints/step_N and writes NEW's config, manifest and metrics.jsonl,
and the run resumes as from its own checkpoint: same step count, rng, seed counters and spend, and
metrics.jsonl holding steps 1..N before step N+1 is appended, so `ait report NEW` shows one arc.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

STEP_DIR = re.compile(r"^step_(\d+)$")
BUNDLE_FILE = "bundle.json"
BUNDLE_FORMAT = "ait-outer-bundle/1"
METRICS_FILE = "metrics.jsonl"
MAX_FILES = 8
JSON_RESERVE_BYTES = 64 * 1024
"""Room left in the size bound for state.json, bundle.json and the backend's small JSON files."""


class CheckpointError(ValueError):
    """A checkpoint that is missing or was trained from another base model."""


class BundleError(CheckpointError):
    """A bundle that is damaged, incomplete, or does not fit the run it would continue (one line)."""


def read_backend_record(path: Path, filename: str, backend: str, model: str) -> dict[str, Any]:
    """The JSON record a backend wrote beside its checkpoint, checked to be this backend's and
    trained from `model` (a checkpoint of another base model would load wrong or not at all)."""
    file = path / filename
    if not file.is_file():
        raise CheckpointError(f"{file} not found: not a checkpoint written by the {backend} backend")
    record = json.loads(file.read_text())
    if record.get("model") != model:
        raise CheckpointError(f"{path} was trained from {record.get('model')!r}, not the configured {model!r}")
    return record


class LoopState(BaseModel):
    """What the loop needs besides the weights to continue exactly where it stopped."""

    step: int
    """Outer steps completed."""
    config_digest: str
    """OuterConfig.digest() of the run that wrote it."""
    rng_state: list[Any]
    """random.Random.getstate() of the task sampler, as JSON."""
    groups_launched: int = 0
    """Groups started so far (numbers episode directories and seeds)."""
    usd_total: float = 0.0
    """Spend of the run so far (earlier runs of the arc included)."""
    usd_carried: float = 0.0
    """Of usd_total, what earlier run directories spent (continued from a bundle): not in this run's
    costs.jsonl, so the episodes' run budget is budget_usd minus it."""
    saved_at: float = 0.0
    """Unix time."""


def rng_to_json(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def rng_from_json(state: list[Any]) -> random.Random:
    rng = random.Random()
    rng.setstate((state[0], tuple(state[1]), state[2]))
    return rng


def checkpoints_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def save_checkpoint(run_dir: Path, backend: Any, state: LoopState, *, config: Any = None,
                    max_bytes: float | None = None, lineage: list[dict[str, Any]] | None = None,
                    extra: dict[str, Path] | None = None) -> Path:
    """RUN_DIR/checkpoints/step_N as a sealed bundle. `max_bytes` bounds the whole directory: the
    backend gets what the metrics, `extra` (bundle file name -> source file: the step-0 held-out
    results, say) and JSON files leave (a backend whose save takes `max_bytes` encodes to fit it)."""
    dest = checkpoints_dir(run_dir) / f"step_{state.step}"
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    metrics = run_dir / METRICS_FILE
    rows = []
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by a crash
            if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= state.step:
                rows.append(line + "\n")
    (tmp / METRICS_FILE).write_text("".join(rows))
    for name, source in (extra or {}).items():
        shutil.copyfile(source, tmp / name)
    kwargs: dict[str, Any] = {}
    if max_bytes is not None and "max_bytes" in inspect.signature(backend.save).parameters:
        small = sum(p.stat().st_size for p in tmp.iterdir() if p.is_file())
        kwargs["max_bytes"] = max_bytes - small - JSON_RESERVE_BYTES
    backend.save(str(tmp / "backend"), **kwargs)
    state = state.model_copy(update={"saved_at": time.time()})
    (tmp / "state.json").write_text(state.model_dump_json(indent=2) + "\n")
    seal(tmp, step=state.step, config=config, source=run_dir, max_bytes=max_bytes, lineage=lineage or [])
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def _files(bundle: Path) -> list[Path]:
    return sorted(p for p in bundle.rglob("*") if p.is_file() and p.name != BUNDLE_FILE)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def seal(bundle: Path, *, step: int, config: Any, source: Path, max_bytes: float | None,
         lineage: list[dict[str, Any]]) -> dict[str, Any]:
    """Write bundle.json: every other file's size and sha256, the config, the step, the lineage."""
    files = {p.relative_to(bundle).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
             for p in _files(bundle)}
    backend_record = {}
    for name in ("backend.json", "tinker.json"):
        if (bundle / "backend" / name).is_file():
            backend_record = json.loads((bundle / "backend" / name).read_text())
    manifest = {
        "format": BUNDLE_FORMAT, "step": step, "created_at": time.time(), "source_run": Path(source).name,
        "lineage": lineage, "config": config.model_dump(mode="json") if config is not None else None,
        "config_digest": config.digest() if config is not None else None,
        "backend": backend_record.get("backend"), "model": backend_record.get("model"),
        "encoding": backend_record.get("encoding"), "hidden_secret_id": hidden_secret_id(), "files": files,
        "total_bytes": sum(f["bytes"] for f in files.values()), "max_bytes": max_bytes,
    }
    text = json.dumps(manifest, indent=2) + "\n"
    manifest["total_bytes"] += len(text.encode())  # approximately its own size too
    (bundle / BUNDLE_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def hidden_secret_id() -> str:
    """A fingerprint (not the secret) of this machine's hidden-eval secret (AIT_HIDDEN_SEED or
    AIT_HOME/hidden_secret): two machines with different ones score inner jobs on different hidden
    sets, so an arc moved between them changes its yardstick."""
    from ait.home import hidden_secret

    return hashlib.sha256(("ait-bundle:" + hidden_secret()).encode()).hexdigest()[:12]


def verify_bundle(bundle: Path) -> dict[str, Any]:
    """bundle.json, checked against the files beside it; raises BundleError (one line) on any mismatch."""
    bundle = Path(bundle)
    if not bundle.is_dir():
        raise BundleError(f"{bundle} is not a directory: pass a checkpoint bundle (RUN_DIR/checkpoints/step_N)")
    path = bundle / BUNDLE_FILE
    if not path.is_file():
        raise BundleError(f"{bundle} has no {BUNDLE_FILE}: not a checkpoint bundle (written by `ait train`)")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError(f"{path} is damaged: not JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else None
        raise BundleError(f"{path}: format {got!r}, expected {BUNDLE_FORMAT!r}")
    files = manifest.get("files") or {}
    present = {p.relative_to(bundle).as_posix() for p in _files(bundle)}
    if missing := sorted(set(files) - present):
        raise BundleError(f"{bundle} is incomplete: {missing[0]} is missing ({len(missing)} file(s) in all)")
    if extra := sorted(present - set(files)):
        raise BundleError(f"{bundle} holds {extra[0]}, which its {BUNDLE_FILE} does not list")
    if len(files) + 1 > MAX_FILES:
        raise BundleError(f"{bundle} has {len(files) + 1} files, more than a bundle's {MAX_FILES}")
    for name, want in files.items():
        file = bundle / name
        if file.stat().st_size != want.get("bytes") or _sha256(file) != want.get("sha256"):
            raise BundleError(f"{file} is damaged: its size or sha256 differs from {BUNDLE_FILE}")
    if "state.json" not in files or manifest.get("config") is None:
        raise BundleError(f"{bundle} lacks the loop state or the config: not a resumable bundle")
    if load_state(bundle).step != manifest.get("step"):
        raise BundleError(f"{bundle}: state.json is at step {load_state(bundle).step}, "
                          f"{BUNDLE_FILE} says {manifest.get('step')}")
    return manifest


def latest(run_dir: Path) -> Path | None:
    """The highest-step complete checkpoint under RUN_DIR/checkpoints, or None."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := STEP_DIR.match(p.name)) and (p / "state.json").is_file()]
    return max(found)[1] if found else None


def load_state(checkpoint: Path) -> LoopState:
    return LoopState.model_validate_json((checkpoint / "state.json").read_text())

