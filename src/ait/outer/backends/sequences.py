"""Training sequences: an episode's turns, merged where each prompt extends the last sequence.

Turn k's prompt usually is turn k-1's prompt + reply + the new observation (the tool result,
the harness's message): the conversation only grows. Forwarding each turn on its own then
re-reads the whole history every turn, O(T²) tokens for T turns. When turn k's prompt starts
with the previous turn's prompt + completion tokens exactly, both turns are one sequence

    prompt₁ completion₁ observation₂ completion₂ observation₃ completion₃ ...

with the sampled (completion) tokens trained on and everything else context, as
tinker-cookbook's RL data processing does. The loss is unchanged: a causal model gives each
completion token the same logprob in the merged sequence as in its own turn (same tokens
before it, same positions), and the loss is a sum over completion tokens.

A prompt that does not extend the sequence starts a new one. That happens whenever the history
is not re-rendered token for token: the chat template drops an earlier reply's `<think>` block,
the policy shortened an older tool result to fit the context, or a sampled reply's tokens are
not the tokenization its re-rendered text gets (a reply cut at max_new_tokens, an odd split).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ait.outer.types import Turn


@dataclass
class Sequence:
    """One forward pass of the trainer: tokens, and where in them the sampled tokens are."""

    tokens: list[int] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)
    """Positions in `tokens` of the sampled tokens that are trained on, ascending, each > 0 (a
    token at position 0 has no context to be predicted from)."""
    logprobs: list[float] = field(default_factory=list)
    """The sampling logprob of each target token (the importance-sampling denominator)."""
    turns: int = 0
    """Assistant turns merged into this sequence."""


def extends(prompt: list[int], tokens: list[int]) -> bool:
    """The prompt is `tokens` followed by zero or more new tokens."""
    return len(prompt) >= len(tokens) and prompt[:len(tokens)] == tokens


def merge_turns(turns: list[Turn], *, merge: bool = True) -> list[Sequence]:
    """The turns with a completion as training sequences: consecutive turns share one while each
    prompt extends the sequence so far, else a new one starts. `merge=False`: one per turn (the
    layout before turns were merged; bench/outer_step_tokens.py compares the two). Turns with an
    empty completion are skipped: their prompt's tokens reach the next turn's prompt anyway."""
    out: list[Sequence] = []
    for turn in turns:
        if not turn.completion_ids:
            continue
        if not (merge and out and extends(turn.prompt_ids, out[-1].tokens)):
            out.append(Sequence())
        seq = out[-1]
        seq.tokens.extend(turn.prompt_ids[len(seq.tokens):])  # the new observation (all of it, when new)
        start = len(seq.tokens)
        seq.tokens.extend(turn.completion_ids)
        for i, logprob in enumerate(turn.logprobs):
            if start + i > 0:
                seq.targets.append(start + i)
                seq.logprobs.append(logprob)
        seq.turns += 1
    return out


def completion_tokens(turns: list[Turn]) -> int:
    """Sampled tokens of the turns: the loss's normaliser (its token mean), merged or not."""
    return sum(len(turn.completion_ids) for turn in turns)
