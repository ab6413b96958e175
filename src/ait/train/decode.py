"""The decoding engine: a static KV cache with row slots, continuous batching, CUDA graphs on a GPU.

One engine serves every sampler of the project: training rollouts and the hidden eval
(`Decoder.generate`, a batch of prompts), the outer loop's agent sampler and the local HF
policy (`ait.train.decode_batch.SamplingEngine`, requests from many threads that join and
leave a running batch).

Why not `model.generate`: for a 100M–1B model a decode step is a few hundred tiny kernels,
so the GPU waits on Python (logits processors, stopping criteria, dynamic cache growth).
Here one decode step is a fixed-shape forward over a preallocated cache, captured once per
(rows, cache length) as a CUDA graph and replayed; sampling is a handful of kernels outside
the graph. On CPU the same code runs eagerly (tests exercise the same masks, positions and
cache bookkeeping as the GPU path).

Layout. The cache has R row slots (R bucketed: 1, 2, 4, 8, 16, then multiples of 16) and L
columns (a multiple of `cache_bucket`). Every decode step writes one shared column `col`
in all rows; a row's tokens occupy the contiguous columns [start, col) and its attention
mask covers exactly those (plus the column being written), so rows of any length and age
share the cache. Positions are per row (RoPE is applied before caching, so a row's column
index never matters, only its mask). A request is prefilled on its own (a small batch of
new requests, left-padded, DynamicCache) and its KV copied into a free row so that it ends
at column `col`; a row that finishes frees its slot at once. When `col` reaches L, the live
columns are shifted left (compaction) or moved into a longer cache (growth); both are one
`_relayout`. Attention uses an explicit boolean 4D mask (transformers passes 4D masks
through untouched), so the captured graph never takes a data-dependent branch.

Sampling: per row (temperature, top_p, its own noise), ait.train.decode_sample. The sampled
tokens stay on the device; the host reads them every `check_every` steps (1 for a continuous
server: finished rows leave at once; 8 for `generate`: each read is a GPU sync).

This module owns the engine's API (Sample, Request, Decoder) and its bookkeeping: which request
is in which row, when rows join, leave and move. The tensors behind that (the cache slots, graph
capture, row moves, prefill inputs) are ait.train.decode_cache's.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

import torch

from ait.train.decode_cache import (Slot, bucket_batch, cache_kwarg, capture, move_rows, prefill_inputs, regroup,
                                    shift_columns, write_prefill)
from ait.train.decode_sample import gumbel, nucleus, sample_tokens  # noqa: F401 - re-exported: their home was here
from ait.train.decode_prefix import PrefixStore
from ait.train.decode_sample import record, sample_rows, sampling_plan

CACHE_BUCKET = 128   # cache lengths are rounded up to a multiple of this: fewer graphs to capture
CHECK_EVERY = 8      # generate(): decode steps between reads of the sampled tokens (each read is a GPU sync)
KEEP_GRAPHS = 3      # (rows, cache length) shapes kept alive: each holds a KV cache (a geometric
                     # server keeps only its longest per row count: ait.train.decode.Decoder._release_shorter)
PREFILL_TOKENS = 16384  # padded prompt tokens prefilled in one forward (requests beyond wait for the next)


@dataclass
class Sample:
    ids: list[int]
    """Sampled tokens, the stop token included when one was hit."""
    logprobs: list[float] = field(default_factory=list)
    """Log-probability of each token under the distribution it was drawn from (temperature applied;
    at temperature 0, under the untempered distribution)."""
    stopped: bool = False
    """Ended on a stop token (False: ran out of new tokens)."""


@dataclass(eq=False)
class Request:
    """One reply to generate; the engine fills ids, logprobs, stopped (or error)."""
    prompt: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    generator: torch.Generator | None = None
    """Its own noise, drawn from only while it generates; None: the batch generator (ait.train.decode_sample)."""
    stop_ids: frozenset[int] | None = None
    """None: the decoder's."""
    tag: Any = None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stopped: bool = False
    error: BaseException | None = None

    def sample(self) -> Sample:
        return Sample(ids=self.ids, logprobs=self.logprobs, stopped=self.stopped)


