"""ait.train.gguf_dequant: every block format it decodes gives bit for bit what the gguf package's numpy
decoder gives, on random blocks (random codes, scales and mins), in any row shape."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from ait.train import gguf_dequant  # noqa: E402

# where each format keeps its float16 scales (byte offsets), so the random bytes there are finite numbers
F16_AT = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2],
          "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def random_blocks(name: str, rows: int, blocks_per_row: int, rng: np.random.Generator) -> np.ndarray:
    per_block, size = gguf_dequant.SIZES[name]
    data = rng.integers(0, 256, size=(rows * blocks_per_row, size), dtype=np.uint8)
    for at in F16_AT[name]:
        data[:, at:at + 2] = rng.normal(0, 0.05, size=(len(data), 1)).astype(np.float16).view(np.uint8)
    return data.reshape(rows, blocks_per_row * size)


@pytest.mark.parametrize("name", sorted(gguf_dequant.SIZES))
def test_bit_for_bit_the_gguf_packages_values(name: str) -> None:
    rng = np.random.default_rng(sum(map(ord, name)))
    data = random_blocks(name, rows=6, blocks_per_row=3, rng=rng)
    want = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[name])
    got = gguf_dequant.dequantize(data, name, device="cpu")
    assert got.dtype == np.float32 and got.shape == want.shape == (6, 3 * gguf_dequant.SIZES[name][0])
    assert np.array_equal(got, want), f"{name}: {np.abs(got - want).max()} max difference"


def test_a_format_it_does_not_decode_is_left_to_the_gguf_package() -> None:
    assert gguf_dequant.dequantize(np.zeros((2, 8), dtype=np.uint8), "IQ2_XXS", device="cpu") is None
    assert gguf_dequant.dequantize(np.zeros((2, 8), dtype=np.float32), "Q8_0", device="cpu") is None


def test_a_three_dimensional_tensor_keeps_its_leading_shape() -> None:
    data = random_blocks("Q8_0", rows=4, blocks_per_row=2, rng=np.random.default_rng(0)).reshape(2, 2, 68)
    got = gguf_dequant.dequantize(data, "Q8_0", device="cpu")
    assert got.shape == (2, 2, 64)
    assert np.array_equal(got, gguf.quants.dequantize(data, gguf.GGMLQuantizationType.Q8_0))


def test_a_device_that_fails_falls_back_to_the_cpu(monkeypatch) -> None:
    """A GPU out of memory (or one the jobs made unusable) never fails a conversion: the CPU decodes."""
    import torch

    real_to = torch.Tensor.to

    def failing_to(self, *args, **kwargs):
        if args and args[0] == "cuda":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", failing_to)
    data = random_blocks("Q4_K", rows=2, blocks_per_row=1, rng=np.random.default_rng(1))
    got = gguf_dequant.dequantize(data, "Q4_K", device="cuda")
    assert np.array_equal(got, gguf.quants.dequantize(data, gguf.GGMLQuantizationType.Q4_K))
