"""The local backend: the agent's LoRA weights in this process (transformers + peft), on a GPU
when there is one, else the CPU.

    training model   base + LoRA adapter (trainable), AdamW, grad clipping
    sampling model   a plain (non-peft) copy of the base model whose weights are base + the
                     adapter merged in (W + scaling * B @ A), owned by a SamplingEngine thread

Why a copy rather than one model behind a lock: sampling for later steps goes on while a
step trains (the outer loop is asynchronous), so the weights being sampled must not change
under a running generation, nor may a long generation stall the optimizer step. After each
step (and after a warm start or a load) `LoraMerge` rewrites, in place, each adapted layer's
weight of the sampling model as base weight + delta, and copies any other trainable tensor
(modules_to_save), between two generation batches (`SamplingEngine.refresh` takes the engine's
lock); from then on every new turn samples the new weights. The cost is one more copy of the
base weights in memory (1 GB for a 0.5B model in bf16), as for an unmerged copy.

Why merged: see ait.outer.backends.lora_merge.

An episode's turns may straddle a refresh; each turn's logprobs are recorded at sampling time,
so the importance ratio stays exact, and the episode's `policy_version` (its staleness) is the
version it started with.

Checkpoint layout (`save` / `load`):

    PATH/adapter/adapter_model.safetensors   LoRA weights (peft's format)
    PATH/adapter/adapter_config.json
    PATH/optimizer.safetensors               AdamW state (its description in the file's metadata)
    PATH/backend.json                        step, base model, LoRA settings, encoding

The adapter and the optimizer's moments are stored exactly (float32) unless the caller gives a size
bound they would exceed; then in bf16 or the compact encoding (ait.outer.state_codec). An older
checkpoint's PATH/optimizer.pt (torch.save) still loads.
"""

from __future__ import annotations

import copy
import json
import time
from itertools import count
from pathlib import Path
from typing import Any

from ait.outer.backends.loss import (
    completion_logprobs,
    importance_sampling_backward,
    nll_loss,
)
from ait.outer.backends.lora_merge import LoraMerge
from ait.outer.backends.sequences import completion_tokens, merge_turns
from ait.outer.checkpoint import CheckpointError, read_backend_record
from ait.outer.config import OuterConfig
from ait.outer.sampler import EnginePolicy, SamplingEngine
from ait.outer.types import StepStats, TrajectoryGroup

