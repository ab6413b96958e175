"""The hidden eval: pre (base weights) and post (trained weights) scores on the secret set.

Runs in its own process and executes no agent code. The model's architecture and
tokenizer come from the base model (trusted); from the trained checkpoint only raw
tensors are read, with safetensors (never pickle), and their names and shapes must
match the base model exactly.

A dev-mode request (`hidden = false, dev = true`) scores the trained weights on the
spec's public dev examples only: the one result an agent may see between jobs.

    python -m ait.evals.hidden_eval REQUEST_JSON
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, Field

from ait.evals.hidden import eval_fingerprint, hidden_examples
from ait.evals.rollout import final_response, prepare_tokenizer, run_conversations
from ait.families import get_family
from ait.home import ait_home
from ait.spec import load_spec
from ait.train.models import resolve_base_model


class EvalRequest(BaseModel):
    task_path: str
    """TaskSpec JSON."""
    base_model: str
    """Base model name (resolved here, by trusted code)."""
    base_model_sha256: str | None = None
    """The weights the job trained from; when set, the name must still resolve to them (an alias
    or a local directory changed between training and eval would otherwise score other weights)."""
    checkpoint: str | None = None
    """Trained checkpoint directory; None scores only the base model."""
    n: int | None = None
    """Hidden examples to score; None = the spec's hidden_eval_size."""
    run_pre: bool = True
    """Also score the base weights."""
    batch_size: int = 256
    """Conversations generated together (one static-cache batch; CUDA-graph replayed on a GPU)."""
    hidden: bool = True
    """Score the hidden set (False: dev examples only, for a result the agent may see)."""
    dev: bool = False
    """Also score the trained weights on the spec's public dev examples."""
    out_path: str
    """Where to write the EvalReport JSON."""
    wait_for_checkpoint: bool = False
    """Load and score the base weights first, then wait for one line on stdin before reading the
    checkpoint: `go` (training finished and its output checked: score it) or anything else, or
    end of input (no checkpoint: exit without a report). run_job starts the eval this way beside
    the training process, so the eval's start-up is not on the job's critical path."""
    threads_after_go: int | None = Field(default=None, ge=1, le=4096)
    """CPU threads from `go` on: a waiting eval shares the job's cores with training until then
    (run_job gives each half), and has them all once training has finished."""


class EvalReport(BaseModel):
    pre: float | None = None
    """Mean hidden-eval score of the base weights."""
    post: float | None = None
    """Mean hidden-eval score of the trained weights."""
    n: int
    """Hidden examples scored (0 in dev-only mode)."""
    dev: float | None = None
    """Mean score of the trained weights on the public dev examples (dev mode)."""
    dev_n: int | None = None
    """Dev examples scored."""
    fingerprint: str
    """Which hidden set (see evals.hidden.eval_fingerprint)."""
    weights_changed: bool | None = None
    """Whether any trained tensor differs from the base."""
    seconds: dict[str, float] = Field(default_factory=dict)
    """Wall time: eval/load_s, eval/pre_s, eval/post_s."""
    samples: list[list[dict]] = Field(default_factory=list)
    """A few post-training conversations, for the record."""


class BaseModelMismatch(ValueError):
    """The base model's name resolves to other weights than the job trained from."""


class CheckpointError(ValueError):
    """A trained checkpoint that cannot be trusted or does not fit the base model."""


