"""How long a GGUF base model takes to become a safetensors model directory (ait.train.gguf.convert), with
the file parsed once against parsed as transformers does it (config, tokenizer and weights each parse it).

    python bench/gguf_convert.py PATH.gguf [--repeats 2] [--json out.json]

Both variants convert the same file into fresh temporary directories, alternating, in one run (the
machine's noise hits both); prints each run's seconds, the medians and their ratio, and checks that
both wrote byte-identical model.safetensors.
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

from ait.train.gguf import convert
from ait.train.models import file_sha256


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("gguf", type=Path)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    times: dict[str, list[float]] = {"parsed_once": [], "parsed_each_time": []}
    digests: dict[str, set[str]] = {k: set() for k in times}
    for _ in range(args.repeats):
        for name in times:
            with tempfile.TemporaryDirectory(prefix="ait-convert-") as tmp:
                t0 = time.monotonic()
                convert(args.gguf, Path(tmp), "bench", parse_once=name == "parsed_once")
                times[name].append(time.monotonic() - t0)
                digests[name] |= {file_sha256(f) for f in sorted(Path(tmp).glob("*.safetensors"))}
            print(f"{name:17s} {times[name][-1]:6.1f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    same = digests["parsed_once"] == digests["parsed_each_time"]
    print(f"median: parsed once {med['parsed_once']:.1f} s, each time {med['parsed_each_time']:.1f} s, "
          f"ratio {med['parsed_each_time'] / med['parsed_once']:.2f}x; identical weights: {same}")
    if args.json:
        args.json.write_text(json.dumps({"gguf": args.gguf.name, "bytes": args.gguf.stat().st_size, "seconds": times,
                                         "median": med, "ratio": med["parsed_each_time"] / med["parsed_once"],
                                         "identical_weights": same, "cpus": os.cpu_count(),
                                         "loadavg_1min": os.getloadavg()[0]}, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
