"""A step's checkpoint as a portable bundle (ait.outer.checkpoint, ait.outer.state_codec): an arc that
survives losing its machine. Two steps on "machine A", the bundle copied to "machine B" (a fresh
AIT_HOME and run directory; A's run, its warm start and its AIT_HOME moved out of reach), one more
step there: one arc of three steps, state carried on; damaged or mismatched bundles are refused in
one line; the encodings' sizes for the real 0.5B agent's shape against the 64 MiB bound."""

from __future__ import annotations

import importlib.util
import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from test_outer_loop import LORA_WITH_HEAD, adapter, ait_train, rows, submit_first_warm_start, write_config
from typer.testing import CliRunner

from ait.cli import app
from ait.outer import checkpoint as ckpt
from ait.outer import state_codec
from ait.outer.config import OuterConfig
from ait.outer.loop import episode_config, import_bundle, resolve_tasks
from ait.outer.tasks import family_cycle, round_robin_task
from ait.report import write_report

MIB = 2**20


# ---- encodings -------------------------------------------------------------------------------


def test_moment_encodings_round_trip_within_their_bounds() -> None:
    g = torch.Generator().manual_seed(0)
    m = torch.randn(3, 1024, generator=g) * torch.logspace(-6, -2, 1024)
    v = m.square() * torch.rand(3, 1024, generator=g) * 4
    v[0, :300] = 0.0  # parameters that never had a gradient
    for kind, x in (("exp_avg", m), ("exp_avg_sq", v)):
        assert torch.equal(state_codec.decode_moment("t", state_codec.encode_moment("t", x, kind, "float32"), kind,
                                                     "float32", list(x.shape)), x)
        bf = state_codec.decode_moment("t", state_codec.encode_moment("t", x, kind, "bfloat16"), kind, "bfloat16",
                                       list(x.shape))
        assert torch.allclose(bf, x, rtol=2**-8, atol=0)
    got = state_codec.decode_moment("t", state_codec.encode_moment("t", m, "exp_avg", "compact"), "exp_avg",
                                    "compact", list(m.shape))
    blocks = state_codec._blocks(m, state_codec.Q8_BLOCK).abs().amax(dim=1)
    err = state_codec._blocks(got - m, state_codec.Q8_BLOCK).abs().amax(dim=1)
    assert (err <= blocks / 254 * 1.0001).all()  # half an int8 step of the block's largest value
    got = state_codec.decode_moment("t", state_codec.encode_moment("t", v, "exp_avg_sq", "compact"), "exp_avg_sq",
                                    "compact", list(v.shape))
    assert torch.equal(got == 0, v == 0)  # zeros stay zeros: no update divides by a made-up second moment
    nz = v > 0
    ratio = (got[nz] / v[nz]).log2().abs()
    logs = torch.where(v > 0, v.clamp_min(1e-38).log2(), torch.nan).reshape(-1, state_codec.LOG4_BLOCK)
    span = (logs.nan_to_num(-1e9).amax(dim=1) - logs.nan_to_num(1e9).amin(dim=1)).max()
    assert ratio.max() <= span / (2 * (state_codec.LOG4_LEVELS - 1)) + 1e-4


