"""The fast trainer computes TRL's GRPO loss: the same advantages, logprobs, loss and gradients
as the installed TRL's GRPOTrainer, for every loss_type, scale_rewards, beta and epsilon a job
may set.

Each case builds a real GRPOTrainer on the tiny model from the GRPOConfig ait.train.grpo would
give it (so the constants ait passes TRL, max_completion_length for dr_grpo among them, are the
ones under test) and ait's policy from ait.train.fast_grpo.load_policy, with identical weights.
Both sides get the same rollouts: prompts of different lengths, completions of different
lengths with tool-result spans that are not trained on, and the same per-function rewards.
TRL scores them through its own `_generate_and_score_completions` (only generation is
replaced) and `_compute_loss`; ait through `advantages`, `reference_logprobs` and
`policy_loss`. With num_iterations = 2 the weights move between scoring and the loss (the
second pass over a batch), so the importance ratio is not 1 and clipping is exercised; with
beta > 0 the adapters are moved before scoring, so the policy differs from the reference and
the KL term and its gradient are not zero.

What this found (fixed in fast_grpo): TRL scores logits divided by the sampling temperature,
and weights the KL term by the importance ratio (GRPOConfig.use_bias_correction_kl, on by
default), which changes the gradient even on the first pass where the ratio's value is 1.
Also pinned here: TRL's bnpo divides by its micro-batch's tokens, dapo by the generation
batch's; ait.train.grpo gives TRL the whole batch as one micro-batch, so both are ait's
token mean. dr_grpo divides by rollouts x max_completion_length on both sides.
"""

from __future__ import annotations

import random
from contextlib import nullcontext

import pytest
import torch

from ait.job.types import LoraConfig, TrainConfig
from ait.train import fast_grpo
from ait.train.rollouts import Rollout
from ait.train.tiny import tiny_model_path

GROUP = 3
# Three prompts of different lengths; per rollout: completion length and the (start, end) of a
# tool-result span inside it (not sampled, not trained on), or None.
SHAPES = [(5, None), (13, (4, 8)), (9, None),
          (16, (3, 6)), (2, None), (11, (7, 9)),
          (7, None), (14, (5, 10)), (12, None)]
MAX_COMPLETION = 20  # above every completion length: dr_grpo's constant shows in the loss scale
# Two reward functions (weights 1.0 and 0.3, as a job's REWARD_WEIGHTS); the third group's
# weighted rewards are all equal (zero std: its advantages must be exactly 0 in both).
REWARDS_A = [1.0, 0.0, 0.5, 0.2, 0.9, 0.4, 0.5, 0.5, 0.5]
REWARDS_B = [0.0, 1.0, 0.25, 0.7, 0.1, 0.1, 0.3, 0.3, 0.3]
WEIGHTS = [1.0, 0.3]

LOSS_TYPES = ["grpo", "dapo", "dr_grpo", "bnpo"]
SCALES = ["group", "batch", "none"]
# (lora, beta, num_iterations, epsilon, temperature): full fine-tuning and LoRA, on-policy and a
# second pass with clipping, beta 0 and > 0 (ait trains beta > 0 only with LoRA: the base is
# the reference), sampling temperature 1 and not.
REGIMES = {
    "full-onpolicy": (False, 0.0, 1, 0.2, 1.0),
    "full-clipped": (False, 0.0, 2, 0.2, 1.0),
    "lora-onpolicy": (True, 0.0, 1, 0.2, 1.0),
    "lora-kl-onpolicy": (True, 0.04, 1, 0.2, 1.0),
    "lora-kl-clipped": (True, 0.1, 2, 0.1, 1.0),
    "full-clipped-temp": (False, 0.0, 2, 0.3, 0.7),
    "lora-kl-clipped-temp": (True, 0.05, 2, 0.2, 1.3),
}
NUDGE = {False: 0.02, True: 0.1}  # the step between a batch's two passes: full weights, LoRA adapters


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matmuls on a loaded 2-core machine: OpenMP's second thread only waits (10x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def base() -> str:
    return str(tiny_model_path())  # not free: it digests the tokenizer corpus on every call


@pytest.fixture(scope="module")
def tokenizer(base):
    from transformers import AutoTokenizer

    from ait.chat.renderers import prepare_tokenizer

    return prepare_tokenizer(AutoTokenizer.from_pretrained(base))


