"""job.toml: the reference job parses; aliases, unknown keys, static and task bounds, types, TOML errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ait.job.config import JobConfigError, load_job_config, parse_job_config
from ait.job.types import JobConfig
from ait.spec import Constraints, load_spec

REPO = Path(__file__).resolve().parents[1]
REFERENCE_TOML = REPO / "src/ait/policy/reference_jobs/calc_chain/job.toml"
TASK = REPO / "examples/tasks/calc_chain.json"


@pytest.fixture(scope="module")
def job_constraints() -> Constraints:
    return load_spec(TASK).constraints


@pytest.fixture(scope="module")
def job_reference_text() -> str:
    return REFERENCE_TOML.read_text()


def toml(*, job: str = 'base_model = "tiny"', train: str | None = None, extra: str = "") -> str:
    """A minimal valid job.toml with [train] replaced or extended by `train` lines."""
    train = train if train is not None else (
        "max_steps = 4\nlearning_rate = 1e-3\nnum_generations = 4\nmax_completion_length = 48\n"
        "dataset_size = 64\n"
    )
    return f"{extra}[job]\n{job}\n\n[train]\n{train}\n"


def with_train(key_value: str, drop: str | None = None) -> str:
    """The minimal job with one [train] line added (and optionally one base key removed)."""
    lines = ["max_steps = 4", "learning_rate = 1e-3", "num_generations = 4", "max_completion_length = 48",
             "dataset_size = 64"]
    lines = [ln for ln in lines if drop is None or not ln.startswith(drop + " ")]
    key = key_value.split("=")[0].strip()
    lines = [ln for ln in lines if not ln.startswith(key + " ")]
    return toml(train="\n".join(lines + [key_value]))


def config_error(text: str, constraints: Constraints | None) -> str:
    with pytest.raises(JobConfigError) as exc:
        parse_job_config(text, constraints)
    return str(exc.value)


# --- the reference job and the DESIGN aliases ------------------------------------------------------


def test_reference_job_is_valid(job_reference_text: str, job_constraints: Constraints) -> None:
    cfg = parse_job_config(job_reference_text, job_constraints)
    assert isinstance(cfg, JobConfig)
    assert cfg.job.base_model == "tiny"
    t = cfg.train
    assert (t.max_steps, t.learning_rate, t.num_generations, t.prompts_per_step) == (4, 1e-3, 4, 2)
    assert (t.max_completion_length, t.max_tool_calling_iterations, t.dataset_size) == (48, 2, 64)
    assert t.loss_type == "dapo" and t.lora is None


def test_load_job_config_reads_the_reference_file(job_constraints: Constraints) -> None:
    cfg = load_job_config(REFERENCE_TOML, job_constraints)
    assert cfg.train.num_generations == 4


def test_design_aliases_map_to_trl_names(job_constraints: Constraints) -> None:
    text = toml(train="max_steps = 4\nlearning_rate = 1e-3\ngroup_size = 6\nmax_completion_tokens = 96\n"
                      "max_turns = 3\ndataset_size = 64\n")
    cfg = parse_job_config(text, job_constraints)
    assert cfg.train.num_generations == 6
    assert cfg.train.max_completion_length == 96
    assert cfg.train.max_tool_calling_iterations == 3
    dumped = cfg.train.model_dump()
    assert {"group_size", "max_completion_tokens", "max_turns"}.isdisjoint(dumped)


@pytest.mark.parametrize("alias,name", [
    ("group_size", "num_generations"),
    ("max_completion_tokens", "max_completion_length"),
    ("max_turns", "max_tool_calling_iterations"),
])
def test_both_spellings_is_an_error_naming_both(alias: str, name: str, job_constraints: Constraints) -> None:
    base = "max_steps = 4\nlearning_rate = 1e-3\nnum_generations = 4\nmax_completion_length = 48\ndataset_size = 64\n"
    if name not in base:
        base += f"{name} = 2\n"
    msg = config_error(toml(train=base + f"{alias} = 4\n"), job_constraints)
    assert repr(alias) in msg and repr(name) in msg
    assert "keep one" in msg


def test_alias_value_is_bounds_checked(job_constraints: Constraints) -> None:
    msg = config_error(with_train("group_size = 1", drop="num_generations"), job_constraints)
    assert "group_size" in msg and "greater than or equal to 2" in msg
    msg = config_error(with_train("group_size = 17", drop="num_generations"), job_constraints)
    assert "exceeds the task's bound of 16" in msg


# --- unknown keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text,key", [
    (with_train("foo = 1"), "train.foo"),
    (toml(job='base_model = "tiny"\nbar = "x"'), "job.bar"),
    (toml(extra='bogus = 1\n'), "bogus"),
    (toml() + "\n[extra]\nx = 1\n", "extra"),
    (toml() + "\n[train.lora]\nr = 8\nrank_typo = 4\n", "train.lora.rank_typo"),
])
def test_unknown_key_is_rejected_by_name(text: str, key: str, job_constraints: Constraints) -> None:
    msg = config_error(text, job_constraints)
    assert re.search(rf"(^|[ ;]){re.escape(key)}: unknown key", msg), msg
    assert msg.startswith("job.toml")


def test_lora_section_parses(job_constraints: Constraints) -> None:
    cfg = parse_job_config(toml() + "\n[train.lora]\nr = 8\nlora_alpha = 16\ntarget_modules = ['q_proj']\n",
                           job_constraints)
    assert cfg.train.lora is not None
    assert (cfg.train.lora.r, cfg.train.lora.lora_alpha, cfg.train.lora.target_modules) == (8, 16, ["q_proj"])


# --- static bounds --------------------------------------------------------------------------------


@pytest.mark.parametrize("line,key,fragment", [
    ("learning_rate = -1e-6", "train.learning_rate", "greater than or equal to 0"),
    ("learning_rate = 1", "train.learning_rate", "less than or equal to 0.01"),
    ("learning_rate = nan", "train.learning_rate", ""),
    ("num_generations = 1", "train.num_generations", "greater than or equal to 2"),
    ("temperature = 0", "train.temperature", "greater than 0"),
    ("temperature = inf", "train.temperature", "less than or equal to 2"),
    ('loss_type = "bogus"', "train.loss_type", "'grpo'"),
    ("max_steps = -1", "train.max_steps", "greater than or equal to 0"),
])
def test_static_bounds(line: str, key: str, fragment: str) -> None:
    # No constraints: these bounds hold for every task.
    msg = config_error(with_train(line), None)
    assert f"{key}:" in msg, msg
    assert fragment in msg


def test_lora_static_bound(job_constraints: Constraints) -> None:
    msg = config_error(toml() + "\n[train.lora]\nr = 0\n", job_constraints)
    assert "train.lora.r:" in msg


# --- task bounds (the spec's Constraints) ---------------------------------------------------------


@pytest.mark.parametrize("line,expected", [
    ("max_steps = 201", "train.max_steps = 201 exceeds the task's bound of 200"),
    ("num_generations = 17", "train.num_generations = 17 exceeds the task's bound of 16"),
    ("max_completion_length = 513", "train.max_completion_length = 513 exceeds the task's bound of 512"),
    ("prompts_per_step = 17", "train.prompts_per_step = 17 exceeds the task's bound of 16"),
    ("max_tool_calling_iterations = 9", "train.max_tool_calling_iterations = 9 exceeds the task's bound of 8"),
    ("dataset_size = 31", "train.dataset_size = 31 is below the task's minimum of 32"),
    ("dataset_size = 20001", "train.dataset_size = 20001 exceeds the task's bound of 20000"),
])
def test_task_bounds(line: str, expected: str, job_constraints: Constraints) -> None:
    text = with_train(line)
    parse_job_config(text, None)  # statically fine: only the task's constraints reject it
    assert expected in config_error(text, job_constraints)


def test_task_bounds_at_the_limit_are_accepted(job_constraints: Constraints) -> None:
    text = toml(train="max_steps = 200\nlearning_rate = 1e-3\nnum_generations = 16\nprompts_per_step = 16\n"
                      "max_completion_length = 512\nmax_tool_calling_iterations = 8\ndataset_size = 32\n")
    cfg = parse_job_config(text, job_constraints)
    assert cfg.train.max_steps == 200 and cfg.train.dataset_size == 32


def test_base_model_not_allowed_lists_the_allowed_models(job_constraints: Constraints) -> None:
    msg = config_error(toml(job='base_model = "gpt2"'), job_constraints)
    assert "job.base_model 'gpt2' is not allowed" in msg
    for model in job_constraints.allowed_base_models:
        assert model in msg


def test_several_task_bound_violations_are_all_reported(job_constraints: Constraints) -> None:
    text = toml(job='base_model = "gpt2"', train="max_steps = 500\nlearning_rate = 1e-3\nnum_generations = 17\n"
                                                  "max_completion_length = 48\ndataset_size = 64\n")
    msg = config_error(text, job_constraints)
    assert "job.base_model" in msg and "train.max_steps = 500" in msg and "train.num_generations = 17" in msg


# --- types, TOML, missing file --------------------------------------------------------------------


@pytest.mark.parametrize("line,key", [
    ("max_steps = 'ten'", "train.max_steps"),
    ("max_steps = 4.5", "train.max_steps"),
    ("max_steps = [4]", "train.max_steps"),
    ("learning_rate = 'fast'", "train.learning_rate"),
])
def test_wrong_types(line: str, key: str, job_constraints: Constraints) -> None:
    msg = config_error(with_train(line), job_constraints)
    assert f"{key}: Input should be a valid" in msg, msg


@pytest.mark.parametrize("line", ["max_steps = true", "seed = true", 'max_steps = "10"'])
def test_bool_and_numeric_string_are_type_errors(line: str, job_constraints: Constraints) -> None:
    """Every key has a type: no lax coercion of TOML booleans or numeric strings."""
    assert "Input should be a valid integer" in config_error(with_train(line), job_constraints)


def test_missing_required_sections_are_named(job_constraints: Constraints) -> None:
    msg = config_error("[train]\nmax_steps = 4\n", job_constraints)
    assert "job: Field required" in msg
    assert "train.learning_rate: Field required" in msg


def test_not_toml_is_a_clear_error(job_constraints: Constraints) -> None:
    msg = config_error("this is [not toml\n", job_constraints)
    assert msg.startswith("job.toml is not valid TOML")
    assert "line 1" in msg


def test_missing_file_names_job_toml(tmp_path: Path, job_constraints: Constraints) -> None:
    with pytest.raises(JobConfigError, match=r"job\.toml not found"):
        load_job_config(tmp_path / "job.toml", job_constraints)


def test_load_names_the_file_in_errors(tmp_path: Path, job_constraints: Constraints) -> None:
    path = tmp_path / "job.toml"
    path.write_text(with_train("foo = 1"))
    with pytest.raises(JobConfigError, match=r"^job\.toml: train\.foo: unknown key"):
        load_job_config(path, job_constraints)


@pytest.mark.parametrize("line", ["learning_rate = 0", "max_steps = 0"])
def test_null_job_is_a_valid_job(line: str, job_constraints: Constraints) -> None:
    # The null job (the control of every surface measurement) is one an agent may write too.
    cfg = parse_job_config(with_train(line), job_constraints)
    key, value = line.split(" = ")
    assert getattr(cfg.train, key) == 0