ADAPTER_DIR = "adapter"
ADAPTER_FILE = "adapter_model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class LocalBackend:
    """TrainerBackend on local hardware (see the module docstring)."""

    def __init__(self, config: OuterConfig):
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        from ait.chat.renderers import prepare_tokenizer
        from ait.compute.gpu_memory import cap_process_memory
        from ait.train.attention import avoid_cudnn_attention, grouped_attention_name
        from ait.train.models import resolve_base_model

        hf_logging.disable_progress_bar()
        self.config = config
        p, t = config.policy, config.trainer
        avoid_cudnn_attention()  # NaN query gradients under masks (see ait.train.attention)
        resolved = resolve_base_model(p.model)
        self.device = t.device or default_device()
        self.memory_fraction = cap_process_memory(self.device, config.agent_gpu_gib)
        dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        self.tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(resolved.path, trust_remote_code=False))
        base = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=dtype, use_safetensors=True,
                                                    trust_remote_code=False,
                                                    attn_implementation=grouped_attention_name()).to(self.device)
        base.config.use_cache = False
        sampler = copy.deepcopy(base).eval()  # before peft wraps base's layers: a plain model
        for q in sampler.parameters():
            q.requires_grad_(False)
        sampler.config.use_cache = True
        lora = LoraConfig(r=t.lora_r, lora_alpha=t.lora_alpha, lora_dropout=t.lora_dropout,
                          target_modules=t.lora_target_modules, task_type="CAUSAL_LM")
        self.model = get_peft_model(base, lora)
        if t.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
            self.model.enable_input_require_grads()
        self.params = {n: q for n, q in self.model.named_parameters() if q.requires_grad}
        self.optimizer = torch.optim.AdamW(list(self.params.values()), lr=t.learning_rate,
                                           weight_decay=t.weight_decay)
        self.step = 0
        self.model_name = p.model
        self.merger = LoraMerge(self.model, sampler)
        self.merger.merge()
        self.engine = SamplingEngine(sampler, self.tokenizer, max_batch=p.sample_batch_size, version=0,
                                     continuous=p.continuous_batching, own_stream=p.sampler_stream,
                                     prefix_cache_gib=p.prefix_cache_gib)
        self._seeds = count(config.seed * 1_000_003)
        self._sampled = self.engine.counters()  # the reading the next step's sampler figures start from
        if p.init_checkpoint:
            self.warm_start(p.init_checkpoint)

    # ---- the TrainerBackend surface ----------------------------------------------------------

    def policy(self, temperature: float | None = None, seed: int | None = None) -> EnginePolicy:
        """A fresh per-episode policy on the sampling engine (the latest refreshed weights)."""
        p = self.config.policy
        return EnginePolicy(self.engine, self.model_name, temperature=p.temperature if temperature is None
                            else temperature, max_new_tokens=p.max_new_tokens,
                            seed=next(self._seeds) if seed is None else seed, max_context=p.max_context)

    def train_step(self, groups: list[TrajectoryGroup], *, merge: bool = True) -> StepStats:
        """One AdamW step of the importance-sampling loss over every completion token of the groups
        (turns whose advantage is 0 add nothing to the gradient but count in the token mean).
        An episode's turns are forwarded as few sequences as their prompts allow (merge_turns);
        `merge=False` forwards each turn alone, as steps did before (for bench/outer_step_tokens.py).
        No trajectory with a non-zero advantage: nothing to learn, no update, the step stays."""
        import torch

        t0 = time.monotonic()
        batch = [(seq, adv) for g in groups for traj, adv in zip(g.trajectories, g.advantages())
                 for seq in merge_turns(traj.turns, merge=merge)]
        tokens = sum(completion_tokens(traj.turns) for g in groups for traj in g.trajectories)
        counts = {"turns": float(sum(seq.turns for seq, _ in batch)), "sequences": float(len(batch))}
        active = [(seq, adv) for seq, adv in batch if adv != 0.0]
        if not active:
            return StepStats(step=self.step, loss=0.0, tokens=tokens, datums=len(batch),
                             seconds=time.monotonic() - t0,
                             extra={"skipped": 1.0, "active_tokens": 0.0, "forward_tokens": 0.0, **counts,
                                    **self.gpu_memory_peaks()})
        self.model.train()
        t_backward = time.monotonic()
        try:
            loss_total, drift, drift_n = importance_sampling_backward(self.model, active, tokens,
                                                                      self.config.policy.temperature)
        except torch.cuda.OutOfMemoryError as e:
            if self.memory_fraction is None:
                raise
            self.optimizer.zero_grad(set_to_none=True)
            raise RuntimeError(f"the agent's training step ran out of the {self.config.agent_gpu_gib:g} GiB held "
                               "for it ([outer] agent_gpu_gib, the cap on this process): raise agent_gpu_gib (and "
                               "lower jobs_per_gpu to match), or lower [policy] max_context or sample_batch_size"
                               ) from e
        t_optimizer = time.monotonic()
        grad_norm = torch.nn.utils.clip_grad_norm_(list(self.params.values()), self.config.trainer.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        t_refresh = time.monotonic()
        self.refresh_sampler(self.step + 1)  # new weights reach the sampler before the new version is visible
        # Where the step's seconds went: the refresh includes waiting for the replies being generated to end.
        seconds = {"seconds_forward_backward": t_optimizer - t_backward, "seconds_optimizer": t_refresh - t_optimizer,
                   "seconds_refresh": time.monotonic() - t_refresh}
        self.step += 1
        return StepStats(step=self.step, loss=loss_total, tokens=tokens, datums=len(batch),
                         seconds=time.monotonic() - t0,
                         extra={"grad_norm": float(grad_norm), "active_tokens": float(drift_n),
                                "kl_sample_train": drift / max(drift_n, 1),
                                "forward_tokens": float(sum(len(seq.tokens) for seq, _ in active)), **counts,
                                **seconds, **self.gpu_memory_peaks(), **self.sampler_counts()})

    def sampler_counts(self) -> dict[str, float]:
        """The sampler's prompt tokens prefilled and served from stored prefixes since the last step."""
        now = self.engine.counters()
        then, self._sampled = self._sampled, now
        return {f"sampler_{k}": float(v - then.get(k, 0)) for k, v in now.items()}

    def gpu_memory_peaks(self) -> dict[str, float]:
        """The agent's peak GPU memory since the last step (sampling and training), then reset: what
        [outer] agent_gpu_gib must hold back from the packed jobs (on an 80 GB card the agent and four
        jobs filled it on 2026-12-07). Empty off CUDA."""
        import torch

        if not self.device.startswith("cuda") or not torch.cuda.is_available():
            return {}
        peaks = {"agent_peak_allocated_gib": torch.cuda.max_memory_allocated(self.device) / 2**30,
                 "agent_peak_reserved_gib": torch.cuda.max_memory_reserved(self.device) / 2**30}
        if self.memory_fraction is not None:  # the cap (ait.compute.gpu_memory.cap_process_memory)
            peaks["agent_cap_gib"] = float(self.config.agent_gpu_gib)
        torch.cuda.reset_peak_memory_stats(self.device)
        return peaks

    def trainable_params(self) -> int:
        """Trainable (LoRA) parameters: what a checkpoint's size scales with (ait.outer.state_codec)."""
        return sum(q.numel() for q in self.params.values())

    def save(self, path: str, *, max_bytes: float | None = None) -> dict[str, Any]:
        """Adapter, AdamW state and step, in the most exact encoding (ait.outer.state_codec) whose
        size fits `max_bytes` (None: float32, exact). Returns what backend.json records."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        from ait.outer import state_codec

        out = Path(path)
        (out / ADAPTER_DIR).mkdir(parents=True, exist_ok=True)
        encoding, fits = state_codec.choose_encoding(self.trainable_params(), max_bytes)
        dtype = state_codec.adapter_dtype(encoding)
        # LoRA tensors only: the base weights are never trained, so an adapter on lm_head or the
        # embeddings need not carry a copy of them (peft's "auto" would save it).
        weights = get_peft_model_state_dict(self.model, save_embedding_layers=False)
        save_file({k: v.detach().to("cpu", dtype).contiguous() for k, v in weights.items()},
                  str(out / ADAPTER_DIR / ADAPTER_FILE), metadata={"format": "pt"})
        self.model.peft_config["default"].save_pretrained(str(out / ADAPTER_DIR))
        names = list(self.params)
        tensors, meta = state_codec.encode_optimizer(self.optimizer.state_dict(), names, encoding)
        save_file(tensors, str(out / OPTIMIZER_FILE), metadata={"ait_optimizer": json.dumps(meta)})
        t = self.config.trainer
        record = {"backend": "local", "step": self.step, "model": self.model_name, "lora_r": t.lora_r,
                  "lora_alpha": t.lora_alpha, "encoding": encoding, "fits": fits,
                  "trainable_params": self.trainable_params(), "saved_at": time.time()}
        (out / "backend.json").write_text(json.dumps(record, indent=2) + "\n")
        return record

    def load(self, path: str) -> None:
        """Resume: adapter weights, optimizer state and step (optimizer.safetensors, or an older
        checkpoint's optimizer.pt)."""
        import torch

        meta = read_backend_record(Path(path), "backend.json", "local", self.model_name)
        self._load_adapter(Path(path))
        if (Path(path) / OPTIMIZER_FILE).is_file():
            state = self._read_optimizer(Path(path) / OPTIMIZER_FILE)
        else:
            state = torch.load(Path(path) / "optimizer.pt", map_location=self.device, weights_only=True)
        self.optimizer.load_state_dict(state)
        self.step = int(meta["step"])
        self.refresh_sampler()

    def _read_optimizer(self, file: Path) -> dict[str, Any]:
        from safetensors import safe_open
        from safetensors.torch import load_file

        from ait.outer import state_codec

        with safe_open(str(file), framework="pt") as f:
            raw = (f.metadata() or {}).get("ait_optimizer")
        if raw is None:
            raise CheckpointError(f"{file} has no optimizer description (not written by ait)")
        try:
            return state_codec.decode_optimizer(load_file(str(file)), json.loads(raw), list(self.params), self.device)
        except (KeyError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"{file} does not fit this model's optimizer: {e}") from None

    # ---- warm start and supervised steps -----------------------------------------------------

    def warm_start(self, path: str) -> None:
        """Start from a checkpoint's (or a bare adapter directory's) weights: fresh optimizer, step 0."""
        self._load_adapter(Path(path))
        self.refresh_sampler()

    def sft_step(self, examples: list[tuple[list[int], list[int]]]) -> float:
        """One AdamW step of next-token loss on (prompt ids, completion ids) pairs, completion tokens
        only, averaged over them (the supervised warm start, ait.outer.warmstart). Returns the loss."""
        import torch

        tokens = sum(len(c) for _, c in examples)
        self.model.train()
        total = 0.0
        for prompt, completion in examples:
            loss = nll_loss(completion_logprobs(self.model, prompt, completion, 1.0)) / tokens
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(list(self.params.values()), self.config.trainer.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        return total

    def adapter_state(self) -> dict[str, Any]:
        """The trainable (LoRA) tensors, detached copies: what changes when the policy learns."""
        return {n: q.detach().clone() for n, q in self.params.items()}

    def refresh_sampler(self, version: int | None = None) -> None:
        """The sampling model becomes base + the current adapter (merged in place, between batches)."""
        self.engine.refresh(self.merger.merge, self.step if version is None else version)

    def close(self) -> None:
        self.engine.close()

    # ---- helpers -----------------------------------------------------------------------------

    def _load_adapter(self, path: Path) -> None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        adapter = path / ADAPTER_DIR if (path / ADAPTER_DIR / ADAPTER_FILE).is_file() else path
        file = adapter / ADAPTER_FILE
        if not file.is_file():
            raise CheckpointError(f"no LoRA adapter at {path} (expected {ADAPTER_DIR}/{ADAPTER_FILE} or {ADAPTER_FILE})")
        config_file = adapter / "adapter_config.json"
        if config_file.is_file():
            saved = json.loads(config_file.read_text())
            t = self.config.trainer
            if (saved.get("r"), saved.get("lora_alpha")) != (t.lora_r, t.lora_alpha):
                raise CheckpointError(f"{adapter} has LoRA r={saved.get('r')}, lora_alpha={saved.get('lora_alpha')}; "
                                      f"the config asks for r={t.lora_r}, lora_alpha={t.lora_alpha}")
        result = set_peft_model_state_dict(self.model, load_file(str(file), device=str(self.device)))
        unexpected = getattr(result, "unexpected_keys", None) or []
        if unexpected:
            raise CheckpointError(f"{file} does not fit the model: unexpected keys {unexpected[:3]}")