def make_batch(tokenizer):
    """(dataset rows for TRL, ait Rollouts, TRL's generation output) for the same 9 rollouts."""
    rng = random.Random(0)
    vocab = len(tokenizer)
    rows, rollouts, prompt_ids, completion_ids, tool_masks = [], [], [], [], []
    for g, question in enumerate(["2+3?", "What is 17 times 4, then minus 9?", "Add 1 and 1 and 1 and 1, please."]):
        prompt = [{"role": "system", "content": "Use the calculator."}, {"role": "user", "content": question}]
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for k in range(GROUP):
            i = g * GROUP + k
            n, span = SHAPES[i]
            completion = [rng.randrange(10, vocab) for _ in range(n)]
            mask = [0 if span and span[0] <= t < span[1] else 1 for t in range(n)]
            rows.append({"prompt": prompt, "ra": REWARDS_A[i], "rb": REWARDS_B[i]})
            rollouts.append(Rollout(row={}, ids=ids + completion, prompt_len=len(ids), sampled=[bool(m) for m in mask]))
            prompt_ids.append(list(ids))
            completion_ids.append(completion)
            tool_masks.append(mask)
    assert len({len(p) for p in prompt_ids}) == 3  # prompts of different lengths: left padding differs per row
    completions = [[{"role": "assistant", "content": tokenizer.decode(c)}] for c in completion_ids]
    # What GRPOTrainer._generate returns: prompt ids, completion ids, tool mask, completions,
    # sampling logprobs, extra fields, images, tool images.
    generated = (prompt_ids, completion_ids, tool_masks, completions, None, {}, None, [[] for _ in rows])
    return rows, rollouts, generated


def reward_a(completions, ra, **kwargs):
    return list(ra)


def reward_b(completions, rb, **kwargs):
    return list(rb)


def config(loss_type: str, scale: str, regime: str) -> TrainConfig:
    lora, beta, iterations, epsilon, temperature = REGIMES[regime]
    return TrainConfig(max_steps=1, learning_rate=1e-3, num_generations=GROUP, prompts_per_step=len(SHAPES) // GROUP,
                       max_completion_length=MAX_COMPLETION, loss_type=loss_type, scale_rewards=scale, beta=beta,
                       epsilon=epsilon, num_iterations=iterations, temperature=temperature,
                       lora=LoraConfig(r=4, lora_alpha=8) if lora else None)


@torch.no_grad()
def nudge(model, seed: int, scale: float) -> None:
    """Move every trainable weight by seeded noise (both sides: the same names get the same noise)."""
    gen = torch.Generator().manual_seed(seed)
    for _, p in sorted(model.named_parameters(), key=lambda item: item[0]):
        if p.requires_grad:
            p.add_(torch.randn(p.shape, generator=gen) * scale)


def trainable_grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


def build_trainer(cfg: TrainConfig, base: str, tokenizer, rows, tmp_path):
    """TRL's GRPOTrainer as ait.train.grpo builds it: its GRPOConfig, its LoRA config, the model by path."""
    from datasets import Dataset
    from peft import LoraConfig as PeftLoraConfig
    from trl import GRPOTrainer

    from ait.train.grpo import grpo_config

    peft = None
    if cfg.lora is not None:
        peft = PeftLoraConfig(task_type="CAUSAL_LM", r=cfg.lora.r, lora_alpha=cfg.lora.lora_alpha,
                              lora_dropout=cfg.lora.lora_dropout, target_modules=cfg.lora.target_modules)
    return GRPOTrainer(model=base, reward_funcs=[reward_a, reward_b], args=grpo_config(cfg, tmp_path, WEIGHTS),
                       train_dataset=Dataset.from_list(rows), processing_class=tokenizer, peft_config=peft)


def sampled_values(per_rollout: list[torch.Tensor], masks: list[list[int]]) -> torch.Tensor:
    """The values at trained-on positions, rollout after rollout."""
    return torch.cat([t[:len(m)][torch.tensor(m, dtype=torch.bool)] for t, m in zip(per_rollout, masks)])


