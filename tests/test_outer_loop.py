"""`ait train` on CPU: two outer steps with the tiny agent (ait.train.tiny) on real episodes (harness,
sandboxed probe, the tiny inner model for any job that gets that far), metrics.jsonl, checkpoints,
and a resumed run that continues from the saved step.

A random tiny agent never emits a tool call, so every reward would be -0.1, every advantage 0 and
no update would happen. The run therefore starts from a warm start (ait.outer.warmstart): a short
SFT whose only target is a bare submit_job call as the first reply. At temperature 1.0 some sampled
replies are that call and some are not, so the rewards differ honestly: a submission of the
untouched template workspace is parseable but judged invalid by the probe (reward 0.0), no
submission scores -0.1. Groups whose rewards differ have non-zero advantages and the backend takes
real optimizer steps: the adapter after step 2 is not the warm start's.

Why the adapter also covers lm_head here: the tiny model's output embeddings are tied to its input
embeddings, which are random and small (std 0.02), and the final RMSNorm fixes the hidden state's
norm, so with adapters on the projections only no token's logit can rise far above the others (the
SFT loss stalls near uniform). An adapter on lm_head lets the logits grow.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from test_outer_loss import sampled_turns, traj
from typer.testing import CliRunner

from ait.cli import app
from ait.configs import load_config
from ait.harness.episode import opening_messages
from ait.harness.types import Message, ToolCallRequest
from ait.outer import checkpoint as ckpt
from ait.outer.backends.local import LocalBackend, completion_logprobs
from ait.outer.config import OuterConfig
from ait.outer.loop import resolve_tasks
from ait.outer.metrics import HELDOUT_KEYS, KEYS
from ait.outer.tasks import training_tasks
from ait.outer.types import TrajectoryGroup
from ait.outer.warmstart import sft_examples

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "examples" / "tasks"
# LoRA on every projection and on lm_head (see the module docstring), as a [trainer] override.
LORA_WITH_HEAD = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
# The warm start's SFT. The probability that the first reply is the submit_job call rises steeply with the
# steps (measured on 2 threads: 120 steps 0.03, 150 steps 0.79), and where it crosses depends on the numerics
# (threads, BLAS, the prompt's exact tokens), so no fixed step count keeps it in the middle. The SFT therefore
# stops at the first check where that probability, by teacher forcing, reaches SUBMIT_P on average over the
# training tasks: the groups then hold submitters and non-submitters, and their rewards differ.
SFT_LR, SFT_BATCH, SFT_MAX_STEPS, SFT_CHECK_EVERY, SUBMIT_P = 1e-2, 2, 400, 3, 0.3


def write_config(path: Path, **overrides) -> Path:
    """configs/outer/cpu_tiny.toml with absolute task paths (and overrides; a table's override updates
    that table), as TOML."""
    config = load_config(ROOT / "configs" / "outer" / "cpu_tiny.toml", OuterConfig)
    data = config.model_dump(mode="json", exclude_none=True)
    data.update(tasks=[str(TASKS / "*.json")], heldout_tasks=[str(TASKS / "triage.json")])
    for key, value in overrides.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    path.write_text(toml(data))
    return path


def toml(data: dict, prefix: str = "") -> str:
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    out = "".join(f"{k} = {json.dumps(v)}\n" for k, v in scalars.items())
    for k, v in tables.items():
        out += f"\n[{prefix}{k}]\n" + toml(v, f"{prefix}{k}.")
    return out


def submit_first_warm_start(config_path: Path, cache_dir: Path) -> Path:
    """A warm start (a backend checkpoint, usable as [policy] init_checkpoint) for the config's policy whose
    target is a submit_job call right after the opening messages of each training task, rendered as the
    sampling policy renders it, trained until that call's mean probability reaches SUBMIT_P."""
    config = load_config(config_path, OuterConfig)
    config.trainer.learning_rate = SFT_LR
    submit = Message(role="assistant", tool_calls=[ToolCallRequest(id="call_0", name="submit_job", arguments={})])
    transcripts = [[*opening_messages(spec), submit] for spec, _ in training_tasks(resolve_tasks(config.tasks))]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        backend = LocalBackend(config)
    try:
        examples = [e for t in transcripts for e in sft_examples(backend.policy(), t, config.policy.max_new_tokens)]
        rng, p = random.Random(config.seed), 0.0
        for step in range(1, SFT_MAX_STEPS + 1):
            backend.sft_step(rng.sample(examples, SFT_BATCH))
            if step % SFT_CHECK_EVERY == 0 and (p := submit_probability(backend, examples)) >= SUBMIT_P:
                break
        assert SUBMIT_P <= p < 0.95, f"the warm start's submit probability is {p:.3f} after {step} steps"
        backend.save(str(cache_dir))
        return cache_dir
    finally:
        backend.close()


