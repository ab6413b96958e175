"""Turning the decoding engine's logits into tokens (ait.train.decode), and tokens into replies.

Each row has its own temperature (0: greedy, logprobs recorded at temperature 1), top_p and noise:
Gumbel-max (argmax(logp + Gumbel noise) is an exact sample of softmax(logp)) from the request's own
torch.Generator, drawn only while the row generates (so a reply depends on its seed and the weights,
never on its batch-mates), or, for requests without one, a single draw of the whole [rows, vocab]
block per step from the batch's generator (`Decoder.generate`). Unlike torch.multinomial, Gumbel-max
cannot trip a device-side assert on a bad row: non-finite logits surface as a clear error when the
tokens are read (`record`).
"""

from __future__ import annotations

import math

import torch


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


def sampling_plan(rows: list, device: torch.device) -> tuple:
    """Per-row temperature / top_p tensors and which rows draw noise from where, for the engine's rows
    (ait.train.decode.Request or None for a free row); the engine keeps it until its rows change."""
    temps = [r.temperature if r is not None and r.temperature > 0 else 0.0 for r in rows]
    top_p = [r.top_p if r is not None and r.temperature > 0 else 1.0 for r in rows]
    own = [(i, r.generator) for i, r in enumerate(rows) if r is not None and r.temperature > 0
           and r.generator is not None]
    shared = any(r is not None and r.temperature > 0 and r.generator is None for r in rows)
    uniform = len(set(temps)) == 1
    dev = device
    return (torch.tensor(temps, device=dev)[:, None], torch.tensor(top_p, device=dev),
            min(top_p) < 1.0, own, shared, torch.tensor(temps, device=dev) > 0, uniform, temps[0])


def sample_rows(logits: torch.Tensor, plan: tuple,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, their logprobs) for every row, each as its row's plan says; `generator`: the batch's."""
    temps, top_p, any_top_p, own, shared, sampled, uniform, t0 = plan
    logits = logits.float()
    if not own and not shared:  # all greedy
        logp = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
    else:
        scale = t0 if uniform else torch.where(temps > 0, temps, torch.ones_like(temps))
        logp = torch.log_softmax(logits / scale, dim=-1)
        if any_top_p:
            logp = nucleus(logp, top_p)
        if shared:
            noise = gumbel(torch.rand(logp.shape, device=logp.device, generator=generator))
            if not uniform:
                noise = noise * sampled[:, None]
        else:
            noise = torch.zeros_like(logp)
        if own:
            drawn = torch.stack([gumbel(torch.rand(logp.shape[-1], device=logp.device, generator=g))
                                 for _, g in own])
            noise[torch.tensor([i for i, _ in own], device=logp.device)] = drawn
        tokens = (logp + noise).argmax(dim=-1)
    return tokens, logp.gather(1, tokens[:, None])[:, 0]


def record(r, tokens: list[int], logprobs: list[float], stop, row: int) -> bool:
    """Append one row's tokens read from the device to its request (ait.train.decode.Request), up to
    a stop token or its limit; whether the request finished (a non-finite logprob finishes it with an
    error: the weights have diverged)."""
    for tok, lp in zip(tokens, logprobs):
        if not math.isfinite(lp):
            r.error = FloatingPointError(
                f"the model produced non-finite logits while sampling (row {row}, token {len(r.ids)}); "
                "the weights have diverged: lower the learning rate or clip gradients harder")
            return True
        r.ids.append(tok)
        r.logprobs.append(lp)
        if tok in stop:
            r.stopped = True
            return True
        if len(r.ids) >= r.max_new_tokens:
            return True
    return False