def run_both(cfg: TrainConfig, base: str, tokenizer, tmp_path, microbatch_tokens: int | None = None,
             loss_fn=None) -> dict[str, float]:
    """Max abs differences (TRL vs ait) of advantages, old and reference logprobs, loss and
    gradients, with the sizes they are relative to. `microbatch_tokens` forces ait's scoring
    micro-batches smaller; `loss_fn` replaces ait's policy_loss (to check this test's power)."""
    rows, rollouts, generated = make_batch(tokenizer)
    masks = generated[2]
    device, autocast = torch.device("cpu"), nullcontext()

    trainer = build_trainer(cfg, base, tokenizer, rows, tmp_path)
    assert (trainer.loss_type, trainer.scale_rewards, trainer.beta, trainer.epsilon_low, trainer.epsilon_high,
            trainer.max_completion_length, trainer.temperature, trainer.num_iterations) == \
        (cfg.loss_type, cfg.scale_rewards, cfg.beta, cfg.epsilon, cfg.epsilon, cfg.max_completion_length,
         cfg.temperature, cfg.num_iterations)
    trl_model = trainer.model
    assert all(p.dtype == torch.float32 for p in trl_model.parameters())
    ait_model, _ = fast_grpo.load_policy(base, cfg, device)
    # The same initial weights (LoRA's A matrices are random on each side).
    ait_model.load_state_dict(trl_model.state_dict())
    names = sorted(n for n, p in ait_model.named_parameters() if p.requires_grad)
    assert names and names == sorted(n for n, p in trl_model.named_parameters() if p.requires_grad)
    if cfg.beta > 0:
        for m in (trl_model, ait_model):  # fresh adapters are the identity: move them off the reference
            nudge(m, 1, 0.05)

    # Scoring. TRL: its own, with only generation replaced by the rollouts above.
    trl_model.train()
    trainer._generate = lambda prompts: generated
    inputs = trainer._generate_and_score_completions([dict(r) for r in rows])
    # ait: as fast_grpo.train does it.
    ait_model.train()
    rewards = torch.tensor([WEIGHTS[0] * a + WEIGHTS[1] * b for a, b in zip(REWARDS_A, REWARDS_B)])
    adv = fast_grpo.advantages(rewards, cfg.num_generations, cfg.scale_rewards)
    ref = old = None
    if cfg.beta > 0:
        ref = fast_grpo.reference_logprobs(ait_model, rollouts, device, autocast, use_base=True,
                                           temperature=cfg.temperature)
    if cfg.num_iterations > 1:
        old = fast_grpo.reference_logprobs(ait_model, rollouts, device, autocast, use_base=False,
                                           temperature=cfg.temperature)
    d = {"advantages": (inputs["advantages"] - adv).abs().max().item(),
         "advantage_scale": inputs["advantages"].abs().max().item()}
    assert (inputs.get("ref_per_token_logps") is None) == (ref is None)
    assert (inputs.get("old_per_token_logps") is None) == (old is None)
    for key, mine in (("ref", ref), ("old", old)):
        if mine is not None:
            theirs = sampled_values(list(inputs[f"{key}_per_token_logps"]), masks)
            ours = sampled_values([mine[i] for i in range(len(rollouts))], masks)
            d[f"{key}_logprobs"] = (theirs - ours).abs().max().item()

    if cfg.num_iterations > 1:
        for m in (trl_model, ait_model):  # the optimizer step between a batch's first and second pass
            nudge(m, 2, NUDGE[cfg.lora is not None])

    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; ait gives TRL no accumulation
    trl_model.zero_grad(set_to_none=True)
    trl_loss = trainer._compute_loss(trl_model, inputs)
    trl_loss.backward()
    trl_loss = trl_loss.item()
    trl_grads = trainable_grads(trl_model)

    ait_model.zero_grad(set_to_none=True)
    with pytest.MonkeyPatch.context() as mp:
        if microbatch_tokens is not None:
            mp.setattr(fast_grpo, "microbatch_tokens", lambda *args, **kwargs: microbatch_tokens)
        stats = (loss_fn or fast_grpo.policy_loss)(ait_model, rollouts, adv, cfg, device, autocast, old, ref)
    ait_grads = trainable_grads(ait_model)

    assert trl_grads.keys() == ait_grads.keys() and trl_grads
    d["loss"] = abs(trl_loss - stats["loss"])
    d["loss_scale"] = abs(trl_loss)
    d["grad"] = max((trl_grads[n] - ait_grads[n]).abs().max().item() for n in trl_grads)
    d["grad_scale"] = max(g.abs().max().item() for g in trl_grads.values())
    metrics = trainer._metrics["train"]
    d["clipped"] = metrics["clip_ratio/region_mean"][-1]  # share of tokens whose clipping changed the loss
    if cfg.beta > 0:
        d["kl"] = abs(metrics["kl"][-1] - stats["kl"])
        d["kl_scale"] = metrics["kl"][-1]
    return d


