"""GGUF files as base models: dequantised once, cached as a safetensors model directory.

transformers reads the GGUF (architecture, tokenizer, chat template, tensors) and
dequantises it; the result is saved as a plain model directory (config.json,
generation_config.json, tokenizer files with the chat template, model.safetensors) under
AIT_HOME/models/gguf-<sha256 of the file>-<converter version>. Every later resolution of
the same file is a directory lookup: no GGUF parsing, no `gguf` package needed.

Weights are saved in float32 when any matrix is quantised: dequantised values (a 4 to 8
bit code times an fp16 scale, plus an fp16 offset) are exact in float32 but bfloat16
would round them a second time, and float32 keeps CPU training in full precision (the
trainer loads CPU models in their saved dtype; GPU paths cast to bfloat16 at load
anyway). The cost is disk: 4 bytes a parameter (0.5 GB for a 135M model, 2 GB for
0.5B). A GGUF whose matrices are all BF16 (unquantised) is saved in bfloat16: lossless.

Concurrent resolvers take a lock file, convert into a temporary directory and rename it
into place, so a reader never sees a half-written model.
"""

from __future__ import annotations

import fcntl
import json
from contextlib import contextmanager, nullcontext
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ait.home import models_dir
from ait.train import gguf_dequant
from ait.train.model_errors import ModelResolutionError

CONVERTER = "v1"
"""Part of the cache key: bump it when the conversion changes, so old caches are not reused."""
META = "ait_gguf.json"
"""Written last into a converted directory: its presence marks a complete conversion."""
conversions = 0
"""Dequantisations this process ran (tests read it to prove cache hits)."""


def cache_dir(sha256: str) -> Path:
    return models_dir() / f"gguf-{sha256[:24]}-{CONVERTER}"


