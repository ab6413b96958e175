"""The reference inner trainer (job `trainer = "trl"`: TRL's GRPOTrainer through ait.train.grpo),
run end to end on CPU through the training process's entry point, ait.train.main.

The tiny model is random and never calls a tool by itself, so on its first turn every other
rollout's reply is replaced by a tool call built from its prompt (everything else, later turns
included, is TRL's own generation, tool loop, reward calls and optimisation). The job's env.py
logs every reset, tool call and reward call next to itself, so the test can check what reached
the agent's code.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from ait.train.tiny import tiny_model_path

STEPS, GROUP, PROMPTS = 2, 4, 2

ENV = '''
"""Sums with an add tool; every call is logged to calls.jsonl beside this file."""
import json
import random
from pathlib import Path

LOG = Path(__file__).with_name("calls.jsonl")
SYSTEM_PROMPT = "Use the add tool, then reply with 'Answer: <n>'."


def log(**event):
    with LOG.open("a") as f:
        f.write(json.dumps(event) + "\\n")


class Environment:
    def reset(self, info: dict) -> None:
        self.info = info
        log(kind="reset", info=info)

    def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: The left operand.
            b: The right operand.
        """
        log(kind="add", a=a, b=b, info=self.info)
        return str(a + b)


def build_dataset(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append({"prompt": f"Add {a} and {b}.", "answer": str(a + b), "info": {"id": i, "a": a, "b": b}})
    return rows


def reward_tool(completion, answer, info, messages):
    tool = [m["content"] for m in messages if m.get("role") == "tool"]
    log(kind="reward_tool", answer=answer, info=info, roles=[m["role"] for m in messages], tool=tool)
    return 1.0 if answer in tool else 0.0


def reward_flaky(completion, answer, info):
    log(kind="reward_flaky", answer=answer, info=info)
    if info["id"] % 2:
        raise ValueError("odd rows raise: the trainer must count this, score 0 and go on")
    return 0.5


REWARD_FUNCS = [reward_tool, reward_flaky]
REWARD_WEIGHTS = [1.0, 0.5]
'''


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matmuls on a loaded 2-core machine: OpenMP's second thread only waits (5x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def trl_job(tmp_path, lora: bool):
    from ait.job.config import parse_job_config
    from ait.job.types import Job

    root = Path(__file__).resolve().parents[1]
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "env.py").write_text(ENV)
    toml = (f'[job]\nbase_model = "tiny"\n\n[train]\nmax_steps = {STEPS}\nlearning_rate = 1e-2\n'
            f'num_generations = {GROUP}\nprompts_per_step = {PROMPTS}\nmax_completion_length = 64\n'
            'max_tool_calling_iterations = 2\ndataset_size = 16\nloss_type = "dapo"\n')
    if lora:
        toml += "\n[train.lora]\nr = 4\nlora_alpha = 8\n"
    (ws / "job.toml").write_text(toml)
    (tmp_path / "run" / "job").mkdir(parents=True)
    return Job(job_id="trl", run_dir=str(tmp_path / "run"), workspace=str(ws), trainer="trl",
               task_path=str(root / "examples" / "tasks" / "calc_chain.json"),
               config=parse_job_config(toml, None), time_budget_s=600)


def script_tool_calls(monkeypatch):
    """On the first turn, every other rollout calls add(a, b) with its prompt's numbers."""
    from trl import GRPOTrainer

    original = GRPOTrainer._generate_single_turn
    scripted: list[tuple[int, int]] = []

    def first_turn_calls(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        ids, logprobs = original(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        if num_generations == 1:  # a turn after a tool result: the model's own reply
            return ids, logprobs
        tok = self.processing_class
        for i in range(0, len(ids), 2):
            a, b = map(int, re.findall(r"Add (\d+) and (\d+)\.", tok.decode(prompt_ids[i]))[-1])
            call = f'<tool_call>\n{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call><|im_end|>'
            ids[i] = tok(call, add_special_tokens=False)["input_ids"]
            scripted.append((a, b))
        return ids, logprobs

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", first_turn_calls)
    return scripted


@pytest.mark.parametrize("lora", [False, True])
def test_a_trl_job_trains_through_the_worker_entry_point(tmp_path, monkeypatch, lora):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from ait.job.env_loader import import_env
    from ait.train import fast_grpo
    from ait.train.main import main
    from ait.train.request import TrainOutput, TrainRequest

    def not_this_one(*args, **kwargs):
        raise AssertionError("trainer = 'trl' ran the fast trainer")

    monkeypatch.setattr(fast_grpo, "train", not_this_one)
    scripted = script_tool_calls(monkeypatch)
    job = trl_job(tmp_path, lora)
    base = tiny_model_path()
    request = tmp_path / "request.json"
    request.write_text(TrainRequest(job=job, base_model_path=str(base), trainer=job.trainer).model_dump_json())

    assert main([str(request)]) == 0

    out = TrainOutput.model_validate_json((tmp_path / "run" / "job" / "train_output.json").read_text())
    assert out.steps == STEPS

    # The checkpoint: a loadable model with the base's tensors (LoRA merged away), trained.
    trained = load_file(f"{out.checkpoint}/model.safetensors")
    base_weights = load_file(f"{base}/model.safetensors")
    assert trained.keys() == base_weights.keys()
    assert all(trained[k].shape == base_weights[k].shape and torch.isfinite(trained[k]).all() for k in trained)
    changed = [k for k in trained if not torch.equal(trained[k], base_weights[k])]
    assert changed
    if lora:  # only the adapted projections move; embeddings and norms are the base's
        assert all("proj" in k for k in changed) and "model.embed_tokens.weight" not in changed
    model = AutoModelForCausalLM.from_pretrained(out.checkpoint)
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[5, 6, 7]])).logits).all()

    # What reached env.py: resets with the rows' info, the scripted tool calls, the rewards.
    events = [json.loads(line) for line in (tmp_path / "ws" / "calls.jsonl").read_text().splitlines()]
    rows = import_env(tmp_path / "ws" / "env.py").build_dataset(job.config.train.dataset_size, job.config.train.seed)
    infos = [r["info"] for r in rows]
    rollouts = STEPS * PROMPTS * GROUP
    tool_rewards = [e for e in events if e["kind"] == "reward_tool"]
    flaky = [e for e in events if e["kind"] == "reward_flaky"]
    assert len(tool_rewards) == len(flaky) == rollouts
    for e in tool_rewards + flaky:
        assert e["info"] in infos and e["answer"] == str(e["info"]["a"] + e["info"]["b"])
    groups = [tool_rewards[i:i + GROUP] for i in range(0, rollouts, GROUP)]
    assert all(len({e["info"]["id"] for e in g}) == 1 for g in groups)  # a group is one prompt's rollouts
    assert [e["info"] for e in events if e["kind"] == "reset"] == [e["info"] for e in tool_rewards]

    calls = [e for e in events if e["kind"] == "add"]
    assert len(scripted) == len(calls) == rollouts // 2
    assert all((c["a"], c["b"]) == (c["info"]["a"], c["info"]["b"]) for c in calls)  # the row's own environment
    answered = [e for e in tool_rewards if e["answer"] in e["tool"]]
    assert len(answered) == rollouts // 2  # the tool's result reached the reward function's messages
    assert all(e["roles"][:2] == ["assistant", "tool"] for e in answered)

    # The summary: TRL's log, averaged over steps, plus ait's own fields.
    m = out.metrics
    assert all(math.isfinite(v) for v in m.values())
    for key in ("train/loss", "train/grad_norm", "train/learning_rate", "train/reward", "train/reward_std",
                "train/reward_first", "train/reward_last", "train/rewards/reward_tool/mean",
                "train/rewards/reward_flaky/mean", "train/tools/call_frequency", "train/num_tokens",
                "train/load_seconds", "train/seconds", "train/save_seconds", "train/import_seconds",
                "train/in_process_seconds"):
        assert key in m, key
    assert m["train/grad_norm"] > 0
    assert m["train/tools/call_frequency"] == pytest.approx(0.5)
    errors = sum(e["info"]["id"] % 2 for e in flaky)
    assert errors > 0 and m["train/reward_errors/reward_flaky"] == errors
    assert m["train/rewards/reward_tool/mean"] == pytest.approx(0.5)
    assert m["train/rewards/reward_flaky/mean"] == pytest.approx(0.5 * (rollouts - errors) / rollouts)
    per_rollout = [1.0 * (t["answer"] in t["tool"]) + 0.5 * (0.0 if f["info"]["id"] % 2 else 0.5)
                   for t, f in zip(tool_rewards, flaky)]
    first = rollouts // STEPS
    assert m["train/reward_first"] == pytest.approx(sum(per_rollout[:first]) / first)
    assert m["train/reward_last"] == pytest.approx(sum(per_rollout[-first:]) / first)
    assert m["train/reward"] == pytest.approx(sum(per_rollout) / rollouts)
