"""Warm starts for training processes: one zygote per executor slot (AIT_WARM_START=1).

A training process spends ~10 s of a ~50 s standard job importing torch and transformers
before it touches the model (measured on an H200: docs/gpu.md). A zygote (ait.sandbox.zygote)
pays those imports once per slot; each job's training process is then forked from it and
confined by the same sandbox layers as a cold start, in-process instead of before an exec.
The zygote runs trusted code only, with a scrubbed environment and no CUDA context (it
refuses to serve if a preload created one); a job's child sees nothing of earlier jobs but
their request lines (paths and scrubbed environments, no secrets).

Off by default: a cold start is the reference the trust-boundary tests were written against.
`ait worker --warm-start` (or AIT_WARM_START=1) turns it on; a zygote that fails falls back to
a cold start for that job (ait.sandbox.run_untrusted).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from pathlib import Path

from ait.sandbox import scrubbed_env
from ait.sandbox.zygote import Zygote

WARM_START_ENV = "AIT_WARM_START"
TRAIN_PRELOAD = [
    "ait.train.main", "ait.train.fast_grpo", "ait.train.rollouts", "ait.evals.rollout",
    "transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto",
    "transformers.models.llama.modeling_llama", "transformers.models.qwen2.modeling_qwen2",
    "transformers.optimization",
    # prepare_tokenizer's response schema: importing trl took 2.0-2.5 s of a warm job's 2.9 s load on an H200
    # (train/load/tokenizer_seconds, docs/measurements/inner-job-h200-s9.json); peft for LoRA jobs.
    "trl.chat_template_utils", "peft",
]
"""What every fast-trainer job imports before its first step (the TRL trainer imports more, cold)."""

_local = threading.local()


def warm_start_enabled() -> bool:
    return os.environ.get(WARM_START_ENV, "0") == "1"


def train_zygote() -> Zygote | None:
    """This thread's (one executor slot's) training zygote, or None when warm starts are off."""
    if not warm_start_enabled():
        return None
    zygote = getattr(_local, "zygote", None)
    if zygote is None:
        home = Path(tempfile.mkdtemp(prefix="ait-train-zygote-"))
        # Registered before the zygote's own close (atexit runs last-in first-out): stop it, then remove its home.
        atexit.register(shutil.rmtree, home, ignore_errors=True)
        zygote = _local.zygote = Zygote(TRAIN_PRELOAD, env=scrubbed_env(home, {}))
    return zygote
