"""Prefix reuse for the decoding server: the KV of replies that ended, kept so that the next call of the same
conversation prefills only what is new.

An agent's turn re-sends its whole conversation: in an H100 arc (2026-12-07, 692 agent calls) the sampler
prefilled 5.1M prompt tokens, of which 0.67M (13%) were new since the same episode's previous call. Each
prefill runs alone on the engine's one thread, so every other row's decode waits for it. When a reply ends
(ait.train.decode.Decoder._read), its row's KV (prompt and fed reply tokens) is copied here; when a request
arrives whose prompt shares at least `min_tokens` leading tokens with a stored sequence (the longest such
match, from any conversation: the system prompt and tools are shared too), only the rest is prefilled, on
top of the stored KV (Decoder._admit). Entries live in host memory (pinned on a GPU, the copies
asynchronous), least recently used first out past `budget_bytes`; a sequence that extends a stored one
replaces it. New weights make every entry stale: the engine clears the store when it swaps them in.

Reused KV was computed by decode steps rather than one prefill, so it equals a fresh prefill's up to
floating-point rounding; the logprobs recorded are still those of the distribution sampled from.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(eq=False)
class Prefix:
    tokens: np.ndarray
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    nbytes: int
    ready: object = None
    """A CUDA event recorded after the copies out of the GPU were queued (None on CPU)."""


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class PrefixStore:
    """Stored (tokens, per-layer KV) of finished rows, matched by longest common prefix."""

    def __init__(self, budget_bytes: int, min_tokens: int = 64):
        if budget_bytes < 0:
            raise ValueError(f"the prefix store's budget must be >= 0 bytes, got {budget_bytes}")
        self.budget_bytes, self.min_tokens = int(budget_bytes), max(1, int(min_tokens))
        self.entries: OrderedDict[int, Prefix] = OrderedDict()
        self.nbytes = 0
        self.stats = {"saved": 0, "hits": 0, "tokens_reused": 0, "evicted": 0, "cleared": 0}
        self._ids = 0

    def clear(self) -> None:
        """Forget every entry (the weights changed: their KV is stale)."""
        self.entries.clear()
        self.nbytes = 0
        self.stats["cleared"] += 1

    def save(self, tokens: list[int], layers, row: int, cols: slice) -> None:
        """Keep row `row`'s KV at columns `cols` (of a static cache's `layers`) for the sequence `tokens`."""
        if len(tokens) < self.min_tokens:
            return
        first = layers[0].keys
        per_token = sum(2 * layer.keys.shape[1] * layer.keys.shape[3] * layer.keys.element_size() for layer in layers)
        nbytes = per_token * len(tokens)
        if nbytes > self.budget_bytes:
            return
        seq = np.asarray(tokens, dtype=np.int64)
        for key in [k for k, e in self.entries.items() if common_prefix(e.tokens, seq) == len(e.tokens)]:
            self._drop(key)  # a shorter stored sequence this one extends: this one serves every match it did
        while self.entries and self.nbytes + nbytes > self.budget_bytes:
            self._drop(next(iter(self.entries)))
            self.stats["evicted"] += 1
        cuda = first.device.type == "cuda"

        def out(t: torch.Tensor) -> torch.Tensor:
            host = torch.empty((t.shape[1], cols.stop - cols.start, t.shape[3]), dtype=t.dtype, pin_memory=cuda)
            host.copy_(t[row, :, cols], non_blocking=cuda)
            return host

        keys = [out(layer.keys) for layer in layers]
        values = [out(layer.values) for layer in layers]
        ready = None
        if cuda:
            ready = torch.cuda.Event()
            ready.record()
        self._ids += 1
        self.entries[self._ids] = Prefix(seq, keys, values, nbytes, ready)
        self.nbytes += nbytes
        self.stats["saved"] += 1

    def match(self, prompt: list[int]) -> tuple[Prefix, int] | None:
        """The stored entry sharing the most leading tokens with `prompt` and how many it can serve (at
        most len(prompt) - 1: the last prompt token is always forwarded, for the next token's logits);
        None below min_tokens."""
        if not self.entries:
            return None
        seq = np.asarray(prompt, dtype=np.int64)
        best, best_n = None, 0
        for key, e in self.entries.items():
            n = common_prefix(e.tokens, seq)
            if n > best_n:
                best, best_n = key, n
        best_n = min(best_n, len(prompt) - 1)
        if best is None or best_n < self.min_tokens:
            return None
        self.entries.move_to_end(best)
        self.stats["hits"] += 1
        self.stats["tokens_reused"] += best_n
        return self.entries[best], best_n

    def load(self, entry: Prefix, n: int, config, device: torch.device):
        """A DynamicCache holding the entry's first `n` tokens' KV on `device` (one row)."""
        from transformers import DynamicCache

        if entry.ready is not None:
            entry.ready.synchronize()
        cache = DynamicCache(config=config)
        cuda = device.type == "cuda"  # pinned host memory: the copies in can be asynchronous
        for i, (k, v) in enumerate(zip(entry.keys, entry.values)):
            cache.update(k[None, :, :n].to(device, non_blocking=cuda), v[None, :, :n].to(device, non_blocking=cuda), i)
        return cache

    def _drop(self, key: int) -> None:
        self.nbytes -= self.entries.pop(key).nbytes
