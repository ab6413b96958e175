"""GGUF's block formats dequantised with torch: on the GPU when there is one, else on every CPU core.

The `gguf` package dequantises with numpy on one core; converting Qwen2.5-Coder-1.5B that way took
108 s of a fresh GPU machine (lease 6). These are the same formulas as ggml's reference decoders
(ggml-quants.c), written as whole-tensor torch operations in the `gguf` package's order of float32
operations, so the result is bit for bit what `gguf.dequantize` returns (tests/test_gguf_dequant.py
checks every format here on random blocks). A format not listed returns None: the caller falls back
to `gguf.dequantize`.

Block layouts (bytes; d, dmin, m are float16 scales; every format is a run of fixed-size blocks):
    Q8_0   34: d, 32 x int8                                   y = q * d
    Q4_0   18: d, 16 bytes of two 4-bit codes                 y = d * (q - 8)
    Q4_1   20: d, m, 16 bytes of 4-bit codes                  y = d * q + m
    Q5_0   22: d, 32 high bits (uint32), 16 bytes of codes    y = d * (q - 16)
    Q5_1   24: d, m, 32 high bits, 16 bytes of codes          y = d * q + m
    Q4_K  144: d, dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32, 128 bytes of codes
    Q5_K  176: as Q4_K, then 32 bytes of fifth bits, then 128 bytes of codes
    Q6_K  210: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, d
"""

from __future__ import annotations

import warnings
from functools import lru_cache

import numpy as np

SIZES = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
         "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}
"""Format name -> (values per block, bytes per block)."""


@lru_cache(maxsize=1)
def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def dequantize(data: np.ndarray, qtype_name: str, device: str | None = None) -> np.ndarray | None:
    """`data`: a GGUF tensor's raw bytes as gguf's reader gives them (uint8, rows x bytes per row).
    Returns float32 values (rows x values per row), or None for a format this module does not decode."""
    if qtype_name not in SIZES or data.dtype != np.uint8:
        return None
    import torch

    per_block, size = SIZES[qtype_name]
    rows = data.shape[:-1]
    with warnings.catch_warnings():  # the reader's memory map is read-only, and these bytes are only read
        warnings.simplefilter("ignore", UserWarning)
        blocks = torch.from_numpy(np.ascontiguousarray(data))
    device = device or default_device()
    try:
        with torch.no_grad():
            y = DECODERS[qtype_name](blocks.to(device).reshape(-1, size))
    except RuntimeError:  # a GPU out of memory or unusable (the jobs hold it): the same values on the CPU
        if device == "cpu":
            raise
        with torch.no_grad():
            y = DECODERS[qtype_name](blocks.reshape(-1, size))
    return y.reshape(*rows, data.shape[-1] // size * per_block).cpu().numpy()


def f16(b) -> "torch.Tensor":  # two bytes per row -> (rows, 1) float32
    import torch

    return b.contiguous().view(torch.float16).to(torch.float32)


def nibbles(qs, width: int) -> "torch.Tensor":
    """Low nibbles of each run of `width` bytes, then its high nibbles: (n, k*width) -> (n, 2k, width)."""
    import torch

    n = qs.shape[0]
    shifts = torch.tensor([0, 4], dtype=torch.uint8, device=qs.device).reshape(1, 1, 2, 1)
    return ((qs.reshape(n, -1, 1, width) >> shifts) & 0x0F).reshape(n, -1, width)


def high_bits(qh) -> "torch.Tensor":
    """Q5_0/Q5_1: 4 bytes read as a little-endian uint32 -> its 32 bits, bit i for value i: (n, 32)."""
    import torch

    shifts = torch.arange(8, dtype=torch.uint8, device=qh.device).reshape(1, 1, 8)
    return ((qh.reshape(-1, 4, 1) >> shifts) & 1).reshape(-1, 32)


def q8_0(b):
    import torch

    return b[:, 2:].contiguous().view(torch.int8).to(torch.float32) * f16(b[:, :2])


def q4_0(b):
    import torch

    q = nibbles(b[:, 2:], 16).reshape(-1, 32).view(torch.int8) - 8
    return f16(b[:, :2]) * q.to(torch.float32)


def q4_1(b):
    import torch

    q = nibbles(b[:, 4:], 16).reshape(-1, 32).to(torch.float32)
    return f16(b[:, :2]) * q + f16(b[:, 2:4])


def q5_0(b):
    import torch

    q = (nibbles(b[:, 6:], 16).reshape(-1, 32) | (high_bits(b[:, 2:6]) << 4)).view(torch.int8) - 16
    return f16(b[:, :2]) * q.to(torch.float32)


def q5_1(b):
    import torch

    q = (nibbles(b[:, 8:], 16).reshape(-1, 32) | (high_bits(b[:, 4:8]) << 4)).to(torch.float32)
    return f16(b[:, :2]) * q + f16(b[:, 2:4])


def k_scales(scales):
    """The 8 sub-blocks' 6-bit scales and mins of Q4_K and Q5_K, from 12 bytes: (n, 8) each, float32."""
    import torch

    d, m, md = scales[:, :4], scales[:, 4:8], scales[:, 8:]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mins = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc.to(torch.float32), mins.to(torch.float32)


def q4_k(b):
    import torch

    n = b.shape[0]
    sc, mins = k_scales(b[:, 4:16])
    d = (f16(b[:, :2]) * sc).reshape(n, -1, 1)
    dm = (f16(b[:, 2:4]) * mins).reshape(n, -1, 1)
    q = nibbles(b[:, 16:], 32).to(torch.float32)
    return (d * q - dm).reshape(n, 256)


def q5_k(b):
    import torch

    n = b.shape[0]
    sc, mins = k_scales(b[:, 4:16])
    d = (f16(b[:, :2]) * sc).reshape(n, -1, 1)
    dm = (f16(b[:, 2:4]) * mins).reshape(n, -1, 1)
    shifts = torch.arange(8, dtype=torch.uint8, device=b.device).reshape(1, 8, 1)
    qh = (b[:, 16:48].reshape(n, 1, 32) >> shifts) & 1  # bit j of byte i: value i of sub-block j
    q = (nibbles(b[:, 48:], 32) | (qh << 4)).to(torch.float32)
    return (d * q - dm).reshape(n, 256)


def q6_k(b):
    import torch

    n = b.shape[0]
    scales = b[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
    d = (f16(b[:, 208:210]) * scales).reshape(n, 16, 1)
    low = nibbles(b[:, :128], 64).reshape(n, -1, 32)  # per half of 128: ql[0:32] lo, ql[32:64] lo, hi, hi
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).reshape(1, 1, 4, 1)
    high = ((b[:, 128:192].reshape(n, -1, 1, 32) >> shifts) & 0x03).reshape(n, -1, 32)
    q = ((low | (high << 4)).view(torch.int8) - 32).reshape(n, 16, -1).to(torch.float32)
    return (d * q).reshape(n, 256)


DECODERS = {"Q8_0": q8_0, "Q4_0": q4_0, "Q4_1": q4_1, "Q5_0": q5_0, "Q5_1": q5_1,
            "Q4_K": q4_k, "Q5_K": q5_k, "Q6_K": q6_k}
