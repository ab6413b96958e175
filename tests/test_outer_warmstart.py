"""The reference warm start: the reference agent's transcript, rendered as the sampling policy renders
it, distilled into the LoRA adapter; cached; loaded as [policy] init_checkpoint."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from ait.outer.backends.local import LocalBackend
from ait.outer.config import OuterConfig
from ait.outer.warmstart import Transcript, build_warm_start, reference_transcript, sft_examples
from ait.policy.job_variants import VARIANTS, triple, variant_job
from ait.policy.reference import reference_job
from ait.spec import load_spec

TASK = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "calc_chain_fast.json"


def test_warm_start_distils_the_reference_transcript(tmp_path: Path, monkeypatch) -> None:
    spec = load_spec(TASK)
    transcript = reference_transcript(spec, tmp_path / "t").messages
    calls = [m.tool_calls[0].name for m in transcript if m.role == "assistant"]
    assert calls[0] == "list_files" and calls[-1] == "submit_job" and "write_file" in calls
    config = OuterConfig(policy={"model": "tiny", "max_new_tokens": 64},
                         trainer={"device": "cpu", "lora_r": 4, "lora_alpha": 8})
    fresh = LocalBackend(config)
    examples = sft_examples(fresh.policy(), transcript, max_completion=64)
    assert examples and all(len(c) <= 64 for _, c in examples)
    text = fresh.tokenizer.decode(examples[0][1])
    assert '"name": "list_files"' in text and text.endswith("<|im_end|>")

    # variants_per_task = 0: the reference job alone, one transcript (the variants: tests below)
    path = build_warm_start(config, [spec], steps=2, batch_size=2, learning_rate=1e-2, cache_dir=tmp_path / "ws",
                            variants_per_task=0)
    meta = json.loads((path / "warmstart.json").read_text())
    assert meta["steps"] == 2 and meta["examples"] == len(examples) and meta["tasks"] == [spec.id]
    assert meta["recoveries"] == 0  # one task, one model: the (0, 0) transcript is plain
    assert meta["variants"] == [[spec.id, "reference", "tiny"]]
    # The same inputs again: the cached checkpoint, no model built (not timed: a loaded machine is slow)
    import ait.outer.backends.local as local_backend

    with monkeypatch.context() as m:
        m.setattr(local_backend, "LocalBackend", lambda *a, **k: pytest.fail("the cached warm start was rebuilt"))
        assert build_warm_start(config, [spec], steps=2, batch_size=2, learning_rate=1e-2,
                                cache_dir=tmp_path / "ws", variants_per_task=0) == path
    warm = LocalBackend(config.model_copy(update={"policy": config.policy.model_copy(
        update={"init_checkpoint": str(path)})}))
    before, after = fresh.adapter_state(), warm.adapter_state()
    assert any(not torch.equal(before[k], after[k]) for k in before) and warm.step == 0
    fresh.close()
    warm.close()


def test_warm_start_transcripts_cover_each_listed_base_model(tmp_path: Path) -> None:
    """With base_models (and variants_per_task = 0), each task gets one reference transcript per model,
    each job writing its model: the GPU reference job on a pretrained one, the shipped job on tiny."""
    from ait.outer import warmstart

    spec = load_spec(TASK)
    seen: list[list] = []
    real = warmstart.sft_warm_start
    warmstart.sft_warm_start = lambda config, transcripts, **kw: seen.append(transcripts) or tmp_path
    try:
        config = OuterConfig(policy={"model": "tiny"}, warmstart={"base_models": ["smollm2-135m", "tiny"]})
        assert build_warm_start(config, [spec], base_models=config.warmstart.base_models,
                                variants_per_task=0) == tmp_path
    finally:
        warmstart.sft_warm_start = real
    (transcripts,) = seen
    written = []
    for t in transcripts:
        toml = next(c.arguments["content"] for m in t.messages if m.role == "assistant" for c in m.tool_calls
                    if c.name == "write_file" and c.arguments.get("path") == "job.toml")
        written.append(toml)
    assert len(written) == 2
    assert 'base_model = "smollm2-135m"' in written[0] and "learning_rate = 1e-6" in written[0]
    assert written[1] == reference_job(spec.family)["job.toml"]  # the shipped tiny job, untouched


def test_the_reference_reads_the_familys_tool_module_before_writing_env_py(tmp_path: Path) -> None:
    """The habit the warm start distils: task_tools.py is read (its real content comes back) before env.py
    is written, for every shipped family, so a held-out family's job is written from its own module."""
    tasks = sorted((TASK.parent).glob("*.json"))
    assert len(tasks) >= 6
    for path in tasks:
        spec = load_spec(path)
        transcript = reference_transcript(spec, tmp_path / spec.id).messages
        steps = [(m.tool_calls[0].name, m.tool_calls[0].arguments.get("path")) for m in transcript
                 if m.role == "assistant" and m.tool_calls]
        read, write = steps.index(("read_file", "task_tools.py")), steps.index(("write_file", "env.py"))
        assert read < write and steps[-1][0] == "submit_job", (spec.id, steps)
        call = next(m.tool_calls[0].id for m in transcript if m.role == "assistant" and m.tool_calls
                    and m.tool_calls[0].arguments.get("path") == "task_tools.py")
        result = next(m.content for m in transcript if m.role == "tool" and m.tool_call_id == call)
        workspace_module = (tmp_path / spec.id / "workspace" / "task_tools.py").read_text()
        assert result.strip() == workspace_module.strip()


