"""Sampling the agent for many concurrent episodes from one in-memory model.

    SamplingEngine   one thread owns the sampling model; episodes' requests queue up and are
                     generated together: continuously (a request joins the running batch at the
                     next decode step and leaves when its reply ends; ait.outer.batching) or in
                     static batches; `refresh` swaps in new weights once the running rows end
    EnginePolicy     an HFPolicy (render, fit, parse, TokenTrace) whose `sample` goes through
                     the engine, with its own seeded generator: an episode's replies depend on
                     its seed and the weights, not on which other episodes shared its batch
                     (a row draws from its generator only while it generates, so this holds
                     from turn to turn too)

The decode loop is written out rather than `model.generate` so that each row draws from its
own generator (Gumbel-max: argmax(logp + Gumbel noise) is an exact sample of softmax(logp)),
and the recorded logprobs are exactly those of the distribution sampled from: the model's
logits at the sampling temperature, no top-k / top-p. Greedy (temperature 0) records
logprobs at temperature 1, as HFPolicy does.
"""

from __future__ import annotations

import collections
import threading
import warnings
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ait.policy.hf_policy import HFPolicy
from ait.spec import TaskSpec

# transformers >= 5.24 renames the cache argument; the older name still works (the GPU image has 5.17).
warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated", category=FutureWarning)


@dataclass
class Request:
    prompt_ids: list[int]
    temperature: float
    max_new_tokens: int
    generator: Any
    future: Future = field(default_factory=Future)


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every id that ends a reply: the tokenizer's eos and the generation config's."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    return ids


def generate_batch(model: Any, requests: list[Request], pad_id: int, stop_ids: set[int]) -> list[tuple[list[int], list[float]]]:
    """Sample each request's reply (one temperature across the batch; a row ends at a stop token or its
    own max_new_tokens, the batch when its last row ends); returns
    (ids, logprobs) per request, the end-of-turn token included when sampled."""
    import torch
    from transformers import DynamicCache

    device = model.device
    temperature, max_new = requests[0].temperature, max(r.max_new_tokens for r in requests)
    width = max(len(r.prompt_ids) for r in requests)
    rows = len(requests)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((rows, width), dtype=torch.long, device=device)
    for i, r in enumerate(requests):
        input_ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids, device=device)
        mask[i, width - len(r.prompt_ids):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out_ids: list[list[int]] = [[] for _ in requests]
    live = [True] * rows  # still generating: not stopped yet
    chosen_steps = []  # each step's sampled-token logprobs, left on the device until the end
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        logits = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                       use_cache=True, logits_to_keep=1).logits[:, -1].float()
        idle = None
        for _ in range(max_new):
            logp = torch.log_softmax(logits / temperature if temperature > 0 else logits, dim=-1)
            if temperature > 0:
                # A row draws from its generator only while it generates, so the generator's state after the
                # reply depends on the reply alone, not on how long its batch-mates went on.
                if idle is None:
                    idle = torch.full((logp.shape[-1],), 0.5, device=device)
                noise = torch.stack([torch.rand(logp.shape[-1], generator=r.generator, device=device) if on else idle
                                     for r, on in zip(requests, live)])
                gumbel = -torch.log(-torch.log(noise.clamp(min=1e-20, max=1.0 - 1e-7)))
                nxt = torch.argmax(logp + gumbel, dim=-1)
            else:
                nxt = torch.argmax(logp, dim=-1)
            chosen_steps.append(logp.gather(1, nxt[:, None])[:, 0])
            for i, tok in enumerate(nxt.tolist()):  # the step's one wait for the device
                if live[i]:
                    out_ids[i].append(tok)
                    live[i] = tok not in stop_ids and len(out_ids[i]) < requests[i].max_new_tokens
            if not any(live):
                break
            mask = torch.cat([mask, torch.ones((rows, 1), dtype=mask.dtype, device=device)], dim=1)
            positions = positions[:, -1:] + 1
            logits = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=positions,
                           past_key_values=cache, use_cache=True).logits[:, -1].float()
        chosen = torch.stack(chosen_steps, dim=1).tolist() if chosen_steps else [[] for _ in requests]
    return [(ids, lp[:len(ids)]) for ids, lp in zip(out_ids, chosen)]


