"""The training process's entry point (runs inside the sandbox, imports agent code).

    python -m ait.train.main TRAIN_REQUEST_JSON

Picks the inner trainer named in the request, trains, and writes `train_output.json`
next to the checkpoint. Out-of-memory exits with EXIT_OOM and a CUDA fault with EXIT_GPU_FAULT,
so the worker can tell them from a crash (and retry a packed job alone) by the exit status.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from ait.train.request import EXIT_GPU_FAULT, EXIT_NO_GPU, EXIT_OOM, GpuMissing, TrainRequest, require_given_gpu


def is_cuda_fault(error: BaseException) -> bool:
    """torch's AcceleratorError (an illegal address, a launch failure; under MPS possibly another
    client's), or the RuntimeError older torch raised for the same."""
    import torch

    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(error, accelerator_error):
        return True
    return isinstance(error, RuntimeError) and str(error).startswith("CUDA error")


def warm_cuda() -> None:
    """Create the CUDA context in a background thread while the trainer's imports run (both take
    seconds; the context is what the first `.to("cuda")` would otherwise wait for). A failure here
    is left for the trainer's own first CUDA call to raise, where it is classified."""
    import torch

    if not torch.cuda.is_available():
        return

    def init() -> None:
        try:
            torch.empty(1, device="cuda")
        except Exception:  # noqa: BLE001 - reported by the trainer's first CUDA call instead
            pass

    threading.Thread(target=init, name="ait-cuda-init", daemon=True).start()


def main(argv: list[str]) -> int:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    request = TrainRequest.model_validate_json(Path(argv[0]).read_text())
    job = request.job
    t0 = time.monotonic()
    try:
        require_given_gpu()
    except GpuMissing as e:
        print(f"ait: {e}", file=sys.stderr)
        return EXIT_NO_GPU
    warm_cuda()
    try:
        if request.trainer == "trl":
            from ait.train.grpo import train
        else:
            from ait.train.fast_grpo import train
        imported = time.monotonic()
        output = train(job, request.base_model_path)
    except Exception as e:
        import torch

        if (isinstance(e, (torch.OutOfMemoryError, MemoryError)) or getattr(e, "out_of_memory", False)
                or (is_cuda_fault(e) and "out of memory" in str(e))):
            print(f"ait: out of memory during training: {type(e).__name__}: {e}", file=sys.stderr)
            return EXIT_OOM
        if is_cuda_fault(e):
            print(f"ait: CUDA fault during training: {type(e).__name__}: {e}", file=sys.stderr)
            return EXIT_GPU_FAULT
        raise
    # Where a job's seconds go before and after the train loop (torch and transformers imports are
    # seconds of a job's start; the worker's clock, JobResult.train_seconds, also counts the sandbox).
    output.metrics["train/import_seconds"] = imported - t0
    output.metrics["train/in_process_seconds"] = time.monotonic() - t0
    (Path(job.run_dir) / "job" / "train_output.json").write_text(output.model_dump_json(indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