@pytest.mark.slow  # 19 s on 2 shared cores: in CI's `pytest -m slow` pass
def test_a_recovery_transcript_fixes_a_slip_the_probe_really_caught(tmp_path: Path) -> None:
    """For every shipped family: the first env.py misnames one task_tools helper, the real probe rejects
    it with an error naming the helper it has, the agent fixes that line with edit_file and submits again;
    the fixed env.py is the reference's, and the slipped write is context only, never a target."""
    from ait.outer.warmstart import recovery_transcript
    from ait.policy.reference import reference_job

    config = OuterConfig(policy={"model": "tiny", "max_new_tokens": 1024}, trainer={"device": "cpu", "lora_r": 4})
    policy = LocalBackend(config).policy()
    slips_that_fit = 0
    for k, path in enumerate(sorted(TASK.parent.glob("*.json"))):
        spec = load_spec(path)
        t = recovery_transcript(spec, tmp_path / spec.id, None, first_slip=k)
        calls = [(i, c) for i, m in enumerate(t.messages) if m.role == "assistant" for c in m.tool_calls]
        names = [c.name for _, c in calls]
        assert names[-3:] == ["submit_job", "edit_file", "submit_job"] and names.count("submit_job") == 2, names
        rejected = next(m.content for m in t.messages if m.role == "tool" and m.name == "submit_job")
        edit = next(c.arguments for _, c in calls if c.name == "edit_file")
        wrong = edit["old"].split("tt.", 1)[1].split("(")[0]
        right = edit["new"].split("tt.", 1)[1].split("(")[0]
        assert rejected.startswith("invalid job (attempt 1, ") and f"no attribute '{wrong}'" in rejected
        assert f"task_tools has {right}" in rejected or f", {right}" in rejected  # the probe's hint names it
        fixed = tmp_path / spec.id
        workspace = next(p for p in fixed.glob("slip-*/workspace") if (p / "env.py").exists()
                         and (p / "env.py").read_text() == reference_job(spec.family)["env.py"])
        assert (workspace.parent / "submission-1").is_dir() and not (workspace.parent / "submission-2").exists()
        (slipped,) = t.untrained
        assert t.messages[slipped].tool_calls[0].name == "write_file" and wrong in t.messages[slipped].content
        # Every turn that fits the tiny model's context is a target, but the slip.
        whole = sft_examples(policy, Transcript(t.messages), max_completion=1024)
        trained = sft_examples(policy, t, max_completion=1024)
        fits = len(sft_examples(policy, t.messages[:slipped + 1], 1024)) > len(sft_examples(policy, t.messages[:slipped], 1024))
        assert len(whole) - len(trained) == int(fits) and set(map(str, trained)) <= set(map(str, whole))
        slips_that_fit += fits
    assert slips_that_fit >= 2  # the exclusion was really exercised


