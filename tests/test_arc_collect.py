"""bench/arc_collect.py: a poll call's files kept before the machine goes away (pieces aside, summaries committed)."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("arc_collect", ROOT / "bench" / "arc_collect.py")
collect = importlib.util.module_from_spec(spec)
spec.loader.exec_module(collect)


def tar_bytes(files: dict[str, bytes], gz: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def pieces(folder: Path, prefix: str, step: int, size: int = 700) -> list[Path]:
    adapter = b"w" * 2000
    listed = {"adapter.safetensors": {"bytes": len(adapter), "sha256": hashlib.sha256(adapter).hexdigest()}}
    data = tar_bytes({"./bundle.json": json.dumps({"step": step, "files": listed}).encode(),
                      "./adapter.safetensors": adapter})
    out = []
    for i in range(0, len(data), size):
        out.append(folder / f"{prefix}.tar.part-{i // size:02d}")
        out[-1].write_bytes(data[i:i + size])
    return out


EPISODE = {"run_id": "g00000-0-ledger-bddd", "task_id": "ledger", "stop_reason": "job_done", "turns": 8,
           "wall_seconds": 174.0, "reward": {"total": 0.37, "validation": 1.0, "job_quality": -0.04, "post": 0.0,
                                             "best_pre": 0.05, "train_speed": 0.9},
           "submissions": [{"attempt": 1, "report": {"config": {"job": {"base_model": "smollm2-135m"},
                                                                "train": {"learning_rate": 1e-6, "max_steps": 12}}}}],
           "job": {"fail_reason": None}, "transcript_secret": "never copied"}


def results(folder: Path, cut: int | None = None) -> None:
    data = tar_bytes({"./progress.log": b"07:42 stage arc start\n", "./noise.bin": bytes(range(256)) * 64 + __import__("os").urandom(20000),
                      "./fingerprints.json": b"{}", "./gpu-monitor.csv": b"timestamp, utilization.gpu [%]\n",
                      "./arc/metrics.jsonl": b'{"step": 1}\n', "./arc/manifest.json": b"{}",
                      "./arc/episodes/g00000-0-ledger-bddd/episode.json": json.dumps(EPISODE).encode(),
                      "./arc/episodes/g00000-0-ledger-bddd/trajectory.jsonl": b"transcript\n"}, gz=True)
    (folder / "results.tgz").write_bytes(data if cut is None else data[:cut])


def test_it_keeps_the_pieces_aside_and_commits_only_summaries(tmp_path):
    got = tmp_path / "poll1"
    got.mkdir()
    made = pieces(got, "bundle", 1)
    pieces(got, "step0", 0)
    results(got)
    arc, out = tmp_path / ".arc", tmp_path / "committed"
    assert collect.main([str(got), "--machine", "m1", "--arc", str(arc), "--out", str(out)]) == 0
    assert sorted(p.name for p in (arc / "bundle").glob("*.part-*")) == [p.name for p in made]
    assert json.loads((arc / "step0" / "bundle.json").read_text())["step"] == 0
    assert json.loads((arc / "bundle" / "bundle.json").read_text())["machine"] == "m1"  # arc_keep's commits name it
    record = json.loads((out / "bundle.json").read_text())
    assert record["step"] == 1 and record["machine"] == "m1" and len(record["pieces"]) == len(made)
    assert record["pieces"][0]["sha256"] == collect.sha256(made[0])
    kept = out / "m1"
    assert (kept / "arc-metrics.jsonl").read_text() == '{"step": 1}\n' and (kept / "progress.log").is_file()
    assert (kept / "gpu-monitor.csv").is_file() and not (kept / "noise.bin").exists()
    [row] = [json.loads(line) for line in (kept / "episodes.jsonl").read_text().splitlines()]
    assert row["family"] == "ledger" and row["choice"]["base_model"] == "smollm2-135m"
    assert row["choice"]["learning_rate"] == 1e-6 and row["reward"]["job_quality"] == -0.04
    assert "never copied" not in (kept / "episodes.jsonl").read_text()
    assert not list(kept.rglob("trajectory.jsonl"))


def test_an_older_bundle_never_replaces_a_newer_one_and_broken_pieces_are_left_alone(tmp_path):
    arc, out = tmp_path / ".arc", tmp_path / "committed"
    for name, step in (("a", 3), ("b", 2)):
        got = tmp_path / name
        got.mkdir()
        pieces(got, "bundle", step)
        collect.main([str(got), "--machine", name, "--arc", str(arc), "--out", str(out)])
    assert json.loads((arc / "bundle" / "bundle.json").read_text())["step"] == 3
    cut = tmp_path / "cut"
    cut.mkdir()
    made = pieces(cut, "bundle", 9)
    for p in made[2:]:  # the call ended before the later pieces came back (the adapter's bytes among them)
        p.unlink()
    collect.main([str(cut), "--machine", "cut", "--arc", str(arc), "--out", str(out)])
    assert json.loads((arc / "bundle" / "bundle.json").read_text())["step"] == 3


def test_a_results_archive_cut_short_is_read_as_far_as_it_goes(tmp_path):
    got = tmp_path / "poll"
    got.mkdir()
    results(got, cut=12000)
    out = tmp_path / "committed"
    assert collect.main([str(got), "--machine", "m", "--arc", str(tmp_path / ".arc"), "--out", str(out)]) == 0
    assert (out / "m" / "progress.log").read_text() == "07:42 stage arc start\n"
    assert not (out / "bundle.json").exists()
