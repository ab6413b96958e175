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
reference job on the random `tiny` model is the shipped job.toml itself, untouched; a variant of it
(`tiny_job`) turns the same knob by the same factor relative to REFERENCE_TRAIN (lr_3e-6 triples the
shipped 1e-3), so a CPU warm start shows a spread too. `agent_job` is what the reference agent writes.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ait.spec import Constraints

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
    # The 1.5B through a LoRA adapter (rank 16 on every linear layer, the base frozen in bf16): an estimated
    # 23 GiB at peak against the full job's 46 (ait.compute.gpu_memory), so it fits an 80 GB card beside the
    # outer loop's 36 GiB agent, where the full 1.5B job is refused. Its rate is ten times the reference
    # job's (LoRA wants about 10x full fine-tuning's: Schulman et al., "LoRA Without Regret", 2025); not yet
    # measured on the surface.
    Variant("lora_qwen15", {"learning_rate": 1e-5, "lora": {"r": 16, "lora_alpha": 32}},
            base_model="qwen2.5-coder-1.5b", knob="adapter"),
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


def resolve_variant(name: str) -> Variant:
    """A variant by name; "a+b" turns the knobs of both (model_qwen15+lr_3e-6: the 1.5B at lr 3e-6), for
    the surface of a base model other than the reference's. Only named variants combine, never a control."""
    parts = name.split("+")
    unknown = [p for p in parts if p not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown job variant {unknown[0]!r}; known: {', '.join(VARIANTS)} (combine two with '+')")
    if len(parts) == 1:
        return VARIANTS[name]
    chosen = [VARIANTS[p] for p in parts]
    if any(v.control for v in chosen):
        raise ValueError(f"{name!r}: a control (null_*) variant does not combine")
    models = {v.base_model for v in chosen if v.base_model}
    keys = [k for v in chosen for k in v.train]
    if len(models) > 1 or len(keys) != len(set(keys)):
        raise ValueError(f"{name!r} turns one knob twice; combine variants that turn different knobs")
    return Variant(name, {k: val for v in chosen for k, val in v.train.items()}, base_model=next(iter(models), None),
                   partial_credit=all(v.partial_credit for v in chosen), knob="+".join(v.knob for v in chosen))


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
        if v == 0:
            return "0.0"
        mantissa, e, exp = repr(v).partition("e")  # 1e-6, as people write it, not repr's 1e-06
        return f"{mantissa}e{int(exp)}" if e else mantissa
    return str(v)


def variant_job(family: str, variant: Variant | str, allowed: list[str] | None = None,
                constraints: Constraints | None = None) -> dict[str, str]:
    """{"job.toml": text, "env.py": text} of `variant` of the family's reference job. `allowed`: the
    task's allowed base models (default: the constraints'); a variant whose model is not among them
    raises ValueError. With `constraints`, the [train] values are kept within the task's bounds."""
    variant = VARIANTS[variant] if isinstance(variant, str) else variant
    shipped = tomllib.loads(shipped_text(family, "job.toml"))
    model = variant.base_model or REFERENCE_MODEL
    allowed = allowed if allowed is not None or constraints is None else constraints.allowed_base_models
    if allowed is not None and model not in allowed:
        raise ValueError(f"variant {variant.name!r} trains {model!r}, which the task does not allow ({allowed})")
    train = {**shipped["train"], **REFERENCE_TRAIN, **variant.train}
    if "max_completion_length" not in variant.train:  # never below what the family's own job gives its turns
        train["max_completion_length"] = max(train["max_completion_length"], shipped["train"]["max_completion_length"])
    train = within(train, constraints)
    lines = [f"# {family}: variant {variant.name} of the reference job (ait.policy.job_variants)",
             "[job]", f"base_model = {toml_value(model)}", "", "[train]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in train.items() if not isinstance(v, dict)]
    for table, values in ((k, v) for k, v in variant.train.items() if isinstance(v, dict)):  # [train.lora]
        lines += ["", f"[train.{table}]", *(f"{k} = {toml_value(v)}" for k, v in values.items())]
    return {"job.toml": "\n".join(lines) + "\n", "env.py": variant_env(family, variant)}


def shipped_text(family: str, name: str) -> str:
    root = REFERENCE_JOBS / family
    if not root.is_dir():
        raise ValueError(f"no reference job for family {family!r}")
    return (root / name).read_text()


def variant_env(family: str, variant: Variant) -> str:
    """The family's env.py, its partial-credit reward weighed 0 when the variant turns it off."""
    env = shipped_text(family, "env.py")
    if not variant.partial_credit:
        env, n = PARTIAL_CREDIT.subn(lambda m: f"REWARD_WEIGHTS = [{m.group(1)}, 0.0,", env, count=1)
        if n != 1:
            raise ValueError(f"{family}'s env.py has no REWARD_WEIGHTS with a partial-credit weight to zero")
    return env


def within(train: dict[str, Any], c: Constraints | None) -> dict[str, Any]:
    """`train` with every value the task bounds (ait.job.types.JobConfig) clamped into its bound."""
    if c is None:
        return train
    out = dict(train)
    for key, bound in (("max_steps", c.max_steps), ("num_generations", c.max_group_size),
                       ("prompts_per_step", c.max_prompts_per_step),
                       ("max_completion_length", c.max_completion_tokens),
                       ("max_tool_calling_iterations", c.max_turns), ("dataset_size", c.max_dataset_rows)):
        if key in out:
            out[key] = min(out[key], bound)
    if "dataset_size" in out:
        out["dataset_size"] = max(out["dataset_size"], c.min_dataset_rows)
    return out


MAX_LEARNING_RATE = 1e-2  # ait.job.types.TrainConfig's bound: lr_1e-5 of the tiny job's 1e-3 lands on it
SCALED = ("learning_rate", "max_steps", "dataset_size")
"""The knobs a tiny variant turns by the variant's factor over REFERENCE_TRAIN, not to its value: the
tiny model's scale (1e-3, 4 steps) is not a pretrained model's."""


def tiny_job(family: str, variant: Variant | str, constraints: Constraints | None = None) -> dict[str, str]:
    """{"job.toml", "env.py"} of `variant` of the family's shipped CPU job on the random `tiny` model:
    learning_rate, max_steps and dataset_size scaled by the variant's factor over REFERENCE_TRAIN
    (max_steps at least 1 unless the variant's is 0: null_steps0 stays a null job), the other keys as
    the variant sets them, all within the task's bounds. The reference variant is the shipped text
    itself, byte for byte (the default `ait episode` job)."""
    variant = VARIANTS[variant] if isinstance(variant, str) else variant
    text = shipped_text(family, "job.toml")
    env = variant_env(family, variant)
    if not variant.train:
        return {"job.toml": text, "env.py": env}
    shipped = tomllib.loads(text)["train"]
    train = {}
    for key, value in variant.train.items():
        if key in SCALED and key in shipped:
            scaled = shipped[key] * value / REFERENCE_TRAIN[key]
            value = (min(float(f"{scaled:.3g}"), MAX_LEARNING_RATE) if key == "learning_rate"
                     else max(round(scaled), 1 if value else 0))
        train[key] = value
    train = within({**shipped, **train}, constraints)
    changed = {k: v for k, v in train.items() if (k in variant.train or v != shipped.get(k)) and not isinstance(v, dict)}
    for key, value in changed.items():  # edit the shipped lines in place: its comments and order stay
        line = f"{key} = {toml_value(value)}"
        text, n = re.subn(rf"^{re.escape(key)}\s*=.*$", line, text, count=1, flags=re.MULTILINE)
        if n == 0:
            text = text.rstrip("\n") + f"\n{line}\n"  # [train] is the file's last table
    for table, values in ((k, v) for k, v in variant.train.items() if isinstance(v, dict)):  # [train.lora]: last
        text = text.rstrip("\n") + f"\n\n[train.{table}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in values.items())
    header = f"# {family}: variant {variant.name} of the tiny reference job (ait.policy.job_variants)\n"
    return {"job.toml": header + text, "env.py": env}


def task_job(family: str, task_id: str | None) -> dict[str, str] | None:
    """{"job.toml", "env.py"} of the reference job written for one task rather than its family
    (reference_jobs/<family>/job.<task_id>.toml, with env.<task_id>.py or else the family's env.py), or None.
    A task sized for one machine (the default episode: a real model trained on a laptop's CPU) has one."""
    if not task_id or not re.fullmatch(r"[A-Za-z0-9_.-]+", task_id):
        return None
    root = REFERENCE_JOBS / family
    toml = root / f"job.{task_id}.toml"
    if not toml.is_file():
        return None
    env = root / f"env.{task_id}.py"
    return {"job.toml": toml.read_text(), "env.py": (env if env.is_file() else root / "env.py").read_text()}


def agent_job(family: str, constraints: Constraints, variant: str | None = None,
              base_model: str | None = None, task_id: str | None = None) -> tuple[str, str, dict[str, str]]:
    """(variant written, base model, {"job.toml", "env.py"}): what the reference agent writes. A task with
    a job of its own (task_job) gets it, byte for byte, unless a variant or another base model is asked
    for. Otherwise a variant that names a base model trains it (that model is the variant's point); else
    `base_model`, else the shipped job's `tiny` (or the task's first allowed model). On `tiny` the variant
    is the tiny job's (tiny_job), on any other model the GPU reference job's (variant_job). A model the
    task does not allow falls back to the reference variant on an allowed model: the agent never writes
    an invalid job."""
    allowed = constraints.allowed_base_models
    own = task_job(family, task_id) if variant in (None, "reference") else None
    if own is not None:
        model = tomllib.loads(own["job.toml"])["job"]["base_model"]
        if base_model in (None, model) and model in allowed:
            return "reference", model, own
    chosen = VARIANTS[variant or "reference"]
    fallback = base_model if base_model in allowed else ("tiny" if "tiny" in allowed else allowed[0])
    model = chosen.base_model or fallback
    if model not in allowed:
        chosen, model = VARIANTS["reference"], fallback
    if model == "tiny":
        return chosen.name, model, tiny_job(family, chosen, constraints)
    return chosen.name, model, variant_job(family, replace(chosen, base_model=model), constraints=constraints)


def triple(job_toml: str) -> tuple[str, float, int]:
    """(base model, learning rate, max steps) of a job.toml: what a spread of jobs is counted by."""
    cfg = tomllib.loads(job_toml)
    return cfg["job"]["base_model"], float(cfg["train"]["learning_rate"]), int(cfg["train"]["max_steps"])


def variant_name(base_model: str, train: dict[str, Any], weights: list[float] | None = None) -> str:
    """The surface's name for a job (bench/job_surface.py's cells): the knobs it turns away from the
    reference job, in VARIANTS' order and joined with "+" ("model_qwen15+lr_3e-6"); "reference" when it
    turns none. A knob at a value no variant has is named by its value ("lr=2e-06"); `weights` (the
    job's REWARD_WEIGHTS, when known) name a partial credit weighed 0. The arc's per-family rows count
    the agent's jobs by it, so its choices read against docs/surface.md's cells."""
    turned, expected = [], REFERENCE_TRAIN
    lora = train.get("lora")
    if lora:  # an adapter variant names the model and the adapter; its own rate is the one not turned
        named = [v for v in VARIANTS.values() if v.train.get("lora") and (v.base_model or REFERENCE_MODEL) == base_model]
        if named and named[0].train["lora"].get("r") == lora.get("r"):
            turned.append(named[0].name)
            expected = {**REFERENCE_TRAIN, **named[0].train}
        else:
            turned += ([] if base_model == REFERENCE_MODEL else [f"model={base_model}"]) + [f"lora_r={lora.get('r', '?')}"]
    elif base_model != REFERENCE_MODEL:
        named = [v for v in VARIANTS.values() if v.base_model == base_model and not v.train.get("lora")]
        turned.append(named[0].name if named else f"model={base_model}")
    for key, label in (("learning_rate", "lr"), ("max_steps", "steps"), ("num_generations", "gens"),
                       ("temperature", "temp"), ("loss_type", "loss")):
        value = train.get(key, expected[key])
        if value == expected[key]:
            continue
        named = [v.name for v in VARIANTS.values() if v.train.get(key) == value and not v.base_model]
        turned.append(named[0] if named else f"{label}={value:g}" if isinstance(value, float) else f"{label}={value}")
    if weights is not None and len(weights) > 1 and weights[1] == 0.0:
        turned.append("no_partial_credit")
    return "+".join(turned) or "reference"
