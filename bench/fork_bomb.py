"""How long a fork bomb in env.py holds the worker: with the sandbox's watchdog, and with its task
rule off (what the pids cgroup / RLIMIT_NPROC alone give), one run each, same host, same job.

    python bench/fork_bomb.py [--out docs/measurements/fork-bomb-cpu.json]

The bomb (`while True: os.fork()` at env.py's import in the training process) is a calc_chain
reference job with that line added, run through `ait.compute.run_job.run_job` as a worker would.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_hostile_jobs import attacks, make_job  # noqa: E402

import ait.sandbox.watch as watch  # noqa: E402
from ait.compute.run_job import run_job  # noqa: E402


def one(root: Path, name: str) -> dict:
    job = make_job(root, name, attacks(1, root)["fork_bomb"][0])
    start = time.monotonic()
    result = run_job(job)
    return {"wall_s": round(time.monotonic() - start, 1), "train_s": round(result.train_seconds or 0, 1),
            "fail_reason": result.fail_reason.value if result.fail_reason else None,
            "error_first_line": (result.error or "").splitlines()[0][:300]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="Also write the JSON here.")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ait-fork-bomb-"))
    report = {"host": platform.node(), "kernel": platform.release(), "watchdog": one(root, "with")}
    watch.STUCK_AT_LIMIT_S = float("inf")  # the task rule never fires; the memory and disk rules stay
    report["task_rule_off"] = one(root, "without")
    report["ratio"] = round(report["task_rule_off"]["wall_s"] / report["watchdog"]["wall_s"], 2)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
