"""Fast batched sampling for small models: a static KV cache, and CUDA graphs on a GPU.

Why not `model.generate`: for a 100M–1B model a decode step is a few hundred tiny kernels,
so the GPU waits on Python (logits processors, stopping criteria, dynamic cache growth).
Here one decode step is a fixed-shape forward over a preallocated cache, captured once
per (batch, cache length) as a CUDA graph and replayed; sampling is a handful of kernels
outside the graph. On CPU the same code runs eagerly (tests exercise the same masks,
positions and cache bookkeeping as the GPU path).

Rows are left-padded. Attention uses an explicit boolean 4D mask (transformers passes 4D
masks through untouched), so the graph never takes a data-dependent branch.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

CACHE_BUCKET = 128   # cache lengths are rounded up to a multiple of this: fewer graphs to capture
CHECK_EVERY = 8      # decode steps between "all rows finished?" checks (each check is a GPU sync)
KEEP_GRAPHS = 3      # (batch, cache length) shapes kept alive: each holds a KV cache


@dataclass
class Sample:
    ids: list[int]
    """Sampled tokens, the stop token included when one was hit."""
    logprobs: list[float] = field(default_factory=list)
    """Log-probability of each token under the distribution it was drawn from (temperature applied;
    at temperature 0, under the untempered distribution)."""
    stopped: bool = False
    """Ended on a stop token (False: ran out of new tokens)."""


def bucket_batch(n: int) -> int:
    """Batch sizes are padded to 1, 2, 4, 8, 16, then multiples of 16: few distinct graphs."""
    if n <= 16:
        return 1 << (n - 1).bit_length()
    return -(-n // 16) * 16


def sample_tokens(logits: torch.Tensor, temperature: float, top_p: float,
                  generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, logprobs) for one step. Greedy when temperature is 0.

    Sampling is Gumbel-max (argmax of logprobs plus Gumbel noise), which draws exactly from
    the softmax; unlike torch.multinomial it cannot trip a device-side assert on a bad row,
    so non-finite logits surface as a clear error after the call (see Decoder)."""
    logits = logits.float()
    if temperature <= 0:
        tokens = logits.argmax(dim=-1)
        return tokens, torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_lp, order = logprobs.sort(dim=-1, descending=True)
        sorted_p = sorted_lp.exp()
        drop = sorted_p.cumsum(dim=-1) - sorted_p > top_p  # keep the smallest prefix reaching top_p
        sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
        logprobs = torch.full_like(logprobs, float("-inf")).scatter_(1, order, sorted_lp)
        logprobs = torch.log_softmax(logprobs, dim=-1)  # renormalise over the nucleus
    uniform = torch.rand(logprobs.shape, device=logprobs.device, generator=generator).clamp_(1e-20, 1.0)
    tokens = (logprobs - torch.log(-torch.log(uniform))).argmax(dim=-1)
    return tokens, logprobs.gather(1, tokens[:, None])[:, 0]


def cache_kwarg(model) -> str:
    """The forward's name for the KV cache: `cache` in recent transformers, `past_key_values` before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


class _Slot:
    """Static buffers (and on CUDA the captured graph) for one (batch, cache length) shape."""

    def __init__(self, model, batch: int, cache_len: int, device: torch.device):
        from transformers import StaticCache

        self.batch, self.cache_len = batch, cache_len
        self.cache = StaticCache(config=model.config, max_cache_len=cache_len)
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.position = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.mask = torch.zeros(batch, 1, 1, cache_len, dtype=torch.bool, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def set_length(self, n: int) -> None:
        """Point every cache layer's write position at n (the cache is otherwise reused as is)."""
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False):
                layer.cumulative_length.fill_(n)


