"""Inner training: GRPO on the agent's environment with TRL's GRPOTrainer.

This runs in the job's training process, which imports agent code (env.py). It writes
only under the job directory: a safetensors checkpoint and `train_output.json`. Its
numbers are informational; the worker measures wall time itself and the hidden eval
runs in a separate process that trusts nothing written here except tensors.

This is the reference implementation (`trainer = "trl"`); ait.train.fast_grpo is the
default and is benchmarked against it (bench/inner_job.py). Entry: ait.train.main.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from ait.job.env_loader import import_env, read_surface
from ait.job.types import Job, TrainConfig
from ait.train.request import TrainOutput, build_rows, safe_reward


def final_text(completion: Any) -> str:
    """The last assistant message's text from a TRL completion (conversational or plain)."""
    if isinstance(completion, str):
        return completion
    for msg in reversed(completion or []):
        if msg.get("role") == "assistant" and isinstance(msg.get("content"), str):
            return msg["content"]
    return ""


def to_trl_reward(fn: Callable[..., Any], errors: dict[str, int]) -> Callable[..., list[float]]:
    """Adapt a per-sample reward fn(completion, answer, info) to TRL's batched signature.
    A reward that raises or returns a non-finite value scores 0 for that sample and is
    counted, so one bad completion cannot crash a whole job."""
    name = getattr(fn, "__name__", "reward")

    def reward(completions, answer, info, **kwargs) -> list[float]:
        out = []
        for completion, gold, raw_info in zip(completions, answer, info):
            messages = completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
            out.append(safe_reward(fn, final_text(completion), gold, json.loads(raw_info), messages, errors))
        return out

    reward.__name__ = name
    return reward


def rollout_env_class(env_class: type) -> type:
    """Subclass the agent's Environment so TRL's `reset(**row)` becomes `reset(info)`."""
    user_reset = env_class.__dict__.get("reset") or getattr(env_class, "reset", None)

    class RolloutEnv(env_class):
        def reset(self, **row):
            if user_reset is not None:
                user_reset(self, json.loads(row.get("info") or "{}"))
            return None

    RolloutEnv.__name__ = env_class.__name__
    return RolloutEnv


def grpo_config(train: TrainConfig, out_dir: Path, reward_weights: list[float] | None):
    import torch
    from trl import GRPOConfig

    cuda = torch.cuda.is_available()
    return GRPOConfig(
        output_dir=str(out_dir / "trl"),
        max_steps=train.max_steps,
        learning_rate=train.learning_rate,
        per_device_train_batch_size=train.prompts_per_step * train.num_generations,
        gradient_accumulation_steps=1,
        num_generations=train.num_generations,
        max_completion_length=train.max_completion_length,
        max_tool_calling_iterations=train.max_tool_calling_iterations,
        temperature=train.temperature,
        top_p=train.top_p,
        beta=train.beta,
        epsilon=train.epsilon,
        loss_type=train.loss_type,
        scale_rewards=train.scale_rewards,
        num_iterations=train.num_iterations,
        lr_scheduler_type=train.lr_scheduler_type,
        warmup_steps=train.warmup_steps,
        optim=train.optim,
        weight_decay=train.weight_decay,
        max_grad_norm=train.max_grad_norm,
        seed=train.seed,
        reward_weights=reward_weights,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=not cuda,
        bf16=cuda and torch.cuda.is_bf16_supported(),
        model_init_kwargs={"dtype": "bfloat16"} if cuda else None,
        disable_tqdm=True,
    )


def train(job: Job, base_model_path: str) -> TrainOutput:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from ait.train.attention import avoid_cudnn_attention

    avoid_cudnn_attention()  # the reference path trains on padded batches too
    out_dir = Path(job.run_dir) / "job"
    surface, errors = read_surface(import_env(Path(job.workspace) / "env.py"))
    if surface is None:
        raise RuntimeError("env.py surface invalid: " + "; ".join(errors))
    train_cfg = job.config.train
    from ait.chat.renderers import prepare_tokenizer

    t_load = time.monotonic()

    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(base_model_path))
    reward_errors: dict[str, int] = {}
    peft_config = None
    if train_cfg.lora is not None:
        lora = train_cfg.lora
        peft_config = LoraConfig(task_type="CAUSAL_LM", r=lora.r, lora_alpha=lora.lora_alpha,
                                 lora_dropout=lora.lora_dropout, target_modules=lora.target_modules)
    trainer = GRPOTrainer(
        model=base_model_path,
        reward_funcs=[to_trl_reward(fn, reward_errors) for fn in surface.reward_funcs],
        args=grpo_config(train_cfg, out_dir, surface.reward_weights),
        train_dataset=Dataset.from_list(build_rows(surface, train_cfg)),
        processing_class=tokenizer,
        environment_factory=rollout_env_class(surface.env_class),
        peft_config=peft_config,
    )
    load_seconds = time.monotonic() - t_load
    start = time.monotonic()
    if train_cfg.max_steps > 0:  # transformers reads max_steps 0 as "train by epochs": the null job trains nothing
        trainer.train()
    train_seconds = time.monotonic() - start

    model = trainer.model
    if peft_config is not None:
        model = model.merge_and_unload()
    checkpoint = out_dir / "checkpoint"
    t_save = time.monotonic()
    model.save_pretrained(checkpoint, safe_serialization=True)
    metrics = summarize_log(trainer.state.log_history)
    metrics.update({f"train/reward_errors/{k}": float(v) for k, v in reward_errors.items()})
    metrics.update({"train/load_seconds": load_seconds, "train/seconds": train_seconds,
                    "train/save_seconds": time.monotonic() - t_save})
    import torch

    if torch.cuda.is_available():
        metrics["train/peak_gpu_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return TrainOutput(checkpoint=str(checkpoint), train_seconds=train_seconds,
                       steps=trainer.state.global_step, metrics=metrics)


def summarize_log(history: list[dict[str, Any]]) -> dict[str, float]:
    """Mean of each numeric per-step metric, renamed to train/<name>; plus first/last reward."""
    steps = [h for h in history if "loss" in h]
    out: dict[str, float] = {}
    for key in sorted({k for h in steps for k in h} - {"step", "epoch"}):
        values = [float(h[key]) for h in steps if isinstance(h.get(key), (int, float))]
        if values:
            out[f"train/{key}"] = sum(values) / len(values)
    if steps and "reward" in steps[0]:
        out["train/reward_first"] = float(steps[0]["reward"])
        out["train/reward_last"] = float(steps[-1]["reward"])
    return out
