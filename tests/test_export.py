"""`ait job export`: a job as a verifiers environment package and a prime-rl config.

The fast tests check what is written (files, the mapping of every job.toml setting, the note of the ones
with no counterpart, the keys against prime-rl's config models) and the errors. The slow test runs
scripts/check_verifiers_export.py, which installs verifiers from the package index into its own venv and
checks every reference job there, rollouts included: set AIT_EXPORT_CHECK=1 (it downloads verifiers; about
3 minutes from nothing, 2 when its venv exists; PRIME_RL_SRC=PATH to a prime-rl checkout also validates
rl.toml with prime-rl's own config model).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tomllib
from importlib.resources import files
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from ait.cli.export import job_export
from ait.harness.episode import seed_workspace
from ait.job.export import ExportError, export_job, load_workspace
from ait.job.export.mapping import (PLACEHOLDER_MODEL, job_keys, prime_rl_plan, verifiers_rows)
from ait.job.export.prime_rl import PACKAGE_KEYS, emit_toml, toml_value
from ait.job.export.prime_rl_schema import KEYS
from ait.job.types import JobConfig, LoraConfig, TrainConfig
from ait.policy.reference import reference_job
from ait.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = sorted(p.name for p in (files("ait") / "policy" / "reference_jobs").iterdir() if p.is_dir())


def workspace(tmp_path: Path, family: str = "calc_chain", job_toml: str | None = None,
              env_py: str | None = None) -> Path:
    """A workspace as an episode's agent leaves it: task.json, INSTRUCTIONS.md, the reference job."""
    ws = tmp_path / f"ws-{family}"
    seed_workspace(ws, load_spec(Path(str(files("ait") / "tasks" / f"{family}.json"))))
    job = reference_job(family)
    (ws / "job.toml").write_text(job_toml if job_toml is not None else job["job.toml"])
    (ws / "env.py").write_text(env_py if env_py is not None else job["env.py"])
    return ws


def config(**train) -> JobConfig:
    base = {"max_steps": 10, "learning_rate": 1e-5, "num_generations": 4, "max_completion_length": 64}
    lora = train.pop("lora", None)
    data = {"job": {"base_model": train.pop("base_model", "tiny")}, "train": {**base, **train}}
    if lora is not None:
        data["train"]["lora"] = lora
    return JobConfig.model_validate(data)


def flat_keys(data: dict, prefix: str = "") -> set[str]:
    """Dotted keys of parsed TOML (an array of tables shares its path; an empty table is a key)."""
    keys: set[str] = set()
    for k, v in data.items():
        path = prefix + k
        if isinstance(v, dict):
            keys |= flat_keys(v, path + ".") if v else {path}
        elif isinstance(v, list) and v and all(isinstance(i, dict) for i in v):
            for item in v:
                keys |= flat_keys(item, path + ".")
        else:
            keys.add(path)
    return keys


def imports_of(source: str) -> set[str]:
    tree = ast.parse(source)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


# ------------------------------------------------------------------------------- verifiers package


