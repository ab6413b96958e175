"""The outer loop's losses, as Tinker defines them, on one sequence: an assistant turn, or an
episode's turns merged into one sequence (ait.outer.backends.sequences).

    importance_sampling   per completion token t:  −exp(logp_θ(t) − logp_sampled(t)) · A
                          summed over the batch's completion tokens, divided by their number

Only completion tokens enter: the prompt (system prompt, task, earlier turns, tool results)
is context for the forward pass and gets no loss of its own. When the weights equal the
sampling weights the ratio is 1 and the gradient is the plain policy gradient A·∇logp_θ;
when the sampler was a few steps behind, the ratio corrects for it (no clipping: Tinker's
`importance_sampling` does not clip either).

    nll                   −Σ logp_θ(t) over completion tokens (supervised warm start)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ait.outer.backends.sequences import Sequence


LOGIT_CHUNK_ELEMENTS = 2**26
"""Vocabulary-projection chunk: positions x vocab stays under this (441 positions of a 152k vocabulary,
256 MiB of float32 logits), so a sequence's logits are never all in memory at once. Unchunked, 5,000
target positions on a 152k vocabulary held about 12 GiB at once in the backward pass (the float32
logits, their tempered copy, the log-softmax and its gradient): the agent's peak, which the packed inner
jobs cannot use. A chunk's peak is about 12 bytes x positions x vocab, 0.8 GiB here."""


def completion_logprobs(model: Any, prompt_ids: list[int], completion_ids: list[int],
                        temperature: float = 1.0) -> Any:
    """logp_θ of each completion token given everything before it, at the sampling temperature
    (0 = greedy: temperature 1, as the sampler records it). A 1-D float32 tensor with grad."""
    start = len(prompt_ids)
    return sequence_logprobs(model, list(prompt_ids) + list(completion_ids),
                             list(range(start, start + len(completion_ids))), temperature)


def sequence_logprobs(model: Any, tokens: list[int], targets: list[int], temperature: float = 1.0,
                      chunk_elements: int = LOGIT_CHUNK_ELEMENTS) -> Any:
    """logp_θ of tokens[p] given tokens[:p] for each position p in `targets` (each > 0), at the
    sampling temperature (0 = greedy: temperature 1). One forward pass of the model's body over the
    whole sequence; the vocabulary projection only at the positions that predict a target
    (observation tokens of a merged sequence need none), a chunk of positions at a time, each
    recomputed in the backward pass instead of kept (activation checkpointing). A 1-D float32 tensor
    with grad, equal to projecting every position at once."""
    import torch
    from torch.utils.checkpoint import checkpoint

    if not targets:
        return torch.zeros(0, device=model.device)
    if min(targets) < 1 or max(targets) >= len(tokens):
        raise ValueError(f"targets must lie in 1..{len(tokens) - 1} (a token with context before it), "
                         f"got {min(targets)}..{max(targets)}")
    ids = torch.tensor([list(tokens)], device=model.device)
    at = torch.tensor([p - 1 for p in targets], device=model.device)  # the positions that predict them
    wanted = ids[0, at + 1]
    head, body = model.get_output_embeddings(), model.get_decoder()
    hidden = body(input_ids=ids).last_hidden_state[0, at]
    softcap = getattr(model.config, "final_logit_softcapping", None)  # Gemma 2's, applied as its forward does
    t = temperature if temperature > 0 else 1.0

    def chunk_logprobs(h: Any, want: Any) -> Any:
        logits = head(h).float()
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        return torch.log_softmax(logits / t, dim=-1).gather(1, want[:, None])[:, 0]

    size = max(1, chunk_elements // head.weight.shape[0])
    if len(targets) <= size:
        return chunk_logprobs(hidden, wanted)
    return torch.cat([checkpoint(chunk_logprobs, hidden[s:s + size], wanted[s:s + size], use_reentrant=False)
                      for s in range(0, len(targets), size)])


def importance_sampling_backward(model: Any, batch: list[tuple[Sequence, float]], tokens: int,
                                 temperature: float) -> tuple[float, float, int]:
    """Accumulate the gradient of Σ_sequences importance_sampling_loss / `tokens` (the batch's
    completion tokens: a token mean however the turns were grouped into sequences), one forward and
    backward pass per (sequence, advantage). Returns (loss, Σ (logp_sampled − logp_θ), targets):
    the drift between sampler and learner, summed over the trained tokens."""
    import torch

    loss_total, drift, n = 0.0, 0.0, 0
    for seq, advantage in batch:
        if not seq.targets:  # one sampled token with no context before it: nothing to predict
            continue
        logp = sequence_logprobs(model, seq.tokens, seq.targets, temperature)
        loss = importance_sampling_loss(logp, seq.logprobs, advantage) / tokens
        loss.backward()
        loss_total += float(loss.detach())
        drift += float((torch.tensor(seq.logprobs, device=logp.device) - logp.detach()).sum())
        n += len(seq.targets)
    return loss_total, drift, n


def importance_sampling_loss(logp_new: Any, logp_sampled: Any, advantage: float) -> Any:
    """−Σ_t exp(logp_new − logp_sampled)·A over one sequence's completion tokens (the caller divides
    by the batch's completion-token count)."""
    import torch

    old = torch.as_tensor(logp_sampled, dtype=logp_new.dtype, device=logp_new.device)
    ratio = torch.exp(logp_new - old)
    return -(ratio * advantage).sum()


def nll_loss(logp_new: Any) -> Any:
    """−Σ_t logp_new: supervised fine-tuning on the completion tokens."""
    return -logp_new.sum()
