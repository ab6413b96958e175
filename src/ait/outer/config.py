"""`ait train`'s config: the outer loop, loaded from TOML (configs/outer/*.toml).

Names follow TRL where TRL has one (learning_rate, num_generations, max_steps,
temperature, max_grad_norm, lora_r, lora_alpha, ...). Every key has a type and a bound;
an unknown key is an error. The resolved config is written to the run's manifest.json
and its digest into every checkpoint's state.json.

    tasks ─ families round robin (never held-out ones) ─ groups_per_step × num_generations episodes
    [policy]   the agent and how it samples          [trainer]  how its weights are updated
    [episode]  each episode's harness config (ait.harness.types.EpisodeConfig)
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import Field, model_validator

from ait.contract import Strict
from ait.harness.types import EpisodeConfig


class PolicySection(Strict):
    model: str = "tiny"
    """The agent's base model: `tiny`, a local directory, a Hugging Face id or a known alias
    (local backend); the service's model name (tinker backend)."""
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    """Sampling temperature of training episodes (0 = greedy: no exploration, no signal)."""
    max_new_tokens: int = Field(default=1024, ge=1, le=32768)
    """Tokens per assistant turn."""
    max_context: int | None = Field(default=None, ge=256, le=1_048_576)
    """Context the prompt + reply must fit; None = the model's own."""
    init_checkpoint: str | None = None
    """Warm start: a checkpoint directory (RUN_DIR/checkpoints/step_N or a warm-start adapter) whose
    weights the policy starts from (fresh optimizer, step 0). Tinker: a tinker:// path also works."""
    sample_batch_size: int = Field(default=16, ge=1, le=1024)
    """Most requests the local sampler generates together."""
    continuous_batching: bool = True
    """Local sampler: a request joins the running batch at the next decode step and leaves when its
    reply ends (False: static batches that decode until their longest reply ends)."""
    sampler_stream: bool = False
    """Local sampler on a GPU: decode on a high-priority CUDA stream of its own instead of the default
    stream it shares with the training step (bench/agent_sampling.py --compare-streams measures both)."""
    prefix_cache_gib: float = Field(default=8.0, ge=0, le=1024)
    """Local sampler: host memory for the KV of the agent's ended replies, so that an episode's next turn
    prefills only what is new since its last one (ait.train.decode_prefix); 0 prefills every prompt whole."""


class TrainerSection(Strict):
    backend: Literal["local", "tinker"] = "local"
    """local: transformers + peft LoRA on this machine; tinker: the Tinker service (TINKER_API_KEY)."""
    learning_rate: float = Field(default=1e-5, gt=0.0, le=1e-2)
    """AdamW learning rate."""
    lora_r: int = Field(default=16, ge=1, le=512)
    """LoRA rank."""
    lora_alpha: int = Field(default=32, ge=1, le=4096)
    """LoRA scaling numerator (local backend)."""
    lora_dropout: float = Field(default=0.0, ge=0.0, le=0.5)
    """Dropout on the LoRA path (local backend)."""
    lora_target_modules: list[str] | Literal["all-linear"] = "all-linear"
    """Modules that get adapters (local backend)."""
    loss: Literal["importance_sampling"] = "importance_sampling"
    """Per completion token −exp(logp − logp_sampled)·A, summed, divided by the batch's completion tokens."""
    max_grad_norm: float = Field(default=1.0, gt=0.0, le=1000.0)
    """Gradient clipping (local backend)."""
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0)
    """AdamW weight decay (local backend)."""
    device: str | None = None
    """Torch device of the local backend; None = cuda when available, else cpu."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (long agent transcripts on a small GPU)."""


class WarmStartSection(Strict):
    steps: int = Field(default=0, ge=0, le=100_000)
    """Supervised steps on the reference agent's transcripts before RL (ait.outer.warmstart; local backend);
    0 = none. Skipped on resume and when [policy] init_checkpoint is set. Cached under AIT_HOME/warmstart."""
    learning_rate: float = Field(default=1e-4, gt=0.0, le=1e-1)
    """Its AdamW learning rate."""
    batch_size: int = Field(default=8, ge=1, le=1024)
    """Assistant turns per supervised step."""
    base_models: list[str] = Field(default_factory=list, max_length=16)
    """Reference transcripts for each task and each base model listed (each must be allowed by the
    tasks); empty = the reference job's own choice. Several give RL a choice to shift."""
    variants_per_task: int | None = Field(default=None, ge=0, le=64)
    """Transcripts per (task, base model), each writing another variant of the reference job
    (ait.policy.job_variants, rotated by seed: ait.outer.warmstart.warm_start_plan); None = the fewest
    that together cover every variant; 0 = the reference job alone, one transcript per pair."""
    model_variant_transcripts: int = Field(default=1, ge=0, le=64)
    """Transcripts for each variant that names its own base model (model_smollm2, model_qwen15, lora_qwen15),
    on distinct tasks where they allow it. One puts such a choice in about one transcript of 25, so a group
    of 8 episodes rarely holds it and RL cannot weigh it; 0 = none."""