@pytest.mark.parametrize("family", FAMILIES)
def test_every_reference_job_exports_an_installable_package(tmp_path, family):
    ws = workspace(tmp_path, family)
    result = export_job(ws, "verifiers", tmp_path / "out")
    out, module = tmp_path / "out", result.module
    assert result.env_id == f"ait-job-{family.replace('_', '-')}" and module == result.env_id.replace("-", "_")
    pyproject = tomllib.loads((out / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == result.env_id
    assert pyproject["project"]["dependencies"] == ["verifiers>=0.4,<0.5"]
    assert pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == [module]
    # the adapter, verbatim; the workspace's files under job/ (not job.toml, not the instructions)
    assert (out / module / "taskset.py").read_text() == (files("ait.job.export") / "vf_taskset.py").read_text()
    assert (out / module / "job" / "env.py").read_text() == (ws / "env.py").read_text()
    assert (out / module / "job" / "task.json").read_text() == (ws / "task.json").read_text()
    assert not (out / module / "job" / "job.toml").exists() and not (out / module / "job" / "INSTRUCTIONS.md").exists()
    assert "__all__ = [\"AitJobTaskset\"]" in (out / module / "__init__.py").read_text()
    settings = json.loads((out / module / "ait_job.json").read_text())
    cfg = load_workspace(ws).config
    assert (settings["dataset_size"], settings["seed"]) == (cfg.train.dataset_size, cfg.train.seed)
    # it runs without ait: nothing in the package imports it
    for py in (out / module).rglob("*.py"):
        assert "ait" not in imports_of(py.read_text()), py
    manifest = json.loads((out / "ait_export.json").read_text())
    assert manifest["target"] == "verifiers" and manifest["env_id"] == result.env_id
    assert sorted(manifest["files"]) == sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    # the README's eval command runs it as ait's rollouts ran
    readme = (out / "README.md").read_text()
    assert f"vf-eval {result.env_id}" in readme and "--env.agent.harness.id null" in readme
    assert f"--env.agent.max-turns {cfg.train.max_tool_calling_iterations + 1}" in readme


def test_the_adapter_is_self_contained():
    source = (files("ait.job.export") / "vf_taskset.py").read_text()
    assert imports_of(source) <= {"__future__", "importlib", "inspect", "json", "math", "re", "sys", "pathlib", "typing",
                                  "pydantic", "verifiers"}
    tree = ast.parse(source)
    names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    assert {"AitJobTaskset", "AitJobTask", "AitJobToolset", "AitJobData", "safe_reward", "run_tool"} <= names
    assert 'if __name__ == "__main__":' in source  # verifiers launches the tool server as `python -m`


def test_export_is_deterministic(tmp_path):
    ws = workspace(tmp_path)
    export_job(ws, "prime-rl", tmp_path / "a")
    export_job(ws, "prime-rl", tmp_path / "b")
    a = {p.relative_to(tmp_path / "a"): p.read_bytes() for p in (tmp_path / "a").rglob("*") if p.is_file()}
    b = {p.relative_to(tmp_path / "b"): p.read_bytes() for p in (tmp_path / "b").rglob("*") if p.is_file()}
    assert a == b


def test_workspace_files_travel_and_third_party_imports_are_named(tmp_path):
    env_py = reference_job("calc_chain")["env.py"].replace("import random\n", "import random\nimport numpy\nimport helper\n")
    ws = workspace(tmp_path, env_py=env_py)
    (ws / "data").mkdir()
    (ws / "data" / "rows.jsonl").write_text("{}\n")
    (ws / "helper.py").write_text("X = 1\n")
    (ws / ".hidden").write_text("secret")
    result = export_job(ws, "verifiers", tmp_path / "out")
    job = tmp_path / "out" / result.module / "job"
    assert (job / "data" / "rows.jsonl").read_text() == "{}\n" and (job / "helper.py").exists()
    assert not (job / ".hidden").exists()
    assert result.third_party_imports == ["numpy"]  # helper is the workspace's own
    assert "numpy" in (tmp_path / "out" / "pyproject.toml").read_text()
    assert "numpy" in (tmp_path / "out" / "NOTES.md").read_text()


# ------------------------------------------------------------------------------- prime-rl config


@pytest.mark.parametrize("family", FAMILIES)
def test_every_reference_job_exports_a_prime_rl_config(tmp_path, family):
    ws = workspace(tmp_path, family)
    result = export_job(ws, "prime-rl", tmp_path / "out")
    t = load_workspace(ws).config.train
    text = (tmp_path / "out" / "rl.toml").read_text()
    rl = tomllib.loads(text)
    assert rl["max_steps"] == t.max_steps and rl["model"]["name"] == PLACEHOLDER_MODEL  # tiny: no hub model
    assert rl["orchestrator"]["group_size"] == t.num_generations
    assert rl["orchestrator"]["batch_size"] == t.prompts_per_step * t.num_generations
    assert rl["orchestrator"]["train"]["sampling"] == {"temperature": t.temperature,
                                                       "max_completion_tokens": t.max_completion_length}
    assert rl["trainer"]["optim"] == {"type": "adamw", "lr": t.learning_rate, "weight_decay": 0.0, "max_norm": 1.0}
    [source] = rl["orchestrator"]["train"]["source"]
    assert source["name"] == source["env"]["taskset"]["id"] == result.env_id
    assert source["env"]["taskset"]["dataset_size"] == t.dataset_size and source["env"]["taskset"]["seed"] == t.seed
    assert source["env"]["agent"] == {"max_turns": t.max_tool_calling_iterations + 1,
                                      "max_output_tokens": t.max_completion_length,
                                      "harness": {"id": "null"}, "runtime": {"type": "subprocess"}}
    assert rl["inference"] == {} and rl["ckpt"] == {}
    # every key written is one of prime-rl's (or the exported taskset's own)
    assert flat_keys(rl) - KEYS <= PACKAGE_KEYS
    # the environment it names is beside it
    env_pkg = tomllib.loads((result.package_dir / "pyproject.toml").read_text())
    assert env_pkg["project"]["name"] == result.env_id and result.package_dir == tmp_path / "out" / "environment"
    # the settings with no counterpart: in the TOML's header, NOTES.md and the result
    unmapped = {r.key for r in result.unmapped}
    assert unmapped == {"job.base_model", "train.epsilon", "train.scale_rewards"}
    header = text.split("\n\n")[0]
    notes = (tmp_path / "out" / "NOTES.md").read_text()
    for key in unmapped:
        assert f"#   {key} = " in header and f"- `{key}` = " in notes


def test_every_setting_of_job_toml_is_accounted_for():
    cfg = config()
    expected = {"job.base_model", *(f"train.{k}" for k in TrainConfig.model_fields if k != "lora"),
                *(f"train.lora.{k}" for k in LoraConfig.model_fields)}
    assert [k for k, _, _ in job_keys(cfg)] == list(dict.fromkeys(k for k, _, _ in job_keys(cfg)))
    for rows in (prime_rl_plan(cfg, "ait-job-x").rows, verifiers_rows(cfg)):
        assert {r.key for r in rows} == expected
        assert all(r.status in {"mapped", "approximate", "unmapped", "run setting", "trainer"} for r in rows)
        assert all(r.note for r in rows if r.status in ("approximate", "unmapped"))
    docs = (ROOT / "docs" / "export.md").read_text()
    missing = sorted(k for k in expected if f"`{k}`" not in docs)
    assert not missing, f"docs/export.md does not map {missing}"


def test_settings_with_no_counterpart_are_noted():
    cfg = config(base_model="Qwen/Qwen3-0.6B", beta=0.1, top_p=0.9, num_iterations=2, loss_type="grpo",
                 optim="adafactor", scale_rewards="none", lora={"r": 8})
    plan = prime_rl_plan(cfg, "ait-job-x")
    assert {r.key for r in plan.unmapped} == {"train.beta", "train.top_p", "train.num_iterations", "train.loss_type",
                                              "train.optim", "train.epsilon"}
    assert plan.values["trainer.optim.type"] == "adamw"  # Adafactor has no counterpart: prime-rl's default
    assert plan.values["trainer.model.lora.rank"] == 8 and "trainer.model.lora.target_modules" not in plan.values
    by_key = {r.key: r for r in plan.rows}
    assert by_key["train.scale_rewards"].status == "mapped" and by_key["job.base_model"].status == "mapped"
    assert by_key["train.lora.target_modules"].status == "approximate"  # all-linear -> prime-rl's default list


@pytest.mark.parametrize("base_model, override, name, status, renderer", [
    ("Qwen/Qwen3-1.7B", None, "Qwen/Qwen3-1.7B", "mapped", None),
    ("tiny", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-1.7B", "mapped", None),
    ("tiny", None, PLACEHOLDER_MODEL, "unmapped", None),
    ("/models/mine.gguf", None, PLACEHOLDER_MODEL, "unmapped", None),
    ("smollm2-135m", None, "HuggingFaceTB/SmolLM2-135M-Instruct", "approximate", {"name": "default"}),
    ("qwen2.5-coder-0.5b", None, "Qwen/Qwen2.5-Coder-0.5B-Instruct", "approximate",
     {"name": "default", "tool_parser": "qwen3"}),
])
def test_base_model_to_prime_rl_model(base_model, override, name, status, renderer):
    plan = prime_rl_plan(config(base_model=base_model), "ait-job-x", override)
    assert plan.model == plan.values["model.name"] == name
    row = next(r for r in plan.rows if r.key == "job.base_model")
    assert row.status == status and (status == "mapped" or row.note)
    got = {k.split(".")[-1]: v for k, v in plan.values.items() if k.startswith("orchestrator.renderer.")}
    assert (got or None) == renderer


def test_alias_to_a_hub_id_is_followed(tmp_path, monkeypatch):
    aliases = tmp_path / "models.toml"
    aliases.write_text('[models]\nmine = "Qwen/Qwen3-1.7B"\n')
    monkeypatch.setenv("AIT_MODELS", str(aliases))
    assert prime_rl_plan(config(base_model="mine"), "ait-job-x").model == "Qwen/Qwen3-1.7B"


@pytest.mark.parametrize("train, scheduler", [
    ({}, {"type": "constant"}),
    ({"lr_scheduler_type": "constant", "warmup_steps": 3}, {"type": "constant"}),  # transformers ignores it
    ({"lr_scheduler_type": "constant_with_warmup", "warmup_steps": 3},
     {"type": "linear", "warmup_steps": 3, "decay_steps": 0, "min_lr": 0.0}),
    ({"lr_scheduler_type": "linear", "warmup_steps": 2},
     {"type": "linear", "warmup_steps": 2, "decay_steps": 8, "min_lr": 0.0}),
    ({"lr_scheduler_type": "cosine", "warmup_steps": 0.15}, {"type": "cosine", "warmup_steps": 2, "min_lr": 0.0}),
    ({"lr_scheduler_type": "cosine", "warmup_steps": 10},
     {"type": "linear", "warmup_steps": 10, "decay_steps": 0, "min_lr": 0.0}),
])
def test_learning_rate_schedule(train, scheduler):
    plan = prime_rl_plan(config(**train), "ait-job-x")
    got = {k.removeprefix("trainer.scheduler."): v for k, v in plan.values.items() if k.startswith("trainer.scheduler.")}
    assert got == scheduler


def test_sgd_is_plain_sgd():
    plan = prime_rl_plan(config(optim="sgd"), "ait-job-x")
    assert (plan.values["trainer.optim.type"], plan.values["trainer.optim.momentum"],
            plan.values["trainer.optim.nesterov"]) == ("sgd", 0.0, False)


def test_toml_writer_round_trips():
    values = {"top": 1, "a.b": 'quote " back \\ nl \n tab \t del \x7f é ✓', "a.c": [1.5, 1e-05, True, "x"],
              "s.name": "n", "s.env.id": 3, "s.env.k.v": 0.0, "later": object()}
    values["later"] = 2.0
    lines = emit_toml(values, {"a.b": "why"}, arrays={"s"})
    parsed = tomllib.loads("\n".join(lines))
    assert parsed == {"top": 1, "a": {"b": values["a.b"], "c": [1.5, 1e-05, True, "x"]},
                      "s": [{"name": "n", "env": {"id": 3, "k": {"v": 0.0}}}], "later": 2.0}
    assert toml_value(3.0) == "3.0" and toml_value(False) == "false"


# ------------------------------------------------------------------------------- bad input


def test_errors_say_what_to_fix(tmp_path):
    ws = workspace(tmp_path)
    with pytest.raises(ExportError, match="unknown target 'trl'"):
        export_job(ws, "trl", tmp_path / "o1")
    with pytest.raises(ExportError, match="not a directory"):
        export_job(tmp_path / "nowhere", "verifiers", tmp_path / "o2")
    with pytest.raises(ExportError, match="--model applies to --to prime-rl"):
        export_job(ws, "verifiers", tmp_path / "o3", model="Qwen/Qwen3-0.6B")
    with pytest.raises(ExportError, match="environment name 'Bad_Name'"):
        export_job(ws, "verifiers", tmp_path / "o4", name="Bad_Name")
    with pytest.raises(ExportError, match="overlaps the workspace"):
        export_job(ws, "verifiers", ws / "out")
    assert not any(p.name.startswith(".o") for p in tmp_path.iterdir())  # no temporary directory left behind


def test_workspace_without_env_py(tmp_path):
    ws = workspace(tmp_path)
    (ws / "env.py").unlink()
    with pytest.raises(ExportError, match="env.py not found"):
        export_job(ws, "verifiers", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("job_toml, message", [
    ("[job]\nbase_model = \"tiny\"\n[train\n", "not valid TOML"),
    ("[job]\nbase_model = \"tiny\"\n[train]\nmax_steps = 4\nlearning_rate = 1e-3\nnum_generations = 4\n"
     "max_completion_length = 48\nbogus = 1\n", "bogus"),
    ("[job]\nbase_model = \"tiny\"\n[train]\nmax_steps = -1\nlearning_rate = 1e-3\nnum_generations = 4\n"
     "max_completion_length = 48\n", "max_steps"),
])
def test_invalid_job_toml(tmp_path, job_toml, message):
    ws = workspace(tmp_path, job_toml=job_toml)
    with pytest.raises(ExportError, match=message):
        export_job(ws, "prime-rl", tmp_path / "out")


@pytest.mark.parametrize("env_py, message", [
    ("def broken(:\n", "SyntaxError"),
    ("SYSTEM_PROMPT = 'x'\nclass Environment: pass\ndef build_dataset(n, seed): return []\n", "REWARD_FUNCS"),
    ("import ait\nSYSTEM_PROMPT = 'x'\nclass Environment: pass\ndef build_dataset(n, seed): return []\n"
     "REWARD_FUNCS = []\n", "imports ait"),
])
def test_invalid_env_py(tmp_path, env_py, message):
    ws = workspace(tmp_path, env_py=env_py)
    with pytest.raises(ExportError, match=message):
        export_job(ws, "verifiers", tmp_path / "out")


def test_out_dir_is_never_clobbered(tmp_path):
    ws = workspace(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="not empty"):
        export_job(ws, "verifiers", other, force=True)
    assert (other / "keep.txt").read_text() == "mine"
    empty = tmp_path / "empty"
    empty.mkdir()
    export_job(ws, "verifiers", empty)  # an empty directory is fine
    with pytest.raises(ExportError, match="--force"):
        export_job(ws, "prime-rl", empty)
    export_job(ws, "prime-rl", empty, force=True)  # an earlier export is replaced whole
    assert (empty / "rl.toml").exists() and not (empty / "pyproject.toml").exists()


def test_cli(tmp_path):
    app = typer.Typer()
    app.command("export")(job_export)
    app.command("other")(lambda: None)  # two commands: `export` is a sub-command, as under `ait job`
    ws = workspace(tmp_path)
    runner = CliRunner()
    ok = runner.invoke(app, ["export", str(ws), "--to", "prime-rl", str(tmp_path / "out"), "--model", "Qwen/Qwen3-1.7B"])
    assert ok.exit_code == 0, ok.output
    assert "Qwen/Qwen3-1.7B" in ok.output and "2 job.toml setting(s) with no prime-rl counterpart" in ok.output
    js = runner.invoke(app, ["export", str(ws), "--to", "verifiers", str(tmp_path / "vf"), "--json"])
    assert js.exit_code == 0 and json.loads(js.output)["env_id"] == "ait-job-calc-chain"
    bad = runner.invoke(app, ["export", str(ws), "--to", "nope", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "unknown target 'nope'" in bad.output


# ------------------------------------------------------------------------------- against verifiers itself


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("AIT_EXPORT_CHECK") != "1",
                    reason="set AIT_EXPORT_CHECK=1: installs verifiers from the package index into its own venv")
def test_exports_match_ait_under_verifiers():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_verifiers_export.py")],
                          capture_output=True, text=True, timeout=1800)
    print(proc.stdout[-6000:], proc.stderr[-3000:])
    assert proc.returncode == 0
    assert "all identical" in proc.stdout