class Decoder:
    """Batched sampling from a causal LM (any transformers model that takes a StaticCache).

    `generate(prompts, max_new_tokens, temperature)` -> one Sample per prompt. The model is
    used in place: weights updated by an optimizer between calls are seen by the next call
    (parameters are updated in place, so captured graphs stay valid)."""

    def __init__(self, model, *, stop_ids: list[int], pad_id: int, cuda_graphs: bool | None = None,
                 max_batch: int = 256):
        self.model = model
        self.device = next(model.parameters()).device
        self.stop_ids = sorted(set(stop_ids))
        self.pad_id = pad_id
        self.cuda_graphs = (self.device.type == "cuda") if cuda_graphs is None else cuda_graphs
        self.max_batch = max_batch
        self.slots: OrderedDict[tuple[int, int], _Slot] = OrderedDict()
        self.stats = {"graphs_captured": 0, "decode_steps": 0, "prefill_tokens": 0}
        self.cache_kwarg = cache_kwarg(model)

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, generator: torch.Generator | None = None) -> list[Sample]:
        out: list[Sample] = []
        for start in range(0, len(prompts), self.max_batch):
            out += self._generate(prompts[start:start + self.max_batch], max_new_tokens, temperature, top_p, generator)
        return out

    def _slot(self, batch: int, cache_len: int) -> _Slot:
        key = (batch, cache_len)
        if key in self.slots:
            self.slots.move_to_end(key)
            return self.slots[key]
        while len(self.slots) >= KEEP_GRAPHS:
            self.slots.popitem(last=False)
        slot = self.slots[key] = _Slot(self.model, batch, cache_len, self.device)
        return slot

    def _forward(self, slot: _Slot, input_ids, mask, position) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position, use_cache=True,
                         logits_to_keep=1, **{self.cache_kwarg: slot.cache})
        return out.logits[:, -1, :]

    def _capture(self, slot: _Slot, length: int) -> None:
        """Record one decode step as a CUDA graph. Warm-up runs write garbage KV at positions
        length.., which the real steps overwrite; the write position is reset afterwards."""
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
        slot.set_length(length)
        self.stats["graphs_captured"] += 1

    @torch.no_grad()
    def _generate(self, prompts, max_new_tokens, temperature, top_p, generator) -> list[Sample]:
        n = len(prompts)
        if n == 0:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        batch = bucket_batch(n)
        length = max(len(p) for p in prompts)
        # +2: the CUDA-graph warm-up writes two positions past the prompt before the real steps.
        cache_len = -(-(length + max_new_tokens + 2) // CACHE_BUCKET) * CACHE_BUCKET
        slot = self._slot(batch, cache_len)
        dev = self.device

        # Prefill (eager): left-padded rows; dummy rows for the batch padding repeat prompt 0.
        rows = list(prompts) + [prompts[0]] * (batch - n)
        ids = torch.full((batch, length), self.pad_id, dtype=torch.long)
        valid = torch.zeros(batch, length, dtype=torch.bool)
        for i, p in enumerate(rows):
            ids[i, length - len(p):] = torch.tensor(p, dtype=torch.long)
            valid[i, length - len(p):] = True
        ids, valid = ids.to(dev), valid.to(dev)
        causal = torch.ones(length, length, dtype=torch.bool, device=dev).tril()
        # Padded query rows attend to themselves only: an all-masked row would put NaN in the cache.
        prefill_mask = (causal[None] & valid[:, None, :]) | torch.eye(length, dtype=torch.bool, device=dev)[None]
        mask4d = torch.zeros(batch, 1, length, cache_len, dtype=torch.bool, device=dev)
        mask4d[:, 0, :, :length] = prefill_mask
        position = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
        slot.set_length(0)
        logits = self._forward(slot, ids, mask4d, position)
        self.stats["prefill_tokens"] += int(batch * length)

        slot.mask.zero_()
        slot.mask[:, 0, 0, :length] = valid
        slot.position.copy_(valid.long().sum(dim=1, keepdim=True))  # next position of each row
        if self.cuda_graphs and slot.graph is None:
            slot.set_length(length)
            self._capture(slot, length)

        stop = torch.tensor(self.stop_ids, device=dev)
        tokens_out = torch.full((batch, max_new_tokens), self.pad_id, dtype=torch.long, device=dev)
        logprobs_out = torch.zeros(batch, max_new_tokens, device=dev)
        live = torch.zeros(batch, max_new_tokens, dtype=torch.bool, device=dev)  # row still generating at step t
        finished = torch.zeros(batch, dtype=torch.bool, device=dev)
        finished[n:] = True
        steps = 0
        for t in range(max_new_tokens):
            token, logprob = sample_tokens(logits, temperature, top_p, generator)
            live[:, t] = ~finished
            token = torch.where(finished, torch.full_like(token, self.pad_id), token)
            tokens_out[:, t] = token
            logprobs_out[:, t] = logprob
            finished |= torch.isin(token, stop)
            steps = t + 1
            if t + 1 == max_new_tokens or ((t + 1) % CHECK_EVERY == 0 and bool(finished.all())):
                break
            # Next step: feed the token at position `position`, cache slot length + t.
            slot.token[:, 0] = token
            slot.mask[:, 0, 0, length + t] = True
            if slot.graph is not None:
                slot.graph.replay()
                logits = slot.logits
            else:
                logits = self._forward(slot, slot.token, slot.mask, slot.position)
            slot.position += 1
        self.stats["decode_steps"] += steps

        produced = logprobs_out[:n, :steps]
        bad = ~torch.isfinite(produced) & live[:n, :steps]
        if bool(bad.any()):
            row, col = (int(x) for x in bad.nonzero()[0])
            raise FloatingPointError(f"the model produced non-finite logits while sampling (row {row}, token {col}); "
                                     "the weights have diverged: lower the learning rate or clip gradients harder")
        out = []
        tokens_cpu, logprobs_cpu = tokens_out[:n, :steps].tolist(), produced.tolist()
        stop_set = set(self.stop_ids)
        for ids_row, lp_row in zip(tokens_cpu, logprobs_cpu):
            cut = next((i + 1 for i, tok in enumerate(ids_row) if tok in stop_set), None)
            end = cut if cut is not None else len(ids_row)
            out.append(Sample(ids=ids_row[:end], logprobs=lp_row[:end], stopped=cut is not None))
        return out
