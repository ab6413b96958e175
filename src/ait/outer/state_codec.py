"""How a checkpoint stores the LoRA adapter and AdamW's moments: exactly, or compactly enough that a
step's bundle fits a bound (64 MiB by default, `checkpoint_max_mib`), chosen per save.

    encoding   adapter   exp_avg (m)   exp_avg_sq (v)        bytes per trainable parameter
    float32    fp32      fp32          fp32                  12      exact: a resume continues bit for bit
    bfloat16   bf16      bf16          bf16                   6      each value rounded to bf16 (8 significant bits)
    compact    bf16      int8 / 256    4-bit log2 / 128      ~3.58   m: absmax-scaled int8 per block of 256;
                                                                     v: 0 kept exact, else 15 log2 levels per
                                                                     block of 128 between the block's min and max

`choose_encoding` takes the most exact encoding whose estimate fits. For the 0.5B agent of
configs/outer/h200_mini.toml (Qwen2.5-0.5B shape, LoRA r = 32 on every linear layer: 17,596,416
trainable parameters) that is `compact`: float32 would be 201 MiB and bfloat16 101 MiB
(bench/outer_bundle_size.py measures it). What compact loses: the adapter is rounded to bf16 (at
most half a bf16 step, 2^-8 of each value), m to 1/254 of its block's largest value, v by a factor
of at most 2^(block log2 range / 28). It is still far closer to the trained state than a fresh
optimizer, which is what a preempted run without one would restart from.

Tensors go to safetensors (no pickle); what a tensor needs to be decoded (shape, encoding) travels
beside it in the file's metadata.
"""

from __future__ import annotations

import math
from typing import Any

ENCODINGS = ("float32", "bfloat16", "compact")
Q8_BLOCK = 256
LOG4_BLOCK = 128
LOG4_LEVELS = 15  # codes 1..15; code 0 is an exact zero


def bytes_per_param(encoding: str) -> float:
    """Adapter + both AdamW moments, per trainable parameter (scales included, headers not)."""
    return {"float32": 12.0, "bfloat16": 6.0,
            "compact": 2.0 + 1.0 + 4.0 / Q8_BLOCK + 0.5 + 8.0 / LOG4_BLOCK}[encoding]


def estimate_bytes(params: int, encoding: str) -> int:
    return math.ceil(params * bytes_per_param(encoding))


def choose_encoding(params: int, budget_bytes: float | None) -> tuple[str, bool]:
    """The most exact encoding whose estimate fits `budget_bytes` (None: float32), and whether it fits."""
    if budget_bytes is None:
        return "float32", True
    for encoding in ENCODINGS:
        if estimate_bytes(params, encoding) <= budget_bytes:
            return encoding, True
    return ENCODINGS[-1], False


def adapter_dtype(encoding: str) -> Any:
    import torch

    return torch.float32 if encoding == "float32" else torch.bfloat16


# ---- AdamW moments ---------------------------------------------------------------------------


def encode_moment(name: str, x: Any, kind: str, encoding: str) -> dict[str, Any]:
    """Tensors (by safetensors key) that store moment `x` (kind "exp_avg" or "exp_avg_sq")."""
    import torch

    x = x.detach().to("cpu", torch.float32).contiguous()
    if encoding == "float32":
        return {name: x}
    if encoding == "bfloat16":
        return {name: x.to(torch.bfloat16)}
    if kind == "exp_avg":
        return _q8_encode(name, x)
    return _log4_encode(name, x)


def decode_moment(name: str, tensors: dict[str, Any], kind: str, encoding: str, shape: list[int]) -> Any:
    import torch

    if encoding in ("float32", "bfloat16"):
        return tensors[name].to(torch.float32).reshape(shape)
    if kind == "exp_avg":
        return _q8_decode(name, tensors, shape)
    return _log4_decode(name, tensors, shape)


def _blocks(x: Any, block: int) -> Any:
    import torch

    flat = x.reshape(-1)
    pad = (-flat.numel()) % block
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    return flat.reshape(-1, block)


def _q8_encode(name: str, x: Any) -> dict[str, Any]:
    import torch

    blocks = _blocks(x, Q8_BLOCK)
    scale = blocks.abs().amax(dim=1)
    q = torch.round(blocks / scale.clamp_min(1e-38)[:, None] * 127).clamp(-127, 127).to(torch.int8)
    return {f"{name}.q8": q.reshape(-1), f"{name}.scale": scale}


