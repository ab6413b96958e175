"""Probe latency over every family's reference job, with and without the sandbox's isolating layers.

    python bench/probe_latency.py [--repeats 3]

Prints per-family medians, the overall median (target: <= 1.5 s), the sandbox's own
overhead as the ratio of two variants measured in the same run (the machine is noisy),
and the cold-start latency without the warm zygote for comparison.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from ait.families import FAMILIES
from ait.probe.runner import probe_workspace, probe_zygote
from ait.sandbox import detect
from ait.sandbox.types import Capabilities
from ait.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]


def unconfined() -> Capabilities:
    caps = detect.cached_capabilities()
    return Capabilities(kernel=caps.kernel, layers=[layer.model_copy(update={"active": layer.active and not layer.isolating})
                                                    for layer in caps.layers])


def measure(workspaces: dict[str, tuple[Path, object]], repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in workspaces}
    for _ in range(repeats):
        for name, (ws, spec) in workspaces.items():
            start = time.perf_counter()
            report = probe_workspace(ws, spec)
            times[name].append(time.perf_counter() - start)
            assert report.valid, (name, report.summary())
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ait-bench-probe-"))
    workspaces = {}
    for name in FAMILIES:
        ws = tmp / name
        shutil.copytree(ROOT / "src" / "ait" / "policy" / "reference_jobs" / name, ws)
        workspaces[name] = (ws, load_spec(ROOT / "examples" / "tasks" / f"{name}.json"))
    measure(workspaces, 1)  # warm the page cache and the detection cache
    sandboxed = measure(workspaces, args.repeats)
    real, bare_caps = detect.cached_capabilities, unconfined()
    detect.cached_capabilities = lambda refresh=False: bare_caps
    os.environ["AIT_UNSAFE_NO_SANDBOX"] = "1"
    try:
        bare = measure(workspaces, args.repeats)
    finally:
        detect.cached_capabilities = real
        os.environ.pop("AIT_UNSAFE_NO_SANDBOX")
    os.environ["AIT_PROBE_ZYGOTE"] = "0"  # cold start: a fresh interpreter per probe
    probe_zygote.cache_clear()
    cold = measure(workspaces, 1)
    print(f"{'family':<18}{'sandboxed s':>12}{'bare s':>10}{'cold s':>10}")
    for name in workspaces:
        print(f"{name:<18}{statistics.median(sandboxed[name]):>12.3f}{statistics.median(bare[name]):>10.3f}"
              f"{statistics.median(cold[name]):>10.3f}")
    all_s = [t for ts in sandboxed.values() for t in ts]
    all_b = [t for ts in bare.values() for t in ts]
    med_s, med_b = statistics.median(all_s), statistics.median(all_b)
    print(f"\nprobe median (sandboxed): {med_s:.3f} s   target <= 1.5 s: {'met' if med_s <= 1.5 else 'NOT met'}")
    print(f"probe median (no isolating layers): {med_b:.3f} s")
    print(f"sandbox overhead: {med_s - med_b:+.3f} s per probe (ratio {med_s / med_b:.2f}x)")
    med_c = statistics.median([t for ts in cold.values() for t in ts])
    print(f"cold start without the zygote (sandboxed): {med_c:.3f} s ({med_c / med_s:.1f}x the warm probe)")
    if args.json:
        import json
        import platform

        Path(args.json).write_text(json.dumps({
            "host": {"cpus": os.cpu_count(), "kernel": platform.release(),
                     "layers": [l.name for l in detect.cached_capabilities().layers if l.active]},
            "repeats": args.repeats, "median_sandboxed_s": med_s, "median_bare_s": med_b,
            "sandbox_overhead_s": med_s - med_b, "ratio": med_s / med_b, "median_cold_s": med_c,
            "per_family": {n: {"sandboxed": sandboxed[n], "bare": bare[n], "cold": cold[n]} for n in workspaces},
        }, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