def dequantised_dir(gguf_path: Path, sha256: str) -> Path:
    """The safetensors directory for a GGUF file whose content hash is `sha256`, converting once."""
    dest = cache_dir(sha256)
    if (dest / META).is_file():
        return dest
    with open(models_dir() / f".{dest.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one converter per file; the others wait, then hit the cache
        if (dest / META).is_file():
            return dest
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=models_dir()))
        try:
            convert(gguf_path, tmp, sha256)
            os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the cache from other users of AIT_HOME
            if dest.exists():  # an incomplete directory (no META): never produced by the rename below
                shutil.rmtree(dest)
            os.rename(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def read_metadata(gguf_path: Path) -> dict:
    """Architecture, chat template and the type of every matrix, read with the `gguf` package."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ModelResolutionError(f"reading GGUF file {gguf_path} needs the 'gguf' package: "
                                   "pip install 'ait[gguf]'") from None
    try:
        reader = GGUFReader(str(gguf_path))
    except (OSError, ValueError, KeyError, IndexError) as e:  # not GGUF, truncated, corrupt
        raise ModelResolutionError(f"{gguf_path} is not a readable GGUF file ({type(e).__name__}: {e})") from None

    def text(key: str) -> str | None:
        field = reader.fields.get(key)
        return None if field is None or not field.data else bytes(field.parts[field.data[0]]).decode()

    return {"architecture": text("general.architecture"), "chat_template": text("tokenizer.chat_template"),
            "matrix_types": sorted({t.tensor_type.name for t in reader.tensors if len(t.shape) >= 2})}


@contextmanager
def parsed_once(workers: int = 0, dequant: str = "torch"):
    """Within it, every `gguf.GGUFReader(path)` of one file is the same reader, and with `workers` > 1 its
    tensors are dequantised ahead on that many threads (numpy releases the GIL in the arithmetic), at
    most 2 x workers tensors ahead of transformers' loop, so memory stays bounded.

    transformers builds a reader for the config, another for the tokenizer and a third for the weights,
    and each parses the whole vocabulary (151,646 strings for Qwen) again; then it dequantises tensor by
    tensor on one core. A reader is a read-only view of a memory map: sharing it changes nothing else.
    Qwen2.5-Coder-0.5B's GGUF on 2 cores (bench/gguf_convert.py, docs/measurements/gguf-convert-qwen05-cpu.json,
    medians of 2, the same weights each way): 59.7 s as transformers does it, 32.3 s parsed once, 33.8 s
    parsed once with 2 dequantising threads (no gain on 2 cores; the GPU machine's 16 are yet to be measured).

    `dequant`: "torch" decodes the formats ait.train.gguf_dequant knows with torch (on the GPU when there
    is one, else on every core: the same values bit for bit), the others with the gguf package's numpy;
    "numpy": the gguf package's decoder for every tensor. On 2 cores the decoding is no longer what the
    conversion waits for (docs/measurements/gguf-convert-qwen05-cpu-torch.json: 31.3 s numpy on one core,
    30.0 s numpy on both, 28.8 s torch; the rest is parsing the metadata, building the model, writing it)."""
    try:
        import gguf
    except ImportError:  # read_metadata says what to install, in one line
        yield
        return
    original, original_dequantize, readers = gguf.GGUFReader, gguf.dequantize, {}
    if dequant not in ("torch", "numpy"):
        raise ValueError(f"dequant must be 'torch' or 'numpy', not {dequant!r}")

    def decode(data, qtype):
        values = gguf_dequant.dequantize(data, qtype.name) if dequant == "torch" else None
        return values if values is not None else original_dequantize(data, qtype)

    pool = ThreadPoolExecutor(workers, thread_name_prefix="gguf") if workers > 1 else None
    waiting: deque = deque()  # tensors not yet submitted, in the order transformers reads them
    ahead: dict[int, Future] = {}
    lock = threading.Lock()

    def top_up() -> None:
        with lock:
            while waiting and len(ahead) < 2 * workers:
                t = waiting.popleft()
                ahead[id(t.data)] = pool.submit(decode, t.data, t.tensor_type)

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)
            if pool is not None:
                waiting.extend(readers[key].tensors)
                top_up()
        return readers[key]

    def dequantize(data, qtype):
        with lock:
            future = ahead.pop(id(data), None)
        if pool is not None:
            top_up()
        return future.result() if future is not None else decode(data, qtype)

    # transformers imports both from the module at each call
    gguf.GGUFReader, gguf.dequantize = reader, dequantize
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.dequantize = original, original_dequantize
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def convert(gguf_path: Path, dest: Path, sha256: str, *, parse_once: bool = True, workers: int | None = None,
            dequant: str = "torch") -> None:
    """Dequantise `gguf_path` into `dest` (config, tokenizer with chat template, model.safetensors).
    `workers`: dequantising threads (default: the CPUs this process may use; 1 = transformers' own loop);
    `dequant`: "torch" (the GPU when there is one) or "numpy" (the gguf package's), see parsed_once."""
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with parsed_once(workers, dequant) if parse_once else nullcontext():
        _convert(gguf_path, dest, sha256)


def _convert(gguf_path: Path, dest: Path, sha256: str) -> None:
    global conversions
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.monotonic()
    meta = read_metadata(gguf_path)
    if not meta["chat_template"]:
        raise ModelResolutionError(f"{gguf_path} carries no chat template (tokenizer.chat_template) in its "
                                   "metadata; jobs and the hidden eval need one to render tool-calling turns")
    dtype = torch.bfloat16 if meta["matrix_types"] == ["BF16"] else torch.float32
    print(f"ait: dequantising {gguf_path.name} once ({', '.join(meta['matrix_types'])} -> {dtype}); "
          f"cached in {cache_dir(sha256)}", file=sys.stderr)
    where, name = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    except Exception as e:  # e.g. an architecture transformers cannot load: the job fails, never the worker
        raise ModelResolutionError(f"transformers cannot load {gguf_path} "
                                   f"(architecture {meta['architecture']!r}): {e}") from None
    model.config.__dict__.pop("quantization_config", None)  # plain weights now: nothing left to dequantise
    model.hf_quantizer = None
    model.to(dtype)
    model.config.dtype = dtype
    tokenizer.chat_template = meta["chat_template"]
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)

    reloaded = AutoTokenizer.from_pretrained(dest)
    if reloaded.chat_template != meta["chat_template"]:
        raise ModelResolutionError(f"the chat template of {gguf_path} did not survive saving the tokenizer")
    if not list(dest.glob("*.safetensors")):
        raise ModelResolutionError(f"converting {gguf_path} wrote no *.safetensors file")
    conversions += 1
    record = {"gguf": str(gguf_path), "sha256": sha256, "converter": CONVERTER,
              "dtype": str(dtype).removeprefix("torch."), "architecture": meta["architecture"], "matrix_types": meta["matrix_types"],
              "seconds": round(time.monotonic() - start, 2), "transformers": _version("transformers")}
    (dest / META).write_text(json.dumps(record, indent=2) + "\n")


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)
