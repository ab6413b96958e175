"""The README's first command, timed: `ait episode --task examples/tasks/calc_chain.json` on this machine.

    python bench/quickstart.py [--runs 3] [--json FILE]

The first run starts from an empty AIT_HOME (so it builds the tiny model), the others reuse it,
as a user's second episode would. For each run: the wall time of the whole command and, from
the episode's own record, the probe, the job's training process, the hidden eval's parts.
Prints each run and the warm runs' mean and spread.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(home: Path, runs: Path) -> dict:
    env = {**os.environ, "AIT_HOME": str(home)}
    env.pop("AIT_HIDDEN_SEED", None)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "ait.cli", "episode", "--task", str(ROOT / "examples" / "tasks" /
                          "calc_chain.json"), "--runs-dir", str(runs), "--json"], env=env, capture_output=True,
                         text=True, check=True, cwd=ROOT)
    wall = time.monotonic() - t0
    episode = json.loads(out.stdout)
    job = episode["job"] or {}
    metrics = job.get("metrics", {})
    probe = sum(s["report"]["seconds"] for s in episode["submissions"])
    return {"wall_s": wall, "episode_s": episode["wall_seconds"], "probe_s": probe,
            "train_process_s": job.get("train_seconds"), "job_total_s": job.get("total_seconds"),
            "eval_load_s": metrics.get("eval/load_s"), "eval_pre_s": metrics.get("eval/pre_s"),
            "eval_post_s": metrics.get("eval/post_s"), "reward": episode["reward"]["total"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    home, runs = Path(tempfile.mkdtemp(prefix="ait-qs-home-")), Path(tempfile.mkdtemp(prefix="ait-qs-runs-"))
    rows = []
    for i in range(args.runs):
        row = one_run(home, runs)
        row["fresh_ait_home"] = i == 0
        rows.append(row)
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}))
    warm = [r["wall_s"] for r in rows[1:]]
    summary = {"warm_wall_mean_s": statistics.mean(warm) if warm else None,
               "warm_wall_stdev_s": statistics.stdev(warm) if len(warm) > 1 else None,
               "fresh_wall_s": rows[0]["wall_s"], "n_warm": len(warm)}
    print(json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps({"host": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                                        "machine": platform.machine()},
                                               "command": "ait episode --task examples/tasks/calc_chain.json",
                                               "runs": rows, **summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
