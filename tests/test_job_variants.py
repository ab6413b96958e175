"""The reference job's variants (ait.policy.job_variants): valid under every task's constraints on a real
model and relative to the tiny CPU job; what ReferencePolicy(variant=...) writes; the spread measure."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from ait.harness.fenced import last_fenced_block
from ait.harness.types import Message
from ait.job.config import parse_job_config
from ait.outer.spread import distinct_triples, job_spread, within_group_std
from ait.policy.job_variants import (REFERENCE_MODEL, REFERENCE_TRAIN, VARIANTS, agent_job, task_job, tiny_job,
                                     triple, variant_job)
from ait.policy.reference import ReferencePolicy, plant_slip, reference_job
from ait.spec import load_spec

TASKS = sorted((Path(__file__).resolve().parents[1] / "examples" / "tasks").glob("*.json"))
SPECS = [load_spec(p) for p in TASKS]


def written_job(policy: ReferencePolicy, spec) -> dict[str, str]:
    """Drive the policy through its scripted turns (no harness) and return the job.toml and env.py it wrote."""
    policy.reset(spec)
    out = {}
    listing = Message(role="tool", name="list_files", content="task_tools.py")
    for _ in range(8):
        messages = [listing, Message(role="tool", name="read_file", content=spec.model_dump_json())]
        reply = policy.act(messages, [])
        for call in reply.tool_calls:
            if call.name == "write_file":
                # env.py is written as the message's fenced block, as the harness reads it
                body = call.arguments.get("content") or last_fenced_block(reply.content)
                out[call.arguments["path"]] = body
    return out


def test_every_variant_of_every_family_is_a_valid_job_on_its_model_and_on_tiny() -> None:
    for spec in SPECS:
        for name, v in VARIANTS.items():
            if (v.base_model or REFERENCE_MODEL) not in spec.constraints.allowed_base_models:
                # a task sized for a laptop (calc_chain_cpu) allows no GPU model: the variant is refused, not bent
                with pytest.raises(ValueError, match="does not allow"):
                    variant_job(spec.family, name, constraints=spec.constraints)
                parse_job_config(tiny_job(spec.family, name, spec.constraints)["job.toml"], spec.constraints)
                continue
            gpu = variant_job(spec.family, name, constraints=spec.constraints)
            cfg = parse_job_config(gpu["job.toml"], spec.constraints)
            assert cfg.job.base_model == (v.base_model or REFERENCE_MODEL)
            for key, value in v.train.items():
                got = getattr(cfg.train, key)
                got = {k: getattr(got, k) for k in value} if isinstance(value, dict) else got  # [train.lora]
                assert got == value, (spec.id, name, key)
            cpu = tiny_job(spec.family, name, spec.constraints)
            parse_job_config(cpu["job.toml"], spec.constraints)
            assert tomllib.loads(cpu["job.toml"])["job"]["base_model"] == "tiny"
            # The partial-credit switch reaches env.py (and only that variant turns it off).
            weights = [line for line in gpu["env.py"].splitlines() if line.startswith("REWARD_WEIGHTS")]
            assert (", 0.0," in weights[0]) == (not v.partial_credit), (spec.id, name, weights)
            assert cpu["env.py"] == gpu["env.py"]


def test_tiny_variants_scale_the_cpu_jobs_knobs_by_the_variants_factor() -> None:
    shipped = tomllib.loads(reference_job("calc_chain")["job.toml"])["train"]

    def train(name: str, constraints=None) -> dict:
        return tomllib.loads(tiny_job("calc_chain", name, constraints)["job.toml"])["train"]

    assert train("lr_3e-6")["learning_rate"] == pytest.approx(3 * shipped["learning_rate"])
    assert train("lr_3e-7")["learning_rate"] == pytest.approx(0.3 * shipped["learning_rate"])
    assert train("lr_1e-5")["learning_rate"] <= 1e-2  # ten times 1e-3, at the contract's bound, not past it
    steps = REFERENCE_TRAIN["max_steps"]
    assert train("steps_30")["max_steps"] == round(shipped["max_steps"] * 30 / steps)
    assert train("steps_30")["dataset_size"] == shipped["dataset_size"] * 1024 // REFERENCE_TRAIN["dataset_size"]
    assert train("steps_4")["max_steps"] == 1  # 4 x 4/12 rounds to 1: never to a null job by accident
    assert train("null_steps0")["max_steps"] == 0 and train("null_lr0")["learning_rate"] == 0.0
    assert (train("gens_16")["num_generations"], train("gens_16")["prompts_per_step"]) == (16, 2)
    assert train("loss_grpo")["loss_type"] == "grpo" and train("temp_0.7")["temperature"] == 0.7
    # Within a tighter task's bounds: clamped there, and still a valid job.
    tight = SPECS[0].constraints.model_copy(update={"max_steps": 5, "max_group_size": 8, "max_dataset_rows": 100})
    for name in ("steps_30", "gens_16"):
        parse_job_config(tiny_job("calc_chain", name, tight)["job.toml"], tight)
    assert (train("steps_30", tight)["max_steps"], train("gens_16", tight)["num_generations"]) == (5, 8)
    assert train("steps_30", tight)["dataset_size"] == 100


def test_the_default_reference_job_is_the_shipped_job_byte_for_byte() -> None:
    """The family's shipped job, or the task's own where it has one (calc_chain_cpu's, for a laptop's CPU)."""
    for spec in SPECS:
        shipped = reference_job(spec.family)
        assert agent_job(spec.family, spec.constraints)[2] == shipped
        assert tiny_job(spec.family, "reference", spec.constraints) == shipped
        own = task_job(spec.family, spec.id)
        assert agent_job(spec.family, spec.constraints, task_id=spec.id)[2] == (own or shipped)
        assert written_job(ReferencePolicy(), spec)["job.toml"] == (own or shipped)["job.toml"]
    assert [s.id for s in SPECS if task_job(s.family, s.id)] == ["calc_chain_cpu"]


@pytest.mark.parametrize("variant,base_model,expected", [
    ("lr_3e-6", "smollm2-135m", ("smollm2-135m", 3e-6, 12)),
    ("steps_30", "qwen2.5-coder-0.5b", ("qwen2.5-coder-0.5b", 1e-6, 30)),
    ("lr_1e-5", None, ("tiny", 1e-2, 4)),  # tiny: the factor (x10) over the shipped 1e-3
    ("steps_4", None, ("tiny", 1e-3, 1)),
    ("model_qwen15", "smollm2-135m", ("qwen2.5-coder-1.5b", 1e-6, 12)),  # the variant's model is its point
    ("model_smollm2", None, ("smollm2-135m", 1e-6, 12)),
    (None, "smollm2-135m", ("smollm2-135m", 1e-6, 12)),  # a real model: the GPU reference job
])
def test_the_reference_policy_writes_its_variants_triple(variant, base_model, expected) -> None:
    spec = SPECS[0]
    policy = ReferencePolicy(jobs=1, base_model=base_model, variant=variant)
    job = written_job(policy, spec)
    model, lr, steps = triple(job["job.toml"])
    assert (model, steps) == expected[::2] and lr == pytest.approx(expected[1])
    assert policy.written == (variant or "reference", expected[0])
    parse_job_config(job["job.toml"], spec.constraints)


def test_a_variant_on_a_model_the_task_forbids_falls_back_to_the_reference_job_on_an_allowed_one() -> None:
    spec = SPECS[0].model_copy(deep=True)
    spec.constraints.allowed_base_models = ["smollm2-135m", "qwen2.5-coder-0.5b"]
    for variant, base_model in [("model_qwen15", None), ("lr_3e-6", "Qwen/Qwen3-0.6B"), (None, None)]:
        policy = ReferencePolicy(jobs=1, base_model=base_model, variant=variant)
        job = written_job(policy, spec)
        parse_job_config(job["job.toml"], spec.constraints)  # never an invalid job
        assert triple(job["job.toml"])[0] == "smollm2-135m"
    assert policy.written == ("reference", "smollm2-135m")
    with pytest.raises(ValueError, match="unknown job variant"):
        ReferencePolicy(variant="lr_42")


def test_a_variant_keeps_the_slip_and_the_longer_refinement_working() -> None:
    spec = SPECS[0]
    policy = ReferencePolicy(jobs=2, base_model="smollm2-135m", variant="steps_4", slip=0)
    job = written_job(policy, spec)
    assert policy.fix is not None and policy.fix[0] in job["env.py"]  # the slipped line is what was written
    assert plant_slip(variant_job(spec.family, "steps_4")["env.py"], 0)[0] == job["env.py"]
    # After a job ran and another is allowed: max_steps doubles.
    reply = policy.act([Message(role="tool", name="submit_job", content="job done; 1 more job(s) allowed")], [])
    assert reply.tool_calls[0].name == "write_file" and triple(reply.tool_calls[0].arguments["content"])[2] == 8


def test_spread_counts_distinct_triples_and_the_within_group_std() -> None:
    jobs = [variant_job("calc_chain", v)["job.toml"] for v in ("reference", "temp_0.7", "lr_3e-6", "model_qwen15")]
    assert distinct_triples(jobs) == 3  # temp_0.7 has the reference's triple
    assert distinct_triples([*jobs, "not toml [", '[job]\nbase_model = "tiny"\n']) == 3  # unparseable: skipped
    assert within_group_std({"a": [0.2, 0.2, 0.2], "b": [0.0, 1.0]}) == pytest.approx(0.25)  # (0 + 0.5) / 2
    assert within_group_std([[0.3]]) is None
    spread = job_spread(jobs + ["x = 1"], {"g": [0.1, 0.3]})
    assert (spread["jobs"], spread["parsed"], spread["distinct_triples"]) == (5, 4, 3)
    assert spread["within_group_std"] == pytest.approx(0.1)


def test_every_variant_job_is_named_back_by_the_surface_name_it_was_made_from():
    """variant_name reads a job back into the surface's name: each variant's GPU job (and a two-knob
    combination) comes back as its own name, so the arc's counts of the agent's jobs line up with
    docs/surface.md's cells."""
    import tomllib

    from ait.policy.job_variants import VARIANTS, resolve_variant, variant_job, variant_name

    for family in ("calc_chain", "dispatch", "ledger"):
        for name in [*(n for n in VARIANTS if n != "null_steps0"), "model_qwen15+lr_3e-6", "model_qwen15+steps_30"]:
            job = variant_job(family, resolve_variant(name))
            cfg = tomllib.loads(job["job.toml"])
            weights = tomllib.loads("w = " + job["env.py"].split("REWARD_WEIGHTS = ", 1)[1].split("\n", 1)[0])["w"]
            assert variant_name(cfg["job"]["base_model"], cfg["train"], weights) == name, (family, name)
    # null_steps0 too, and a value no variant has is named by its value
    assert variant_name("qwen2.5-coder-0.5b", {"max_steps": 0}) == "null_steps0"
    assert variant_name("qwen2.5-coder-0.5b", {"learning_rate": 2e-6, "temperature": 0.9}) == "lr=2e-06+temp=0.9"