def test_the_warm_start_alternates_plain_and_recovery_transcripts(tmp_path: Path) -> None:
    from ait.outer import warmstart

    specs = [load_spec(TASK), load_spec(TASK.parent / "triage.json")]
    seen: list = []
    real = warmstart.sft_warm_start
    warmstart.sft_warm_start = lambda config, transcripts, **kw: seen.append(transcripts) or tmp_path
    try:
        build_warm_start(OuterConfig(policy={"model": "tiny"}), specs, base_models=["tiny", "tiny"],
                         variants_per_task=0)
    finally:
        warmstart.sft_warm_start = real
    (transcripts,) = seen
    recovers = [any(c.name == "edit_file" for m in t.messages for c in m.tool_calls) for t in transcripts]
    assert recovers == [False, True, True, False]  # (task, model) = (0,0), (0,1), (1,0), (1,1)
    assert [bool(t.untrained) for t in transcripts] == recovers


def test_a_rejection_that_does_not_name_the_slip_is_no_recovery(tmp_path: Path, monkeypatch) -> None:
    """A probe that failed for another reason (here: it timed out) is not what the fix answers: every
    slip is tried, then the plain reference transcript is used."""
    from ait.outer import warmstart
    from ait.probe.types import ProbeCheck, ProbeError, ProbeReport

    probes = []
    timed_out = ProbeReport(valid=False, errors=[ProbeError(check=ProbeCheck.timeout, message="the probe ran past 60 s")])
    monkeypatch.setattr(warmstart, "probe_workspace", lambda ws, spec: probes.append(ws) or timed_out)
    t = warmstart.recovery_transcript(load_spec(TASK), tmp_path, None, tries=3)
    assert len(probes) == 3 and t.untrained == frozenset()
    assert not any(c.name == "edit_file" for m in t.messages for c in m.tool_calls)
    assert [c.name for m in t.messages for c in m.tool_calls].count("submit_job") == 1


FIVE = ["calc_chain", "dispatch", "ledger", "multi_hop", "string_pipeline"]


def planned_transcripts(tmp_path: Path, monkeypatch, base_models: list[str] | None, seed: int = 0) -> tuple[list, dict]:
    """build_warm_start's transcripts and note for the five training families, SFT left out and the slips
    not probed (recovery transcripts are tested above): what is distilled, not how."""
    from ait.outer import warmstart

    seen: list = []
    monkeypatch.setattr(warmstart, "sft_warm_start",
                        lambda config, transcripts, **kw: seen.append((transcripts, kw["note"])) or tmp_path)
    monkeypatch.setattr(warmstart, "recovery_transcript", lambda spec, workdir, model, first_slip=0, variant=None:
                        warmstart.reference_transcript(spec, workdir, base_model=model, variant=variant))
    specs = [load_spec(TASK.parent / f"{f}.json") for f in FIVE]
    build_warm_start(OuterConfig(policy={"model": "tiny"}, seed=seed), specs, base_models=base_models)
    ((transcripts, note),) = seen
    return transcripts, note


def job_tomls(transcripts: list) -> list[str]:
    return [next(c.arguments["content"] for m in t.messages if m.role == "assistant" for c in m.tool_calls
                 if c.name == "write_file" and c.arguments.get("path") == "job.toml") for t in transcripts]


def test_the_warm_start_distils_the_job_variants_on_every_listed_base_model(tmp_path: Path, monkeypatch) -> None:
    """The starting agent must see different jobs for a task, or every group's jobs are one job: >= 8 distinct
    (model, lr, steps) triples, every listed base model, every non-control variant, no null job."""
    models = ["smollm2-135m", "qwen2.5-coder-0.5b"]
    transcripts, note = planned_transcripts(tmp_path, monkeypatch, models)
    tomls = job_tomls(transcripts)
    triples = [triple(t) for t in tomls]
    assert len(set(triples)) >= 8
    assert set(models) <= {m for m, _, _ in triples}
    assert all(lr > 0 and steps > 0 for _, lr, steps in triples)  # no control job distilled
    used = [v for _, v, _ in note["variants"]]
    assert set(used) == {n for n, v in VARIANTS.items() if not v.control}
    # The note says what each transcript wrote: its job is that variant's job on that model.
    for (task, variant, model), text in zip(note["variants"], tomls):
        family = load_spec(TASK.parent / f"{task}.json").family
        assert triple(text) == triple(variant_job(family, replace(VARIANTS[variant], base_model=model))["job.toml"])
    # Several variants per family, not one job per family.
    assert all(len({v for t, v, _ in note["variants"] if t == task}) >= 3 for task in FIVE)