class SamplingEngine:
    """Owns the sampling model; one worker thread generates the queued requests of all episodes.

    continuous (the default): a running batch (ait.outer.batching) that a request joins at the next
    decode step and leaves as soon as its reply ends; static: requests waiting together are
    generated as one batch until its longest reply ends (generate_batch), the arrangement the
    continuous one is measured against (bench/outer_continuous_batching.py)."""

    def __init__(self, model: Any, tokenizer: Any, max_batch: int = 16, version: int = 0, continuous: bool = True):
        self.model, self.tokenizer, self.max_batch = model, tokenizer, max_batch
        self.continuous = continuous
        self.version = version
        """Optimizer steps of the weights being sampled from."""
        self.stop_ids = eos_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.stop_ids)
        self.tokenizer_lock = threading.Lock()  # a fast tokenizer is not safe to call from several threads at once
        self.cond = threading.Condition()  # guards pending, active, paused, closing
        self.pending: collections.deque[Request] = collections.deque()
        self.active = 0       # rows being generated
        self.paused = False   # a weight swap waits: admit nothing until the running rows finish
        self.closing = False
        self.batches = 0      # prefills (a batch of requests that started together)
        self.tokens = 0
        self._worker = threading.Thread(target=self._run_continuous if continuous else self._run_static,
                                        name="ait-sampler", daemon=True)
        self._worker.start()

    def sample(self, prompt_ids: list[int], temperature: float, max_new_tokens: int,
               generator: Any) -> tuple[list[int], list[float]]:
        request = Request(list(prompt_ids), temperature, max_new_tokens, generator)
        with self.cond:
            if self.closing:
                raise RuntimeError("the sampling engine is closed")
            self.pending.append(request)
            self.cond.notify_all()
        return request.future.result()

    def refresh(self, update: Any, version: int) -> None:
        """Swap in new weights: `update(model)` copies them in place once no reply is being generated
        (the running rows finish on the weights they started with; new requests wait)."""
        with self.cond:
            self.paused = True
            self.cond.wait_for(lambda: self.active == 0)
            try:
                update(self.model)
                self.version = version
            finally:
                self.paused = False
                self.cond.notify_all()

    def close(self) -> None:
        """Serve what is queued, then stop the worker."""
        with self.cond:
            self.closing = True
            self.cond.notify_all()

    def _take(self, room: int) -> list[Request] | None:
        """Wait for work; return up to `room` queued requests to start ([] while paused or full),
        or None when closed and drained. Marks them active before letting go of the lock."""
        with self.cond:
            self.cond.wait_for(lambda: self.closing or self.active or (self.pending and not self.paused))
            if self.closing and not self.active and not self.pending:
                return None
            taken = []
            while self.pending and not self.paused and len(taken) < room:
                taken.append(self.pending.popleft())
            self.active += len(taken)
            return taken

    def _finished(self, n: int) -> None:
        with self.cond:
            self.active -= n
            self.cond.notify_all()

    def _run_continuous(self) -> None:
        from ait.outer.batching import RunningBatch

        batch = RunningBatch(self.model, self.pad_id, self.stop_ids)
        while True:
            new = self._take(self.max_batch - len(batch))
            if new is None:
                return
            try:
                if new:
                    batch.admit(new)
                    self.batches += 1
                done = batch.sample_next() if len(batch) else []
                for row in done:  # handed out before the forward pass: an error there cannot lose them
                    self.tokens += len(row.ids)
                    row.request.future.set_result((row.ids, row.logprobs))
                if done:
                    self._finished(len(done))
                if len(batch):
                    batch.advance()
            except BaseException as e:  # noqa: BLE001 - each waiting episode sees the error
                in_batch = {id(r.request) for r in batch.rows}  # admit adds all of `new` or none
                failed = [r.request for r in batch.rows] + [r for r in new if id(r) not in in_batch]
                failed = [r for r in failed if not r.future.done()]  # replies handed out this step stand
                for r in failed:
                    r.future.set_exception(e)
                self._finished(len(failed))
                batch = RunningBatch(self.model, self.pad_id, self.stop_ids)

    def _run_static(self) -> None:
        while True:
            pending = self._take(self.max_batch)
            if pending is None:
                return
            by_key: dict[float, list[Request]] = {}
            for r in pending:
                by_key.setdefault(r.temperature, []).append(r)
            for batch in by_key.values():
                try:
                    results = generate_batch(self.model, batch, self.pad_id, self.stop_ids)
                except BaseException as e:  # noqa: BLE001 - each waiting episode sees the error
                    for r in batch:
                        r.future.set_exception(e)
                    self._finished(len(batch))
                    continue
                self.batches += 1
                for r, res in zip(batch, results):
                    self.tokens += len(res[0])
                    r.future.set_result(res)
                self._finished(len(batch))


class EnginePolicy(HFPolicy):
    """An HFPolicy for one episode, sampling through a shared engine with its own seed."""

    def __init__(self, engine: SamplingEngine, model_name: str, *, temperature: float, max_new_tokens: int,
                 seed: int, max_context: int | None = None):
        super().__init__(model_name, temperature=temperature, max_new_tokens=max_new_tokens,
                         max_context=max_context, seed=seed, loaded=(engine.model, engine.tokenizer))
        self.engine = engine
        self.settings["engine_version"] = engine.version

    def reset(self, spec: TaskSpec) -> None:
        import torch

        self.turn = 0
        self.generator = torch.Generator(device=self.engine.model.device)
        self.generator.manual_seed(int(self.seed or 0))

    def render(self, messages, tools):
        with self.engine.tokenizer_lock:
            return super().render(messages, tools)

    def parse(self, prompt_ids, ids, tools):
        with self.engine.tokenizer_lock:
            return super().parse(prompt_ids, ids, tools)

    def sample(self, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
        if not hasattr(self, "generator"):
            self.reset(None)  # type: ignore[arg-type]
        return self.engine.sample(prompt_ids, self.temperature, self.max_new_tokens, self.generator)
