"""The training process's entry point (runs inside the sandbox, imports agent code).

    python -m ait.train.main TRAIN_REQUEST_JSON

Picks the inner trainer named in the request, trains, and writes `train_output.json`
next to the checkpoint. Out-of-memory exits with EXIT_OOM so the worker can tell it
from a crash (and retry a packed job alone).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ait.train.request import EXIT_OOM, TrainRequest


def main(argv: list[str]) -> int:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    request = TrainRequest.model_validate_json(Path(argv[0]).read_text())
    job = request.job
    try:
        if request.trainer == "trl":
            from ait.train.grpo import train
        else:
            from ait.train.fast_grpo import train
        output = train(job, request.base_model_path)
    except Exception as e:
        import torch

        if isinstance(e, torch.OutOfMemoryError):
            print(f"ait: out of memory during training: {e}", file=sys.stderr)
            return EXIT_OOM
        raise
    (Path(job.run_dir) / "job" / "train_output.json").write_text(output.model_dump_json(indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
