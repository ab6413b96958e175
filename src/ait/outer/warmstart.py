"""A supervised warm start: distil the reference agent's tool use into the trainable policy.

An untrained small agent almost never emits a well-formed tool call, so it never submits,
every episode of a group scores the same (−0.1) and RL has nothing to learn from. A short
SFT on the reference policy's transcripts teaches the tool-call format and the shape of an
episode (list, read, check baselines, write, submit), so that sampled episodes differ and
some submit. The rewards stay honest: they come from the harness as for any policy.

    reference_transcript   drive the harness tools with the scripted reference policy up to its
                           submit_job call (no job runs: the call is only the target); with a slip,
                           through a really probed, rejected first submission and the agent's fix
    recovery_transcript    a reference transcript whose slip the probe caught (build_warm_start uses
                           one for every other task and base model)
    sft_examples           (prompt ids, completion ids) per assistant turn, rendered exactly as the
                           sampling policy renders them (chat template, tool schemas, context fitting)
    sft_warm_start         SFT a LocalBackend on the assistant turns of any transcripts and save its
                           adapter; cached by a digest of everything that determines it, under
                           AIT_HOME/warmstart/
    warm_start_plan        which (task, base model, job variant) each transcript writes: the reference
                           job's variants by a rotation over the seed, so the starting agent's jobs
                           differ inside a group (one job everywhere gives the outer step nothing to learn)
    build_warm_start       sft_warm_start on the reference transcripts of a set of tasks
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ait.chat.renderers import to_template
from ait.evals.baselines import BaselineStore
from ait.harness.episode import READ_ONLY, invalid_job_text, opening_messages, seed_workspace
from ait.harness.tools import TOOL_SCHEMAS, EpisodeTools
from ait.harness.types import Message, PolicyStop
from ait.harness.workspace_tools import WorkspaceTools
from ait.home import ait_home
from ait.job import task_tools
from ait.policy.job_variants import VARIANTS
from ait.policy.reference import TT_CALL, ReferencePolicy
from ait.probe.runner import probe_workspace
from ait.spec import TaskSpec

WARMSTART_VERSION = "ws-v5"  # v3: the reference reads task_tools.py first; v4: half the transcripts fix a slip;
                             # v5: the transcripts write job variants (warm_start_plan)


@dataclass
class Transcript:
    """A conversation to distil, and the indices of its assistant turns that are context, not targets
    (a planted mistake: the model should learn to fix it, not to make it)."""

    messages: list[Message]
    untrained: frozenset[int] = frozenset()
    variant: str | None = None
    """The job variant the reference agent wrote (after any fallback: ReferencePolicy.written)."""
    base_model: str | None = None
    """... and its base model."""


def reference_transcript(spec: TaskSpec, workdir: Path, baselines: BaselineStore | None = None,
                         base_model: str | None = None, slip: int | None = None,
                         variant: str | None = None) -> Transcript:
    """The reference agent's conversation up to and including its submit_job call (its job on
    `base_model` when given, else on the reference job's own choice; `variant` of it when given,
    ReferencePolicy's). With `slip` (ReferencePolicy's),
    its first env.py misnames one task_tools helper: that submission is really probed, and the
    transcript goes on through the probe's error, the agent's edit_file fix and its second submit_job
    call; the slipped write is left untrained. Nothing else is probed, and no job runs."""
    workspace = workdir / "workspace"
    seed_workspace(workspace, spec)
    agent = ReferencePolicy(jobs=1, base_model=base_model, slip=slip, variant=variant)
    attempts = []

    def probe_submission() -> str:  # as the harness's submit_job does it, short of running the job
        attempts.append(workdir / f"submission-{len(attempts) + 1}")
        shutil.copytree(workspace, attempts[-1], symlinks=True)
        task_tools.install(attempts[-1], spec.family)
        report = probe_workspace(attempts[-1], spec)
        if report.valid:
            return f"job valid (attempt {len(attempts)}); not run (warm-start transcript)"
        return invalid_job_text(report, len(attempts), spec.max_submission_attempts - len(attempts))

    tools = EpisodeTools(WorkspaceTools(workspace, read_only=READ_ONLY), spec, baselines=baselines,
                         submit=probe_submission if slip is not None else lambda: "not run (warm-start transcript)")
    messages = opening_messages(spec)
    untrained = set()
    agent.reset(spec)
    for _ in range(50):
        reply = agent.act(messages, TOOL_SCHEMAS)
        if agent.fix is not None and any(c.name == "write_file" and c.arguments.get("path") == "env.py"
                                         for c in reply.tool_calls):
            untrained.add(len(messages))  # the slipped env.py
        messages.append(reply)
        if not reply.tool_calls or (any(c.name == "submit_job" for c in reply.tool_calls) and agent.fix is None):
            break
        for call in reply.tool_calls:
            result = tools.dispatch(call, reply.content)  # the reply's text: where a fenced file body is
            messages.append(Message(role="tool", content=result, tool_call_id=call.id, name=call.name))
    variant, model = agent.written or (None, None)
    return Transcript(messages, frozenset(untrained), variant, model)


def recovery_transcript(spec: TaskSpec, workdir: Path, base_model: str | None, first_slip: int = 0,
                        tries: int = 6, variant: str | None = None) -> Transcript:
    """A reference transcript in which the probe rejects a slip and the agent fixes it: slips `first_slip`,
    `first_slip` + 1, ... until the probe catches one (a slip in code the probe never runs passes it), at
    most `tries`; failing that, the plain reference transcript."""
    for k in range(tries):
        t = reference_transcript(spec, workdir / f"slip-{k}", base_model=base_model, slip=first_slip + k,
                                 variant=variant)
        edits = [c.arguments for m in t.messages for c in m.tool_calls if c.name == "edit_file"]
        verdict = next((m.content for m in t.messages if m.role == "tool" and m.name == "submit_job"), "")
        # The fix must answer the probe's own words (not, say, a probe that timed out).
        if edits and TT_CALL.search(edits[0]["old"]).group(1) in verdict:
            return t
    return reference_transcript(spec, workdir / "plain", base_model=base_model, variant=variant)


def completion_ids(tokenizer: Any, history: list[Message], reply: Message) -> list[int]:
    """The tokens a model emits for `reply` after `history`: the full render minus the prompt render,
    through the end-of-turn token."""
    prompt = tokenizer.apply_chat_template(to_template(history), tools=TOOL_SCHEMAS, tokenize=False,
                                           add_generation_prompt=True)
    full = tokenizer.apply_chat_template(to_template([*history, reply]), tools=TOOL_SCHEMAS, tokenize=False,
                                         add_generation_prompt=False)
    if not full.startswith(prompt):
        raise ValueError("the chat template does not render the reply as a continuation of its prompt")
    text = full[len(prompt):]
    end = tokenizer.eos_token or ""
    if end and end in text:
        text = text[:text.index(end) + len(end)]
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def sft_examples(policy: Any, transcript: list[Message] | Transcript,
                 max_completion: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids) per assistant turn (but a Transcript's untrained ones) whose reply
    fits `max_completion` tokens (a longer one could never be sampled whole) and whose prompt fits the
    model's context. `policy` is an HFPolicy: its `fit` renders the prompt as sampling does."""
    if isinstance(transcript, Transcript):
        transcript, untrained = transcript.messages, transcript.untrained
    else:
        untrained = frozenset()
    out = []
    for i, m in enumerate(transcript):
        if m.role != "assistant" or i in untrained:
            continue
        completion = completion_ids(policy.tokenizer, transcript[:i], m)
        if len(completion) > max_completion:
            continue
        try:
            prompt, _ = policy.fit(transcript[:i], TOOL_SCHEMAS)
        except PolicyStop:  # the conversation so far outgrows the model's context
            continue
        out.append((prompt, completion))
    return out