def submit_probability(backend: LocalBackend, examples: list[tuple[list[int], list[int]]]) -> float:
    """Mean over the examples of the probability that the whole target reply is sampled (temperature 1)."""
    with torch.no_grad():
        return sum(math.exp(float(completion_logprobs(backend.model, prompt, completion, 1.0).sum()))
                   for prompt, completion in examples) / len(examples)


def adapter(path: Path) -> dict[str, torch.Tensor]:
    """The LoRA tensors of a saved adapter (a checkpoint's, or a warm start's)."""
    from safetensors.torch import load_file

    return {k: v for k, v in load_file(str(path / "adapter" / "adapter_model.safetensors")).items() if "lora_" in k}


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def ait_train(*args: str) -> dict:
    result = CliRunner().invoke(app, ["train", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[result.stdout.index("{"):])


@pytest.mark.slow  # 59 s on 2 shared cores: in CI's `pytest -m slow` pass
@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning")  # lm_head's adapter: fine
def test_two_steps_then_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    # Off-policy by one step: both steps' groups start at once (the second step's sample while the first trains).
    # Groups of 4: more chances that a group's rewards differ.
    overrides: dict = {"max_steps_off_policy": 1, "num_generations": 4,
                       "trainer": {"lora_target_modules": LORA_WITH_HEAD}}
    warm = submit_first_warm_start(write_config(tmp_path / "sft.toml", **overrides), tmp_path / "warmstart")
    overrides["policy"] = {"init_checkpoint": str(warm)}
    summary = ait_train("--config", str(write_config(tmp_path / "a.toml", **overrides)), "--run-dir", str(run))
    assert summary["step"] == 2 and summary["stopped"] == "max_steps"
    first = rows(run)
    assert [r["step"] for r in first] == [1, 2]
    for r in first:
        assert set(KEYS) <= set(r), set(KEYS) - set(r)
        assert r["episodes"] == 8 and r["staleness_max"] <= 1
        assert r["policy_tokens"] > 0 and r["train_tokens"] == r["policy_tokens"] and r["usd"] == 0.0
    assert set(HELDOUT_KEYS) <= set(first[1]) and first[1]["heldout_n"] == 1  # heldout_every = 2
    assert "heldout_reward" not in first[0]

    # Every episode is a real, scored harness episode; the metrics are theirs; triage is never trained on.
    episodes = [json.loads(p.read_text()) for p in sorted((run / "episodes").glob("*/episode.json"))]
    assert len(episodes) == 16 and all(not e["task_id"].startswith("triage") for e in episodes)
    rewards = [e["reward"]["total"] for e in episodes]
    assert sum(r["reward_mean"] * r["episodes"] for r in first) == pytest.approx(sum(rewards))
    # The held-out evaluation went through the agent benchmark's runner: its layout and results.json.
    # The starting policy is evaluated first (step 0), on the same seeds as every later evaluation, and
    # each later row carries the paired difference with it (held-out transfer).
    assert len(list((run / "heldout").glob("step-*/runs/*/episode.json"))) == 2
    start, held = sorted((run / "heldout").glob("step-*/results.json"))
    assert (start.parent.name, held.parent.name) == ("step-00000", "step-00002")
    assert json.loads(held.read_text())["overall"]["episodes"] == 1
    (a,), (b,) = (json.loads(p.read_text())["episodes"] for p in (start, held))
    assert (a["task_id"], a["run_id"]) == (b["task_id"], b["run_id"])
    assert first[1]["heldout_vs_start"] == pytest.approx(b["reward"] - a["reward"])
    assert first[1]["heldout_start_reward"] == pytest.approx(a["reward"]) and first[1]["heldout_vs_start_se2"] is None
    # A bundle is written right after the step-0 evaluation (a machine lost in step 1 keeps it), and every
    # bundle carries those results for a continued run to compare with.
    step0, step2 = run / "checkpoints" / "step_0", run / "checkpoints" / "step_2"
    assert ckpt.load_state(step0).step == 0 and (step0 / "metrics.jsonl").read_text() == ""
    for bundle in (step0, step2):
        assert (bundle / "heldout_start.json").read_bytes() == start.read_bytes()
        assert len([p for p in bundle.rglob("*") if p.is_file()]) <= ckpt.MAX_FILES
    # The rewards are the harness's: a parseable submission the probe rejects (0.0) or none (-0.1).
    assert set(rewards) == {0.0, -0.1}
    for e in episodes:
        submitted = bool(e["submissions"])
        assert e["reward"]["total"] == (0.0 if submitted else -0.1)
        assert all(s["parseable"] and not s["report"]["valid"] for s in e["submissions"])
    # Some group's rewards differ: its advantages are non-zero and the backend took real optimizer steps.
    groups: dict[str, set[float]] = {}
    for e in episodes:
        groups.setdefault(Path(e["run_dir"]).name.split("-")[0], set()).add(e["reward"]["total"])
    assert any(len(g) > 1 for g in groups.values()), groups
    assert any(r["reward_std"] > 0 and "trainer/skipped" not in r and r["loss"] != 0.0 for r in first)
    assert summary["policy_version"] >= 1 and first[-1]["policy_version"] == summary["policy_version"]
    # ... and the weights moved: step 2's adapter is not the warm start's.
    start, after = adapter(warm), adapter(run / "checkpoints" / "step_2" / "backend")
    assert start.keys() == after.keys() and any("lm_head" in k for k in start)
    assert any(not torch.equal(start[k], after[k]) for k in start)

    for step in (1, 2):
        state = json.loads((run / "checkpoints" / f"step_{step}" / "state.json").read_text())
        assert state["step"] == step and state["config_digest"] == json.loads(
            (run / "manifest.json").read_text())["config_digest"]
        assert (run / "checkpoints" / f"step_{step}" / "backend" / "adapter" / "adapter_model.safetensors").is_file()

    # A crash after step 2's checkpoint left a half-written step 3: the resumed run writes step 3 once.
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 3, "partial": True}) + "\n")
    overrides["max_steps"] = 3
    summary = ait_train("--config", str(write_config(tmp_path / "b.toml", **overrides)), "--resume", str(run))
    after = rows(run)
    assert [r["step"] for r in after] == [1, 2, 3] and "partial" not in after[2]
    assert after[:2] == first and set(KEYS) <= set(after[2])
    assert after[2]["policy_version"] >= first[1]["policy_version"]  # the optimizer's count goes on too
    assert summary["step"] == 3 and summary["checkpoint"].endswith("step_3")
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["resumes"][0]["from_step"] == 2 and manifest["resumes"][0]["config_changed"]
    # The resumed sampler carries on numbering groups: nothing overwrote step 1-2's episodes.
    assert len(list((run / "episodes").glob("*/episode.json"))) == 24

    # A finished run resumed with the same config has nothing left to do.
    summary = ait_train("--resume", str(run))
    assert summary["step"] == 3 and [r["step"] for r in rows(run)] == [1, 2, 3]


