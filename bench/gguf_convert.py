"""How long a GGUF base model takes to become a safetensors model directory (ait.train.gguf.convert), three
ways: as transformers does it (the file parsed for the config, the tokenizer and the weights, tensors
dequantised on one core), parsed once, parsed once with the tensors dequantised ahead on every CPU by
the gguf package's numpy, and (the default) by torch (ait.train.gguf_dequant; on the GPU when there is one).

    python bench/gguf_convert.py PATH.gguf [--repeats 2] [--json out.json]

The variants convert the same file into fresh temporary directories, in turn, in one run (the
machine's noise hits all); prints each run's seconds, the medians and their ratios to the first, and
checks that all wrote byte-identical model.safetensors.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ait.train import gguf_dequant
from ait.train.gguf import convert
from ait.train.models import file_sha256


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("gguf", type=Path)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    variants = {"parsed_each_time": {"parse_once": False}, "parsed_once": {"workers": 1, "dequant": "numpy"},
                "parsed_once_parallel": {"dequant": "numpy"},  # numpy on every CPU this process may use
                "parsed_once_torch": {}}  # the default: torch, on the GPU when there is one
    times: dict[str, list[float]] = {k: [] for k in variants}
    digests: dict[str, set[str]] = {k: set() for k in times}
    for _ in range(args.repeats):
        for name in times:
            with tempfile.TemporaryDirectory(prefix="ait-convert-") as tmp:
                t0 = time.monotonic()
                convert(args.gguf, Path(tmp), "bench", **variants[name])
                times[name].append(time.monotonic() - t0)
                digests[name] |= {file_sha256(f) for f in sorted(Path(tmp).glob("*.safetensors"))}
            print(f"{name:20s} {times[name][-1]:6.1f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    same = len({frozenset(d) for d in digests.values()}) == 1
    base = med["parsed_each_time"]
    print("median: " + ", ".join(f"{k} {v:.1f} s ({base / v:.2f}x)" for k, v in med.items())
          + f"; identical weights: {same}")
    if args.json:
        args.json.write_text(json.dumps({"gguf": args.gguf.name, "bytes": args.gguf.stat().st_size, "seconds": times,
                                         "median": med, "speedup": {k: base / v for k, v in med.items()},
                                         "identical_weights": same, "cpus": os.cpu_count(),
                                         "dequant_device": gguf_dequant.default_device(),
                                         "loadavg_1min": os.getloadavg()[0]}, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
