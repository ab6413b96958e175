"""Continuous batching for the agent sampler: requests join and leave a running decode batch.

A static batch (ait.outer.sampler.generate_batch) decodes until its longest reply ends, so at
every turn each episode waits for the slowest one: on the H200 arc a 10-token reply waited 42 s
behind another episode's env.py, and every turn took as long as its longest reply. Here a row
that finishes leaves the batch at once (its episode goes on to run its tool call), and a waiting
request joins at the next decode step: it is prefilled on its own, then its KV cache and mask
are left-padded to the running batch's length and appended along the batch axis.

Each row samples exactly as in generate_batch: temperature applied to the logits, Gumbel-max
noise from the request's own generator drawn only while the row generates (so a reply depends
on its seed and the weights, not on its batch-mates), greedy rows record logprobs at
temperature 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Row:
    request: Any  # ait.outer.sampler.Request
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


def left_pad(t: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """`t` padded with zeros at the start of `dim` up to `length`."""
    missing = length - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


class RunningBatch:
    """The rows being decoded, their KV cache (a transformers DynamicCache), 2D attention mask,
    next positions and last logits. `admit` adds requests; `sample_next` samples one token per row
    and removes and returns the rows that finished; `advance` runs the forward pass for the rest."""

    def __init__(self, model: Any, pad_id: int, stop_ids: set[int]):
        self.model, self.pad_id, self.stop_ids = model, pad_id, stop_ids
        self.rows: list[Row] = []
        self.cache: Any = None
        self.mask: torch.Tensor | None = None       # [rows, length] 1 = a real token
        self.positions: torch.Tensor | None = None  # [rows, 1] the next token's position
        self.logits: torch.Tensor | None = None     # [rows, vocab] fp32, for the next token

    def __len__(self) -> int:
        return len(self.rows)

    @torch.inference_mode()
    def admit(self, requests: list[Any]) -> None:
        """Prefill `requests` together (left-padded) and add them to the running batch."""
        from transformers import DynamicCache

        device = self.model.device
        width = max(len(r.prompt_ids) for r in requests)
        ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for i, r in enumerate(requests):
            ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            mask[i, width - len(r.prompt_ids):] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                            use_cache=True, logits_to_keep=1).logits[:, -1].float()
        if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
            raise NotImplementedError("continuous batching needs a full-attention KV cache; this model has sliding-"
                                      "window layers: set [policy] continuous_batching = false")
        rows = [Row(r) for r in requests]
        if not self.rows:
            self.rows, self.cache, self.mask, self.logits = rows, cache, mask, logits
            self.positions = positions[:, -1:] + 1
            return
        length = max(self.mask.shape[1], width)
        self.mask = torch.cat([left_pad(self.mask, length, 1), left_pad(mask, length, 1)])
        for ours, new in zip(self.cache.layers, cache.layers):
            ours.keys = torch.cat([left_pad(ours.keys, length, 2), left_pad(new.keys, length, 2)])
            ours.values = torch.cat([left_pad(ours.values, length, 2), left_pad(new.values, length, 2)])
        self.positions = torch.cat([self.positions, positions[:, -1:] + 1])
        self.logits = torch.cat([self.logits, logits])
        self.rows += rows

    def step(self) -> list[Row]:
        """`sample_next`, then `advance` for the rows that go on; returns the rows that finished."""
        done = self.sample_next()
        if self.rows:
            self.advance()
        return done

    @torch.inference_mode()
    def sample_next(self) -> list[Row]:
        """Sample the next token of every row; remove and return the rows that finished. The engine
        hands those replies out before `advance`, so a failing forward pass cannot lose them."""
        device = self.logits.device
        temps = [r.request.temperature for r in self.rows]
        scale = torch.tensor([t if t > 0 else 1.0 for t in temps], device=device)
        logp = torch.log_softmax(self.logits / scale[:, None], dim=-1)
        sampled = [i for i, t in enumerate(temps) if t > 0]
        choice = logp.clone()
        if sampled:
            # Each row draws from its own generator, and only while it generates (see module docstring).
            noise = torch.stack([torch.rand(logp.shape[-1], generator=self.rows[i].request.generator, device=device)
                                 for i in sampled])
            choice[sampled] += -torch.log(-torch.log(noise.clamp(min=1e-20, max=1.0 - 1e-7)))
        nxt = torch.argmax(choice, dim=-1)
        chosen = logp.gather(1, nxt[:, None])[:, 0]
        finished, keep = [], []
        for i, (tok, lp) in enumerate(zip(nxt.tolist(), chosen.tolist())):  # the step's one wait for the device
            row = self.rows[i]
            row.ids.append(tok)
            row.logprobs.append(lp)
            done = tok in self.stop_ids or len(row.ids) >= row.request.max_new_tokens
            (finished if done else keep).append(i)
        done_rows = [self.rows[i] for i in finished]
        self.next_tokens = nxt[keep] if finished else nxt
        if finished:
            self._keep(keep)
        return done_rows

    @torch.inference_mode()
    def advance(self) -> None:
        """Feed each remaining row its sampled token: the logits of the next step."""
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.rows), 1))], dim=1)
        self.logits = self.model(input_ids=self.next_tokens[:, None], attention_mask=self.mask,
                                 position_ids=self.positions, past_key_values=self.cache,
                                 use_cache=True).logits[:, -1].float()
        self.positions = self.positions + 1

    def _keep(self, keep: list[int]) -> None:
        """Drop every row not in `keep`, and the leading cache columns no remaining row uses."""
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache = self.mask = self.positions = self.logits = None
            return
        index = torch.tensor(keep, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        start = int((mask.sum(dim=0) > 0).nonzero()[0])  # columns before this are padding in every row
        self.mask = mask[:, start:]
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, start:]
            layer.values = layer.values.index_select(0, index)[:, :, start:]
        self.positions = self.positions.index_select(0, index)
        self.logits = self.logits.index_select(0, index)