def test_a_fresh_run_refuses_an_existing_run_dir(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    result = CliRunner().invoke(app, ["train", "--config", str(write_config(tmp_path / "a.toml")), "--run-dir",
                                      str(run)])
    assert result.exit_code == 2 and "--resume" in result.output


def test_checkpoint_round_trip_and_warm_start(tmp_path: Path) -> None:
    config = OuterConfig(policy={"model": "tiny", "max_new_tokens": 16},
                         trainer={"device": "cpu", "lora_r": 4, "lora_alpha": 8, "learning_rate": 1e-2})
    trained = LocalBackend(config)
    turns = sampled_turns(trained, [5, 6])
    trained.train_step([TrajectoryGroup(task_id="t", trajectories=[traj(0.5, turns[:1]), traj(0.0, turns[1:])],
                                        policy_version=0)])
    trained.save(str(tmp_path / "ckpt"))
    weights = trained.adapter_state()
    optimizer = trained.optimizer.state_dict()
    trained.close()

    resumed = LocalBackend(config)
    resumed.load(str(tmp_path / "ckpt"))
    assert resumed.step == 1 and resumed.engine.version == 1
    assert all(torch.equal(weights[k], v) for k, v in resumed.adapter_state().items())
    state = resumed.optimizer.state_dict()["state"]
    assert all(torch.equal(optimizer["state"][i]["exp_avg"], state[i]["exp_avg"]) for i in optimizer["state"])
    ids = torch.tensor([turns[0].prompt_ids + turns[0].completion_ids])
    with torch.no_grad():  # the sampler samples the resumed weights (the adapter merged into its copy of the base)
        assert torch.allclose(resumed.engine.model(input_ids=ids).logits, resumed.model(input_ids=ids).logits,
                              atol=1e-5, rtol=1e-5)
    resumed.close()

    warm = LocalBackend(config.model_copy(update={"policy": config.policy.model_copy(
        update={"init_checkpoint": str(tmp_path / "ckpt")})}))
    assert warm.step == 0 and not warm.optimizer.state_dict()["state"]  # weights only: fresh optimizer
    assert all(torch.equal(weights[k], v) for k, v in warm.adapter_state().items())
    warm.close()


def test_a_spent_budget_stops_before_sampling(tmp_path: Path) -> None:
    run = tmp_path / "run"
    summary = ait_train("--config", str(write_config(tmp_path / "a.toml", budget_usd=0.0)), "--run-dir", str(run))
    assert summary["stopped"] == "budget" and summary["step"] == 0
    # The one bundle is the one written after the step-0 held-out evaluation (cpu_tiny holds triage out).
    assert summary["checkpoint"].endswith("step_0") and (Path(summary["checkpoint"]) / "heldout_start.json").is_file()
    assert not (run / "episodes").exists()
