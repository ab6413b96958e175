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

Sampling. Each row has its own temperature (0: greedy, logprobs recorded at temperature 1),
top_p and noise: Gumbel-max (argmax(logp + Gumbel noise) is an exact sample of softmax(logp))
from the request's own torch.Generator, drawn only while the row generates (so a reply
depends on its seed and the weights, never on its batch-mates), or, for requests without
one, a single draw of the whole [rows, vocab] block per step from the batch's generator
(`Decoder.generate`). The sampled tokens stay on the device; the host reads them every
`check_every` steps (1 for a continuous server: finished rows leave at once; 8 for
`generate`: each read is a GPU sync).
"""

from __future__ import annotations

import inspect
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

import torch

CACHE_BUCKET = 128   # cache lengths are rounded up to a multiple of this: fewer graphs to capture
CHECK_EVERY = 8      # generate(): decode steps between reads of the sampled tokens (each read is a GPU sync)
KEEP_GRAPHS = 3      # (rows, cache length) shapes kept alive: each holds a KV cache
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
    """Its own noise, drawn from only while it generates; None: the batch generator (see module doc)."""
    stop_ids: frozenset[int] | None = None
    """None: the decoder's."""
    tag: Any = None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stopped: bool = False
    error: BaseException | None = None

    def sample(self) -> Sample:
        return Sample(ids=self.ids, logprobs=self.logprobs, stopped=self.stopped)


