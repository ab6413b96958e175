"""The decoding engine's KV cache (ait.train.decode): row slots, CUDA graph capture, moving rows.

The engine (`ait.train.decode.Decoder`) decides when a row joins, leaves or moves; this module
owns what that does to the tensors. A `Slot` is one (rows, cache length) shape: its StaticCache,
the static input buffers a decode step reads (token, position, mask) and, on CUDA, that step
captured as a graph (`capture`). A relayout is `shift_columns` (compaction inside the same slot)
or `move_rows` (into another slot); `prefill_inputs` and `write_prefill` bring new prompts in.
Layout and the reasons for it: ait.train.decode's module docstring.
"""

from __future__ import annotations

import inspect
from typing import Callable

import torch


def bucket_batch(n: int) -> int:
    """Batch sizes are padded to 1, 2, 4, 8, 16, then multiples of 16: few distinct graphs."""
    if n <= 16:
        return 1 << (n - 1).bit_length()
    return -(-n // 16) * 16


def cache_kwarg(model) -> str:
    """The forward's name for the KV cache: `cache` in recent transformers, `past_key_values` before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


class Slot:
    """Static buffers (and on CUDA the captured graph) for one (rows, cache length) shape."""

    def __init__(self, model, rows: int, cache_len: int, device: torch.device):
        from transformers import StaticCache

        self.rows, self.cache_len = rows, cache_len
        self.cache = StaticCache(config=model.config, max_cache_len=cache_len)
        if any(getattr(layer, "is_sliding", False) for layer in self.cache.layers):
            raise NotImplementedError("the decoding engine needs a full-attention KV cache; this model has "
                                      "sliding-window layers")
        self.token = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.position = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.mask = torch.zeros(rows, 1, 1, cache_len, dtype=torch.bool, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        self.length = 0  # the cache's write column, as last set

    def set_length(self, n: int) -> None:
        """Point every cache layer's write position at n (the cache is otherwise reused as is)."""
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False):
                layer.cumulative_length.fill_(n)
        self.length = n


def capture(slot: Slot, forward: Callable[..., torch.Tensor], device: torch.device) -> None:
    """Record one decode step as a CUDA graph (warm-up steps write columns 0 and 1 of an empty cache).
    `forward(slot, token, mask, position)`: the engine's forward, last-token logits."""
    slot.set_length(0)
    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            forward(slot, slot.token, slot.mask, slot.position)
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        slot.logits = forward(slot, slot.token, slot.mask, slot.position)
    slot.graph = graph


def shift_columns(slot: Slot, src: slice, dst: slice, span: int) -> None:
    """Compaction in place: every row's `span` live columns move from `src` to `dst` (KV and mask)."""
    if span and src != dst:
        for layer in slot.cache.layers:
            layer.keys[:, :, dst] = layer.keys[:, :, src].clone()
            layer.values[:, :, dst] = layer.values[:, :, src].clone()
    if span:
        kept = slot.mask[..., src].clone()
        slot.mask.zero_()
        slot.mask[..., dst] = kept
    else:
        slot.mask.zero_()


def move_rows(old: Slot, new: Slot, live: list[int], src: slice, dst: slice, span: int,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy the `live` rows of `old` into the first rows of `new` (whose mask is already cleared), their
    columns `src` landing on `dst`; returns (their rows in old, their rows in new) as index tensors."""
    at_old = torch.tensor(live, device=device)
    at_new = torch.arange(len(live), device=device)
    if span:
        for ours, theirs in zip(new.cache.layers, old.cache.layers):
            ours.keys[at_new, :, dst] = theirs.keys[at_old, :, src]
            ours.values[at_new, :, dst] = theirs.values[at_old, :, src]
        new.mask[at_new, :, :, dst] = old.mask[at_old, :, :, src]
    new.position[at_new] = old.position[at_old]
    return at_old, at_new


def regroup(t: torch.Tensor, rows: int, at_old: torch.Tensor, at_new: torch.Tensor) -> torch.Tensor:
    """A per-row tensor of `rows` rows (zeros) holding `t`'s rows `at_old` at `at_new`."""
    out = t.new_zeros(rows, *t.shape[1:])
    out[at_new] = t[at_old]
    return out


def prefill_inputs(prompts: list[list[int]], width: int, pad_id: int,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(input ids, 4D mask or None, positions) of the prompts left-padded to `width`, for one prefill."""
    n, dev = len(prompts), device
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    valid = torch.zeros(n, width, dtype=torch.bool)
    for i, prompt in enumerate(prompts):
        ids[i, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        valid[i, width - len(prompt):] = True
    ids, valid = ids.to(dev), valid.to(dev)
    position = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
    mask = None  # no padding: plain causal attention (the fast kernels)
    if not bool(valid.all()):
        causal = torch.ones(width, width, dtype=torch.bool, device=dev).tril()
        # Padded query rows attend to themselves only: an all-masked row would put NaN in the cache.
        mask = ((causal[None] & valid[:, None, :]) | torch.eye(width, dtype=torch.bool, device=dev)[None])[:, None]
    return ids, mask, position


def write_prefill(slot: Slot, cache, at: torch.Tensor, cols: slice) -> None:
    """Copy a prefill's KV (a DynamicCache, one row per new request) into the slot's rows `at`, columns `cols`."""
    for ours, theirs in zip(slot.cache.layers, cache.layers):
        ours.keys[at, :, cols] = theirs.keys
        ours.values[at, :, cols] = theirs.values
