"""Properties every registered family must have (docs/design.md, "Task families")."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from transformers.utils import get_json_schema
from typer.testing import CliRunner

from ait.cli import app
from ait.evals.hidden import hidden_examples
from ait.families import FAMILIES, training_families
from ait.harness.episode import seed_workspace
from ait.home import hidden_secret
from ait.outer.tasks import HeldOutError, sample_training_tasks, training_tasks
from ait.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
TASKS = sorted((ROOT / "examples" / "tasks").glob("*.json"))
REFERENCE_JOBS = ROOT / "src" / "ait" / "policy" / "reference_jobs"
NAMES = sorted(FAMILIES)


def test_every_family_has_a_task_spec_and_a_reference_job():
    spec_families = {load_spec(p).family for p in TASKS}
    assert set(NAMES) <= spec_families, f"families without a TaskSpec: {set(NAMES) - spec_families}"
    for name in NAMES:
        assert (REFERENCE_JOBS / name / "env.py").is_file() and (REFERENCE_JOBS / name / "job.toml").is_file()


def test_triage_is_held_out_and_never_sampled_for_training():
    assert FAMILIES["triage"].held_out and "triage" not in training_families()
    assert set(training_families()) == {"calc_chain", "multi_hop", "string_pipeline", "ledger", "dispatch"}
    picks = sample_training_tasks(TASKS, 500, random.Random(0))
    assert picks and all(not FAMILIES[s.family].held_out for s, _ in picks)
    assert {s.family for s, _ in picks} == set(training_families())
    held = [p for p in TASKS if FAMILIES[load_spec(p).family].held_out]
    assert held and training_tasks(held) == []
    with pytest.raises(HeldOutError):
        sample_training_tasks(held, 1, random.Random(0))


@pytest.mark.parametrize("name", NAMES)
def test_generator_is_deterministic_and_tools_have_schemas(name):
    fam = FAMILIES[name]
    d = fam.difficulty()
    a = [fam.example(random.Random(7), d) for _ in range(3)]
    b = [fam.example(random.Random(7), d) for _ in range(3)]
    assert [e.model_dump() for e in a] == [e.model_dump() for e in b]
    json.dumps(a[0].world)
    spec_tools = {t.name: [p.name for p in t.parameters] for t in fam.eval_format(d).tools}
    fns = {fn.__name__: fn for fn in fam.tools(a[0].world)}
    assert set(spec_tools) == set(fns)
    for tool_name, params in spec_tools.items():
        schema = get_json_schema(fns[tool_name])["function"]
        assert list(schema["parameters"].get("properties", {})) == params


@pytest.mark.parametrize("path", TASKS, ids=[p.stem for p in TASKS])
def test_no_hidden_data_in_task_specs_or_workspaces(path, tmp_path, monkeypatch):
    monkeypatch.setenv("AIT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AIT_HIDDEN_SEED", raising=False)
    spec = load_spec(path)
    secret = hidden_secret()
    hidden = hidden_examples(spec)
    assert len(hidden) == spec.hidden_eval_size and len({h.prompt for h in hidden}) == len(hidden)
    dev_prompts = {d.prompt for d in spec.dev_examples}
    assert not dev_prompts & {h.prompt for h in hidden}
    seed_workspace(tmp_path / "ws", spec)
    texts = [path.read_text()] + [p.read_text() for p in (tmp_path / "ws").rglob("*") if p.is_file()]
    blob = "\n".join(texts)
    assert secret not in blob
    for h in hidden:
        assert h.prompt not in blob


@pytest.mark.parametrize("path", TASKS, ids=[p.stem for p in TASKS])
def test_reference_job_passes_ait_job_validate(path, tmp_path):
    spec = load_spec(path)
    ws = tmp_path / "ws"
    shutil.copytree(REFERENCE_JOBS / spec.family, ws)
    # beside it the task's task.json, as every workspace has one (`ait job init`, an episode's): task_tools.py
    # reads its knobs there (calc_chain_cpu's `calculator: false` leaves Environment without the calculator)
    (ws / "task.json").write_text(spec.model_dump_json())
    result = CliRunner().invoke(app, ["job", "validate", str(ws), "--task", str(path), "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 0 and report["valid"], report["errors"]


def test_validate_with_task_gives_a_workspace_without_task_json_the_tasks_knobs(tmp_path):
    """`ait job validate WS --task calc_chain_cpu` on a bare copy of the reference job: the probe sees the task's
    task.json (no calculator at this rung), and the user's workspace is left as it was."""
    ws = tmp_path / "ws"
    shutil.copytree(REFERENCE_JOBS / "calc_chain", ws)
    before = sorted(p.name for p in ws.iterdir())
    result = CliRunner().invoke(app, ["job", "validate", str(ws), "--task", "calc_chain_cpu", "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 0 and report["valid"], report["errors"]
    assert sorted(p.name for p in ws.iterdir()) == before and not (ws / "task.json").exists()


def test_tasks_sample_prints_a_gold_trace_that_reaches_the_answer():
    for name in NAMES:
        result = CliRunner().invoke(app, ["tasks", "sample", name, "--n", "3", "--json"])
        assert result.exit_code == 0, result.output
        samples = json.loads(result.stdout)
        assert len(samples) == 3
        for s in samples:
            assert s["trace"], f"{name}: empty gold trace"
            assert not any(step["result"].startswith("error:") for step in s["trace"]), s
    unknown = CliRunner().invoke(app, ["tasks", "sample", "no_such_family"])
    assert unknown.exit_code == 2 and "unknown task family" in unknown.output


def test_committed_task_specs_match_the_generator():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_task_specs.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_an_inline_spec_says_the_data_is_in_the_question():
    """The agent reads the spec's description: at an inline rung it must not claim the data is
    only behind the tools."""
    from ait.spec import INLINE_NOTE, Constraints, build_spec

    c = Constraints(allowed_base_models=["tiny"], max_steps=1, max_group_size=2, max_prompts_per_step=1,
                    max_completion_tokens=8, max_turns=1, time_budget_s=1, min_dataset_rows=1, max_dataset_rows=1)
    for name in ("multi_hop", "string_pipeline", "ledger", "dispatch", "triage"):
        inline = build_spec(name, difficulty={"inline": True}, constraints=c)
        plain = build_spec(name, constraints=c)
        assert inline.description == plain.description + INLINE_NOTE
        assert INLINE_NOTE not in plain.description