def agent_shape_params(r: int) -> int:
    """Trainable parameters of LoRA r on every linear layer of the Qwen2.5-0.5B shape (the h200_mini.toml
    agent, Qwen2.5-Coder-0.5B-Instruct), counted on the meta device: no weights are made."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                  num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                  tie_word_embeddings=True)
    with torch.device("meta"):
        model = get_peft_model(AutoModelForCausalLM.from_config(config),
                               LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", task_type="CAUSAL_LM"))
    return sum(q.numel() for q in model.parameters() if q.requires_grad)


def test_the_real_agents_bundle_fits_64_mib_in_at_most_8_files() -> None:
    h200 = OuterConfig.model_validate(__import__("tomllib").loads(
        (Path(__file__).resolve().parents[1] / "configs" / "outer" / "h200_mini.toml").read_text()))
    params = agent_shape_params(h200.trainer.lora_r)
    assert h200.trainer.lora_r == 32 and params == 24 * 32 * ((6 * 896 + 4864) + (896 + 128 + 128 + 896 + 2 * 4864 + 896))  # r·(in + out)
    assert params == 17_596_416
    bound = h200.checkpoint_max_mib * MIB - ckpt.JSON_RESERVE_BYTES - 256 * 1024  # a long arc's metrics.jsonl
    # Exact (float32) would be 201 MiB, bf16 101 MiB: the compact encoding is the one that fits.
    assert state_codec.estimate_bytes(params, "float32") / MIB == pytest.approx(201.4, abs=0.1)
    assert state_codec.estimate_bytes(params, "bfloat16") / MIB == pytest.approx(100.7, abs=0.1)
    encoding, fits = state_codec.choose_encoding(params, bound)
    assert (encoding, fits) == ("compact", True)
    assert state_codec.estimate_bytes(params, "compact") / MIB == pytest.approx(60.1, abs=0.1)
    # At the reference system's rank 8 the exact state fits.
    assert state_codec.choose_encoding(agent_shape_params(8), bound) == ("float32", True)
    # The local backend's bundle: 4 files under backend/, state.json, metrics.jsonl, bundle.json.
    assert 7 <= ckpt.MAX_FILES == 8


# ---- one arc over two machines --------------------------------------------------------------


def load_bench(name: str):
    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # three outer steps over two "machines" (~45 s); the bundle's parts are tested above by default
@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning")
def test_an_arc_continues_on_another_machine_from_the_bundle_alone(tmp_path: Path, monkeypatch) -> None:
    a, b = tmp_path / "machine-a", tmp_path / "machine-b"
    a.mkdir()
    b.mkdir()
    overrides: dict = {"num_generations": 4, "heldout_every": 0, "trainer": {"lora_target_modules": LORA_WITH_HEAD}}
    warm = submit_first_warm_start(write_config(a / "sft.toml", **overrides), a / "warmstart")
    overrides["policy"] = {"init_checkpoint": str(warm)}
    run_a = a / "run"
    ait_train("--config", str(write_config(a / "a.toml", **overrides)), "--run-dir", str(run_a))
    first = rows(run_a)
    assert [r["step"] for r in first] == [1, 2]
    assert first[-1]["policy_version"] >= 1, "no real update in two steps: the bundle would carry no optimizer state"
    step2 = run_a / "checkpoints" / "step_2"
    manifest = ckpt.verify_bundle(step2)
    files = [p for p in step2.rglob("*") if p.is_file()]
    assert len(files) <= ckpt.MAX_FILES and sum(p.stat().st_size for p in files) <= 64 * MIB
    assert manifest["encoding"] == "float32" and manifest["step"] == 2  # the tiny agent fits exactly
    state_a = ckpt.load_state(step2)
    # step_0 is the warm start, written before step 1 although no held-out task runs here: the adapter an
    # arc's end compares its final one with, on a machine where the warm start was never built.
    step0 = run_a / "checkpoints" / "step_0"
    assert ckpt.load_state(step0).step == 0 and ckpt.verify_bundle(step0)["step"] == 0
    start, warm_start = adapter(step0 / "backend"), adapter(warm)
    assert start.keys() == warm_start.keys() and all(torch.equal(start[k], warm_start[k]) for k in start)

    # Machine B: the bundle alone, carried as a lease carries it (bench/gpu.sh packs it in pieces, a poll
    # brings them back, bench/arc_collect.py checks and keeps them, the next machine joins them). A's run,
    # warm start and AIT_HOME are out of reach.
    bundle = b / "bundle"
    bundle.mkdir()
    poll = tmp_path / "poll"
    poll.mkdir()
    subprocess.run(f"tar cf - -C {step2} . | split -b 64K -d - {poll}/bundle.tar.part-", shell=True, check=True)
    collect = load_bench("arc_collect")
    assert collect.main([str(poll), "--machine", "a", "--arc", str(tmp_path / ".arc"), "--out", str(tmp_path / "kept")]) == 0
    assert json.loads((tmp_path / "kept" / "bundle.json").read_text())["step"] == 2
    subprocess.run(f"cat {tmp_path}/.arc/bundle/bundle.tar.part-* | tar xf - -C {bundle}", shell=True, check=True)
    shutil.move(str(a), str(tmp_path / "gone"))
    monkeypatch.setenv("AIT_HOME", str(b / "home"))
    overrides["max_steps"] = 3
    run_b = b / "run"
    summary = ait_train("--config", str(write_config(b / "b.toml", **overrides)), "--resume-from", str(bundle),
                        "--run-dir", str(run_b))
    assert summary["step"] == 3 and summary["checkpoint"].endswith("step_3")
    after = rows(run_b)
    assert [r["step"] for r in after] == [1, 2, 3]  # once each: A's two, B's one
    assert after[:2] == first
    assert after[2]["policy_version"] >= first[1]["policy_version"]  # the optimizer's count goes on

    # The loop's state went on from A's: group numbering (and so seeds and run ids), the task order, spend.
    state_b = ckpt.load_state(run_b / "checkpoints" / "step_3")
    assert state_b.step == 3 and state_b.groups_launched == state_a.groups_launched + 2
    assert state_b.usd_total >= state_a.usd_total and state_b.usd_carried == state_a.usd_total
    names = sorted(p.name for p in (run_b / "episodes").iterdir())
    assert {n.split("-")[0] for n in names} == {f"g{state_a.groups_launched + i:05d}" for i in range(2)}
    config = OuterConfig.model_validate_json((run_b / "config.json").read_text())
    # Round robin: step 3's groups are slots 4 and 5 of the seed's family cycle, as if A had gone on.
    cycle = family_cycle(resolve_tasks(config.tasks), config.seed)
    expected = [round_robin_task(cycle, 2 * config.groups_per_step + i)[0].id for i in range(2)]
    for i, task in enumerate(expected):
        assert all(f"-{task}-" in n for n in names if n.startswith(f"g{state_a.groups_launched + i:05d}-"))
    assert state_b.rng_state == state_a.rng_state  # drawn only by task_sampling = "uniform"
    # B's own bundle names the run it continues; its manifest says where the arc came from.
    assert ckpt.verify_bundle(run_b / "checkpoints" / "step_3")["lineage"][0]["run"] == "run"
    manifest_b = json.loads((run_b / "manifest.json").read_text())
    assert manifest_b["continued_from"]["step"] == 2 and manifest_b["resumes"][0]["config_changed"]
    assert manifest_b["continued_from"]["warnings"]  # another AIT_HOME: another hidden-eval secret, said so

    # `ait report` shows one arc: steps 1..3, nothing skipped, nothing twice.
    warnings: list[str] = []
    _, summary = write_report(run_b, tmp_path / "report.html", warnings)
    assert (summary["steps"], summary["first_step"], summary["last_step"]) == (3, 1, 3) and not warnings
    assert summary["reward_first"] == first[0]["reward_mean"]

    # A finished continued run resumed in place has nothing left to do.
    assert ait_train("--resume", str(run_b))["step"] == 3 and [r["step"] for r in rows(run_b)] == [1, 2, 3]


# ---- refusals --------------------------------------------------------------------------------


class FakeBackend:
    """A backend whose checkpoint is one JSON record (no model to load)."""

    step = 4

    def save(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "backend.json").write_text(json.dumps({"backend": "local", "step": 4, "model": "tiny"}))


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    config = load_tiny(tmp_path)
    run = tmp_path / "src-run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "usd": 0.5}) + "\n" for s in range(1, 6)))
    state = ckpt.LoopState(step=4, config_digest=config.digest(), rng_state=ckpt.rng_to_json(random.Random(3)),
                           groups_launched=9, usd_total=2.0)
    return ckpt.save_checkpoint(run, FakeBackend(), state, config=config, max_bytes=64 * MIB)


def load_tiny(tmp_path: Path, **overrides) -> OuterConfig:
    from ait.configs import load_config

    return load_config(write_config(tmp_path / f"c{len(overrides)}.toml", budget_usd=5.0, **overrides), OuterConfig)


def test_a_continued_run_carries_the_metrics_and_the_spend(bundle: Path, tmp_path: Path) -> None:
    assert [json.loads(line)["step"] for line in (bundle / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    run = tmp_path / "new"
    config = import_bundle(bundle, run, None)
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    state = ckpt.load_state(ckpt.latest(run))
    assert (state.step, state.groups_launched, state.usd_total, state.usd_carried) == (4, 9, 2.0, 2.0)
    ckpt.verify_bundle(ckpt.latest(run))  # the copy is sealed again
    # The episodes' run budget counts what earlier machines spent (not in this run's costs.jsonl).
    assert episode_config(config, run, carried_usd=state.usd_carried).run_budget_usd == 3.0


def refusal(args: list[str]) -> str:
    result = CliRunner().invoke(app, ["train", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize("damage", ["flip", "missing", "extra", "manifest", "not-a-bundle"])
def test_a_damaged_bundle_is_refused_in_one_line(bundle: Path, tmp_path: Path, damage: str) -> None:
    target = bundle
    if damage == "flip":
        f = bundle / "state.json"
        f.write_text(f.read_text().replace('"groups_launched": 9', '"groups_launched": 8'))
        want = "is damaged"
    elif damage == "missing":
        (bundle / "backend" / "backend.json").unlink()
        want = "is incomplete"
    elif damage == "extra":
        (bundle / "notes.txt").write_text("x")
        want = "does not list"
    elif damage == "manifest":
        (bundle / "bundle.json").write_text("{not json")
        want = "not JSON"
    else:
        target = tmp_path
        want = "not a checkpoint bundle"
    line = refusal(["--resume-from", str(target), "--run-dir", str(tmp_path / "new")])
    assert want in line, line
    assert not (tmp_path / "new" / "checkpoints").exists()


def test_a_bundle_that_does_not_fit_the_config_is_refused(bundle: Path, tmp_path: Path) -> None:
    other = write_config(tmp_path / "r4.toml", trainer={"lora_r": 4})
    line = refusal(["--config", str(other), "--resume-from", str(bundle), "--run-dir", str(tmp_path / "new")])
    assert "trainer.lora_r = 8" in line and "4" in line
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "metrics.jsonl").write_text("")
    line = refusal(["--resume-from", str(bundle), "--run-dir", str(tmp_path / "used")])
    assert "already holds a run" in line
    line = refusal(["--resume", str(tmp_path / "used"), "--resume-from", str(bundle)])
    assert "pass one" in line


def test_a_continued_run_compares_its_heldout_with_the_first_machines_step_0(tmp_path: Path) -> None:
    """The step-0 held-out results travel in the bundle: machine B's evaluation at step 6 is paired with
    machine A's at step 0 (same tasks, same seeds), not dropped for want of a start."""
    from ait.agent_eval.stats import summarize
    from ait.agent_eval.types import EpisodeRow, EvalPlan, EvalResults
    from ait.outer.heldout import START_FILE, heldout_transfer, results_path, start_for_bundle

    def results(rewards: list[float]) -> str:
        rows = [EpisodeRow(task_id="triage", run_id=f"triage-{i}", stop_reason="submitted", infra_error=False,
                           reward=r, validation=1.0, job_quality=0.5, uplift_term=0.0, train_speed=1.0, valid=True,
                           job_ran=True, job_failed=False, base_model="smollm2-135m") for i, r in enumerate(rewards)]
        plan = EvalPlan(policy="p", tasks=["examples/tasks/triage.json"], episodes=len(rows))
        return EvalResults(plan=plan, per_task={"triage": summarize(rows)}, overall=summarize(rows), episodes=rows,
                           planned=len(rows)).model_dump_json()

    config = load_tiny(tmp_path)
    run_a = tmp_path / "a"
    results_path(run_a, 0).parent.mkdir(parents=True)
    results_path(run_a, 0).write_text(results([0.1, 0.2, 0.3]))
    state = ckpt.LoopState(step=4, config_digest=config.digest(), rng_state=ckpt.rng_to_json(random.Random(1)))
    bundle = ckpt.save_checkpoint(run_a, FakeBackend(), state, config=config, max_bytes=64 * MIB,
                                  extra=start_for_bundle(run_a))
    assert (bundle / START_FILE).read_bytes() == results_path(run_a, 0).read_bytes()
    ckpt.verify_bundle(bundle)  # sealed with it: a damaged copy would be refused

    run_b = tmp_path / "b"
    import_bundle(bundle, run_b, None)
    assert results_path(run_b, 0).read_bytes() == results_path(run_a, 0).read_bytes()
    results_path(run_b, 6).parent.mkdir(parents=True)
    results_path(run_b, 6).write_text(results([0.5, 0.2, 0.3]))
    diff, start = heldout_transfer(run_b, 6)
    assert start == pytest.approx(0.2) and diff.mean == pytest.approx(0.4 / 3) and diff.n == 3
    # A bundle written before any held-out evaluation has none, and a run continued from it has no start.
    bare = ckpt.save_checkpoint(tmp_path / "c", FakeBackend(), state, config=config, max_bytes=64 * MIB,
                                extra=start_for_bundle(tmp_path / "c"))
    assert not (bare / START_FILE).exists()
    import_bundle(bare, tmp_path / "d", None)
    assert heldout_transfer(tmp_path / "d", 6) is None
