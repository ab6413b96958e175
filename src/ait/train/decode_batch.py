"""Sampling one in-memory model for many threads at once, through the decoding engine.

    SamplingEngine   one worker thread owns the model and a Decoder (ait.train.decode); episodes'
                     requests queue up and are generated together: continuously (a request joins
                     the running batch at the next decode step and leaves when its reply ends) or
                     in static batches (requests waiting together decode until the longest ends:
                     the arrangement the continuous one is measured against); `refresh` swaps in
                     new weights once the running rows end

Policies that share a loaded model share its engine by being handed it (ait.cli.eval's policy
factory, the outer loop's EnginePolicy), so their episodes' replies are decoded together.

Each request brings its own torch.Generator: a reply depends on its seed and the weights, not
on which other requests shared its batch (a row draws noise only while it generates, so this
holds from turn to turn too). The recorded logprobs are exactly those of the distribution
sampled from: the model's logits at the sampling temperature, no top-k / top-p; greedy
(temperature 0) records logprobs at temperature 1.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from concurrent.futures import Future
from typing import Any

from ait.train.decode import Decoder, Request
from ait.train.decode_cache import bucket_batch
from ait.train.decode_prefix import PrefixStore


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every id that ends a reply: the tokenizer's eos and the generation config's."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    return ids


class SamplingEngine:
    """Owns the sampling model; one worker thread generates the queued requests of all threads."""

    def __init__(self, model: Any, tokenizer: Any, max_batch: int = 16, version: int = 0, continuous: bool = True,
                 cuda_graphs: bool | None = None, own_stream: bool = False, prefix_cache_gib: float = 0.0):
        """`own_stream`: on a GPU, decode on a high-priority CUDA stream of the engine's own. On the default
        stream, which every thread shares, each decode step queues behind whatever another thread of the
        process enqueued there first (the outer loop's training step: tens of seconds of kernels).
        `prefix_cache_gib`: host memory for the KV of ended replies, so that a conversation's next call
        prefills only its new tokens (ait.train.decode_prefix); 0: every prompt is prefilled whole."""
        self.model, self.tokenizer, self.max_batch = model, tokenizer, max_batch
        self.stream = None
        device = getattr(model, "device", None)
        if own_stream and device is not None and getattr(device, "type", "") == "cuda":
            import torch

            self.stream = torch.cuda.Stream(device=device, priority=-1)  # -1: the highest priority there is
            self.stream.wait_stream(torch.cuda.current_stream(device))  # the weights as loaded
        self.continuous = continuous
        self.version = version
        """Optimizer steps of the weights being sampled from."""
        stop = eos_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stop)
        # A continuous engine keeps one rows bucket (its max batch) and doubles its cache length when it
        # must grow: few shapes, so few CUDA graphs to capture.
        if prefix_cache_gib < 0:
            raise ValueError(f"prefix_cache_gib must be >= 0, got {prefix_cache_gib}")
        self.prefixes = PrefixStore(int(prefix_cache_gib * 2**30)) if prefix_cache_gib > 0 else None
        self.decoder = Decoder(model, stop_ids=stop, pad_id=self.pad_id, cuda_graphs=cuda_graphs, max_batch=max_batch,
                               min_rows=bucket_batch(max_batch) if continuous else 1, geometric=continuous,
                               prefixes=self.prefixes)
        self.tokenizer_lock = threading.Lock()  # a fast tokenizer is not safe to call from several threads at once
        self.cond = threading.Condition()  # guards pending, active, paused, closing
        self.pending: collections.deque[Request] = collections.deque()
        self.active = 0       # requests handed to the decoder and not finished
        self.paused = False   # a weight swap waits: admit nothing until the running rows finish
        self.closing = False
        self.batches = 0      # groups of requests admitted together (each one prefill)
        self.tokens = 0
        self._worker = threading.Thread(target=self._run, name="ait-sampler", daemon=True)
        self._worker.start()

    def counters(self) -> dict[str, int]:
        """Running totals since the engine started: prompt tokens prefilled, prompt tokens served from stored
        prefixes instead (ait.train.decode_prefix) and tokens generated. A step's share is two readings' difference."""
        reused = self.prefixes.stats["tokens_reused"] if self.prefixes is not None else 0
        return {"prefill_tokens": self.decoder.stats["prefill_tokens"], "prefix_tokens_reused": reused,
                "generated_tokens": self.tokens}

    @property
    def stop_ids(self) -> set[int]:
        return set(self.decoder.stop_ids)

    @stop_ids.setter
    def stop_ids(self, ids: set[int]) -> None:
        self.decoder.stop_ids = sorted(ids)

    def sample(self, prompt_ids: list[int], temperature: float, max_new_tokens: int,
               generator: Any) -> tuple[list[int], list[float]]:
        if max_new_tokens <= 0:
            return [], []
        request = Request(list(prompt_ids), max_new_tokens, temperature, generator=generator, tag=Future())
        with self.cond:
            if self.closing:
                raise RuntimeError("the sampling engine is closed")
            self.pending.append(request)
            self.cond.notify_all()
        return request.tag.result()

    def refresh(self, update: Any, version: int) -> None:
        """Swap in new weights: `update(model)` copies them in place once no reply is being generated
        (the running rows finish on the weights they started with; new requests wait). In place:
        captured CUDA graphs read the same tensors."""
        with self.cond:
            self.paused = True
            self.cond.wait_for(lambda: self.active == 0)
            try:
                with self._after_sampling():
                    update(self.model)
                if self.prefixes is not None:
                    self.prefixes.clear()  # their KV came from the old weights
                self.version = version
            finally:
                self.paused = False
                self.cond.notify_all()

    def close(self) -> None:
        """Serve what is queued, then stop the worker, and wait for it: a worker still inside a torch op
        when the interpreter exits aborts the process ("terminate called without an active exception")."""
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        if threading.current_thread() is not self._worker:
            self._worker.join()

    @contextlib.contextmanager
    def _after_sampling(self):
        """The caller's stream waits for the engine's queued work, and the engine's for what the caller
        enqueued meanwhile (new weights copied in place)."""
        if self.stream is None:
            yield
            return
        import torch

        torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)
        yield
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))

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

    def _run(self) -> None:
        if self.stream is None:
            return self._loop()
        import torch

        with torch.cuda.stream(self.stream):
            return self._loop()

    def _loop(self) -> None:
        dec = self.decoder
        while True:
            if self.continuous:
                room = self.max_batch - dec.live - len(dec.waiting)
            else:
                room = 0 if dec.busy else self.max_batch
            new = self._take(room)
            if new is None:
                return
            try:
                if new:
                    dec.submit(new)
                    self.batches += 1
                done = dec.step() if dec.busy else []
            except BaseException as e:  # noqa: BLE001 - each waiting request sees the error
                failed = [r for r in dec.requests() if not r.tag.done()]
                dec.abort()
                for r in failed:
                    r.tag.set_exception(e)
                self._finished(len(failed))
                continue
            for r in done:  # handed out before the next forward pass: an error there cannot lose them
                if r.error is not None:
                    r.tag.set_exception(r.error)
                else:
                    self.tokens += len(r.ids)
                    r.tag.set_result((r.ids, r.logprobs))
            if done:
                self._finished(len(done))