class Decoder:
    """Batched sampling from a causal LM (any transformers model that takes a StaticCache).

    `generate(prompts, max_new_tokens, temperature)` -> one Sample per prompt. Continuous use:
    `submit(requests)`, then `step()` until `busy` is False; each step returns the requests that
    finished (one thread drives a Decoder). The model is used in place: weights updated by an
    optimizer between calls are seen by the next call (parameters are updated in place, so
    captured graphs stay valid)."""

    def __init__(self, model, *, stop_ids, pad_id: int, cuda_graphs: bool | None = None,
                 max_batch: int = 256, cache_bucket: int = CACHE_BUCKET, check_every: int = 1, min_rows: int = 1,
                 geometric: bool = False, prefixes: PrefixStore | None = None):
        """`prefixes`: keep finished rows' KV there and prefill a request only past the longest stored prefix
        of its prompt (ait.train.decode_prefix; the sampling server's, never a batch job's)."""
        self.model = model
        self.prefixes = prefixes
        self.device = next(model.parameters()).device
        self.stop_ids = sorted(set(stop_ids))
        self.pad_id = pad_id
        self.cuda_graphs = (self.device.type == "cuda") if cuda_graphs is None else cuda_graphs
        self.max_batch = max_batch
        self.cache_bucket = cache_bucket
        self.check_every = check_every
        self.min_rows = min_rows  # row slots allocated at least (a server: its max batch, so one rows bucket)
        self.geometric = geometric  # cache lengths cache_bucket * 2^k, kept while they fit: few graphs for a server
        self.generator: torch.Generator | None = None  # the batch generator (requests without their own)
        self.slots: OrderedDict[tuple[int, int], Slot] = OrderedDict()
        self.stats = {"graphs_captured": 0, "decode_steps": 0, "prefill_tokens": 0, "compactions": 0,
                      "relayouts": 0}
        self.cache_kwarg = cache_kwarg(model)
        self.waiting: deque[Request] = deque()
        self._clear()

    def _clear(self) -> None:
        self.slot: Slot | None = None
        self.col = 0
        self.rows: list[Request | None] = []
        self.start: list[int] = []       # first column of each row's tokens
        self.logits: torch.Tensor | None = None
        self.window: list[tuple[torch.Tensor, torch.Tensor]] = []  # sampled (tokens, logprobs), not yet read
        self.feed: torch.Tensor | None = None  # the last sampled tokens, to be fed at the next step
        self._plan: tuple | None = None

    # ---- the batch API -------------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, generator: torch.Generator | None = None) -> list[Sample]:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if not prompts or max_new_tokens <= 0:
            return [Sample(ids=[]) for _ in prompts]
        requests = [Request(list(p), max_new_tokens, temperature, top_p) for p in prompts]
        self.run(requests, generator=generator, caller="generate()")
        return [r.sample() for r in requests]

    def run(self, requests: list[Request], on_done=None, generator: torch.Generator | None = None,
            caller: str = "run()") -> None:
        """Serve `requests` to the end as one batch job (tokens read every CHECK_EVERY steps: each read is a
        GPU sync). `on_done(request)` sees each finished request and may submit more: a multi-turn
        rollout's next turn joins the running batch (ait.train.rollouts)."""
        if self.busy:
            raise RuntimeError(f"{caller} on a Decoder that is serving requests")
        saved = self.check_every, self.generator
        self.check_every, self.generator = CHECK_EVERY, generator
        try:
            self.submit(requests)
            while self.busy:
                for r in self.step():
                    if r.error is not None:
                        raise r.error
                    if on_done is not None:
                        on_done(r)
        except BaseException:
            self.abort()
            raise
        finally:
            self.check_every, self.generator = saved

    # ---- the continuous API --------------------------------------------------------------------

    def submit(self, requests: list[Request]) -> None:
        """Queue requests; each joins the running batch at the next step with a free row."""
        for r in requests:
            if not r.prompt:
                raise ValueError("every prompt needs at least one token")
        self.waiting.extend(requests)

    @property
    def live(self) -> int:
        return sum(r is not None for r in self.rows)

    @property
    def busy(self) -> bool:
        return bool(self.waiting) or self.live > 0

    def requests(self) -> list[Request]:
        """Every request not finished yet (running or waiting)."""
        return [r for r in self.rows if r is not None] + list(self.waiting)

    def abort(self) -> None:
        """Drop every running and waiting request (after an error); the caches stay for reuse."""
        self.waiting.clear()
        self._clear()

    @torch.no_grad()
    def step(self) -> list[Request]:
        """Feed the last sampled tokens (one forward), admit waiting requests into free rows, sample
        the next token of every row; returns the requests that finished (their replies complete).
        A forward pass that fails raises before anything of this step is sampled."""
        done: list[Request] = []
        if self.feed is not None:
            if self.col >= self.slot.cache_len and self.window:
                done += self._read()  # a relayout moves rows: read their tokens first
            if self.live:
                self._advance()
            self.feed = None
        if self.waiting and not self.window and self.live < self.max_batch:
            done += self._admit()
        if not self.live:
            return done
        self._sample()
        due = min(r.max_new_tokens - len(r.ids) for r in self.rows if r is not None)
        if len(self.window) >= min(self.check_every, due):
            done += self._read()
        return done

    # ---- internals -----------------------------------------------------------------------------

    def _bucket_len(self, n: int) -> int:
        if self.geometric:
            return self.cache_bucket << max(0, (-(-n // self.cache_bucket) - 1).bit_length())
        return -(-n // self.cache_bucket) * self.cache_bucket

    def _forward(self, slot: Slot, input_ids, mask, position, cache=None) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position, use_cache=True,
                         logits_to_keep=1, **{self.cache_kwarg: slot.cache if cache is None else cache})
        return out.logits[:, -1, :]

    def _get_slot(self, rows: int, cache_len: int) -> Slot:
        key = (rows, cache_len)
        if key in self.slots:
            self.slots.move_to_end(key)
            return self.slots[key]
        for old in list(self.slots):
            if len(self.slots) < KEEP_GRAPHS:
                break
            if self.slots[old] is not self.slot:
                del self.slots[old]
        slot = Slot(self.model, rows, cache_len, self.device)
        # One eager step at column 0 allocates the cache (and checks the shape works); every row attends
        # to what it writes there, so no row is all-masked (that would put NaN in the cache).
        slot.mask[..., :3] = True
        slot.set_length(0)
        self._forward(slot, slot.token, slot.mask, slot.position)
        if self.cuda_graphs:
            capture(slot, self._forward, self.device)
            self.stats["graphs_captured"] += 1
        slot.mask.zero_()
        slot.set_length(0)
        self.slots[key] = slot
        return slot

    def _advance(self) -> None:
        """Feed every row its last sampled token at column `col`: the logits of the next step."""
        if self.col >= self.slot.cache_len:
            self._make_room()
        slot = self.slot
        slot.token[:, 0] = self.feed
        slot.mask[:, 0, 0, self.col] = True
        if slot.length != self.col:
            slot.set_length(self.col)
        if slot.graph is not None:
            slot.graph.replay()
            self.logits = slot.logits
        else:
            self.logits = self._forward(slot, slot.token, slot.mask, slot.position)
        slot.length = self.col + 1  # the forward advanced the write position
        slot.position += 1
        self.col += 1
        self.stats["decode_steps"] += 1

    def _remaining(self) -> int:
        return max((r.max_new_tokens - len(r.ids) for r in self.rows if r is not None), default=0)

    def _span(self) -> int:
        """Columns of the longest live row."""
        return max((self.col - s for r, s in zip(self.rows, self.start) if r is not None), default=0)

    def _make_room(self) -> None:
        """The write column reached the cache's end: shift the live columns left when that frees at
        least a quarter of the cache, else move to a longer cache."""
        span, length = self._span(), self.slot.cache_len
        if length - span >= max(length // 4, 1):
            self.stats["compactions"] += 1
            self._relayout(self.slot.rows, length, span)
        else:
            grown = max(span + max(self._remaining(), self.cache_bucket) + 1, length + length // 2)
            self._relayout(self.slot.rows, self._bucket_len(grown), span)

    def _relayout(self, rows: int, cache_len: int, col: int) -> None:
        """Move the live rows into the (rows, cache_len) slot (this one or another), their columns
        shifted so that the next write column is `col`."""
        old, span = self.slot, self._span()
        live = [i for i, r in enumerate(self.rows) if r is not None]
        assert col >= span and cache_len > col and rows >= len(live)
        new = self._get_slot(rows, cache_len)
        self.stats["relayouts"] += 1
        src, dst = slice(self.col - span, self.col), slice(col - span, col)
        if new is old:
            shift_columns(new, src, dst, span)
        else:
            new.mask.zero_()
            if live:
                at_old, at_new = move_rows(old, new, live, src, dst, span, self.device)
                self.logits = regroup(self.logits, rows, at_old, at_new)
                if self.feed is not None:
                    self.feed = regroup(self.feed, rows, at_old, at_new)
            else:
                self.logits = None
            self.rows = [self.rows[i] for i in live] + [None] * (rows - len(live))
            self.start = [self.start[i] for i in live] + [0] * (rows - len(live))
            self._plan = None
        self.start = [s + col - self.col for s in self.start]
        self.slot, self.col = new, col
        if self.geometric:
            self._release_shorter(new)

    def _release_shorter(self, slot: Slot) -> None:
        """A geometric (server) cache only grows at a fixed row count and an idle start reuses a longer cache
        that fits, so a shorter cache of the same rows is never used again: free it. Kept, the outer loop's
        agent engine held its 8k- and 16k-column caches (16 rows: 3.75 and 7.5 GiB on the 1.5B agent) beside
        the 32k one it used, and the packed jobs could not have that memory."""
        for key in [k for k in self.slots if k[0] == slot.rows and k[1] < slot.cache_len]:
            del self.slots[key]

    def _admit(self) -> list[Request]:
        """Prefill waiting requests (as many as there are rows for) and copy their KV into free rows."""
        room = self.max_batch - self.live
        new: list[Request] = []
        budget = PREFILL_TOKENS
        while self.waiting and len(new) < room:
            width = max([len(r.prompt) for r in new] + [len(self.waiting[0].prompt)])
            if new and width * (len(new) + 1) > budget:
                break
            new.append(self.waiting.popleft())
        width = max(len(r.prompt) for r in new)
        need_rows, span = self.live + len(new), self._span()
        remaining = max([self._remaining()] + [r.max_new_tokens for r in new])
        if not self.live:  # an idle engine starts afresh: the cache sized for these requests
            rows, cache_len = max(bucket_batch(need_rows), self.min_rows), self._bucket_len(width + remaining + 1)
            if self.geometric and self.slot is not None and self.slot.rows == rows and self.slot.cache_len > cache_len:
                cache_len = self.slot.cache_len  # a longer cache that fits: no other graph
            self._relayout(rows, cache_len, width)
        elif self.slot.rows < need_rows or self.col < width or self.col >= self.slot.cache_len:
            rows = max(bucket_batch(need_rows), self.slot.rows)
            col = max(span, width)
            cache_len = self._bucket_len(col + remaining + 1)
            if rows == self.slot.rows:
                cache_len = max(cache_len, self.slot.cache_len)
            self._relayout(rows, cache_len, col)
        free = [i for i, r in enumerate(self.rows) if r is None][:len(new)]
        try:
            prefilled = self._prefill_into(new, free)
        except Exception as e:  # noqa: BLE001 - a bad request (e.g. an id outside the vocabulary) fails alone
            for r in new:
                r.error = e
            return new
        at = torch.tensor(free, device=self.device)
        mask = self.slot.mask
        mask[at] = False
        for i, r in zip(free, new):
            mask[i, 0, 0, self.col - len(r.prompt):self.col] = True
            self.rows[i], self.start[i] = r, self.col - len(r.prompt)
        self.slot.position[at, 0] = torch.tensor([len(r.prompt) for r in new], device=self.device)
        for rows, logits in prefilled:
            if self.logits is None:
                self.logits = logits.new_zeros(self.slot.rows, logits.shape[-1])
            self.logits[rows] = logits.to(self.logits.dtype)
        self._plan = None
        return []

    def _prefill_into(self, new: list[Request], free: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Prefill the new requests and write their KV into rows `free` so that each prompt ends at column
        `col`: those whose prompt starts with a stored prefix (self.prefixes) one by one, from it; the rest
        together, left-padded. Returns (rows, their last-token logits) per forward."""
        reuse = {id(r): self.prefixes.match(r.prompt) for r in new} if self.prefixes is not None else {}
        fresh = [(r, i) for r, i in zip(new, free) if reuse.get(id(r)) is None]
        out = []
        if fresh:
            width = max(len(r.prompt) for r, _ in fresh)
            logits, cache = self._prefill([r for r, _ in fresh], width)
            at = torch.tensor([i for _, i in fresh], device=self.device)
            write_prefill(self.slot, cache, at, slice(self.col - width, self.col))
            out.append((at, logits))
        for r, i in zip(new, free):
            if reuse.get(id(r)) is not None:
                entry, n = reuse[id(r)]
                cache = self.prefixes.load(entry, n, self.model.config, self.device)
                ids = torch.tensor([r.prompt[n:]], device=self.device)
                position = torch.arange(n, len(r.prompt), device=self.device)[None]
                logits = self._forward(self.slot, ids, None, position, cache=cache)
                self.stats["prefill_tokens"] += len(r.prompt) - n
                at = torch.tensor([i], device=self.device)
                write_prefill(self.slot, cache, at, slice(self.col - len(r.prompt), self.col))
                out.append((at, logits))
        return out

    def _prefill(self, new: list[Request], width: int):
        """Last-token logits and a DynamicCache of the new prompts, left-padded to `width`."""
        from transformers import DynamicCache

        ids, mask, position = prefill_inputs([r.prompt for r in new], width, self.pad_id, self.device)
        cache = DynamicCache(config=self.model.config)
        logits = self._forward(self.slot, ids, mask, position, cache=cache)
        self.stats["prefill_tokens"] += len(new) * width
        return logits, cache

    def _sample(self) -> None:
        if self._plan is None:  # per-row temperatures and noise sources, kept until the rows change
            self._plan = sampling_plan(self.rows, self.device)
        tokens, logprobs = sample_rows(self.logits, self._plan, self.generator)
        self.feed = tokens
        self.window.append((tokens, logprobs))

    def _read(self) -> list[Request]:
        """Bring the window's tokens to the host (one sync); finish rows at a stop token or their limit."""
        tokens = torch.stack([t for t, _ in self.window], dim=1).tolist()
        logprobs = torch.stack([lp for _, lp in self.window], dim=1).tolist()
        self.window = []
        done, freed = [], []
        default_stop = set(self.stop_ids)
        for i, r in enumerate(self.rows):
            if r is None:
                continue
            stop = default_stop if r.stop_ids is None else r.stop_ids
            if record(r, tokens[i], logprobs[i], stop, i):
                if self.prefixes is not None and r.error is None:
                    # Columns [start, col) hold the prompt and every fed token (not the last one sampled).
                    n = min(self.col - self.start[i], len(r.prompt) + len(r.ids))
                    self.prefixes.save((r.prompt + r.ids)[:n], self.slot.cache.layers, i,
                                       slice(self.start[i], self.start[i] + n))
                done.append(r)
                freed.append(i)
                self.rows[i] = None
        if freed:
            self.slot.mask[torch.tensor(freed, device=self.device)] = False
            self._plan = None
        return done