class OuterConfig(Strict):
    tasks: list[str] = Field(default_factory=lambda: ["examples/tasks/*.json"], min_length=1)
    """TaskSpec paths or globs; held-out families among them are never trained on."""
    heldout_tasks: list[str] = Field(default_factory=lambda: ["examples/tasks/triage.json"])
    """Tasks of the held-out evaluation (paths or globs)."""
    groups_per_step: int = Field(default=4, ge=1, le=1024)
    """Tasks (groups) per optimizer step."""
    num_generations: int = Field(default=4, ge=2, le=256)
    """Episodes per task: the group size G. Advantages are reward minus the group mean."""
    max_steps: int = Field(default=10, ge=1, le=100_000)
    """Optimizer steps of the whole run (a resumed run continues up to it)."""
    max_steps_off_policy: int = Field(default=1, ge=0, le=64)
    """A group sampled more than this many optimizer steps ago is dropped and re-sampled (0 = on-policy)."""
    episode_timeout_s: float = Field(default=3600.0, gt=0.0, le=7 * 24 * 3600)
    """Wall-clock limit of one episode; at it the episode is scored as it stood (timed_out). A job's wait for
    a GPU slot moves it, up to [episode] slot_wait_s."""
    concurrency: int = Field(default=4, ge=1, le=1024)
    """Episodes in flight at once."""
    heldout_every: int = Field(default=0, ge=0, le=100_000)
    """Held-out evaluation every N steps (and at the last step), after one of the starting policy (step 0)
    on the same seeds: each row then carries the paired difference with it (heldout_vs_start); 0 = never."""
    heldout_episodes: int = Field(default=4, ge=1, le=1024)
    """Episodes of a held-out evaluation (spread over heldout_tasks)."""
    heldout_temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    """Sampling temperature of held-out episodes (0 = greedy)."""
    checkpoint_every: int = Field(default=5, ge=1, le=100_000)
    """Checkpoint every N steps (and always at the end)."""
    checkpoint_max_mib: float = Field(default=64.0, gt=0.0, le=1_048_576.0)
    """Size bound of one checkpoint bundle (RUN_DIR/checkpoints/step_N, what a preempted run needs to go
    on elsewhere): the local backend stores its adapter and optimizer exactly (float32) when they fit,
    else in bf16, else compactly (ait.outer.state_codec); bundle.json records the encoding."""
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    """Task sampling and per-episode sampling seeds."""
    task_sampling: Literal["round_robin", "uniform"] = "round_robin"
    """round_robin: the training families in one order shuffled by `seed`, cycled group by group (a
    family's task files in turn), so every family is trained on equally often and one step's groups
    have distinct families (while groups_per_step <= families); a resumed run goes on where the step
    count says (ait.outer.tasks.round_robin_task). uniform: each group's task drawn with replacement."""
    jobs_per_gpu: int = Field(default=1, ge=1, le=64)
    """With [episode] executor = "local": inner jobs packed on each GPU at once (the agent may share it)."""
    agent_gpu_gib: float = Field(default=0.0, ge=0.0, le=4096.0)
    """With jobs_per_gpu > 1 and the agent on the same GPU (local backend, device cuda): GPU memory
    the inner jobs' admission leaves to the agent's sampler and trainer (their KV cache and
    long-transcript activations are not in any job's estimate)."""
    prefetch_baselines: bool = False
    """When a group starts, measure its task's missing baselines (the allowed models' untrained scores on
    this machine's hidden set) on a background thread, while the agent writes its jobs, instead of when
    the first job is scored. A fresh machine has none (its hidden sets are its own); one at a time either
    way (ait.evals.best_pre)."""
    budget_usd: float | None = Field(default=None, ge=0.0)
    """Stop the run once its episodes have spent this much (LLM + jobs); None = no cap."""
    policy: PolicySection = Field(default_factory=PolicySection)
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    warmstart: WarmStartSection = Field(default_factory=WarmStartSection)
    episode: EpisodeConfig = Field(default_factory=EpisodeConfig)
    """Each episode's harness config (executor, eval size, max jobs, ...); its timeout_s is set from
    episode_timeout_s and its run_group from the run."""

    @model_validator(mode="after")
    def _consistent(self) -> OuterConfig:
        if self.episode.timeout_s is not None:
            raise ValueError("episode.timeout_s: set episode_timeout_s at the top level instead")
        if self.warmstart.steps and self.trainer.backend != "local":
            raise ValueError("warmstart.steps: the reference warm start runs on the local backend only")
        return self

    def digest(self) -> str:
        """Short hash of the resolved config (written into checkpoints; resume warns on a change)."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]