def bucket_batch(n: int) -> int:
    """Batch sizes are padded to 1, 2, 4, 8, 16, then multiples of 16: few distinct graphs."""
    if n <= 16:
        return 1 << (n - 1).bit_length()
    return -(-n // 16) * 16


def gumbel(uniform: torch.Tensor) -> torch.Tensor:
    return -torch.log(-torch.log(uniform.clamp_(1e-20, 1.0)))


def nucleus(logprobs: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """Logprobs renormalised over each row's smallest prefix (by probability) reaching top_p."""
    sorted_lp, order = logprobs.sort(dim=-1, descending=True)
    sorted_p = sorted_lp.exp()
    limit = top_p[:, None] if isinstance(top_p, torch.Tensor) else top_p
    drop = sorted_p.cumsum(dim=-1) - sorted_p > limit
    if isinstance(top_p, torch.Tensor):
        drop &= (top_p < 1.0)[:, None]
    sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
    logprobs = torch.full_like(logprobs, float("-inf")).scatter_(1, order, sorted_lp)
    return torch.log_softmax(logprobs, dim=-1)


def sample_tokens(logits: torch.Tensor, temperature: float, top_p: float,
                  generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, logprobs) for one step, one temperature for all rows. Greedy when temperature is 0.

    Sampling is Gumbel-max (argmax of logprobs plus Gumbel noise), which draws exactly from
    the softmax; unlike torch.multinomial it cannot trip a device-side assert on a bad row,
    so non-finite logits surface as a clear error after the call (see Decoder)."""
    logits = logits.float()
    if temperature <= 0:
        tokens = logits.argmax(dim=-1)
        return tokens, torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        logprobs = nucleus(logprobs, top_p)
    noise = gumbel(torch.rand(logprobs.shape, device=logprobs.device, generator=generator))
    tokens = (logprobs + noise).argmax(dim=-1)
    return tokens, logprobs.gather(1, tokens[:, None])[:, 0]


def cache_kwarg(model) -> str:
    """The forward's name for the KV cache: `cache` in recent transformers, `past_key_values` before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


class _Slot:
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


class Decoder:
    """Batched sampling from a causal LM (any transformers model that takes a StaticCache).

    `generate(prompts, max_new_tokens, temperature)` -> one Sample per prompt. Continuous use:
    `submit(requests)`, then `step()` until `busy` is False; each step returns the requests that
    finished (one thread drives a Decoder). The model is used in place: weights updated by an
    optimizer between calls are seen by the next call (parameters are updated in place, so
    captured graphs stay valid)."""

    def __init__(self, model, *, stop_ids, pad_id: int, cuda_graphs: bool | None = None,
                 max_batch: int = 256, cache_bucket: int = CACHE_BUCKET, check_every: int = 1, min_rows: int = 1,
                 geometric: bool = False):
        self.model = model
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
        self.slots: OrderedDict[tuple[int, int], _Slot] = OrderedDict()
        self.stats = {"graphs_captured": 0, "decode_steps": 0, "prefill_tokens": 0, "compactions": 0,
                      "relayouts": 0}
        self.cache_kwarg = cache_kwarg(model)
        self.waiting: deque[Request] = deque()
        self._clear()

    def _clear(self) -> None:
        self.slot: _Slot | None = None
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
        if self.busy:
            raise RuntimeError("generate() on a Decoder that is serving requests")
        requests = [Request(list(p), max_new_tokens, temperature, top_p) for p in prompts]
        saved = self.check_every, self.generator
        self.check_every, self.generator = CHECK_EVERY, generator
        try:
            self.submit(requests)
            while self.busy:
                for r in self.step():
                    if r.error is not None:
                        raise r.error
        except BaseException:
            self.abort()
            raise
        finally:
            self.check_every, self.generator = saved
        return [r.sample() for r in requests]

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

    def _forward(self, slot: _Slot, input_ids, mask, position, cache=None) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position, use_cache=True,
                         logits_to_keep=1, **{self.cache_kwarg: slot.cache if cache is None else cache})
        return out.logits[:, -1, :]

    def _get_slot(self, rows: int, cache_len: int) -> _Slot:
        key = (rows, cache_len)
        if key in self.slots:
            self.slots.move_to_end(key)
            return self.slots[key]
        for old in list(self.slots):
            if len(self.slots) < KEEP_GRAPHS:
                break
            if self.slots[old] is not self.slot:
                del self.slots[old]
        slot = _Slot(self.model, rows, cache_len, self.device)
        # One eager step at column 0 allocates the cache (and checks the shape works); every row attends
        # to what it writes there, so no row is all-masked (that would put NaN in the cache).
        slot.mask[..., :3] = True
        slot.set_length(0)
        self._forward(slot, slot.token, slot.mask, slot.position)
        if self.cuda_graphs:
            self._capture(slot)
        slot.mask.zero_()
        slot.set_length(0)
        self.slots[key] = slot
        return slot

    def _capture(self, slot: _Slot) -> None:
        """Record one decode step as a CUDA graph (warm-up steps write columns 0 and 1 of an empty cache)."""
        slot.set_length(0)
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward(slot, slot.token, slot.mask, slot.position)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            slot.logits = self._forward(slot, slot.token, slot.mask, slot.position)
        slot.graph = graph
        self.stats["graphs_captured"] += 1

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
            if span and src != dst:
                for layer in new.cache.layers:
                    layer.keys[:, :, dst] = layer.keys[:, :, src].clone()
                    layer.values[:, :, dst] = layer.values[:, :, src].clone()
            if span:
                kept = new.mask[..., src].clone()
                new.mask.zero_()
                new.mask[..., dst] = kept
            else:
                new.mask.zero_()
        else:
            new.mask.zero_()
            if live:
                at_old = torch.tensor(live, device=self.device)
                at_new = torch.arange(len(live), device=self.device)
                if span:
                    for ours, theirs in zip(new.cache.layers, old.cache.layers):
                        ours.keys[at_new, :, dst] = theirs.keys[at_old, :, src]
                        ours.values[at_new, :, dst] = theirs.values[at_old, :, src]
                    new.mask[at_new, :, :, dst] = old.mask[at_old, :, :, src]
                new.position[at_new] = old.position[at_old]
                logits = self.logits.new_zeros(rows, self.logits.shape[-1])
                logits[at_new] = self.logits[at_old]
                self.logits = logits
                if self.feed is not None:
                    feed = self.feed.new_zeros(rows)
                    feed[at_new] = self.feed[at_old]
                    self.feed = feed
            else:
                self.logits = None
            self.rows = [self.rows[i] for i in live] + [None] * (rows - len(live))
            self.start = [self.start[i] for i in live] + [0] * (rows - len(live))
            self._plan = None
        self.start = [s + col - self.col for s in self.start]
        self.slot, self.col = new, col

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
        try:
            logits, cache = self._prefill(new, width)
        except Exception as e:  # noqa: BLE001 - a bad request (e.g. an id outside the vocabulary) fails alone
            for r in new:
                r.error = e
            return new
        free = [i for i, r in enumerate(self.rows) if r is None][:len(new)]
        at = torch.tensor(free, device=self.device)
        cols = slice(self.col - width, self.col)
        for ours, theirs in zip(self.slot.cache.layers, cache.layers):
            ours.keys[at, :, cols] = theirs.keys
            ours.values[at, :, cols] = theirs.values
        mask = self.slot.mask
        mask[at] = False
        for i, r in zip(free, new):
            mask[i, 0, 0, self.col - len(r.prompt):self.col] = True
            self.rows[i], self.start[i] = r, self.col - len(r.prompt)
        self.slot.position[at, 0] = torch.tensor([len(r.prompt) for r in new], device=self.device)
        if self.logits is None:
            self.logits = logits.new_zeros(self.slot.rows, logits.shape[-1])
        self.logits[at] = logits.to(self.logits.dtype)
        self._plan = None
        return []

    def _prefill(self, new: list[Request], width: int):
        """Last-token logits and a DynamicCache of the new prompts, left-padded to `width`."""
        from transformers import DynamicCache

        n, dev = len(new), self.device
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        valid = torch.zeros(n, width, dtype=torch.bool)
        for i, r in enumerate(new):
            ids[i, width - len(r.prompt):] = torch.tensor(r.prompt, dtype=torch.long)
            valid[i, width - len(r.prompt):] = True
        ids, valid = ids.to(dev), valid.to(dev)
        position = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
        mask = None  # no padding: plain causal attention (the fast kernels)
        if not bool(valid.all()):
            causal = torch.ones(width, width, dtype=torch.bool, device=dev).tril()
            # Padded query rows attend to themselves only: an all-masked row would put NaN in the cache.
            mask = ((causal[None] & valid[:, None, :]) | torch.eye(width, dtype=torch.bool, device=dev)[None])[:, None]
        cache = DynamicCache(config=self.model.config)
        logits = self._forward(self.slot, ids, mask, position, cache=cache)
        self.stats["prefill_tokens"] += n * width
        return logits, cache

    def _sampling_plan(self) -> tuple:
        """Per-row temperature / top_p tensors and which rows draw noise from where (kept until rows change)."""
        if self._plan is None:
            rows = self.rows
            temps = [r.temperature if r is not None and r.temperature > 0 else 0.0 for r in rows]
            top_p = [r.top_p if r is not None and r.temperature > 0 else 1.0 for r in rows]
            own = [(i, r.generator) for i, r in enumerate(rows) if r is not None and r.temperature > 0
                   and r.generator is not None]
            shared = any(r is not None and r.temperature > 0 and r.generator is None for r in rows)
            uniform = len(set(temps)) == 1
            dev = self.device
            self._plan = (torch.tensor(temps, device=dev)[:, None], torch.tensor(top_p, device=dev),
                          min(top_p) < 1.0, own, shared, torch.tensor(temps, device=dev) > 0, uniform, temps[0])
        return self._plan

    def _sample(self) -> None:
        temps, top_p, any_top_p, own, shared, sampled, uniform, t0 = self._sampling_plan()
        logits = self.logits.float()
        if not own and not shared:  # all greedy
            logp = torch.log_softmax(logits, dim=-1)
            tokens = logits.argmax(dim=-1)
        else:
            scale = t0 if uniform else torch.where(temps > 0, temps, torch.ones_like(temps))
            logp = torch.log_softmax(logits / scale, dim=-1)
            if any_top_p:
                logp = nucleus(logp, top_p)
            if shared:
                noise = gumbel(torch.rand(logp.shape, device=logp.device, generator=self.generator))
                if not uniform:
                    noise = noise * sampled[:, None]
            else:
                noise = torch.zeros_like(logp)
            if own:
                drawn = torch.stack([gumbel(torch.rand(logp.shape[-1], device=logp.device, generator=g))
                                     for _, g in own])
                noise[torch.tensor([i for i, _ in own], device=logp.device)] = drawn
            tokens = (logp + noise).argmax(dim=-1)
        self.feed = tokens
        self.window.append((tokens, logp.gather(1, tokens[:, None])[:, 0]))

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
            finished = False
            for tok, lp in zip(tokens[i], logprobs[i]):
                if not math.isfinite(lp):
                    r.error = FloatingPointError(
                        f"the model produced non-finite logits while sampling (row {i}, token {len(r.ids)}); "
                        "the weights have diverged: lower the learning rate or clip gradients harder")
                    finished = True
                    break
                r.ids.append(tok)
                r.logprobs.append(lp)
                if tok in stop:
                    r.stopped = finished = True
                    break
                if len(r.ids) >= r.max_new_tokens:
                    finished = True
                    break
            if finished:
                done.append(r)
                freed.append(i)
                self.rows[i] = None
        if freed:
            self.slot.mask[torch.tensor(freed, device=self.device)] = False
            self._plan = None
        return done
