"""bench/gpu.sh's arc stage and bench/gpu_poll.sh, run on this machine with a fake GPU and a fake `ait train`.

They only ever run on a leased GPU machine, where a bug costs the lease: on 2026-12-07 a bare `wait` kept
the arc from starting for 3 minutes, and a poll that tarred a 16 GiB disk image ran out of time before it
copied the warm start's bundle, which was lost with the machine. Here the stage's control flow runs for
real (model waits, the 80 GB card's config, packing each new bundle, a crash resumed from the newest
bundle), and the poll brings the pieces back first and never the disk images.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("split") is None,
                                reason="needs bash and coreutils")

FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *"-l "*) exec sleep 600 ;;
  *memory.total*) echo 81559 ;;
  *) echo "Fake H100, 1.0, 81559 MiB" ;;
esac
"""

# `ait train` as the arc stage calls it: a new run writes step_0 (the warm start) and step_1, then dies
# (a lost process); a resumed run records where it resumed from and writes step 2.
FAKE_AIT = """#!/bin/sh
log="$FAKE_LOG"; echo "$*" >> "$log"
dir=""; from=""
while [ $# -gt 0 ]; do
  case "$1" in --run-dir) dir=$2; shift ;; --resume-from) from=$2; shift ;; esac; shift
done
bundle() { mkdir -p "$dir/checkpoints/step_$1"; head -c 40000 /dev/urandom > "$dir/checkpoints/step_$1/adapter.bin"
  sum=$(sha256sum "$dir/checkpoints/step_$1/adapter.bin" | cut -d' ' -f1)
  printf '{"step": %s, "files": {"adapter.bin": {"bytes": 40000, "sha256": "%s"}}}' "$1" "$sum" \
    > "$dir/checkpoints/step_$1/bundle.json"; }
if [ -z "$from" ]; then
  mkdir -p "$dir/episodes/g00000-0-ledger-x"; truncate -s 1G "$dir/episodes/g00000-0-ledger-x/.job.ait-disk.img"
  bundle 0; sleep 1; bundle 1; echo '{"step": 1, "seconds": 300, "reward_mean": 0.2, "valid_rate": 0.5}' > "$dir/metrics.jsonl"; sleep 1; exit 3
fi
bundle 2; echo '{"step": 2, "seconds": 250, "reward_mean": 0.3, "valid_rate": 0.6, "families": {"ledger": {"job_quality_mean": 0.1, "job_quality_std": 0.2, "distinct_configs": 3, "valid_rate": 0.75, "variants": {"model_qwen15": 5, "reference": 2, "lr_3e-6": 1}}}}' > "$dir/metrics.jsonl"; sleep 1; exit 0
"""


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_the_arc_stage_resumes_from_its_newest_bundle_and_the_poll_brings_the_pieces_first(tmp_path):
    bin_dir, stage, results, out = (tmp_path / n for n in ("bin", "stage", "results", "out"))
    for d in (bin_dir, stage, out):
        d.mkdir()
    executable(bin_dir / "nvidia-smi", FAKE_NVIDIA_SMI)
    fake_ait = executable(tmp_path / "fake-ait", FAKE_AIT)
    for name in ("smol", "qwen", "qwen15"):  # staged and converted already: `need` goes straight on
        for suffix in (".gguf.done", ".ready"):
            (stage / f"{name}{suffix}").touch()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RESULTS": str(results), "STAGE": str(stage),
           "CODE": str(tmp_path / "code"), "AIT_HOME": str(tmp_path / "home"), "AIT_CMD": str(fake_ait),
           "FAKE_LOG": str(tmp_path / "ait.log"), "PACK_EVERY_S": "0.2"}
    start = time.monotonic()
    run = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), "arc"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert time.monotonic() - start < 60, "the stage waited on something that never ends"
    progress = (results / "progress.log").read_text()
    assert "jobs_per_gpu = 4, agent_gpu_gib = 46" in progress  # the 80 GB card's settings
    config = (results / "outer-config.toml").read_text()
    assert "\njobs_per_gpu = 4" in config and "\nagent_gpu_gib = 46" in config
    calls = (tmp_path / "ait.log").read_text().splitlines()
    assert len(calls) == 2 and calls[0].startswith("train --config")
    assert f"--resume-from {results}/arc/checkpoints/step_1" in calls[1]  # the crash resumed from the newest
    assert "arc run 1 exited rc=3" in progress and "arc run 2 exited rc=0" in progress
    assert (results / "ALL_DONE").exists()

    # The poll: pieces of the newest bundle (step 2) and of the warm start, a results archive without the
    # disk image, all within a call's time.
    poll = subprocess.run(["bash", str(ROOT / "bench" / "gpu_poll.sh"), "0"], cwd=ROOT, timeout=60,
                          env={**env, "OUT": str(out)}, capture_output=True, text=True)
    assert poll.returncode == 0, poll.stderr[-2000:]
    assert "step 2 250s reward +0.300 valid 0.60" in poll.stdout
    assert "ledger:q+0.100/sd0.200/c3/v0.75/model_qwen15x5/referencex2" in poll.stdout.split()  # its two most used
    pieces = sorted(out.glob("bundle.tar.part-*"))
    with tarfile.open(fileobj=__import__("io").BytesIO(b"".join(p.read_bytes() for p in pieces))) as tar:
        assert json.load(tar.extractfile("./bundle.json"))["step"] == 2
    assert sorted(out.glob("step0.tar.part-*"))
    with tarfile.open(out / "results.tgz") as tar:
        names = tar.getnames()
    assert "./progress.log" in names and not [n for n in names if n.endswith(".img")]
    # The warm start's pieces come back once, the newest bundle's once per bundle: a later poll brings
    # neither again (4 pieces and the results passed a call's 64 MiB), unless the bundle changed or RESEND=1.
    def poll_again(**extra) -> list[str]:
        shutil.rmtree(out)
        out.mkdir()
        subprocess.run(["bash", str(ROOT / "bench" / "gpu_poll.sh"), "0"], cwd=ROOT, timeout=60,
                       env={**env, "OUT": str(out), **extra}, capture_output=True, text=True, check=True)
        assert (out / "results.tgz").exists() and not list(out.glob("step0.tar.part-*"))
        return sorted(p.name for p in out.glob("bundle.tar.part-*"))

    assert poll_again() == []
    assert poll_again(RESEND="1") == [p.name for p in pieces]
    newer = results / pieces[0].name
    os.utime(newer, (newer.stat().st_atime, newer.stat().st_mtime + 5))  # the next step's bundle packed
    assert poll_again() == [p.name for p in pieces]
    assert poll_again() == []


