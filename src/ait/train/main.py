"""The training process's entry point (runs inside the sandbox, imports agent code).

    python -m ait.train.main TRAIN_REQUEST_JSON

Picks the inner trainer named in the request, trains, and writes `train_output.json`
next to the checkpoint. Out-of-memory exits with EXIT_OOM so the worker can tell it
from a crash (and retry a packed job alone).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ait.train.request import EXIT_OOM, TrainRequest


def main(argv: list[str]) -> int:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    request = TrainRequest.model_validate_json(Path(argv[0]).read_text())
    job = request.job
    t0 = time.monotonic()
    try:
        if request.trainer == "trl":
            from ait.train.grpo import train
        else:
            from ait.train.fast_grpo import train
        imported = time.monotonic()
        output = train(job, request.base_model_path)
    except Exception as e:
        import torch

        if isinstance(e, torch.OutOfMemoryError):
            print(f"ait: out of memory during training: {e}", file=sys.stderr)
            return EXIT_OOM
        raise
    # Where a job's seconds go before and after the train loop (torch and transformers imports are
    # seconds of a job's start; the worker's clock, JobResult.train_seconds, also counts the sandbox).
    output.metrics["train/import_seconds"] = imported - t0
    output.metrics["train/in_process_seconds"] = time.monotonic() - t0
    (Path(job.run_dir) / "job" / "train_output.json").write_text(output.model_dump_json(indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
