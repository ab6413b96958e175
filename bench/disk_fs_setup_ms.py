"""What a run's own capped file system (ait.sandbox.diskfs) costs per run, in milliseconds.

    python bench/disk_fs_setup_ms.py [--repeats 15] [--disk-gib 16] [--files 100000] [--json OUT.json]

Three parts, each measured here on this host:
  image     the parent's share for training: a sparse file of --disk-gib truncated and made ext4
            by mkfs.ext4 (no journal) with --files inodes;
  cold run  a sandboxed `python -c pass` started cold (start_untrusted), with the run's directory
            as it is (the watchdog bound), on a tmpfs, and on the ext4 image: the setup cost per run
            (making the image, the loop device, mount, seeding, the watch, copy-out, unmount) is the
            difference of the medians, measured interleaved in one process (the machine is noisy);
  zygote    the same three through a warm zygote, as probes run (a light preload).
Prints one line per part and variant, then the per-run setup cost of each kind.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from ait.sandbox import Limits, SandboxPolicy, run_untrusted
from ait.sandbox import diskfs
from ait.sandbox.detect import cached_capabilities
from ait.sandbox.zygote import Zygote

VARIANTS = (None, "tmpfs", "image")


def ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:7.1f} ms  min {min(values) * 1000:7.1f} ms  (n={len(values)})"


def one_run(base: Path, kind: str | None, limits: Limits, zygote: Zygote | None) -> float:
    work = Path(tempfile.mkdtemp(dir=base))
    run = work / "run"
    run.mkdir()
    (run / "request.json").write_text("{}")
    policy = SandboxPolicy(write=[str(run)], limits=limits, disk_fs=kind, keep=["out"])
    args = ["-m", "ait.sandbox.types"] if zygote is not None else ["-c", "pass"]
    start = time.perf_counter()
    outcome = run_untrusted(args, cwd=run, timeout_s=120, log_path=work / "log", policy=policy, zygote=zygote)
    seconds = time.perf_counter() - start
    if outcome.returncode != 0 or outcome.disk_fs != kind:
        raise SystemExit(f"{kind}: the run failed or had another file system ({outcome})\n{outcome.log_tail}")
    shutil.rmtree(work)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--disk-gib", type=float, default=16.0)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--json", help="also write the measurements here")
    args = parser.parse_args()
    caps = cached_capabilities()
    kinds = [k for k in VARIANTS if k is None or k in caps.disk_fs]
    layer = next(layer for layer in caps.layers if layer.name == "disk")
    print(f"kernel {caps.kernel}; disk layer: {layer.detail}")
    size = int(args.disk_gib * 2**30)
    limits = Limits(disk_bytes=size, disk_files=args.files)
    base = Path(tempfile.mkdtemp(prefix="ait-bench-diskfs-"))
    out: dict = {"kernel": caps.kernel, "disk_layer": layer.detail, "repeats": args.repeats,
                 "disk_bytes": size, "disk_files": args.files, "cores": os.cpu_count(),
                 "load_average_before": os.getloadavg()}
    try:
        if "image" in kinds:
            made = []
            for i in range(args.repeats):
                image = str(base / f".img{i}")
                start = time.perf_counter()
                diskfs.make_image(image, size, args.files, os.getuid(), os.getgid())
                made.append(time.perf_counter() - start)
                allocated = os.stat(image).st_blocks * 512
                os.unlink(image)
            print(f"image   {args.disk_gib:g} GiB, {args.files} inodes: {ms(made)}; "
                  f"{allocated / 2**20:.1f} MiB allocated on the host")
            out["make_image_ms"] = {"median": statistics.median(made) * 1000, "min": min(made) * 1000}
            out["image_allocated_bytes"] = allocated
        results: dict[str, dict[str | None, list[float]]] = {}
        zygote = Zygote(["ait.sandbox.types"], env={"PATH": os.environ.get("PATH", ""), "HOME": str(base)})
        try:
            for mode, z in (("cold", None), ("zygote", zygote)):
                times: dict[str | None, list[float]] = {k: [] for k in kinds}
                for kind in kinds:  # warm-up: the first run pays imports and the cache
                    one_run(base, kind, limits, z)
                for _ in range(args.repeats):
                    for kind in kinds:
                        times[kind].append(one_run(base, kind, limits, z))
                results[mode] = times
                for kind in kinds:
                    print(f"{mode:6}  {str(kind or 'host dir'):8} {ms(times[kind])}")
        finally:
            zygote.close()
        for mode, times in results.items():
            plain = statistics.median(times[None])
            out[mode] = {str(kind or "host_dir"): {"median_ms": statistics.median(t) * 1000, "min_ms": min(t) * 1000}
                         for kind, t in times.items()}
            for kind in kinds[1:]:
                cost = (statistics.median(times[kind]) - plain) * 1000
                out[mode][str(kind)]["setup_ms"] = cost
                print(f"setup cost per run, {mode}, {kind}: {cost:+.1f} ms"
                      + (" (making the image, above, included)" if kind == "image" else ""))
        out["load_average_after"] = os.getloadavg()
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
