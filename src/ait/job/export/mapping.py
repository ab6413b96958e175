"""How each job.toml setting carries over to a verifiers environment and to a prime-rl config.

One row per setting of job.toml (every key of [job], [train] and [train.lora]), whether the job set
it or left ait's default: an export lists them all, because a default can differ too (ait's
`scale_rewards = "group"` divides advantages by the group's reward std; prime-rl's GRPO does not).

Status of a row:
    mapped       the counterpart means the same thing
    approximate  the counterpart exists but behaves a little differently (the note says how)
    unmapped     no counterpart: the exported config does not carry it (the note says what happens)
    run setting  (verifiers) not part of an environment package: set when running it (eval / prime-rl)
    trainer      (verifiers) a trainer's setting: the prime-rl export carries it
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ait.job.types import JobConfig, LoraConfig, TrainConfig

MAPPED, APPROX, UNMAPPED = "mapped", "approximate", "unmapped"
RUN_SETTING, TRAINER = "run setting", "trainer"

PLACEHOLDER_MODEL = "Qwen/Qwen3-0.6B"
"""Written as prime-rl's model when the job's base model has no Hugging Face counterpart (it is
prime-rl's own default model name, and one its renderers know)."""

KNOWN_HUB_IDS = {
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "qwen2.5-coder-0.5b": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "qwen2.5-coder-1.5b": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
}
"""ait's short model names (built in, or the alias the docs use) -> the Hugging Face model they are a
quantised copy of."""

QWEN_TOOL_CALL_MODELS = ("Qwen/Qwen2.5",)
"""Hub ids outside prime-rl's renderer map whose tool calls are Qwen3's <tool_call> JSON (hermes)."""
RENDERER_MAPPED_PREFIXES = ("Qwen/Qwen3", "PrimeIntellect/Qwen3")
"""Hub ids prime-rl's `renderer = "auto"` resolves (checked against renderers 0.1.12's map for the
models ait's tasks allow; another id may need [orchestrator.renderer], see the note)."""


@dataclass
class Row:
    key: str
    """The job.toml key, e.g. train.learning_rate."""
    value: Any
    """Its value in this job (ait's default when the job left it out)."""
    set_in_job: bool
    """Whether job.toml sets it (False: ait's default)."""
    target: str
    """The counterpart's field(s), "" when there is none."""
    status: str
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def job_keys(config: JobConfig) -> list[tuple[str, Any, bool]]:
    """(key, value, set in job.toml) for every setting of job.toml, in the models' order."""
    out: list[tuple[str, Any, bool]] = [("job.base_model", config.job.base_model, True)]
    train = config.train
    for name in TrainConfig.model_fields:
        if name == "lora":
            continue
        out.append((f"train.{name}", getattr(train, name), name in train.model_fields_set))
    lora = train.lora
    for name in LoraConfig.model_fields:
        out.append((f"train.lora.{name}", getattr(lora, name) if lora else None,
                    lora is not None and name in lora.model_fields_set))
    return out


def warmup_steps(train: TrainConfig) -> int:
    """Warmup steps as ait's trainer counts them (a fraction below 1 is a share of max_steps)."""
    w = train.warmup_steps
    return int(math.ceil(w * train.max_steps)) if 0 < w < 1 else int(w)


# ------------------------------------------------------------------------------------ verifiers

VERIFIERS_ENV_ROWS = [
    ("env.py SYSTEM_PROMPT", "TaskData.system_prompt of every task", MAPPED, ""),
    ("env.py build_dataset(n, seed)", "Taskset.load(): one task per row (prompt, answer, info as JSON text)", MAPPED,
     "n and seed are the taskset config's dataset_size and seed (job.toml's train.dataset_size, train.seed)"),
    ("env.py class Environment", "a task-scoped vf.Toolset: one tool server, one Environment, per rollout", MAPPED,
     "reset(info) runs with the row's info before the first tool call"),
    ("env.py Environment public methods", "MCP tools with the same names, docstrings and parameters", MAPPED,
     "arguments pass through as the model wrote them (no type coercion); results and errors are ait's text, cut "
     "at 4000 characters. Two malformed calls differ: MCP refuses a call missing a required argument with its own "
     "error (ait answers `error: TypeError: ...`), and drops an argument the method does not take (ait answers a "
     "TypeError)"),
    ("env.py REWARD_FUNCS", "one @vf.reward per function, in REWARD_FUNCS order", MAPPED,
     "same arguments (completion = the last assistant message's text), errors and non-finite values score 0, "
     "values clipped to [0, 1]"),
    ("env.py REWARD_WEIGHTS", "each @vf.reward's weight (1.0 each when absent)", MAPPED,
     "verifiers' trace reward is the weighted sum, as ait's"),
]


def verifiers_rows(config: JobConfig) -> list[Row]:
    """job.toml's settings as the verifiers package sees them."""
    rows = []
    for key, value, set_in_job in job_keys(config):
        if key == "train.dataset_size":
            rows.append(Row(key, value, set_in_job, "taskset config dataset_size (its default)", MAPPED))
        elif key == "train.seed":
            rows.append(Row(key, value, set_in_job, "taskset config seed (its default)", APPROX,
                            "the dataset's seed; sampling and data order are the trainer's"))
        elif key == "train.max_tool_calling_iterations":
            rows.append(Row(key, value, set_in_job, f"--env.agent.max-turns {value + 1}", RUN_SETTING,
                            "model turns = tool rounds + the final reply"))
        elif key == "train.max_completion_length":
            rows.append(Row(key, value, set_in_job, f"--env.agent.max-output-tokens {value}", RUN_SETTING,
                            "verifiers checks its token caps between turns"))
        elif key in ("train.temperature", "train.top_p"):
            rows.append(Row(key, value, set_in_job, f"--sampling.{key.split('.')[1]} {value}", RUN_SETTING))
        elif key == "job.base_model":
            rows.append(Row(key, value, set_in_job, "the model evaluated or trained (eval -m / prime-rl)", RUN_SETTING))
        else:
            rows.append(Row(key, value, set_in_job, "prime-rl config", TRAINER,
                            "a training setting: `ait job export --to prime-rl` carries it"))
    return rows


# ------------------------------------------------------------------------------------ prime-rl


@dataclass
class PrimeRLPlan:
    values: dict[str, Any]
    """Dotted prime-rl config keys -> values (`orchestrator.train.source.env...` is the one source)."""
    comments: dict[str, str]
    """Dotted key -> the job.toml key(s) it comes from."""
    rows: list[Row]
    model: str
    """The model name written."""

    @property
    def unmapped(self) -> list[Row]:
        return [r for r in self.rows if r.status == UNMAPPED]


SOURCE = "orchestrator.train.source"
"""prime-rl's list of training environments; the export writes one entry, keys below are relative to it."""


def hub_model(name: str, override: str | None = None) -> tuple[str, str, str]:
    """(Hugging Face id, status, note) for job.toml's base_model."""
    if override:
        return override, MAPPED, f"--model {override} (job.toml says {name!r})"
    if _is_hub_id(name):
        return name, MAPPED, ""
    try:
        from ait.train.models import load_aliases

        target = load_aliases().get(name)
    except Exception:  # an unreadable alias file: treated as no alias
        target = None
    if target and _is_hub_id(target):
        return target, MAPPED, f"ait alias {name!r} -> {target}"
    if name in KNOWN_HUB_IDS:
        hub = KNOWN_HUB_IDS[name]
        return hub, APPROX, (f"ait trains {name!r} from a quantised GGUF copy of {hub}; prime-rl loads the hub's "
                             "weights")
    what = ("ait's built-in random tiny model" if name == "tiny"
            else f"{name!r} resolves to local weights ait found on this machine")
    return PLACEHOLDER_MODEL, UNMAPPED, (f"{what} has no Hugging Face counterpart: {PLACEHOLDER_MODEL} (prime-rl's "
                                         "default model) is written instead; put the model you mean to train "
                                         "(`ait job export ... --model ORG/NAME`)")


def _is_hub_id(name: str) -> bool:
    return (name.count("/") == 1 and not name.startswith((".", "/", "~")) and not name.endswith(".gguf")
            and not name.startswith("gguf:") and all(name.split("/")))


def renderer_for(model: str) -> tuple[dict[str, Any] | None, str]:
    """[orchestrator.renderer] for a model outside prime-rl's renderer map, and a note."""
    if model.startswith(RENDERER_MAPPED_PREFIXES):
        return None, ""
    if model.startswith(QWEN_TOOL_CALL_MODELS):
        return ({"name": "default", "tool_parser": "qwen3"},
                f"{model} is not in prime-rl's renderer map: its chat template is used as is, and its "
                "<tool_call> JSON is read with the qwen3 tool parser")
    return ({"name": "default"},
            f"{model} may not be in prime-rl's renderer map: its chat template is used as is; set "
            "[orchestrator.renderer] tool_parser to the parser of its tool-call format (renderers has qwen3, "
            "qwen3.5, glm, deepseek-v3), or the rollouts cannot call tools")


def prime_rl_plan(config: JobConfig, env_id: str, model_override: str | None = None) -> PrimeRLPlan:
    t = config.train
    values: dict[str, Any] = {}
    comments: dict[str, str] = {}
    rows: list[Row] = []

    def put(key: str, value: Any, source: str) -> None:
        values[key] = value
        comments[key] = source

    model, model_status, model_note = hub_model(config.job.base_model, model_override)
    put("model.name", model, "job.base_model")
    renderer, renderer_note = renderer_for(model)
    if renderer:
        for k, v in renderer.items():
            put(f"orchestrator.renderer.{k}", v, "job.base_model")
    put("max_steps", t.max_steps, "train.max_steps")
    put("orchestrator.group_size", t.num_generations, "train.num_generations")
    put("orchestrator.batch_size", t.prompts_per_step * t.num_generations,
        "train.prompts_per_step x train.num_generations")
    put("orchestrator.train.sampling.temperature", t.temperature, "train.temperature")
    put("orchestrator.train.sampling.max_completion_tokens", t.max_completion_length, "train.max_completion_length")
    put(f"{SOURCE}.name", env_id, "the exported environment")
    put(f"{SOURCE}.env.taskset.id", env_id, "the exported environment")
    put(f"{SOURCE}.env.taskset.dataset_size", t.dataset_size, "train.dataset_size")
    put(f"{SOURCE}.env.taskset.seed", t.seed, "train.seed")
    put(f"{SOURCE}.env.agent.max_turns", t.max_tool_calling_iterations + 1, "train.max_tool_calling_iterations + 1")
    put(f"{SOURCE}.env.agent.max_output_tokens", t.max_completion_length, "train.max_completion_length")
    put(f"{SOURCE}.env.agent.harness.id", "null", "ait's rollouts: a plain chat loop with the job's tools")
    put(f"{SOURCE}.env.agent.runtime.type", "subprocess", "ait's rollouts run on the training host")
    optim_type = {"adamw_torch": "adamw", "adamw_torch_fused": "adamw", "sgd": "sgd"}.get(t.optim, "adamw")
    put("trainer.optim.type", optim_type, "train.optim")
    put("trainer.optim.lr", t.learning_rate, "train.learning_rate")
    put("trainer.optim.weight_decay", t.weight_decay, "train.weight_decay")
    put("trainer.optim.max_norm", t.max_grad_norm, "train.max_grad_norm")
    if optim_type == "sgd":  # torch's SGD as transformers builds it: no momentum
        put("trainer.optim.momentum", 0.0, "train.optim")
        put("trainer.optim.nesterov", False, "train.optim")
    sched, sched_status, sched_note = _scheduler(t)
    for k, v in sched.items():
        put(f"trainer.scheduler.{k}", v, "train.lr_scheduler_type, train.warmup_steps")
    if t.lora is not None:
        put("trainer.model.lora.rank", t.lora.r, "train.lora.r")
        put("trainer.model.lora.alpha", float(t.lora.lora_alpha), "train.lora.lora_alpha")
        put("trainer.model.lora.dropout", t.lora.lora_dropout, "train.lora.lora_dropout")
        if t.lora.target_modules != "all-linear":
            put("trainer.model.lora.target_modules", list(t.lora.target_modules), "train.lora.target_modules")

    for key, value, set_in_job in job_keys(config):
        status, target, note = _prime_rl_row(key, value, t, optim_type, sched_status, sched_note)
        if key == "job.base_model":
            status, target, note = model_status, "model.name", "; ".join(n for n in (model_note, renderer_note) if n)
        rows.append(Row(key, value, set_in_job, target, status, note))
    return PrimeRLPlan(values=values, comments=comments, rows=rows, model=model)


def _scheduler(t: TrainConfig) -> tuple[dict[str, Any], str, str]:
    w, kind = warmup_steps(t), t.lr_scheduler_type
    start = "prime-rl's warmup starts at 1e-8 x lr where transformers' starts at 0"
    if kind == "constant" or (kind == "constant_with_warmup" and w == 0):
        return {"type": "constant"}, MAPPED, ("transformers' 'constant' ignores warmup_steps" if kind == "constant"
                                              and w else "")
    if kind == "constant_with_warmup" or (kind == "cosine" and w >= t.max_steps):
        return ({"type": "linear", "warmup_steps": w, "decay_steps": 0, "min_lr": 0.0}, APPROX,
                f"linear warmup over {w} steps, then constant; {start}")
    if kind == "linear":
        return ({"type": "linear", "warmup_steps": w, "decay_steps": max(t.max_steps - w, 0), "min_lr": 0.0}, APPROX,
                f"warmup {w} steps, then linear decay to 0 at max_steps; {start}, and its decay ends one step "
                "earlier")
    return ({"type": "cosine", "warmup_steps": w, "min_lr": 0.0}, APPROX,
            f"warmup {w} steps, then cosine decay to 0 at max_steps" + (f"; {start}" if w else ""))


def _prime_rl_row(key: str, value: Any, t: TrainConfig, optim_type: str, sched_status: str,
                  sched_note: str) -> tuple[str, str, str]:
    """(status, prime-rl field, note) for one job.toml key."""
    leaf = key.rsplit(".", 1)[-1]
    lora = "trainer.model.lora." + {"r": "rank", "lora_alpha": "alpha", "lora_dropout": "dropout"}.get(leaf, leaf)
    table: dict[str, tuple[str, str, str]] = {
        "train.max_steps": (MAPPED, "max_steps", ""),
        "train.learning_rate": (MAPPED, "trainer.optim.lr", ""),
        "train.num_generations": (MAPPED, "orchestrator.group_size", ""),
        "train.prompts_per_step": (MAPPED, "orchestrator.batch_size",
                                   f"batch_size counts rollouts: prompts_per_step x num_generations = "
                                   f"{t.prompts_per_step * t.num_generations}"),
        "train.temperature": (MAPPED, "orchestrator.train.sampling.temperature", ""),
        "train.max_completion_length": (
            APPROX, f"{SOURCE}.env.agent.max_output_tokens, orchestrator.train.sampling.max_completion_tokens",
            "ait cuts a rollout at exactly this many generated tokens over all turns; verifiers stops a rollout "
            "between turns once it has generated this many, and each turn is capped at the same number"),
        "train.max_tool_calling_iterations": (
            APPROX, f"{SOURCE}.env.agent.max_turns",
            f"max_turns counts model turns: {t.max_tool_calling_iterations} tool rounds + the final reply = "
            f"{t.max_tool_calling_iterations + 1}; ait does not run tool calls made in the last turn, verifiers "
            "stops before the turn after it"),
        "train.weight_decay": (MAPPED, "trainer.optim.weight_decay", "written even at 0: prime-rl's default is 0.01"),
        "train.max_grad_norm": (MAPPED, "trainer.optim.max_norm", ""),
        "train.dataset_size": (MAPPED, f"{SOURCE}.env.taskset.dataset_size", ""),
        "train.seed": (APPROX, f"{SOURCE}.env.taskset.seed",
                       "seeds the dataset only; prime-rl has no seed for its sampling and data order"),
        "train.lr_scheduler_type": (sched_status, "trainer.scheduler", sched_note),
        "train.warmup_steps": (sched_status if t.warmup_steps else MAPPED, "trainer.scheduler.warmup_steps",
                               f"{warmup_steps(t)} steps" if t.warmup_steps else ""),
    }
    if key in table:
        return table[key]
    if key == "train.top_p":
        return ((MAPPED, "", "prime-rl samples training rollouts at top_p 1.0") if value == 1.0 else
                (UNMAPPED, "", "prime-rl samples training rollouts at top_p 1.0; this top_p is not carried"))
    if key == "train.beta":
        return ((MAPPED, "", "no KL to a reference model, as in prime-rl's grpo") if value == 0.0 else
                (UNMAPPED, "", "prime-rl's grpo has no KL penalty to a reference model (its loss has only a small "
                 "trainer-vs-sampler term, trainer.loss.kl_tau); this beta is not carried"))
    if key == "train.epsilon":
        return (UNMAPPED, "", "prime-rl's default loss has no ratio clipping: it masks tokens whose probability moved "
                "by more than trainer.loss.dppo_mask_low/high (0.2 by default, left as is)")
    if key == "train.loss_type":
        return ((APPROX, "", "prime-rl normalises the loss by the step's token count, DAPO's token-level "
                 "aggregation") if value == "dapo" else
                (UNMAPPED, "", f"prime-rl aggregates the loss over the step's tokens (DAPO-like); {value!r} "
                 "aggregation is not available"))
    if key == "train.scale_rewards":
        return ((MAPPED, "", "prime-rl's grpo advantage is the reward minus the group's mean") if value == "none" else
                (UNMAPPED, "", f"prime-rl's grpo advantage is the reward minus the group's mean, not divided by the "
                 f"{'group' if value == 'group' else 'batch'}'s reward std (scale_rewards = 'none')"))
    if key == "train.num_iterations":
        return ((MAPPED, "", "one optimizer step per batch") if value == 1 else
                (UNMAPPED, "", "prime-rl makes one optimizer step per batch (it trains asynchronously, up to "
                 "orchestrator.max_off_policy_steps behind the sampler)"))
    if key == "train.optim":
        if value == "adafactor":
            return UNMAPPED, "trainer.optim.type", "prime-rl has no Adafactor: AdamW is written instead"
        note = "SGD without momentum, as transformers builds it" if optim_type == "sgd" else (
            "AdamW; fused or not is prime-rl's choice" if value == "adamw_torch_fused" else "")
        return MAPPED, "trainer.optim.type", note
    if key.startswith("train.lora."):
        if t.lora is None:
            return MAPPED, "", "no [train.lora]: full fine-tuning, as prime-rl does without [trainer.model.lora]"
        if key == "train.lora.target_modules":
            if value == "all-linear":
                return (APPROX, "trainer.model.lora.target_modules",
                        "'all-linear' left to prime-rl's default list (q/k/v/o and MLP projections, experts)")
            return MAPPED, "trainer.model.lora.target_modules", ""
        return MAPPED, lora, ""
    return UNMAPPED, "", "no counterpart known"
