"""The outer loop's data: what one agent episode contributes to a policy update.

An episode with a trainable policy yields a `Trajectory`: one `Turn` per assistant reply,
each with the exact token ids the policy saw (prompt) and sampled (completion) and the
sampling logprobs. Tool results and the harness's messages live only in later turns'
prompts, so they are never trained on: the loss covers `completion_ids` alone.

Episodes of one task form a `TrajectoryGroup`; its advantages are reward minus the group
mean (no std scaling: the rewards are already in [0, 1] and a constant group carries no
signal). A trainer backend turns groups into one optimizer step.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, Field, model_validator


class Turn(BaseModel):
    """One assistant reply as sampled."""

    prompt_ids: list[int]
    """The rendered conversation the reply was sampled from (masked out of the loss)."""
    completion_ids: list[int]
    """The sampled tokens (trained on)."""
    logprobs: list[float]
    """Sampling logprob of each completion token (the importance-sampling denominator)."""

    @model_validator(mode="after")
    def _aligned(self) -> Turn:
        if len(self.logprobs) != len(self.completion_ids):
            raise ValueError(f"{len(self.logprobs)} logprobs for {len(self.completion_ids)} completion tokens")
        return self


class Trajectory(BaseModel):
    """One episode of the agent, scored."""

    episode_id: str
    """The episode's run id."""
    task_id: str
    """TaskSpec id."""
    family: str
    """Task family."""
    turns: list[Turn]
    """Every assistant reply with tokens (empty when the policy never produced one)."""
    reward: float
    """The episode reward (ait.reward), the outer loop's return."""
    components: dict[str, float] = Field(default_factory=dict)
    """The reward's decomposition and job figures (validation, job_quality, speed, post, uplift, ...)."""
    base_model: str | None = None
    """The base model the agent's scored job trained, if any."""
    policy_version: int = 0
    """Optimizer steps the sampling policy had taken when this episode started."""
    timed_out: bool = False
    """The episode hit its wall-clock limit (scored as it stood, not dropped)."""


class TrajectoryGroup(BaseModel):
    """G episodes of one task with the same policy version: the unit of advantage computation."""

    task_id: str
    trajectories: list[Trajectory]
    policy_version: int
    """The policy version the group was sampled with (oldest member)."""

    def advantages(self) -> list[float]:
        rewards = [t.reward for t in self.trajectories]
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        return [r - mean for r in rewards]


class StepStats(BaseModel):
    """What one optimizer step reports."""

    step: int
    """Optimizer steps taken after this one."""
    loss: float
    tokens: int
    """Completion tokens trained on."""
    datums: int
    """Sequences in the batch: an episode's turns share one while each prompt extends the one before
    (ait.outer.backends.sequences), so this is at most the number of assistant turns."""
    seconds: float
    extra: dict[str, float] = Field(default_factory=dict)


class TrainerBackend(Protocol):
    """Where the agent's weights live and how they are updated and sampled from.

    Implementations: `local` (transformers + peft on local GPUs or CPU) and `tinker`
    (the Tinker service). Chosen by `[trainer] backend` in the outer config."""

    step: int
    """Optimizer steps taken so far (the current policy version)."""

    def policy(self, temperature: float | None = None, seed: int | None = None):
        """A Policy (ait.policy.base) that samples from the current weights and records tokens.

        The loop calls it once per episode (the policy may keep per-episode state); `seed` makes
        the episode's samples reproducible, `temperature` overrides the config's (held-out
        evaluation samples greedily)."""

    def train_step(self, groups: list[TrajectoryGroup]) -> StepStats:
        """One importance-sampling policy-gradient step on the groups' completion tokens."""

    def save(self, path: str) -> None:
        """Write a checkpoint (adapter weights + optimizer state + step) under path."""

    def load(self, path: str) -> None:
        """Resume from a checkpoint written by save."""

    def warm_start(self, path: str) -> None:
        """Load weights only (an adapter or a checkpoint), with a fresh optimizer: `[policy] init_checkpoint`."""

    def close(self) -> None:
        """Release what the backend holds (threads, clients)."""