def warm_start_plan(specs: list[TaskSpec], base_models: list[str] | None = None,
                    variants_per_task: int | None = None, seed: int = 0,
                    per_model_variant: int = 1) -> list[tuple[int, int, str | None, str | None]]:
    """(task index, parity, base model, variant) of each warm-start transcript; parity 1: it recovers from
    a slip. Per (task, base model) pair `variants_per_task` transcripts (None: the fewest that together
    cover every variant), their variants the non-control variants that keep the pair's model, taken in
    turn from an offset of `seed`; then `per_model_variant` transcripts per variant that names its own
    model, on the tasks that allow it in turn (distinct tasks while there are enough). Model variants get transcripts of their own rather than slots of a pair, so every base model
    listed keeps its pairs' transcripts. No control (null_*) variant is distilled: a warm-started agent
    should not learn to train nothing. variants_per_task = 0: one reference-job transcript a pair (ws-v4)."""
    models = base_models or [None]
    if variants_per_task == 0:
        return [(i, (i + j) % 2, model, None) for i in range(len(specs)) for j, model in enumerate(models)]
    knobs = [v.name for v in VARIANTS.values() if not v.control and v.base_model is None]
    own_model = [v for v in VARIANTS.values() if not v.control and v.base_model is not None]
    pairs = len(specs) * len(models)
    per_pair = variants_per_task or -(-len(knobs) // pairs)
    plan = []
    for i in range(len(specs)):
        for j, model in enumerate(models):
            for r in range(per_pair):
                # Pair p's r-th slot is p + r * pairs: the slots number 0 .. pairs * per_pair - 1 (so they
                # cover every knob when there are enough), and a pair's own variants lie `pairs` apart in
                # the list, i.e. turn different knobs, not neighbouring rates of one.
                slot = i * len(models) + j + r * pairs
                plan.append((i, (i + j + r) % 2, model, knobs[(seed + slot) % len(knobs)]))
    for k, v in enumerate(own_model):
        allowing = [i for i in range(len(specs)) if v.base_model in specs[i].constraints.allowed_base_models]
        for r in range(per_model_variant if allowing else 0):
            plan.append((allowing[(seed + k + r) % len(allowing)], len(plan) % 2, None, v.name))
    return plan


def build_warm_start(config: Any, specs: list[TaskSpec], *, steps: int = 60, learning_rate: float = 3e-3,
                     batch_size: int = 8, cache_dir: Path | None = None,
                     base_models: list[str] | None = None, variants_per_task: int | None = None,
                     per_model_variant: int = 1) -> Path:
    """A warm-start checkpoint for `config`'s policy (local backend), SFT'd for `steps` steps on the
    reference transcripts of `specs` planned by warm_start_plan: per task and base model in
    `base_models` (so the agent starts out choosing among them and RL can shift the choice), jobs drawn
    from the reference job's variants (rotated by config.seed), every other one recovering from a slip.
    Returns its directory (usable as [policy] init_checkpoint)."""
    plan = warm_start_plan(specs, base_models, variants_per_task, config.seed, per_model_variant)
    with tempfile.TemporaryDirectory(prefix="ait-warmstart-") as tmp:
        transcripts = [recovery_transcript(specs[i], Path(tmp) / f"{n}", model, first_slip=i + n, variant=variant)
                       if parity else reference_transcript(specs[i], Path(tmp) / f"{n}", base_model=model,
                                                           variant=variant)
                       for n, (i, parity, model, variant) in enumerate(plan)]
    return sft_warm_start(config, transcripts, steps=steps, learning_rate=learning_rate, batch_size=batch_size,
                          cache_dir=cache_dir, note={"source": "reference", "tasks": [s.id for s in specs],
                                                     "base_models": base_models or [],
                                                     "recoveries": sum(bool(t.untrained) for t in transcripts),
                                                     "variants": [[specs[i].id, t.variant, t.base_model]
                                                                  for (i, *_), t in zip(plan, transcripts)]})


def sft_warm_start(config: Any, transcripts: list[list[Message] | Transcript], *, steps: int, learning_rate: float,
                   batch_size: int = 8, cache_dir: Path | None = None, note: dict[str, Any] | None = None) -> Path:
    """A warm-start checkpoint for `config`'s policy (local backend): `steps` AdamW steps of next-token
    loss on the assistant turns of `transcripts` (each turn a target given everything before it, rendered
    as the sampling policy renders it: `sft_examples`), `batch_size` turns per step drawn with
    config.seed, from an adapter initialised with config.seed. Cached under AIT_HOME/warmstart (or
    `cache_dir`) by a digest of everything that determines it; `note` is recorded in its
    warmstart.json. Returns its directory (usable as [policy] init_checkpoint)."""
    import torch

    from ait.outer.backends.local import LocalBackend

    transcripts = [t if isinstance(t, Transcript) else Transcript(list(t)) for t in transcripts]
    sft_config = config.model_copy(deep=True)
    sft_config.trainer.learning_rate = learning_rate
    sft_config.policy.init_checkpoint = None
    sft_config.warmstart.steps = 0
    key = json.dumps({"v": WARMSTART_VERSION, "model": config.policy.model, "trainer": sft_config.trainer.model_dump(),
                      "max_new_tokens": config.policy.max_new_tokens, "max_context": config.policy.max_context,
                      "transcripts": [[m.model_dump_json() for m in t.messages] + sorted(t.untrained)
                                      for t in transcripts], "steps": steps,
                      "bs": batch_size, "seed": config.seed}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    dest = (cache_dir or ait_home() / "warmstart") / f"{config.policy.model.replace('/', '_')}-{digest}"
    if (dest / "backend.json").is_file():
        return dest
    with torch.random.fork_rng(devices=[]):  # peft initialises LoRA on the CPU; the caller's RNG stays as it was
        torch.random.default_generator.manual_seed(config.seed)
        backend = LocalBackend(sft_config)
    try:
        policy = backend.policy()
        examples = [e for t in transcripts for e in sft_examples(policy, t, config.policy.max_new_tokens)]
        if not examples:
            raise ValueError("no assistant turn fits policy.max_new_tokens: nothing to distil")
        rng = random.Random(config.seed)
        losses = []
        for _ in range(steps):
            losses.append(backend.sft_step(rng.sample(examples, min(batch_size, len(examples)))))
        tmp_dest = Path(tempfile.mkdtemp(prefix=".ws-", dir=dest.parent if dest.parent.exists()
                                         else _mkdir(dest.parent)))
        backend.save(str(tmp_dest))
        (tmp_dest / "warmstart.json").write_text(json.dumps({
            **(note or {}), "examples": len(examples), "steps": steps, "learning_rate": learning_rate,
            "batch_size": batch_size, "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None}, indent=2) + "\n")
        try:
            tmp_dest.rename(dest)
        except OSError:  # built meanwhile by another process: theirs is identical
            shutil.rmtree(tmp_dest, ignore_errors=True)
        return dest
    finally:
        backend.close()


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
