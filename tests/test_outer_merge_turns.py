"""An episode's turns merged into one training sequence where each prompt extends the last
(ait.outer.backends.sequences): which turns merge, and, on the tiny model with a LoRA adapter,
that the merged forward gives every sampled token the logprob it gets in its own turn, so the
local backend's loss and gradient are those of the per-turn computation it replaced, with far
fewer tokens forwarded."""

from __future__ import annotations

import random

import pytest
import torch

from ait.outer.backends.local import LocalBackend
from ait.outer.backends.loss import (
    completion_logprobs,
    importance_sampling_backward,
    importance_sampling_loss,
    sequence_logprobs,
)
from ait.outer.backends.sequences import completion_tokens, merge_turns
from ait.outer.config import OuterConfig
from ait.outer.types import Trajectory, TrajectoryGroup, Turn

TEMPERATURE = 0.7


def traj(reward: float, turns: list[Turn]) -> Trajectory:
    return Trajectory(episode_id=f"e{reward}", task_id="t", family="calc_chain", turns=turns, reward=reward)


def test_turns_merge_while_each_prompt_extends_the_sequence() -> None:
    turns = [Turn(prompt_ids=[1, 2], completion_ids=[3, 4], logprobs=[-0.1, -0.2]),
             Turn(prompt_ids=[1, 2, 3, 4, 5], completion_ids=[], logprobs=[]),  # empty reply: skipped
             Turn(prompt_ids=[1, 2, 3, 4, 5, 6], completion_ids=[7], logprobs=[-0.3]),
             Turn(prompt_ids=[1, 2, 3, 4, 5, 6, 7], completion_ids=[8], logprobs=[-0.4]),  # no new observation
             Turn(prompt_ids=[1, 2, 9, 5], completion_ids=[10], logprobs=[-0.5]),  # history re-rendered: new
             Turn(prompt_ids=[1, 2, 9, 5, 10, 11], completion_ids=[12, 13], logprobs=[-0.6, -0.7])]
    first, second = merge_turns(turns)
    assert first.tokens == [1, 2, 3, 4, 5, 6, 7, 8] and first.turns == 3
    assert first.targets == [2, 3, 6, 7] and first.logprobs == [-0.1, -0.2, -0.3, -0.4]
    assert second.tokens == [1, 2, 9, 5, 10, 11, 12, 13] and second.turns == 2
    assert second.targets == [4, 6, 7] and second.logprobs == [-0.5, -0.6, -0.7]
    alone = merge_turns(turns, merge=False)  # the per-turn layout: each prompt + its reply
    assert [s.tokens for s in alone] == [t.prompt_ids + t.completion_ids for t in turns if t.completion_ids]
    assert sum(len(s.targets) for s in alone) == completion_tokens(turns) == 7
    # A first reply with no prompt: its first token has nothing before it and is not predicted.
    bare, = merge_turns([Turn(prompt_ids=[], completion_ids=[3, 4], logprobs=[-0.1, -0.2])])
    assert bare.targets == [1] and bare.logprobs == [-0.2]


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "grad-checkpointing"])
def backend(request) -> LocalBackend:
    config = OuterConfig(policy={"model": "tiny", "max_new_tokens": 12, "temperature": TEMPERATURE},
                         trainer={"learning_rate": 1e-3, "lora_r": 4, "lora_alpha": 8, "device": "cpu",
                                  "gradient_checkpointing": request.param})
    torch.manual_seed(0)
    b = LocalBackend(config)
    yield b
    b.close()


def episode(backend: LocalBackend, seed: int, turns: int = 5) -> list[Turn]:
    """Sampled turns with growing prompts: each prompt is the last prompt + reply + an observation
    (random tokens standing in for a tool result); the fourth re-renders the history (one earlier
    token changed), so that trajectory is two sequences."""
    rng = random.Random(seed)
    vocab = backend.model.config.vocab_size
    policy = backend.policy(seed=seed)
    prompt, out = [rng.randrange(vocab) for _ in range(20)], []
    for k in range(turns):
        if k == 3:
            prompt[5] = (prompt[5] + 1) % vocab
        ids, logprobs = policy.sample(prompt)
        out.append(Turn(prompt_ids=list(prompt), completion_ids=ids, logprobs=logprobs))
        prompt = prompt + ids + [rng.randrange(vocab) for _ in range(rng.randint(3, 9))]
    return out


def nudge(backend: LocalBackend) -> None:
    """Move the adapter off the sampler's weights: the importance ratio is no longer 1."""
    with torch.no_grad():
        for p in backend.params.values():
            p.add_(torch.randn_like(p) * 0.05)


def per_turn_backward(backend: LocalBackend, batch: list[tuple[Turn, float]], tokens: int) -> float:
    """The local step's loss as it was computed before turns were merged: one forward per turn."""
    total = 0.0
    for turn, adv in batch:
        logp = completion_logprobs(backend.model, turn.prompt_ids, turn.completion_ids, TEMPERATURE)
        loss = importance_sampling_loss(logp, turn.logprobs, adv) / tokens
        loss.backward()
        total += float(loss.detach())
    return total


def grads(backend: LocalBackend) -> list[torch.Tensor]:
    out = [q.grad.clone() for q in backend.params.values()]
    backend.optimizer.zero_grad(set_to_none=True)
    return out


