"""One real job on a GPU through the sandbox: the calc_chain reference job on the tiny model.

    python bench/gpu_smoke_job.py [--base-model tiny] [--eval-size 64]

Prints the JobResult: training ran inside every sandbox layer with the GPU bound in,
and the hidden eval ran on the GPU.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from ait.compute.run_job import run_job
from ait.job.config import parse_job_config
from ait.job.types import Job
from ait.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-model", default="tiny")
    parser.add_argument("--eval-size", type=int, default=64)
    args = parser.parse_args()
    task = ROOT / "examples" / "tasks" / "calc_chain.json"
    spec = load_spec(task)
    tmp = Path(tempfile.mkdtemp(prefix="ait-gpu-smoke-"))
    ws = tmp / "ws"
    shutil.copytree(ROOT / "src" / "ait" / "policy" / "reference_jobs" / "calc_chain", ws)
    text = (ws / "job.toml").read_text().replace('base_model = "tiny"', f'base_model = "{args.base_model}"')
    config = parse_job_config(text, spec.constraints if args.base_model == "tiny" else None)
    job = Job(job_id="gpu-smoke", run_dir=str(tmp / "run"), workspace=str(ws), task_path=str(task), config=config,
              time_budget_s=600, eval_size=args.eval_size)
    result = run_job(job)
    print(result.model_dump_json(indent=2))
    log = tmp / "run" / "job" / "train.log"
    if log.exists():
        print("--- train.log (tail) ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))


if __name__ == "__main__":
    main()
