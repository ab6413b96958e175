"""The hidden sets this machine's secret gives the shipped tasks, by fingerprint (never by seed).

    python bench/fingerprints.py [--n 200] > fingerprints.json

GPU sessions write this beside their results, so a committed figure names the hidden set it was
measured on, and a rerun on another secret is known to be on another set.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ait.evals.hidden import eval_fingerprint
from ait.spec import load_spec

TASKS = Path(__file__).resolve().parents[1] / "examples" / "tasks"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=None, help="hidden examples (default: each spec's hidden_eval_size)")
    args = p.parse_args()
    out = {}
    for path in sorted(TASKS.glob("*.json")):
        spec = load_spec(path)
        n = args.n or spec.hidden_eval_size
        out[path.stem] = {"family": spec.family, "n": n, "fingerprint": eval_fingerprint(spec, n)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
