"""configs/outer/tinker_reference.toml: the reference system's settings on the Tinker backend, checked
by ait's own config loader (unknown keys are errors) and turned into the requests the backend would
send, in the SDK's own types, against a fake ServiceClient (no network, no key needed)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

tinker = pytest.importorskip("tinker", reason="the tinker SDK is an optional extra: pip install 'ait[tinker]'")

from test_tinker_backend import FakeService, names, traj

from ait.configs import ConfigError, load_config
from ait.outer import checkpoint as ckpt
from ait.outer.backends import make_backend
from ait.outer.backends.tinker import TinkerBackend, TinkerUnavailable
from ait.outer.config import OuterConfig
from ait.outer.types import TrajectoryGroup, Turn

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "outer" / "tinker_reference.toml"


def load() -> OuterConfig:
    return load_config(CONFIG, OuterConfig)


def test_it_validates_with_the_reference_settings() -> None:
    config = load()
    assert config.trainer.backend == "tinker"
    assert config.policy.model.startswith("Qwen/Qwen3-")
    assert (config.trainer.lora_r, config.trainer.learning_rate) == (8, 4e-5)
    assert config.num_generations == 8 and config.max_steps_off_policy == 2
    assert config.warmstart.steps == 0  # the reference warm start is local-only: the validator refuses it here
    assert config.heldout_every and config.heldout_episodes >= 16


def test_an_unknown_or_out_of_bounds_key_is_an_error(tmp_path: Path) -> None:
    text = CONFIG.read_text()
    (tmp_path / "typo.toml").write_text(text.replace("max_steps_off_policy = 2", "max_steps_offpolicy = 2"))
    with pytest.raises(ConfigError, match="max_steps_offpolicy"):
        load_config(tmp_path / "typo.toml", OuterConfig)
    (tmp_path / "far.toml").write_text(text.replace("max_steps_off_policy = 2", "max_steps_off_policy = 65"))
    with pytest.raises(ConfigError, match="max_steps_off_policy"):
        load_config(tmp_path / "far.toml", OuterConfig)
    data = tomllib.loads(text)
    data["warmstart"] = {"steps": 10}
    with pytest.raises(ValueError, match="local backend only"):
        OuterConfig.model_validate(data)


def group_of_eight() -> TrajectoryGroup:
    """Eight episodes of one task, rewards 0.0 .. 0.7: every advantage non-zero."""
    trajectories = [traj(0.1 * i, [Turn(prompt_ids=[1, 2, 3], completion_ids=[10 + i, 11],
                                        logprobs=[-0.5, -0.25])], i) for i in range(8)]
    return TrajectoryGroup(task_id="t", trajectories=trajectories, policy_version=0)


def test_make_backend_builds_the_service_requests_in_the_sdks_types(monkeypatch, tmp_path: Path) -> None:
    config = load()
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    with pytest.raises(TinkerUnavailable, match="TINKER_API_KEY"):
        make_backend(config)

    service = FakeService()
    monkeypatch.setenv("TINKER_API_KEY", "test-key-not-sent-anywhere")
    monkeypatch.setattr(tinker, "ServiceClient", lambda api_key: service)
    backend = make_backend(config)
    assert isinstance(backend, TinkerBackend) and service.log == []
    stats = backend.train_step([group_of_eight()])
    assert names(service.log) == ["create_lora_training_client", "forward_backward", "optim_step",
                                  "save_weights_and_get_sampling_client"]
    assert service.log[0][1:] == (config.policy.model, 8)
    _, data, loss_fn = service.log[1]
    assert loss_fn == "importance_sampling" and len(data) == 8
    assert all(isinstance(d, tinker.Datum) and isinstance(d.model_input, tinker.ModelInput) for d in data)
    assert all(isinstance(v, tinker.TensorData) for d in data for v in d.loss_fn_inputs.values())
    adam = service.log[2][1]
    assert isinstance(adam, tinker.AdamParams)
    assert (adam.learning_rate, adam.grad_clip_norm) == (4e-5, config.trainer.max_grad_norm)
    assert stats.step == backend.step == 1

    # Its checkpoint is a bundle of four small files; a resume asks the service for the saved state.
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    state = ckpt.LoopState(step=1, config_digest=config.digest(), rng_state=[3, [0] * 625, None])
    bundle = ckpt.save_checkpoint(run, backend, state, config=config, max_bytes=config.checkpoint_max_mib * 2**20)
    manifest = ckpt.verify_bundle(bundle)
    assert len(manifest["files"]) + 1 == 4 and manifest["backend"] == "tinker"
    resumed = TinkerBackend(config, service_client=service)
    resumed.load(str(bundle / "backend"))
    assert service.log[-2][0] == "create_training_client_from_state_with_optimizer"
    assert service.log[-2][1].startswith("tinker://") and resumed.step == 1