def agree(d: dict[str, float]) -> bool:
    """Equal up to float32 rounding (the two sides sum in different orders)."""
    return (d["advantages"] <= 1e-6 * max(1.0, d["advantage_scale"])
            and d.get("old_logprobs", 0.0) <= 1e-5 and d.get("ref_logprobs", 0.0) <= 1e-5
            and d["loss"] <= 1e-6 + 1e-5 * d["loss_scale"]
            and d["grad"] <= 1e-8 + 1e-5 * d["grad_scale"]
            and d.get("kl", 0.0) <= 1e-8 + 1e-5 * d.get("kl_scale", 0.0))


@pytest.mark.parametrize("regime", list(REGIMES))
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_fast_trainer_loss_and_gradients_equal_trls(loss_type, scale, regime, base, tokenizer, tmp_path):
    cfg = config(loss_type, scale, regime)
    d = run_both(cfg, base, tokenizer, tmp_path)
    assert agree(d), d
    assert d["grad_scale"] > 1e-4  # a real gradient, not two zeros
    if cfg.num_iterations > 1:
        assert 0 < d["clipped"] < 0.5, d  # epsilon matters here: some tokens are clipped, not all
    if cfg.beta > 0:
        assert d["kl_scale"] > 1e-4, d  # the KL term is not zero


@pytest.mark.parametrize("microbatch_tokens", [1, 120])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_parity_holds_when_ait_scores_in_several_microbatches(loss_type, microbatch_tokens, base, tokenizer,
                                                              tmp_path):
    """ait accumulates the loss over micro-batches (one rollout each, or a few); TRL scores the
    whole batch at once. The normalisers are the whole batch's on both sides."""
    groups = fast_grpo.microbatches(make_batch(tokenizer)[1], microbatch_tokens)
    assert len(groups) > 2
    d = run_both(config(loss_type, "group", "lora-kl-clipped"), base, tokenizer, tmp_path,
                 microbatch_tokens=microbatch_tokens)
    assert agree(d), d


def _as(loss_type: str | None = None, **changes):
    """ait's policy_loss run with another TrainConfig than the job's (a wrong aggregation)."""
    def loss_fn(model, rollouts, adv, cfg, *args):
        update = dict(changes, **({"loss_type": loss_type} if loss_type else {}))
        return fast_grpo.policy_loss(model, rollouts, adv, cfg.model_copy(update=update), *args)
    return loss_fn


def _bnpo_per_microbatch(model, rollouts, adv, cfg, device, autocast, old, ref):
    """Each half of the batch normalised by its own tokens, as TRL's bnpo does per micro-batch
    (right only when a step is one micro-batch, as ait.train.grpo configures TRL)."""
    stats = {"loss": 0.0, "kl": 0.0}
    for part in (range(0, 4), range(4, len(rollouts))):
        sub = [rollouts[i] for i in part]
        remap = (lambda lp: {j: lp[i] for j, i in enumerate(part)} if lp else lp)
        s = fast_grpo.policy_loss(model, sub, adv[list(part)], cfg, device, autocast, remap(old), remap(ref))
        stats = {k: stats[k] + s[k] for k in stats}
    return stats


@pytest.mark.parametrize("loss_type, loss_fn", [
    ("grpo", _as("dapo")),  # token-level instead of sequence-level mean
    ("dapo", _as("grpo")),
    ("dr_grpo", _as(max_completion_length=16)),  # dr_grpo's constant is max_completion_length, not the longest
    ("dr_grpo", _as("dapo")),
    ("bnpo", _bnpo_per_microbatch),
    ("dapo", _as(temperature=1.0)),  # scoring without the sampling temperature
    ("grpo", _as(epsilon=0.3)),  # another clip range
    ("dapo", _as(beta=0.2)),  # another KL weight
])
def test_the_parity_check_catches_a_wrong_aggregation(loss_type, loss_fn, base, tokenizer, tmp_path):
    """This file's comparison has the power to see each of these mistakes on its inputs."""
    d = run_both(config(loss_type, "group", "lora-kl-clipped-temp"), base, tokenizer, tmp_path, loss_fn=loss_fn)
    assert not agree(d), d
    assert d["loss"] > 1e-4 * d["loss_scale"] or d["grad"] > 1e-3 * d["grad_scale"], d