def test_merged_sequences_give_the_per_turn_loss_and_gradient(backend: LocalBackend) -> None:
    good, bad = episode(backend, 1), episode(backend, 2)
    nudge(backend)
    merged = merge_turns(good)
    assert [s.turns for s in merged] == [3, 2]  # the re-rendered fourth prompt starts a second sequence
    # Every sampled token: the same logprob in the merged sequence as in its own turn.
    with torch.no_grad():
        for seq, turns in zip(merged, [good[:3], good[3:]]):
            alone = torch.cat([completion_logprobs(backend.model, t.prompt_ids, t.completion_ids, TEMPERATURE)
                               for t in turns])
            assert torch.allclose(sequence_logprobs(backend.model, seq.tokens, seq.targets, TEMPERATURE), alone,
                                  atol=1e-5)

    tokens = completion_tokens(good) + completion_tokens(bad)
    backend.model.train()
    reference = per_turn_backward(backend, [(t, 0.4) for t in good] + [(t, -0.4) for t in bad], tokens)
    g_ref = grads(backend)
    batch = [(s, 0.4) for s in merged] + [(s, -0.4) for s in merge_turns(bad)]
    loss, drift, n = importance_sampling_backward(backend.model, batch, tokens, TEMPERATURE)
    g_merged = grads(backend)
    backend.model.eval()
    assert n == tokens and abs(loss) > 1e-4  # the ratio is not 1: the loss has a value to compare
    assert loss == pytest.approx(reference, rel=1e-5, abs=3e-7)  # float32 sums of terms of both signs
    assert any(float(g.abs().max()) > 0 for g in g_ref)
    for a, b in zip(g_merged, g_ref):
        assert torch.allclose(a, b, atol=1e-7, rtol=1e-4)  # gradients up to ~0.04


def test_train_step_merged_is_the_per_turn_step_with_fewer_tokens(backend: LocalBackend) -> None:
    group = TrajectoryGroup(task_id="t", trajectories=[traj(0.7, episode(backend, 3)), traj(0.1, episode(backend, 4))],
                            policy_version=backend.step)
    nudge(backend)
    weights, optimizer = backend.adapter_state(), backend.optimizer.state_dict()
    step = backend.step
    before = backend.train_step([group], merge=False)
    with torch.no_grad():  # back to the same weights and optimizer state for the merged step
        for name, q in backend.params.items():
            q.copy_(weights[name])
    backend.optimizer.load_state_dict(optimizer)
    backend.step = step
    after = backend.train_step([group])
    assert before.tokens == after.tokens == before.extra["active_tokens"] == after.extra["active_tokens"]
    assert (before.datums, after.datums) == (10, 4) and before.extra["turns"] == after.extra["turns"] == 10
    assert after.loss == pytest.approx(before.loss, rel=1e-5, abs=3e-7)
    assert after.extra["grad_norm"] == pytest.approx(before.extra["grad_norm"], rel=1e-4)
    assert after.extra["kl_sample_train"] == pytest.approx(before.extra["kl_sample_train"], rel=1e-4, abs=1e-7)
    # Forwarded: the per-turn step re-reads each prompt; merged, each sequence once.
    per_turn = sum(len(t.prompt_ids) + len(t.completion_ids) for tr in group.trajectories for t in tr.turns)
    merged = sum(len(s.tokens) for tr in group.trajectories for s in merge_turns(tr.turns))
    assert before.extra["forward_tokens"] == per_turn and after.extra["forward_tokens"] == merged
    assert merged < 0.6 * per_turn  # 5 turns, 2 sequences per episode: about half


def test_chunked_vocabulary_projection_gives_the_full_projections_logprobs_and_gradient(backend: LocalBackend) -> None:
    """sequence_logprobs projects onto the vocabulary a chunk of positions at a time, each chunk recomputed
    in the backward pass (the agent's memory peak on a 152k vocabulary): the logprobs and the gradient are
    those of one projection of every position, as the model's own forward computes them."""
    seq = merge_turns(episode(backend, 5))[0]
    vocab = backend.model.get_output_embeddings().weight.shape[0]
    assert len(seq.targets) > 3  # three chunks of at most 2 positions at least
    nudge(backend)
    backend.model.train()

    def run(chunk_elements: int | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        if chunk_elements is None:  # the model's own forward: every kept position projected at once
            ids = torch.tensor([seq.tokens])
            keep = torch.tensor([p - 1 for p in seq.targets])
            logits = backend.model(input_ids=ids, logits_to_keep=keep).logits[0].float() / TEMPERATURE
            logp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, keep + 1][:, None])[:, 0]
        else:
            logp = sequence_logprobs(backend.model, seq.tokens, seq.targets, TEMPERATURE, chunk_elements)
        (logp * torch.linspace(-1, 1, len(logp))).sum().backward()  # every position's gradient weighs in
        return logp.detach(), grads(backend)

    full, g_full = run(None)
    one, g_one = run(10 * vocab * len(seq.targets))
    chunked, g_chunked = run(2 * vocab)
    backend.model.eval()
    assert torch.allclose(one, full, atol=1e-6) and torch.allclose(chunked, full, atol=1e-6)
    assert any(float(g.abs().max()) > 0 for g in g_full)
    for a, b, c in zip(g_chunked, g_one, g_full):  # float32 sums in another order: off by rounding only
        scale = float(c.abs().max())
        assert float((a - c).abs().max()) <= 1e-5 * scale and float((b - c).abs().max()) <= 1e-5 * scale


def test_targets_outside_the_sequence_are_refused(backend: LocalBackend) -> None:
    with pytest.raises(ValueError, match="targets must lie in 1..3"):
        sequence_logprobs(backend.model, [1, 2, 3, 4], [0, 2])
    with pytest.raises(ValueError, match="targets must lie"):
        sequence_logprobs(backend.model, [1, 2, 3, 4], [4])
