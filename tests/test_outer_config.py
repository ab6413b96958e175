"""`ait train`'s config: the shipped configs load; unknown keys, out-of-bounds values and
contradictions are one clear line from the CLI, before anything loads or runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ait.cli import app
from ait.configs import ConfigError, load_config
from ait.outer.config import OuterConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["cpu_tiny", "h200_mini"])
def test_shipped_configs_load(name: str) -> None:
    config = load_config(ROOT / "configs" / "outer" / f"{name}.toml", OuterConfig)
    assert config.trainer.backend == "local" and config.trainer.loss == "importance_sampling"
    assert config.num_generations >= 2 and config.digest() == OuterConfig.model_validate(config.model_dump()).digest()


def test_defaults_follow_trl_names() -> None:
    c = OuterConfig()
    assert {"learning_rate", "lora_r", "lora_alpha", "max_grad_norm"} <= set(c.trainer.model_dump())
    assert {"num_generations", "max_steps", "groups_per_step", "max_steps_off_policy"} <= set(c.model_dump())
    assert c.policy.model == "tiny" and c.tasks == ["examples/tasks/*.json"]


def train(tmp_path: Path, text: str):
    path = tmp_path / "outer.toml"
    path.write_text(text)
    return CliRunner().invoke(app, ["train", "--config", str(path), "--run-dir", str(tmp_path / "run")])


@pytest.mark.parametrize("text, needle", [
    ("groups_per_step = 1\nlearning_rate = 1e-5\n", "learning_rate: unknown key"),
    ("[trainer]\nlr = 1e-5\n", "trainer.lr: unknown key"),
    ("num_generations = 1\n", "num_generations: Input should be greater than or equal to 2"),
    ("[trainer]\nlearning_rate = 0.5\n", "trainer.learning_rate: Input should be less than or equal to 0.01"),
    ("[trainer]\nbackend = \"cloud\"\n", "trainer.backend: Input should be 'local' or 'tinker'"),
    ("task_sampling = \"random\"\n", "task_sampling: Input should be 'round_robin' or 'uniform'"),
    ("[episode]\ntimeout_s = 5\n", "set episode_timeout_s at the top level"),
    ("[episode]\nmax_turns = 0\n", "episode.max_turns"),
    ("tasks = [\n", "not valid TOML"),
])
def test_config_errors_are_one_line(tmp_path: Path, text: str, needle: str) -> None:
    result = train(tmp_path, text)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())  # the console wraps at 80 columns; the message is one line
    assert text.startswith("error:") and text.count("error:") == 1 and needle in text, result.output
    assert not (tmp_path / "run").exists()  # nothing started


def test_load_config_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing.toml not found"):
        load_config(tmp_path / "missing.toml", OuterConfig)


def test_train_needs_a_config_or_a_run_to_resume(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["train"])
    assert result.exit_code == 2 and "--config" in result.output
    result = CliRunner().invoke(app, ["train", "--resume", str(tmp_path)])
    assert result.exit_code == 2 and "config.json not found" in " ".join(result.output.split())


def test_outer_episodes_drop_inner_checkpoints_unless_told_to_keep_them(tmp_path):
    from ait.outer.config import OuterConfig
    from ait.outer.loop import episode_config

    assert episode_config(OuterConfig(), tmp_path / "run").keep_checkpoints is False
    kept = OuterConfig(episode={"keep_checkpoints": True})
    assert episode_config(kept, tmp_path / "run").keep_checkpoints is True


@pytest.mark.parametrize("name", sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "configs" / "outer").glob("*.toml")))
def test_a_gpu_arc_trains_on_no_laptop_only_task(name: str, monkeypatch) -> None:
    """calc_chain_cpu (the default episode's rung: smollm2-135m and tiny only) belongs in CPU configs: in a
    GPU arc a third of calc_chain's groups would train models the arc never measures."""
    from ait.outer.loop import resolve_tasks
    from ait.spec import load_spec

    root = Path(__file__).resolve().parents[1]
    config = load_config(root / "configs" / "outer" / f"{name}.toml", OuterConfig)
    if config.policy.model == "tiny":
        return
    monkeypatch.chdir(root)  # the configs name tasks relative to the repository root
    specs = [load_spec(p) for p in resolve_tasks(config.tasks)]
    assert specs and all("qwen2.5-coder-0.5b" in s.constraints.allowed_base_models for s in specs), name
