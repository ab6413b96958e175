"""The jobs an agent can write for a family: the reference job on a real model and its variants.

    reference job   the family's shipped env.py and job.toml (src/ait/policy/reference_jobs/<family>/)
                    with REFERENCE_TRAIN over its [train] table and REFERENCE_MODEL as base model: a
                    job meant to sit in the middle of what a job can reach within the time budget,
                    not at its top
    variant         the reference job with one knob the agent controls turned (base model, learning
                    rate, steps and dataset size, num_generations, temperature, loss_type, the
                    partial-credit reward); `null_*` variants are the controls: they train nothing

bench/job_surface.py measures every variant's job_quality (docs/surface.md); the warm start shows
the starting agent jobs drawn from these variants, so its choices differ inside a group. The CPU
reference job on the random `tiny` model is the shipped job.toml itself, untouched.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REFERENCE_JOBS = Path(__file__).resolve().parent / "reference_jobs"
REFERENCE_MODEL = "qwen2.5-coder-0.5b"
REFERENCE_TRAIN: dict[str, Any] = {
    # 12 steps x 32 rollouts x <= 128 tokens: a fifth of the standard bench job (docs/gpu.md), whose
    # 30 x 64 at 1e-6 lifted Qwen-0.5B by +0.18 to +0.55; longer, hotter and larger variants have room.
    "max_steps": 12, "learning_rate": 1e-6, "num_generations": 8, "prompts_per_step": 4,
    "max_completion_length": 128, "dataset_size": 256, "temperature": 1.0, "loss_type": "dapo",
}
PARTIAL_CREDIT = re.compile(r"^REWARD_WEIGHTS\s*=\s*\[\s*([^,\]]+),\s*([^,\]]+),", re.MULTILINE)


@dataclass(frozen=True)
class Variant:
    name: str
    train: dict[str, Any] = field(default_factory=dict)
    """Overrides of the reference job's [train] keys."""
    base_model: str | None = None
    """None: REFERENCE_MODEL."""
    partial_credit: bool = True
    """False: the env's second reward function (its partial credit) weighs 0."""
    control: bool = False
    """A null job: trains nothing, so its post must equal its pre."""
    knob: str = "reference"
    """Which knob it turns (the surface's rows group by it)."""


VARIANTS: dict[str, Variant] = {v.name: v for v in [
    Variant("reference"),
    Variant("null_lr0", {"learning_rate": 0.0}, control=True, knob="control"),
    Variant("null_steps0", {"max_steps": 0}, control=True, knob="control"),
    Variant("model_smollm2", base_model="smollm2-135m", knob="base_model"),
    Variant("model_qwen15", base_model="qwen2.5-coder-1.5b", knob="base_model"),
    Variant("lr_3e-7", {"learning_rate": 3e-7}, knob="learning_rate"),
    Variant("lr_3e-6", {"learning_rate": 3e-6}, knob="learning_rate"),
    Variant("lr_1e-5", {"learning_rate": 1e-5}, knob="learning_rate"),
    Variant("steps_4", {"max_steps": 4}, knob="max_steps"),
    Variant("steps_30", {"max_steps": 30, "dataset_size": 1024}, knob="max_steps"),
    Variant("gens_4", {"num_generations": 4, "prompts_per_step": 8}, knob="num_generations"),
    Variant("gens_16", {"num_generations": 16, "prompts_per_step": 2}, knob="num_generations"),
    Variant("temp_0.7", {"temperature": 0.7}, knob="temperature"),
    Variant("loss_grpo", {"loss_type": "grpo"}, knob="loss_type"),
    Variant("loss_dr_grpo", {"loss_type": "dr_grpo"}, knob="loss_type"),
    Variant("no_partial_credit", partial_credit=False, knob="reward_shaping"),
]}


def null_of(variant: Variant) -> Variant:
    """The control for `variant`'s base model: the same job at learning rate 0."""
    return Variant(f"null_lr0@{variant.base_model or REFERENCE_MODEL}", {"learning_rate": 0.0},
                   base_model=variant.base_model, control=True, knob="control")


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, float):
        return repr(v) if v != 0 else "0.0"
    return str(v)


def variant_job(family: str, variant: Variant | str, allowed: list[str] | None = None) -> dict[str, str]:
    """{"job.toml": text, "env.py": text} of `variant` of the family's reference job. `allowed`: the
    task's allowed base models; a variant whose model is not among them raises ValueError."""
    variant = VARIANTS[variant] if isinstance(variant, str) else variant
    root = REFERENCE_JOBS / family
    if not root.is_dir():
        raise ValueError(f"no reference job for family {family!r}")
    shipped = tomllib.loads((root / "job.toml").read_text())
    model = variant.base_model or REFERENCE_MODEL
    if allowed is not None and model not in allowed:
        raise ValueError(f"variant {variant.name!r} trains {model!r}, which the task does not allow ({allowed})")
    train = {**shipped["train"], **REFERENCE_TRAIN, **variant.train}
    if "max_completion_length" not in variant.train:  # never below what the family's own job gives its turns
        train["max_completion_length"] = max(train["max_completion_length"], shipped["train"]["max_completion_length"])
    lines = [f"# {family}: variant {variant.name} of the reference job (ait.policy.job_variants)",
             "[job]", f"base_model = {toml_value(model)}", "", "[train]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in train.items() if not isinstance(v, dict)]
    env = (root / "env.py").read_text()
    if not variant.partial_credit:
        env, n = PARTIAL_CREDIT.subn(lambda m: f"REWARD_WEIGHTS = [{m.group(1)}, 0.0,", env, count=1)
        if n != 1:
            raise ValueError(f"{family}'s env.py has no REWARD_WEIGHTS with a partial-credit weight to zero")
    return {"job.toml": "\n".join(lines) + "\n", "env.py": env}


def triple(job_toml: str) -> tuple[str, float, int]:
    """(base model, learning rate, max steps) of a job.toml: what a spread of jobs is counted by."""
    cfg = tomllib.loads(job_toml)
    return cfg["job"]["base_model"], float(cfg["train"]["learning_rate"]), int(cfg["train"]["max_steps"])