def _q8_decode(name: str, tensors: dict[str, Any], shape: list[int]) -> Any:
    import torch

    q, scale = tensors[f"{name}.q8"].reshape(-1, Q8_BLOCK), tensors[f"{name}.scale"]
    flat = (q.to(torch.float32) * (scale[:, None] / 127)).reshape(-1)
    return flat[:math.prod(shape)].reshape(shape)


def _log4_encode(name: str, x: Any) -> dict[str, Any]:
    import torch

    blocks = _blocks(x.clamp_min(0), LOG4_BLOCK)
    nonzero = blocks > 0
    logs = torch.log2(torch.where(nonzero, blocks, torch.ones_like(blocks)))
    lo = torch.where(nonzero, logs, torch.full_like(logs, math.inf)).amin(dim=1)
    hi = torch.where(nonzero, logs, torch.full_like(logs, -math.inf)).amax(dim=1)
    empty = ~nonzero.any(dim=1)
    lo, hi = torch.where(empty, 0.0, lo), torch.where(empty, 0.0, hi)
    span = (hi - lo).clamp_min(1e-12)[:, None]
    codes = 1 + torch.round((logs - lo[:, None]) / span * (LOG4_LEVELS - 1))
    codes = torch.where(nonzero, codes.clamp(1, LOG4_LEVELS), torch.zeros_like(codes)).to(torch.uint8).reshape(-1)
    packed = codes[0::2] | (codes[1::2] << 4)  # LOG4_BLOCK is even: every block packs whole
    return {f"{name}.log4": packed, f"{name}.lo": lo, f"{name}.hi": hi}


def _log4_decode(name: str, tensors: dict[str, Any], shape: list[int]) -> Any:
    import torch

    packed = tensors[f"{name}.log4"]
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=1).reshape(-1, LOG4_BLOCK).to(torch.float32)
    lo, hi = tensors[f"{name}.lo"][:, None], tensors[f"{name}.hi"][:, None]
    values = torch.exp2(lo + (codes - 1) / (LOG4_LEVELS - 1) * (hi - lo))
    flat = torch.where(codes > 0, values, torch.zeros_like(values)).reshape(-1)
    return flat[:math.prod(shape)].reshape(shape)


def encode_optimizer(state_dict: dict[str, Any], names: list[str], encoding: str) -> tuple[dict[str, Any], dict]:
    """AdamW's state_dict as safetensors tensors plus a JSON-able description (param groups, shapes,
    encoding). `names` are the trainable parameters' names in the optimizer's order (keys by name, so
    a file is never applied to parameters in another order)."""
    import torch

    tensors: dict[str, Any] = {}
    entries: dict[str, Any] = {}
    for index, state in state_dict["state"].items():
        name = names[int(index)]
        entry: dict[str, Any] = {}
        for key, value in state.items():
            if key in ("exp_avg", "exp_avg_sq"):
                tensors.update(encode_moment(f"{key}/{name}", value, key, encoding))
                entry[key] = list(value.shape)
            elif torch.is_tensor(value):
                entry[key] = {"scalar": float(value)} if value.numel() == 1 else None
                if entry[key] is None:
                    tensors[f"{key}/{name}"] = value.detach().to("cpu").contiguous()
                    entry[key] = list(value.shape)
            else:
                entry[key] = {"scalar": value}
        entries[name] = entry
    return tensors, {"encoding": encoding, "param_groups": state_dict["param_groups"], "state": entries}


def decode_optimizer(tensors: dict[str, Any], meta: dict, names: list[str], device: Any) -> dict[str, Any]:
    """encode_optimizer's output back to a state_dict for `optimizer.load_state_dict`."""
    import torch

    encoding = meta["encoding"]
    if set(meta["state"]) - set(names):
        unknown = sorted(set(meta["state"]) - set(names))[:3]
        raise ValueError(f"optimizer state for parameters the model does not have: {unknown}")
    state: dict[int, dict[str, Any]] = {}
    for index, name in enumerate(names):
        entry = meta["state"].get(name)
        if entry is None:
            continue
        out: dict[str, Any] = {}
        for key, spec in entry.items():
            if key in ("exp_avg", "exp_avg_sq"):
                out[key] = decode_moment(f"{key}/{name}", tensors, key, encoding, spec).to(device)
            elif isinstance(spec, dict):
                value = spec["scalar"]
                out[key] = torch.tensor(float(value), dtype=torch.float32) if key == "step" else value
            else:
                out[key] = tensors[f"{key}/{name}"].to(device)
        state[index] = out
    return {"state": state, "param_groups": meta["param_groups"]}
