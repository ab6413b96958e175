"""Inner training: GRPO with batched static-cache sampling (the default trainer).

Same contract as ait.train.grpo (TRL's GRPOTrainer, kept as the reference it is measured
against in bench/inner_job.py): the job's TrainConfig, the agent's env.py, a safetensors
checkpoint and TrainOutput. What makes it fast on a GPU:
  - all rollouts of a step are sampled together through ait.train.decode (static KV cache,
    one CUDA graph per shape), tool turns continue in token space (ait.train.rollouts);
  - one scoring forward per micro-batch, logits only for the positions that are trained on;
  - bf16 autocast over fp32 master weights (full fine-tuning) or a bf16 base with fp32
    LoRA adapters.

The loss is TRL's: clipped importance ratio against the policy that sampled (exactly 1 when
num_iterations = 1), optional k3 KL to the base model (beta) weighted by that ratio, logprobs
of temperature-scaled logits, aggregated per loss_type (tests/test_loss_parity.py checks it
against the installed TRL for every loss_type, scale_rewards, beta and epsilon).
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from ait.job.env_loader import import_env, read_surface
from ait.job.types import Job, TrainConfig
from ait.train.attention import avoid_cudnn_attention, grouped_attention_name
from ait.train.decode import Decoder
from ait.train.request import (
    LOGIT_BUDGET,
    LOGIT_BUDGET_ENV,
    TrainOutput,
    build_rows,
    safe_reward,
)
from ait.chat.renderers import stop_ids
from ait.train.rollouts import Rollout, rollout_batch


def logit_budget() -> int:
    """LOGIT_BUDGET, or the executor's smaller one for a packed job (AIT_LOGIT_BUDGET; bounded)."""
    try:
        return min(2**31, max(2**20, int(os.environ.get(LOGIT_BUDGET_ENV, LOGIT_BUDGET))))
    except ValueError:
        return LOGIT_BUDGET