def test_an_arc_that_continues_waits_for_its_carried_bundle_to_be_joined(tmp_path):
    """ARC_RESUME=1: the stage starts no new arc while the bundle's pieces are still coming in; once the
    last staging call has joined them and marked it, it resumes from them."""
    bin_dir, stage, results = (tmp_path / n for n in ("bin", "stage", "results"))
    for d in (bin_dir, stage):
        d.mkdir()
    executable(bin_dir / "nvidia-smi", FAKE_NVIDIA_SMI)
    fake_ait = executable(tmp_path / "fake-ait", FAKE_AIT)
    for name in ("smol", "qwen", "qwen15"):
        for suffix in (".gguf.done", ".ready"):
            (stage / f"{name}{suffix}").touch()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RESULTS": str(results), "STAGE": str(stage),
           "CODE": str(tmp_path / "code"), "AIT_HOME": str(tmp_path / "home"), "AIT_CMD": str(fake_ait),
           "FAKE_LOG": str(tmp_path / "ait.log"), "PACK_EVERY_S": "0.2", "ARC_RESUME": "1"}
    run = subprocess.Popen(["bash", str(ROOT / "bench" / "gpu.sh"), "arc"], cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while "waiting for the carried bundle" not in ((results / "progress.log").read_text()
                                                        if (results / "progress.log").exists() else ""):
            assert time.monotonic() < deadline and run.poll() is None
            time.sleep(0.2)
        (stage / "bundle").mkdir()  # half joined: no mark yet
        time.sleep(3)
        assert not (tmp_path / "ait.log").exists() and run.poll() is None
        (stage / "bundle.joined").touch()
        assert run.wait(timeout=60) == 0
    finally:
        run.kill()
    calls = (tmp_path / "ait.log").read_text().splitlines()
    assert len(calls) == 1 and f"--resume-from {stage}/bundle" in calls[0]
