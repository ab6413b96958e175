"""Keep what a GPU machine's arc made, before the machine goes away: run it on each poll call's files.

    python bench/arc_collect.py FILES_AT --machine 2026-12-07-h100-a [--arc .arc] [--out docs/measurements/arc]

FILES_AT is the folder a `bench/gpu_poll.sh` call brought back: results.tgz (the run without weights),
bundle.tar.part-* (the newest checkpoint bundle) and, once, step0.tar.part-* (the warm start's).

- The bundle pieces go to the git-ignored ARC/bundle/ (the newest step replaces an older one, never the
  reverse), the warm start's to ARC/step0/. They are what the next machine resumes from and what the
  arc's end compares with. They are not left in the tree: every tracked file travels with every device
  call, whose limit is 64 MiB, and a bundle may be 64 MiB itself. `python bench/arc_keep.py save` keeps
  them in git history instead (a new checkout has no ARC/; `restore` brings them back).
- What is committed instead, under OUT/MACHINE/: each arc run's metrics.jsonl and manifest.json, a summary
  of every finished episode (episodes.jsonl: family, stop reason, reward terms, the job it chose),
  progress.log, gpu.txt, gpu-monitor.csv and fingerprints.json (the hidden sets by fingerprint, never the
  secret); and
  OUT/bundle.json: the step and each piece's size and sha256, which the next machine's pieces must match.

It reads a results.tgz cut short (a poll that ran out of time) as far as it goes.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import sys
import tarfile
from pathlib import Path

KEEP = ("progress.log", "gpu.txt", "fingerprints.json", "gpu-monitor.csv")  # the monitor: memory and load over time
RUN_FILES = ("metrics.jsonl", "manifest.json", "costs.jsonl")
MAX_MEMBER = 5 * 2**20  # a summary file larger than this is not a summary


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            h.update(block)
    return h.hexdigest()


def bundle_step(pieces: list[Path]) -> int | None:
    """The step of the bundle the pieces make, or None when they do not make a whole one: every file its
    bundle.json lists must be there with that size and sha256 (a missing last piece ends the tar early,
    which tarfile reads as a shorter archive, not an error)."""
    data = b"".join(p.read_bytes() for p in pieces)
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for m in tar:
                if m.isfile():
                    files["/".join(Path(m.name).parts)] = tar.extractfile(m).read()
        manifest = json.loads(files.pop("bundle.json"))
        listed = manifest.get("files", {})
        if set(listed) != set(files) or any(hashlib.sha256(files[name]).hexdigest() != want.get("sha256")
                                            for name, want in listed.items()):
            return None
        return int(manifest["step"])
    except (tarfile.TarError, KeyError, ValueError, TypeError, AttributeError, OSError):
        return None


def keep_pieces(files_at: Path, prefix: str, dest: Path, newer_only: bool, machine: str | None = None) -> dict | None:
    pieces = sorted(files_at.glob(f"{prefix}.tar.part-*"))
    if not pieces:
        return None
    step = bundle_step(pieces)
    if step is None:
        print(f"{prefix}: {len(pieces)} pieces that do not make a bundle (cut short?): left alone", file=sys.stderr)
        return None
    record = dest / "bundle.json"
    kept = json.loads(record.read_text()) if newer_only and record.is_file() else None
    if kept is not None and kept["step"] > step:
        print(f"{prefix}: step {step} is older than the kept step {kept['step']}: left alone", file=sys.stderr)
        return kept
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for p in pieces:
        shutil.copyfile(p, dest / p.name)
    info = {"step": step, **({"machine": machine} if machine else {}),
            "pieces": [{"name": p.name, "bytes": p.stat().st_size, "sha256": sha256(p)} for p in pieces]}
    record.write_text(json.dumps(info, indent=1) + "\n")
    return info


def episode_summary(episode: dict) -> dict:
    """What one finished episode did and scored: no transcript, no hidden data."""
    reward = episode.get("reward") or {}
    submitted = [s.get("report", {}).get("config") for s in episode.get("submissions") or []]
    chosen = next((c for c in reversed(submitted) if c), None) or {}
    train = chosen.get("train") or {}
    return {"episode": episode.get("run_id"), "family": episode.get("task_id"), "stop_reason": episode.get("stop_reason"),
            "turns": episode.get("turns"), "wall_seconds": episode.get("wall_seconds"),
            "reward": {k: reward.get(k) for k in ("total", "validation", "job_quality", "train_speed", "post", "best_pre")},
            "job_fail_reason": (episode.get("job") or {}).get("fail_reason"),
            "choice": {"base_model": (chosen.get("job") or {}).get("base_model"),
                       **{k: train.get(k) for k in ("learning_rate", "max_steps", "num_generations", "temperature",
                                                    "loss_type", "dataset_size", "lora")}}}


def keep_results(tgz: Path, dest: Path) -> dict[str, int]:
    """The summaries out of results.tgz (as far as it reads) into dest; counts of what was kept."""
    dest.mkdir(parents=True, exist_ok=True)
    counts = {"files": 0, "episodes": 0}
    episodes: dict[str, dict] = {}
    try:
        with tarfile.open(tgz) as tar:
            for m in tar:
                if not m.isfile() or m.size > MAX_MEMBER:
                    continue
                parts = Path(m.name).parts  # "./arc/x" reads as ("arc", "x")
                name = "/".join(parts)
                if name in KEEP or (len(parts) == 2 and parts[0].startswith("arc") and parts[1] in RUN_FILES):
                    target = dest / name.replace("/", "-") if len(parts) == 2 else dest / name
                    target.write_bytes(tar.extractfile(m).read())
                    counts["files"] += 1
                elif len(parts) == 4 and parts[0].startswith("arc") and parts[1] == "episodes" and parts[3] == "episode.json":
                    try:
                        episodes[f"{parts[0]}/{parts[2]}"] = episode_summary(json.load(tar.extractfile(m)))
                    except (json.JSONDecodeError, AttributeError):
                        pass
    except (tarfile.TarError, EOFError, OSError) as e:
        print(f"{tgz}: read as far as it goes ({type(e).__name__}: {e})", file=sys.stderr)
    if episodes:
        old = {}
        path = dest / "episodes.jsonl"
        if path.is_file():
            old = {r["key"]: r for r in map(json.loads, path.read_text().splitlines())}
        old.update({k: {"key": k, **v} for k, v in episodes.items()})
        path.write_text("".join(json.dumps(old[k]) + "\n" for k in sorted(old)))
        counts["episodes"] = len(old)
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files_at", type=Path, help="the folder a poll call's files came back in")
    ap.add_argument("--machine", required=True, help="a label for this machine, e.g. 2026-12-07-h100-a")
    ap.add_argument("--arc", type=Path, default=Path(".arc"), help="where the pieces are kept (git-ignored)")
    ap.add_argument("--out", type=Path, default=Path("docs/measurements/arc"), help="where the summaries are committed")
    a = ap.parse_args(argv)
    if not a.files_at.is_dir():
        ap.error(f"{a.files_at} is not a folder: pass the files_at of a poll call")
    if "/" in a.machine or a.machine.startswith("."):
        ap.error(f"--machine {a.machine!r}: a plain label, no slashes")
    bundle = keep_pieces(a.files_at, "bundle", a.arc / "bundle", newer_only=True, machine=a.machine)
    step0 = keep_pieces(a.files_at, "step0", a.arc / "step0", newer_only=False, machine=a.machine)
    counts = keep_results(a.files_at / "results.tgz", a.out / a.machine) if (a.files_at / "results.tgz").is_file() else {}
    if bundle:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "bundle.json").write_text(json.dumps({"machine": a.machine, **bundle}, indent=1) + "\n")
    print(json.dumps({"bundle_step": bundle and bundle["step"], "step0": bool(step0), **counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