def microbatch_tokens(vocab: int, device: torch.device | None = None, budget: int | None = None) -> int:
    """Padded tokens per scoring micro-batch: fewer for big vocabularies (logits dominate memory),
    and at most 2048 on CPU, where attention materialises every (query, key) score for backward
    (a 64-rollout job of a 135M model otherwise passes the sandbox's 12 GiB)."""
    tokens = max(1024, min(16_384, (budget or logit_budget()) // max(vocab, 1)))
    return min(tokens, 2048) if device is not None and device.type == "cpu" else tokens


def load_policy(base_model_path: str, train: TrainConfig, device: torch.device,
                timeline: dict[str, float] | None = None):
    """(model, tokenizer). LoRA: bf16 base on GPU, fp32 adapters; full: fp32 master weights.
    `timeline` receives the seconds of each part (train/load/<part> metrics)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ait.chat.renderers import prepare_tokenizer

    timeline = {} if timeline is None else timeline
    t = time.monotonic()
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(base_model_path))
    timeline["tokenizer"] = time.monotonic() - t
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if (cuda and train.lora is not None) else torch.float32
    t = time.monotonic()
    # Straight onto the device (device_map): no CPU copy of the weights first, then a second one.
    model = AutoModelForCausalLM.from_pretrained(base_model_path, dtype=dtype, use_safetensors=True,
                                                 device_map=device if cuda else None,
                                                 attn_implementation=grouped_attention_name())
    if not cuda:
        model = model.to(device)
    timeline["weights"] = time.monotonic() - t
    if train.lora is not None:
        from peft import LoraConfig, get_peft_model

        lora = train.lora
        model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", r=lora.r, lora_alpha=lora.lora_alpha,
                                                 lora_dropout=lora.lora_dropout, target_modules=lora.target_modules))
    model.config.use_cache = False
    return model, tokenizer


class SamplingCopy:
    """The weights the sampler reads. On a GPU a bf16 copy of the policy (the trained weights
    stay fp32, or fp32 adapters over a bf16 base), refreshed in place after every optimizer
    step so captured CUDA graphs stay valid; on CPU the policy itself."""

    def __init__(self, model, dtype: torch.dtype):
        if all(p.dtype == dtype for p in model.parameters()):
            self.model, self.pairs = model, []
            return
        self.model = copy.deepcopy(model).to(dtype).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.pairs = [(g, t) for g, t in zip(self.model.parameters(), model.parameters()) if t.requires_grad]

    @torch.no_grad()
    def refresh(self) -> None:
        for g, t in self.pairs:
            g.copy_(t)


def make_optimizer(model, train: TrainConfig):
    from transformers import get_scheduler

    params = [p for p in model.parameters() if p.requires_grad]
    if train.optim == "sgd":
        opt = torch.optim.SGD(params, lr=train.learning_rate, weight_decay=train.weight_decay)
    elif train.optim == "adafactor":
        from transformers.optimization import Adafactor

        opt = Adafactor(params, lr=train.learning_rate, weight_decay=train.weight_decay, relative_step=False,
                        scale_parameter=False)
    else:
        fused = train.optim == "adamw_torch_fused" or params[0].is_cuda
        opt = torch.optim.AdamW(params, lr=train.learning_rate, weight_decay=train.weight_decay, fused=fused)
    warmup = train.warmup_steps
    warmup_steps = int(math.ceil(warmup * train.max_steps)) if 0 < warmup < 1 else int(warmup)
    sched = get_scheduler(train.lr_scheduler_type, opt, num_warmup_steps=warmup_steps,
                          num_training_steps=train.max_steps)
    return opt, sched


def advantages(rewards: torch.Tensor, group: int, scale: str) -> torch.Tensor:
    """GRPO advantages: reward minus its group's mean, scaled as TRL's scale_rewards says."""
    grouped = rewards.view(-1, group)
    adv = grouped - grouped.mean(dim=1, keepdim=True)
    if scale == "group":
        adv = adv / (grouped.std(dim=1, keepdim=True) + 1e-4)
    elif scale == "batch":
        adv = adv / (rewards.std() + 1e-4)
    return adv.reshape(-1)


def score_batch(model, batch: list[Rollout], device: torch.device, autocast,
                temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token logprobs of each rollout's post-prompt tokens (left-padded to a common width)
    and the matching sampled-token mask; logits are computed only for post-prompt positions.
    The logits are divided by the sampling temperature first, as TRL's GRPOTrainer does: the
    policy trained on (and its ratio and KL) is the distribution the rollouts were sampled from."""
    width = max(len(r.ids) for r in batch)
    tail = max(len(r.ids) - r.prompt_len for r in batch)  # post-prompt tokens, right-aligned
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    attn = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros(len(batch), tail, dtype=torch.bool)
    for i, r in enumerate(batch):
        ids[i, width - len(r.ids):] = torch.tensor(r.ids)
        attn[i, width - len(r.ids):] = 1
        n = len(r.ids) - r.prompt_len
        mask[i, tail - n:] = torch.tensor(r.sampled, dtype=torch.bool)
    ids, attn, mask = ids.to(device), attn.to(device), mask.to(device)
    position = (attn.cumsum(dim=1) - 1).clamp(min=0)
    # An explicit causal mask in which each padding position attends to itself: a query row with
    # nothing to attend to comes out of some attention kernels as NaN, and a NaN anywhere in the
    # graph reaches the gradient even where the loss mask is 0 (0 * NaN = NaN in backward).
    valid = attn.bool()
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    mask4d = (causal[None] & valid[:, None, :]) | torch.eye(width, dtype=torch.bool, device=device)[None]
    with autocast:
        logits = model(input_ids=ids, attention_mask=mask4d[:, None], position_ids=position, use_cache=False,
                       logits_to_keep=tail + 1).logits[:, :-1, :]
    targets = ids[:, width - tail:]
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1).gather(2, targets[..., None])[..., 0]
    return logprobs.masked_fill(~mask, 0.0), mask


def microbatches(rollouts: list[Rollout], budget: int = 8192) -> list[list[int]]:
    """Indices grouped so each group's padded size (rows x longest) stays under budget."""
    order = sorted(range(len(rollouts)), key=lambda i: len(rollouts[i].ids))
    groups, current, longest = [], [], 0
    for i in order:
        n = len(rollouts[i].ids)
        if current and max(longest, n) * (len(current) + 1) > budget:
            groups.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    return groups + ([current] if current else [])


def policy_loss(model, rollouts: list[Rollout], adv: torch.Tensor, train: TrainConfig, device, autocast,
                old: dict[int, torch.Tensor] | None, ref: dict[int, torch.Tensor] | None) -> dict[str, float]:
    """Accumulate gradients of the GRPO loss over micro-batches; returns loss statistics."""
    total_tokens = max(1, sum(r.completion_tokens for r in rollouts))
    n = len(rollouts)
    stats = {"loss": 0.0, "clip_ratio": 0.0, "kl": 0.0}
    for group in microbatches(rollouts, microbatch_tokens(model.config.vocab_size, device)):
        batch = [rollouts[i] for i in group]
        logprobs, mask = score_batch(model, batch, device, autocast, train.temperature)
        a = adv[group].to(device)[:, None]
        old_lp = torch.stack([_pad_to(old[i], logprobs.shape[1]) for i in group]) if old else logprobs.detach()
        ratio = torch.exp(logprobs - old_lp)
        clipped = torch.clamp(ratio, 1 - train.epsilon, 1 + train.epsilon)
        per_token = -torch.min(ratio * a, clipped * a)
        if train.beta > 0 and ref is not None:
            ref_lp = torch.stack([_pad_to(ref[i], logprobs.shape[1]) for i in group])
            kl = torch.exp(ref_lp - logprobs) - (ref_lp - logprobs) - 1
            # Times the importance ratio, as TRL does by default (GRPOConfig.use_bias_correction_kl):
            # the unbiased reverse-KL gradient. The ratio's value is 1 on the first pass over a batch,
            # but it is differentiable, so it changes the gradient there too (by kl * grad logprob).
            kl = kl * ratio
            per_token = per_token + train.beta * kl
            stats["kl"] += float((kl.detach() * mask).sum()) / total_tokens  # as TRL logs it: times the ratio
        per_token = torch.where(mask, per_token, 0.0)  # masked positions contribute exactly nothing
        m = mask.float()
        if train.loss_type == "grpo":
            loss = ((per_token * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)).sum() / n
        elif train.loss_type == "dr_grpo":
            loss = (per_token * m).sum() / (n * train.max_completion_length)
        else:  # dapo, bnpo: every sampled token in the batch weighs the same. TRL's bnpo divides by the
            # tokens of its micro-batch and dapo by those of the generation batch; ait.train.grpo gives TRL one
            # micro-batch per step (whole batch per device, no accumulation), so in TRL too they are one loss.
            loss = (per_token * m).sum() / total_tokens
        if not torch.isfinite(loss):  # diagnosed, not hidden: the step will be skipped (see train)
            print(json.dumps({"nonfinite_loss": True, "rows": len(batch), "width": max(len(r.ids) for r in batch),
                              "tail": logprobs.shape[1], "sampled": int(mask.sum()),
                              "nonfinite_logprobs": int((~torch.isfinite(logprobs)).sum())}), flush=True)
        loss.backward()
        stats["loss"] += loss.item()
        stats["clip_ratio"] += float(((ratio != clipped).float() * m).sum()) / total_tokens
    return stats


def _pad_to(t: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (width - t.shape[0], 0))


@torch.no_grad()
def reference_logprobs(model, rollouts: list[Rollout], device, autocast, use_base: bool,
                       temperature: float = 1.0) -> dict[int, torch.Tensor]:
    """Per-rollout logprobs of post-prompt tokens under the current (or, with use_base, the
    adapter-free base) weights: num_iterations > 1 needs the former, beta > 0 the latter."""
    ctx = model.disable_adapter() if use_base and hasattr(model, "disable_adapter") else nullcontext()
    out = {}
    with ctx:
        for group in microbatches(rollouts, microbatch_tokens(model.config.vocab_size, device)):
            logprobs, _ = score_batch(model, [rollouts[i] for i in group], device, autocast, temperature)
            for row, i in enumerate(group):
                n = len(rollouts[i].ids) - rollouts[i].prompt_len
                out[i] = logprobs[row, logprobs.shape[1] - n:].detach()
    return out


def train(job: Job, base_model_path: str, sampling_dtype: torch.dtype | None = None,
          on_step: Callable[[int], None] | None = None) -> TrainOutput:
    """`on_step(step)` is called after each optimizer step (bench/profile_fast_step.py steps a profiler)."""
    cfg = job.config.train
    out_dir = Path(job.run_dir) / "job"
    surface, errors = read_surface(import_env(Path(job.workspace) / "env.py"))
    if surface is None:
        raise RuntimeError("env.py surface invalid: " + "; ".join(errors))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    avoid_cudnn_attention()
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    if cfg.beta > 0 and cfg.lora is None:
        raise ValueError("beta > 0 needs a reference model: use [train.lora] (the base is the reference)")
    t_load = time.monotonic()
    timeline: dict[str, float] = {}
    # env.py's dataset is built while the weights load (file reads and device copies release the GIL).
    with ThreadPoolExecutor(max_workers=1) as pool:
        rows_future = pool.submit(_timed, build_rows, surface, cfg)
        model, tokenizer = load_policy(base_model_path, cfg, device, timeline)
        t = time.monotonic()
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
        opt, sched = make_optimizer(model, cfg)
        timeline["optimizer"] = time.monotonic() - t
        t = time.monotonic()
        sampler = SamplingCopy(model, sampling_dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32))
        decoder = Decoder(sampler.model, stop_ids=stop_ids(tokenizer, model), pad_id=tokenizer.pad_token_id)
        timeline["sampling_copy"] = time.monotonic() - t
        max_length = int(getattr(model.config, "max_position_embeddings", 4096) or 4096)
        t = time.monotonic()
        rows, timeline["dataset"] = rows_future.result()
        timeline["dataset_wait"] = time.monotonic() - t
    load_seconds = time.monotonic() - t_load

    reward_errors: dict[str, int] = {}
    weights = surface.reward_weights or [1.0] * len(surface.reward_funcs)
    history: list[dict[str, float]] = []
    order: list[int] = []
    skipped = 0  # optimizer steps skipped for a non-finite gradient norm
    start = time.monotonic()
    for step in range(cfg.max_steps):
        t0 = time.monotonic()
        if len(order) < cfg.prompts_per_step:
            fresh = list(range(len(rows)))
            rng.shuffle(fresh)
            order += fresh
        picked, order = order[:cfg.prompts_per_step], order[cfg.prompts_per_step:]
        batch_rows = [rows[i] for i in picked for _ in range(cfg.num_generations)]
        sampler.model.eval()
        rollouts = rollout_batch(decoder, tokenizer, surface, batch_rows,
                                 max_completion_length=cfg.max_completion_length,
                                 max_turns=cfg.max_tool_calling_iterations, temperature=cfg.temperature,
                                 top_p=cfg.top_p, max_length=max_length, generator=generator)
        t_gen = time.monotonic()
        per_fn = [[safe_reward(fn, r.final, r.row["answer"], json.loads(r.row["info"]), r.messages, reward_errors)
                   for r in rollouts] for fn in surface.reward_funcs]
        rewards = torch.tensor([sum(w * v[j] for w, v in zip(weights, per_fn)) for j in range(len(rollouts))])
        adv = advantages(rewards, cfg.num_generations, cfg.scale_rewards)
        model.train()
        ref = (reference_logprobs(model, rollouts, device, autocast, use_base=True, temperature=cfg.temperature)
               if cfg.beta > 0 else None)
        old = (reference_logprobs(model, rollouts, device, autocast, use_base=False, temperature=cfg.temperature)
               if cfg.num_iterations > 1 else None)
        stats: dict[str, float] = {}
        for _ in range(cfg.num_iterations):
            opt.zero_grad(set_to_none=True)
            stats = policy_loss(model, rollouts, adv, cfg, device, autocast, old, ref)
            grad_norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                                       cfg.max_grad_norm)
            if torch.isfinite(grad_norm):
                opt.step()
            else:  # one bad batch (an inf/NaN loss) must not turn every weight into NaN: skip it, count it
                skipped += 1
                print(json.dumps({"step": step + 1, "skipped": "non-finite gradient norm",
                                  "grad_norm": str(float(grad_norm))}), flush=True)
        sched.step()
        sampler.refresh()
        t_end = time.monotonic()
        lengths = [r.completion_tokens for r in rollouts]
        history.append({
            "reward": float(rewards.mean()), "reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0,
            **{f"rewards/{getattr(fn, '__name__', 'reward')}": sum(v) / len(v)
               for fn, v in zip(surface.reward_funcs, per_fn)},
            "completion_length": sum(lengths) / len(lengths), "tool_calls": sum(r.tool_calls for r in rollouts)
            / len(rollouts), "truncated": sum(r.truncated for r in rollouts) / len(rollouts),
            "grad_norm": float(grad_norm), "learning_rate": sched.get_last_lr()[0], **stats,
            "step_seconds": t_end - t0, "generate_seconds": t_gen - t0, "optimize_seconds": t_end - t_gen,
            "generated_tokens": float(sum(lengths)),
            "num_tokens": (history[-1]["num_tokens"] if history else 0.0) + sum(len(r.ids) for r in rollouts),
        })
        print(json.dumps({"step": step + 1, **{k: float(f"{v:.4g}") for k, v in history[-1].items()}}), flush=True)
        if on_step is not None:
            on_step(step + 1)
    train_seconds = time.monotonic() - start

    checkpoint = out_dir / "checkpoint"
    t_save = time.monotonic()
    save_checkpoint(model, checkpoint, device)
    metrics = summarize(history)
    metrics.update({"train/load_seconds": load_seconds, "train/seconds": train_seconds,
                    "train/save_seconds": time.monotonic() - t_save,
                    "train/graphs_captured": float(decoder.stats["graphs_captured"]),
                    "train/skipped_nonfinite_steps": float(skipped)})
    metrics.update({f"train/load/{k}_seconds": v for k, v in timeline.items()})
    if device.type == "cuda":
        metrics["train/peak_gpu_memory_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    metrics.update({f"train/reward_errors/{k}": float(v) for k, v in reward_errors.items()})
    return TrainOutput(checkpoint=str(checkpoint), train_seconds=train_seconds, steps=len(history), metrics=metrics)


def _timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    t = time.monotonic()
    return fn(*args), time.monotonic() - t


def save_checkpoint(model, path: Path, device: torch.device) -> None:
    """Merged weights as safetensors; bf16 on GPU (the dtype the eval runs in), fp32 on CPU."""
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    if device.type == "cuda":
        model = model.to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)


def summarize(history: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each per-step metric as train/<name>, plus first/last reward and totals."""
    out: dict[str, float] = {}
    for key in sorted({k for h in history for k in h}):
        # A skipped step's NaN/inf (grad norm, loss) would make the whole mean, and the job's
        # output, invalid: means are over finite values (the skipped steps are counted apart).
        values = [h[key] for h in history if key in h and math.isfinite(h[key])]
        if values:
            out[f"train/{key}"] = sum(values) / len(values)
    if history:
        out["train/reward_first"] = history[0]["reward"]
        out["train/reward_last"] = history[-1]["reward"]
        out["train/generated_tokens_total"] = sum(h["generated_tokens"] for h in history)
        out["train/num_tokens"] = history[-1]["num_tokens"]  # cumulative tokens scored, as TRL counts them
        gen = sum(h["generate_seconds"] for h in history)
        out["train/generated_tokens_per_second"] = out["train/generated_tokens_total"] / max(gen, 1e-9)
    return out
