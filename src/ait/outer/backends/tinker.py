"""The Tinker backend: the agent's LoRA weights live on the Tinker service.

    ServiceClient (key: TINKER_API_KEY)
      ├─ create_lora_training_client(base_model, rank)           one LoRA training run
      │    ├─ forward_backward(datums, "importance_sampling")    gradients on the sampled tokens
      │    ├─ optim_step(AdamParams(...))                        the update
      │    ├─ save_weights_and_get_sampling_client()             publish: a sampler on the new weights
      │    └─ save_state(name)                                   a checkpoint (weights + optimizer)
      ├─ create_training_client_from_state_with_optimizer(path)  resume from save_state's tinker:// path
      └─ create_training_client_from_state(path)                 warm start (weights only)

A datum is one training sequence (`trajectory_datums`): an episode's consecutive turns whose
prompts each extend the sequence so far, merged (ait.outer.backends.sequences), so a T-turn
episode is sent once rather than as T ever longer prompts. Tinker's loss tensors share the
next-token alignment: position i of `model_input` predicts token i + 1 of the sequence, so

    model_input    = tokens[:-1]
    target_tokens  = tokens[1:]
    logprobs       = 0 on observation targets (prompt, tool results, ...), the sampling logprob on
                     each completion target
    advantages     = 0 on observation targets, the episode's group advantage on each completion target

and `importance_sampling`, −Σ exp(logp_learner − logp_sampled) · advantage, covers completion
tokens only: prompts and tool results weigh nothing. Tinker sums over tokens; the local
backend divides that sum by the batch's completion tokens (ait.outer.backends.loss), so the
train step scales the advantages by 1 / that count and the two backends optimise the same
objective with the same learning rate and gradient clipping. Trajectories whose advantage
is exactly 0 add no gradient and are not sent (their tokens still count in the mean).

Checkpoints live on the service; `save(path)` writes the tinker:// path, the step and the
settings to `path/tinker.json`, which `load(path)` (resume) and `warm_start(path)` read back.
`warm_start` also takes a tinker:// path directly.
"""

from __future__ import annotations

import json
import os
import threading
import time
from itertools import count
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ait.outer.backends.sequences import Sequence, completion_tokens, merge_turns
from ait.outer.checkpoint import CheckpointError, read_backend_record  # noqa: F401 - CheckpointError is re-exported
from ait.outer.types import StepStats, TrajectoryGroup

if TYPE_CHECKING:
    import tinker

    from ait.outer.config import OuterConfig
    from ait.policy.tinker_policy import TinkerPolicy

LOSS_FN = "importance_sampling"
CHECKPOINT_FILE = "tinker.json"


class TinkerUnavailable(RuntimeError):
    """The tinker SDK is not installed, or no API key is set."""




def _sdk():
    try:
        import tinker
    except ImportError as e:
        raise TinkerUnavailable("the tinker backend needs the tinker SDK: pip install 'ait[tinker]'") from e
    return tinker


def trajectory_datums(group: TrajectoryGroup, *, scale: float = 1.0,
                      keep_zero_advantage: bool = False) -> list[tinker.Datum]:
    """One `tinker.Datum` per training sequence of each trajectory (merge_turns), in the layout of
    Tinker's `importance_sampling` loss (see the module docstring), advantages multiplied by `scale`.
    Trajectories whose advantage is exactly 0 are left out unless `keep_zero_advantage`."""
    return [sequence_datum(seq, advantage * scale)
            for trajectory, advantage in zip(group.trajectories, group.advantages())
            if advantage != 0.0 or keep_zero_advantage
            for seq in merge_turns(trajectory.turns) if len(seq.tokens) >= 2]


def sequence_datum(seq: Sequence, advantage: float) -> tinker.Datum:
    """A sequence as a datum: target i is tokens[i + 1]; only the sampled tokens' targets carry their
    sampling logprob and the advantage, every other target 0 (no loss)."""
    import numpy as np

    tinker = _sdk()
    rows = np.asarray(seq.targets, dtype=np.int64) - 1  # the target row that predicts each sampled token
    sampled = np.zeros(len(seq.tokens) - 1, dtype=np.float32)
    sampled[rows] = seq.logprobs
    advantages = np.zeros(len(seq.tokens) - 1, dtype=np.float32)
    advantages[rows] = advantage
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(seq.tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData.from_numpy(np.asarray(seq.tokens[1:], dtype=np.int64)),
            "logprobs": tinker.TensorData.from_numpy(sampled),
            "advantages": tinker.TensorData.from_numpy(advantages),
        },
    )