def test_the_tiny_warm_start_spreads_too_and_the_rotation_follows_the_seed(tmp_path: Path, monkeypatch) -> None:
    transcripts, note = planned_transcripts(tmp_path, monkeypatch, None)
    triples = {triple(t) for t in job_tomls(transcripts)}
    assert len(triples) >= 8 and sum(m == "tiny" for m, _, _ in triples) >= 6  # tiny-relative variants
    assert {n for n, v in VARIANTS.items() if not v.control} == {v for _, v, _ in note["variants"]}
    _, other = planned_transcripts(tmp_path / "s1", monkeypatch, None, seed=1)
    assert other["variants"] != note["variants"]
    assert {v for _, v, _ in other["variants"]} == {v for _, v, _ in note["variants"]}


def test_the_variant_plan_alternates_recoveries_and_keeps_the_legacy_plan_at_zero() -> None:
    from ait.outer.warmstart import warm_start_plan

    specs = [load_spec(TASK.parent / f"{f}.json") for f in FIVE]
    plan = warm_start_plan(specs, ["smollm2-135m", "qwen2.5-coder-0.5b"], None, seed=0)
    assert sum(p for _, p, _, _ in plan) == len(plan) // 2  # every other transcript fixes a slip
    assert warm_start_plan(specs[:2], ["a", "b"], 0) == [(0, 0, "a", None), (0, 1, "b", None),
                                                         (1, 1, "a", None), (1, 0, "b", None)]
    own_model = [n for n, v in VARIANTS.items() if v.base_model and not v.control]
    assert len(own_model) == 3  # model_smollm2, model_qwen15, lora_qwen15
    assert len(warm_start_plan(specs, None, 1)) == len(specs) + len(own_model)  # one knob each, plus the model variants
    assert {v for *_, v in warm_start_plan(specs, None, 1)} >= set(own_model)
    # Three transcripts a model variant, on three distinct tasks; none at 0.
    three = warm_start_plan(specs, ["smollm2-135m", "qwen2.5-coder-0.5b"], 2, seed=0, per_model_variant=3)
    for name in own_model:
        tasks = [i for i, _, _, v in three if v == name]
        assert len(tasks) == len(set(tasks)) == 3, (name, tasks)
    assert len(three) == 5 * 2 * 2 + 3 * len(own_model)
    assert not {v for *_, v in warm_start_plan(specs, None, 1, per_model_variant=0)} & set(own_model)


def test_a_recovery_transcript_writes_its_variant(tmp_path: Path) -> None:
    from ait.outer.warmstart import recovery_transcript

    t = recovery_transcript(load_spec(TASK), tmp_path, "smollm2-135m", first_slip=0, variant="lr_3e-6")
    assert t.untrained and (t.variant, t.base_model) == ("lr_3e-6", "smollm2-135m")
    assert triple(job_tomls([t])[0]) == ("smollm2-135m", 3e-6, 12)


def test_the_loop_passes_the_warmstart_table_to_the_warm_start(tmp_path: Path, monkeypatch) -> None:
    from ait.outer import loop, warmstart

    seen = {}
    monkeypatch.setattr(warmstart, "build_warm_start", lambda config, specs, **kw: seen.update(kw) or tmp_path)
    config = OuterConfig(warmstart={"steps": 3, "base_models": ["smollm2-135m"], "variants_per_task": 2,
                                    "model_variant_transcripts": 3})
    warmed = loop.with_warm_start(config, [TASK])
    assert warmed.policy.init_checkpoint == str(tmp_path)
    assert (seen["steps"], seen["base_models"], seen["variants_per_task"], seen["per_model_variant"]) == (
        3, ["smollm2-135m"], 2, 3)
    assert OuterConfig().warmstart.model_variant_transcripts == 1
    assert OuterConfig().warmstart.variants_per_task is None  # default: as many as cover every variant