def load_checkpoint_tensors(checkpoint: Path) -> dict:
    from safetensors.torch import load_file

    files = sorted(checkpoint.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{checkpoint} holds no *.safetensors file (other formats are never loaded)")
    tensors = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def apply_checkpoint(model, tensors: dict) -> bool:
    """Load trained tensors into `model` (strict names and shapes); True if any changed."""
    import torch

    state = model.state_dict()
    tied = {k for k in state if k.endswith("lm_head.weight")} if model.config.tie_word_embeddings else set()
    unexpected = sorted(set(tensors) - set(state))
    missing = sorted(set(state) - set(tensors) - tied)
    if unexpected or missing:
        raise CheckpointError(f"checkpoint does not match the base model: unexpected {unexpected[:5]}, missing {missing[:5]}")
    changed = False
    with torch.no_grad():
        for name, tensor in tensors.items():
            if tensor.shape != state[name].shape:
                raise CheckpointError(f"{name}: shape {tuple(tensor.shape)} != base {tuple(state[name].shape)}")
            tensor = tensor.to(device=state[name].device, dtype=state[name].dtype)
            changed = changed or not torch.equal(tensor, state[name])
            state[name].copy_(tensor)
    return changed


PRE_CACHE_VERSION = "pre-v1"


def scoring_code_digest(root: Path | None = None) -> str:
    """sha256 over the source of everything that turns weights into a score (the eval, the families'
    generators and scorers, the sampler), so a fix to any of it never meets a score cached before.
    `root`: the ait package directory (this one by default)."""
    root = root or Path(__file__).resolve().parents[1]
    files = sorted([*(root / "evals").glob("*.py"), *(root / "families").rglob("*.py"), root / "train" / "decode.py"])
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def pre_cache_path(base, tokenizer, spec, n: int, device: str, dtype, batch_size: int) -> Path:
    """Where the base weights' score on this hidden set is remembered. Every job of an outer step
    trains the same few base models on the same tasks, and the untrained score is a pure function
    of everything in this key (greedy decoding): the scoring code, the weights' hash, the chat
    template, the hidden set, the eval format, the numerics (device, dtype, batch size, library
    versions). Only this trusted process writes it; sandboxed training cannot reach AIT_HOME."""
    import torch
    import transformers

    key = json.dumps({"v": PRE_CACHE_VERSION, "code": scoring_code_digest(), "weights": base.sha256,
                      "template": tokenizer.chat_template,
                      "set": eval_fingerprint(spec, n), "format": spec.eval_format.model_dump(mode="json"),
                      "device": device, "dtype": str(dtype), "batch": batch_size, "torch": torch.__version__,
                      "transformers": transformers.__version__}, sort_keys=True, default=str)
    return ait_home() / "pre_scores" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def cached_pre(path: Path) -> float | None:
    try:
        value = json.loads(path.read_text())["pre"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return float(value) if isinstance(value, (int, float)) and 0.0 <= value <= 1.0 else None


def remember_pre(path: Path, pre: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".pre-")
    with os.fdopen(fd, "w") as f:
        json.dump({"pre": pre}, f)
    os.replace(tmp, path)  # atomic: concurrent evals of the same base write the same value


def score(model, tokenizer, spec, examples, batch_size) -> tuple[float, list[list[dict]]]:
    family = get_family(spec.family)
    convs = run_conversations(model, tokenizer, family, spec.eval_format, examples, batch_size)
    scores = [family.score(final_response(c), ex.answer) for c, ex in zip(convs, examples)]
    return sum(scores) / max(len(scores), 1), convs


class NoCheckpoint(Exception):
    """A waiting eval was told there is no checkpoint to score (training failed)."""


EXIT_NO_CHECKPOINT = 3


def wait_for_go() -> None:
    line = sys.stdin.readline()
    if line.strip() != "go":
        raise NoCheckpoint


def evaluate(req: EvalRequest) -> EvalReport:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = load_spec(req.task_path)
    n = req.n or spec.hidden_eval_size
    examples = hidden_examples(spec, n) if req.hidden else []
    t0 = time.monotonic()
    base = resolve_base_model(req.base_model)
    if req.base_model_sha256 and base.sha256 != req.base_model_sha256:
        raise BaseModelMismatch(f"base model {req.base_model!r} now resolves to weights {base.sha256[:12]}, not the "
                              f"{req.base_model_sha256[:12]} the job trained from: restore them (models.toml alias or "
                              "directory) and evaluate again")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(base.path, dtype=dtype, use_safetensors=True,
                                                 trust_remote_code=False).to(device).eval()
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(base.path, trust_remote_code=False))
    report = EvalReport(n=len(examples), fingerprint=eval_fingerprint(spec, n))
    report.seconds["eval/load_s"] = time.monotonic() - t0
    if req.run_pre and examples:
        t = time.monotonic()
        cache = pre_cache_path(base, tokenizer, spec, n, device, dtype, req.batch_size)
        report.pre = cached_pre(cache)
        if report.pre is None:
            report.pre, _ = score(model, tokenizer, spec, examples, req.batch_size)
            remember_pre(cache, report.pre)
        else:
            report.seconds["eval/pre_cached"] = 1.0
        report.seconds["eval/pre_s"] = time.monotonic() - t
    if req.checkpoint and req.wait_for_checkpoint:
        t = time.monotonic()
        wait_for_go()
        report.seconds["eval/waited_s"] = time.monotonic() - t
        if req.threads_after_go:
            torch.set_num_threads(req.threads_after_go)
    if req.checkpoint:
        report.weights_changed = apply_checkpoint(model, load_checkpoint_tensors(Path(req.checkpoint)))
    if req.checkpoint and examples:
        t = time.monotonic()
        report.post, convs = score(model, tokenizer, spec, examples, req.batch_size)
        report.seconds["eval/post_s"] = time.monotonic() - t
        report.samples = convs[:3]
    if req.dev and spec.dev_examples:
        from ait.evals.dev_eval import dev_examples

        t = time.monotonic()
        dev = dev_examples(spec)
        report.dev, _ = score(model, tokenizer, spec, dev, req.batch_size)
        report.dev_n = len(dev)
        report.seconds["eval/dev_s"] = time.monotonic() - t
    return report


def main(argv: list[str]) -> int:
    req = EvalRequest.model_validate_json(Path(argv[0]).read_text())
    try:
        report = evaluate(req)
    except NoCheckpoint:
        return EXIT_NO_CHECKPOINT
    Path(req.out_path).write_text(report.model_dump_json(indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