class TinkerBackend:
    """TrainerBackend on the Tinker service (see the module docstring), configured like the local
    backend from an OuterConfig: [policy] model / temperature / max_new_tokens / max_context /
    init_checkpoint, [trainer] lora_r / learning_rate / weight_decay / max_grad_norm.

    `service_client` stands in for the network in tests; by default a `tinker.ServiceClient` is
    built with the key from TINKER_API_KEY. `tokenizer` defaults to the SDK's tokenizer for the
    base model (`TrainingClient.get_tokenizer()`)."""

    def __init__(self, config: OuterConfig, *, service_client: Any = None, tokenizer: Any = None):
        tinker = _sdk()
        if service_client is None:
            key = os.environ.get("TINKER_API_KEY")
            if not key:
                raise TinkerUnavailable("the tinker backend needs an API key in TINKER_API_KEY "
                                        "(or set [trainer] backend = \"local\")")
            service_client = tinker.ServiceClient(api_key=key)
        self.config = config
        self.service = service_client
        self.model_name = config.policy.model
        t = config.trainer
        self.adam = tinker.AdamParams(learning_rate=t.learning_rate, weight_decay=t.weight_decay,
                                      grad_clip_norm=t.max_grad_norm)
        self._tokenizer, self._tokenizer_ready = tokenizer, False
        self._tokenizer_lock = threading.Lock()
        self._seeds = count(config.seed * 1_000_003)
        self.training: Any = None
        self.sampler: Any = None
        self.step = 0
        if config.policy.init_checkpoint:
            self.warm_start(config.policy.init_checkpoint)

    # ---- the TrainerBackend surface ----------------------------------------------------------

    def policy(self, temperature: float | None = None, seed: int | None = None) -> TinkerPolicy:
        """A fresh per-episode policy on the latest published weights (it keeps that version)."""
        from ait.policy.tinker_policy import TinkerPolicy

        if self.sampler is None:
            self._publish()
        p = self.config.policy
        return TinkerPolicy(self.sampler, self.tokenizer, base_model=self.model_name, version=self.step,
                            temperature=p.temperature if temperature is None else temperature,
                            max_new_tokens=p.max_new_tokens, max_context=p.max_context,
                            seed=next(self._seeds) if seed is None else seed, tokenizer_lock=self._tokenizer_lock)

    def train_step(self, groups: list[TrajectoryGroup]) -> StepStats:
        """forward_backward and optim_step (both submitted before waiting on either), then publish."""
        t0 = time.monotonic()
        trajectories = [traj for g in groups for traj in g.trajectories]
        tokens = sum(completion_tokens(traj.turns) for traj in trajectories)
        sequences = [seq for traj in trajectories for seq in merge_turns(traj.turns)]
        counts = {"turns": float(sum(seq.turns for seq in sequences)), "sequences": float(len(sequences))}
        datums = [d for g in groups for d in trajectory_datums(g, scale=1.0 / max(tokens, 1))]
        active = sum(int((d.loss_fn_inputs["advantages"].to_numpy() != 0).sum()) for d in datums)
        if not datums:  # every group constant: nothing to learn, no update, the step stays
            return StepStats(step=self.step, loss=0.0, tokens=tokens, datums=len(sequences),
                             seconds=time.monotonic() - t0,
                             extra={"skipped": 1.0, "active_tokens": 0.0, "forward_tokens": 0.0, **counts})
        training = self._training()
        backward = training.forward_backward(datums, loss_fn=LOSS_FN)
        update = training.optim_step(self.adam)
        out, optim = backward.result(), update.result()
        self.step += 1
        self._publish()
        extra = {"active_tokens": float(active), "forward_tokens": float(sum(d.model_input.length for d in datums)),
                 **counts, **_drift(datums, out.loss_fn_outputs)}
        extra.update({f"optim/{k}": float(v) for k, v in (optim.metrics or {}).items()})
        return StepStats(step=self.step, loss=float(out.metrics.get("loss:sum", 0.0)), tokens=tokens,
                         datums=len(sequences), seconds=time.monotonic() - t0, extra=extra)

    def save(self, path: str) -> None:
        """save_state on the service (weights + optimizer); its tinker:// path and the step go to
        path/tinker.json."""
        saved = self._training().save_state(f"ait-step-{self.step:06d}", overwrite=True).result()
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        record = {"backend": "tinker", "state_path": saved.path, "step": self.step, "model": self.model_name,
                  "lora_r": self.config.trainer.lora_r, "saved_at": time.time()}
        tmp = out / (CHECKPOINT_FILE + ".tmp")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        tmp.replace(out / CHECKPOINT_FILE)

    def load(self, path: str) -> None:
        """Resume from `save`'s directory: weights, optimizer state and step."""
        record = read_backend_record(Path(path), CHECKPOINT_FILE, "tinker", self.model_name)
        self.training = self.service.create_training_client_from_state_with_optimizer(record["state_path"]).result()
        self.step = int(record["step"])
        self._publish()

    def warm_start(self, path: str) -> None:
        """Start from a checkpoint's weights (a `save` directory or a tinker:// path): fresh optimizer, step 0."""
        state = path if path.startswith("tinker://") else read_backend_record(Path(path), CHECKPOINT_FILE, "tinker", self.model_name)["state_path"]
        self.training = self.service.create_training_client_from_state(state).result()
        self.step = 0
        self._publish()

    def close(self) -> None:
        """Nothing to release here: the service session ends with the process."""

    # ---- helpers -----------------------------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        """The base model's tokenizer (chat template, tool-call parser), prepared once."""
        if not self._tokenizer_ready:
            from ait.chat.renderers import prepare_tokenizer

            raw = self._tokenizer if self._tokenizer is not None else self._training().get_tokenizer()
            self._tokenizer, self._tokenizer_ready = prepare_tokenizer(raw), True
        return self._tokenizer

    def _training(self) -> Any:
        if self.training is None:
            self.training = self.service.create_lora_training_client(base_model=self.model_name,
                                                                     rank=self.config.trainer.lora_r).result()
        return self.training

    def _publish(self) -> None:
        """A sampler on the current weights: new policies sample from it; older ones keep theirs."""
        self.sampler = self._training().save_weights_and_get_sampling_client().result()


def _drift(datums: list[tinker.Datum], outputs: list[dict[str, Any]]) -> dict[str, float]:
    """mean(sampling logprob − learner logprob) over the trained tokens, the learner's taken before
    the update: an estimate of KL(sampler ‖ learner) that grows with staleness."""
    diffs = []
    for datum, output in zip(datums, outputs):
        learner = output.get("logprobs")
        if learner is None:
            return {}
        mask = datum.loss_fn_inputs["advantages"].to_numpy() != 0
        diffs.extend((datum.loss_fn_inputs["logprobs"].to_numpy() - learner.to_numpy().reshape(-1))[mask].tolist())
    return {"kl_sample_train": sum(diffs) / len(diffs)} if diffs else {}
