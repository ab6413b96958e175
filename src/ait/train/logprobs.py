"""Log-probabilities of chosen tokens without the whole vocabulary projection in memory at once.

Scoring a policy means logp(token | context) at every trained position: the model's output head
projects each position's hidden state onto the vocabulary, and a log-softmax normalises it. Projected
all at once, positions x vocab floats are held several times over (the logits, their float32 tempered
copy, the log-softmax kept for the backward pass and its gradient): 12 bytes each, 3.2 GiB for 1,766
positions of Qwen2.5's 152k vocabulary, a fifth of a 0.5B job's peak. Here the head runs a chunk of
positions at a time, and each chunk is recomputed in the backward pass instead of kept (activation
checkpointing), so only one chunk's projection is ever alive. The result equals the all-at-once one.

Used by the inner trainer (ait.train.fast_grpo.score_batch) and the outer loop's agent
(ait.outer.backends.loss.sequence_logprobs).
"""

from __future__ import annotations

from typing import Any

LOGIT_CHUNK_ELEMENTS = 2**26
"""Positions x vocab of one chunk: 441 positions of a 152k vocabulary, 256 MiB of float32 logits, about
0.8 GiB at its peak (12 bytes an element). The agent's training step, 5,000 targets of a 24,000-token
sequence on the 1.5B: 6.41 GiB above the weights chunked against 10.58 GiB at once, in the same time
(bench/agent_step_memory.py, docs/outer.md "Machine 4")."""


def target_logprobs(head: Any, hidden: Any, targets: Any, temperature: float = 1.0,
                    softcap: float | None = None, chunk_elements: int | None = None) -> Any:
    """log_softmax(head(hidden) / temperature)[targets], float32, one value per row of `hidden`
    ([N, hidden] -> [N]; `targets` [N] token ids). `softcap`: a final logit soft-capping (Gemma 2's
    final_logit_softcapping), applied before the temperature as the model's own forward does.
    `chunk_elements`: positions x vocab a chunk (None: LOGIT_CHUNK_ELEMENTS)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    t = temperature if temperature > 0 else 1.0

    def chunk(h: Any, want: Any) -> Any:
        logits = head(h).float()
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        return torch.log_softmax(logits / t, dim=-1).gather(1, want[:, None])[:, 0]

    size = max(1, (chunk_elements or LOGIT_CHUNK_ELEMENTS) // head.weight.shape[0])
    if hidden.shape[0] <= size:
        return chunk(hidden, targets)
    return torch.cat([checkpoint(chunk, hidden[s:s + size], targets[s:s + size], use_reentrant=False)
                      for s in range(0, hidden.shape[0], size)])


PLAIN_HEADS = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "starcoder2", "olmo2"})
"""Architectures whose causal-LM forward is the decoder's last hidden state through the output head (with
Gemma 2's soft-capping, softcap_of): their chosen-token logprobs can be computed from the two parts. Others
may scale their logits in the forward (Cohere's logit_scale, Granite's logits_scaling): they are scored
through the model's own forward."""


def plain_head(model: Any) -> bool:
    """Whether `model`'s logits are its output head applied to its decoder's hidden states (PLAIN_HEADS)."""
    return getattr(model.config, "model_type", None) in PLAIN_HEADS


def softcap_of(model: Any) -> float | None:
    """The model's final logit soft-capping (Gemma 2), which its forward applies after the head."""
    return getattr(model.config, "final_logit_softcapping", None)
