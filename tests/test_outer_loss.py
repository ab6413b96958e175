"""The outer loop's update: advantages, the importance-sampling loss (completion tokens only; ratio 1
at the sampling weights gives the plain policy gradient) and the local backend's train_step on real
sampled trajectories with differing rewards."""

from __future__ import annotations

import pytest
import torch
from fakes import TASK

from ait.harness.episode import opening_messages
from ait.harness.tools import TOOL_SCHEMAS
from ait.outer.backends.local import LocalBackend
from ait.outer.backends.loss import completion_logprobs, importance_sampling_loss
from ait.outer.config import OuterConfig
from ait.outer.types import Trajectory, TrajectoryGroup, Turn
from ait.spec import load_spec


def traj(reward: float, turns: list[Turn] | None = None, version: int = 0) -> Trajectory:
    return Trajectory(episode_id=f"e{reward}", task_id="t", family="calc_chain", turns=turns or [], reward=reward,
                      policy_version=version)


def test_advantages_are_reward_minus_group_mean() -> None:
    group = TrajectoryGroup(task_id="t", trajectories=[traj(0.5), traj(-0.1), traj(0.2)], policy_version=0)
    assert group.advantages() == pytest.approx([0.3, -0.3, 0.0])
    constant = TrajectoryGroup(task_id="t", trajectories=[traj(-0.1), traj(-0.1)], policy_version=0)
    assert constant.advantages() == [0.0, 0.0]  # a constant group carries no signal


@pytest.fixture(params=[False, True], ids=["plain", "grad-checkpointing"])
def backend(request) -> LocalBackend:
    config = OuterConfig(policy={"model": "tiny", "max_new_tokens": 24, "temperature": 1.0},
                         trainer={"learning_rate": 1e-2, "lora_r": 4, "lora_alpha": 8, "device": "cpu",
                                  "gradient_checkpointing": request.param})
    torch.manual_seed(0)
    b = LocalBackend(config)
    yield b
    b.close()


def sampled_turns(backend: LocalBackend, seeds: list[int]) -> list[Turn]:
    """Real turns: the tiny policy's replies to an episode's opening messages, as sampled."""
    messages = opening_messages(load_spec(TASK))
    out = []
    for seed in seeds:
        policy = backend.policy(seed=seed)
        policy.reset(None)
        t = policy.act(messages, TOOL_SCHEMAS).tokens
        out.append(Turn(prompt_ids=t.prompt_ids, completion_ids=t.completion_ids, logprobs=t.logprobs))
    return out


def full_sequence_objective(model, turn: Turn, mask_prompt: bool) -> torch.Tensor:
    """An independent reference: every position's next-token logprob, weighted by a 0/1 mask."""
    ids = torch.tensor([turn.prompt_ids + turn.completion_ids])
    logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
    targets = ids[0, 1:]
    per_token = logp.gather(1, targets[:, None])[:, 0]
    mask = torch.ones_like(per_token)
    if mask_prompt:
        mask[: len(turn.prompt_ids) - 1] = 0.0
    return (per_token * mask).sum()


def grads(model, loss: torch.Tensor) -> list[torch.Tensor]:
    params = [p for p in model.parameters() if p.requires_grad]
    return [g.clone() for g in torch.autograd.grad(loss, params)]


def test_loss_covers_completion_tokens_only_and_equals_plain_pg_at_ratio_one(backend: LocalBackend) -> None:
    turn = sampled_turns(backend, [11])[0]
    model, advantage = backend.model, 0.7
    # Give the adapter non-zero weights so every LoRA tensor gets a gradient.
    with torch.no_grad():
        for p in backend.params.values():
            p.add_(torch.randn_like(p) * 0.05)
    backend.refresh_sampler()
    logp = completion_logprobs(model, turn.prompt_ids, turn.completion_ids, 1.0)
    assert logp.shape == (len(turn.completion_ids),)
    current = logp.detach().tolist()  # sampling weights == current weights: ratio exactly 1
    g_is = grads(model, importance_sampling_loss(logp, current, advantage))
    g_pg = grads(model, -advantage * full_sequence_objective(model, turn, mask_prompt=True))
    g_all = grads(model, -advantage * full_sequence_objective(model, turn, mask_prompt=False))
    for a, b in zip(g_is, g_pg):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    assert any(not torch.allclose(a, c, atol=1e-5, rtol=1e-4) for a, c in zip(g_is, g_all))  # prompts would differ
    # Stale samples: logp_sampled lower by d scales the gradient by exp(d).
    logp = completion_logprobs(model, turn.prompt_ids, turn.completion_ids, 1.0)
    g_stale = grads(model, importance_sampling_loss(logp, [x - 0.5 for x in current], advantage))
    for a, b in zip(g_stale, g_is):
        assert torch.allclose(a, b * torch.exp(torch.tensor(0.5)), atol=1e-5, rtol=1e-3)


def test_train_step_moves_weights_towards_the_better_episode(backend: LocalBackend) -> None:
    good, bad = sampled_turns(backend, [1, 2])
    group = TrajectoryGroup(task_id="t", trajectories=[traj(0.6, [good]), traj(-0.1, [bad])], policy_version=0)

    def logp(turn: Turn) -> float:
        with torch.no_grad():
            return float(completion_logprobs(backend.model, turn.prompt_ids, turn.completion_ids, 1.0).sum())

    for g in backend.optimizer.param_groups:  # a small step: the first-order effect decides the direction
        g["lr"] = 1e-4
    before_weights = backend.adapter_state()
    before = logp(good) - logp(bad)
    step = backend.step
    stats = backend.train_step([group])
    assert backend.step == step + 1 and stats.step == step + 1
    assert stats.tokens == len(good.completion_ids) + len(bad.completion_ids) and stats.datums == 2
    assert stats.extra["grad_norm"] > 0 and "skipped" not in stats.extra  # (the loss value itself is 0 at ratio 1
    # when both replies have the same length: the advantages sum to 0)
    # The sampler's figures since the last step: the two sampled turns at least, and nothing since this one.
    assert stats.extra["sampler_generated_tokens"] >= stats.tokens and stats.extra["sampler_prefill_tokens"] > 0
    assert set(backend.sampler_counts().values()) == {0.0}
    parts = [stats.extra[k] for k in ("seconds_forward_backward", "seconds_optimizer", "seconds_refresh")]
    assert min(parts) >= 0 and parts[0] > 0 and sum(parts) <= stats.seconds  # where the step's seconds went
    after_weights = backend.adapter_state()
    assert any(not torch.equal(before_weights[k], after_weights[k]) for k in before_weights)
    assert logp(good) - logp(bad) > before  # the better episode's tokens became relatively likelier
    # The sampler was refreshed: it now samples the new weights (the adapter merged into its copy of the base).
    ids = torch.tensor([good.prompt_ids + good.completion_ids])
    with torch.no_grad():
        sampled, trained = backend.engine.model(input_ids=ids).logits, backend.model(input_ids=ids).logits
    assert torch.allclose(sampled, trained, atol=1e-5, rtol=1e-5)
    assert backend.engine.version == backend.step


def test_a_constant_group_is_no_update(backend: LocalBackend) -> None:
    turns = sampled_turns(backend, [3, 4])
    group = TrajectoryGroup(task_id="t", trajectories=[traj(-0.1, turns[:1]), traj(-0.1, turns[1:])],
                            policy_version=backend.step)
    before, step = backend.adapter_state(), backend.step
    stats = backend.train_step([group])
    assert stats.extra["skipped"] == 1.0 and stats.loss == 0.0 and backend.step == step
    assert all(torch.equal(before[k], v) for k, v in backend.adapter_state().items())
