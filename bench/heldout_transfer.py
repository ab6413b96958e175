"""Held-out transfer at an arc's end: the warm start (step_0) against the final adapter, paired.

    python bench/heldout_transfer.py --start RUN/checkpoints/step_0 --final RUN/checkpoints/step_N \\
        --episodes 16 --out runs/transfer [--config configs/outer/h200_qwen15.toml]

Both bundles play the config's held-out tasks (triage) on this machine, with the same episode seeds and
the same hidden set (ait.outer.transfer). Prints each mean reward with 2 SE, n, and the paired difference
final − start with 2 SE; writes OUT/transfer.json (the hidden set named by its fingerprint, never its
secret). On the GPU: `bench/gpu.sh transfer` with START and FINAL.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ait.configs import load_config
from ait.outer.checkpoint import BundleError
from ait.outer.config import OuterConfig
from ait.outer.loop import OuterRunError
from ait.outer.transfer import compare_bundles


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--start", required=True, type=Path, help="the warm start's bundle (RUN/checkpoints/step_0)")
    p.add_argument("--final", required=True, type=Path, help="the final bundle (RUN/checkpoints/step_N)")
    p.add_argument("--episodes", type=int, default=16, help="held-out episodes per adapter (n >= 16)")
    p.add_argument("--out", required=True, type=Path, help="a new directory for both runs and transfer.json")
    p.add_argument("--config", default=None, help="an outer config TOML (default: each bundle's own)")
    args = p.parse_args()
    config = load_config(args.config, OuterConfig) if args.config else None
    try:
        s = compare_bundles(args.start, args.final, args.out, config=config, episodes=args.episodes,
                            say=lambda m: print(m, file=sys.stderr, flush=True))
    except (BundleError, OuterRunError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    a, b = s["start"], s["final"]
    print(f"start (step {a['step']}): reward {a['reward']:+.3f} ± {a['reward_se2']:.3f} (n = {a['n']})")
    print(f"final (step {b['step']}): reward {b['reward']:+.3f} ± {b['reward_se2']:.3f} (n = {b['n']})")
    print(f"final − start, paired: {s['final_minus_start']:+.3f} ± {s['final_minus_start_se2']:.3f} "
          f"({s['n_pairs']} pairs; hidden set {s['hidden_secret_id']})")
    print(f"written: {args.out / 'transfer.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
