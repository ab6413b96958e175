"""The Tinker backend without the service: the datums built from trajectories (exact tokens, shifted
targets, sampling logprobs, advantages, prompt masking) in the SDK's own types, and the calls the
backend makes for a train step, a checkpoint, a resume and a policy turn, against a fake
ServiceClient that stands in for the network and answers with the SDK's own futures and results."""

from __future__ import annotations

import json
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

tinker = pytest.importorskip("tinker", reason="the tinker SDK is an optional extra: pip install 'ait[tinker]'")

from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture

from ait.harness.tools import TOOL_SCHEMAS
from ait.harness.types import Message
from ait.outer.backends.tinker import (
    CheckpointError,
    TinkerBackend,
    TinkerUnavailable,
    trajectory_datums,
)
from ait.outer.config import OuterConfig
from ait.outer.types import Trajectory, TrajectoryGroup, Turn


def config(model: str = "Qwen/Qwen3-8B", **policy) -> OuterConfig:
    return OuterConfig(policy={"model": model, **policy},
                       trainer={"backend": "tinker", "lora_r": 16, "learning_rate": 4e-5, "max_grad_norm": 0.5})


def traj(reward: float, turns: list[Turn], i: int = 0) -> Trajectory:
    return Trajectory(episode_id=f"ep{i}", task_id="t", family="calc_chain", turns=turns, reward=reward)


def group() -> TrajectoryGroup:
    """Two episodes: rewards 0.8 and 0.2 (advantages +0.3 and -0.3); the first has two turns, the
    second's prompt extending the first's prompt + reply, and an empty reply between them; the second
    episode one turn."""
    a = [Turn(prompt_ids=[1, 2, 3], completion_ids=[10, 11], logprobs=[-0.5, -0.25]),
         Turn(prompt_ids=[1, 2, 3, 10, 11, 4], completion_ids=[], logprobs=[]),
         Turn(prompt_ids=[1, 2, 3, 10, 11, 5, 6], completion_ids=[12, 13, 14], logprobs=[-1.0, -2.0, -3.0])]
    b = [Turn(prompt_ids=[7, 8], completion_ids=[20], logprobs=[-0.125])]
    return TrajectoryGroup(task_id="t", trajectories=[traj(0.8, a, 0), traj(0.2, b, 1)], policy_version=0)


def inputs(datum) -> dict[str, list]:
    return {k: v.tolist() for k, v in datum.loss_fn_inputs.items()}


def test_datums_follow_the_importance_sampling_layout() -> None:
    datums = trajectory_datums(group())
    assert len(datums) == 2  # the first episode's two replies share one sequence; the empty reply is skipped
    assert all(isinstance(d, tinker.Datum) and isinstance(d.model_input, tinker.ModelInput) for d in datums)
    assert all(isinstance(v, tinker.TensorData) for d in datums for v in d.loss_fn_inputs.values())
    first, second = datums

    # input = tokens[:-1]; target i = token i + 1; only the sampled tokens' targets weigh: the prompt,
    # and the observation [5, 6] between the two replies, carry no logprob and no advantage.
    assert first.model_input.to_ints() == [1, 2, 3, 10, 11, 5, 6, 12, 13]
    got = inputs(first)
    assert set(got) == {"target_tokens", "logprobs", "advantages"}
    assert got["target_tokens"] == [2, 3, 10, 11, 5, 6, 12, 13, 14]
    assert got["logprobs"] == [0.0, 0.0, -0.5, -0.25, 0.0, 0.0, -1.0, -2.0, -3.0]
    assert got["advantages"] == pytest.approx([0.0, 0.0, 0.3, 0.3, 0.0, 0.0, 0.3, 0.3, 0.3])
    assert first.loss_fn_inputs["target_tokens"].dtype == "int64"
    assert first.loss_fn_inputs["advantages"].dtype == first.loss_fn_inputs["logprobs"].dtype == "float32"

    assert second.model_input.to_ints() == [7, 8]
    got = inputs(second)
    assert got["target_tokens"] == [8, 20]
    assert got["logprobs"] == [0.0, -0.125]
    assert got["advantages"] == pytest.approx([0.0, -0.3])

    # The SDK's own wire encoding takes them as they are.
    from tinker.proto.request_conv import forward_backward_request_to_proto

    request = tinker.types.ForwardBackwardRequest(
        forward_backward_input=tinker.types.ForwardBackwardInput(data=datums, loss_fn="importance_sampling"),
        model_id="m", seq_id=1)
    wire = forward_backward_request_to_proto(request)
    assert len(wire.data) == 2 and set(wire.data[0].loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"}


def test_a_prompt_that_does_not_extend_the_sequence_starts_a_new_datum() -> None:
    """The second prompt re-renders the first reply ([10, 99] for [10, 11]: a template that rewrites
    history): it is not the sequence so far, so it is a datum of its own, with the first reply's
    re-rendered tokens as context only. A third prompt extending the second turn joins that datum."""
    turns = [Turn(prompt_ids=[1, 2], completion_ids=[10, 11], logprobs=[-0.5, -0.25]),
             Turn(prompt_ids=[1, 2, 10, 99, 5], completion_ids=[12], logprobs=[-1.0]),
             Turn(prompt_ids=[1, 2, 10, 99, 5, 12, 6], completion_ids=[13, 14], logprobs=[-2.0, -3.0])]
    g = TrajectoryGroup(task_id="t", trajectories=[traj(1.0, turns, 0), traj(0.0, turns[:1], 1)], policy_version=0)
    first, second, third = trajectory_datums(g)
    assert first.model_input.to_ints() == [1, 2, 10]
    assert inputs(first)["logprobs"] == [0.0, -0.5, -0.25]
    assert second.model_input.to_ints() == [1, 2, 10, 99, 5, 12, 6, 13]
    assert inputs(second)["target_tokens"] == [2, 10, 99, 5, 12, 6, 13, 14]
    assert inputs(second)["logprobs"] == [0.0, 0.0, 0.0, 0.0, -1.0, 0.0, -2.0, -3.0]
    assert inputs(second)["advantages"] == pytest.approx([0.0] * 4 + [0.5, 0.0, 0.5, 0.5])
    assert third.model_input.to_ints() == [1, 2, 10] and inputs(third)["advantages"] == pytest.approx([0, -0.5, -0.5])


def test_merged_datums_send_fewer_tokens_with_the_same_loss_terms() -> None:
    """Against one datum per turn (how they were built before): the same (target, logprob, advantage)
    on every sampled token, and the shared history sent once."""
    from ait.outer.backends.sequences import merge_turns
    from ait.outer.backends.tinker import sequence_datum

    prompt, turns = [1, 2, 3, 4], []
    for k in range(8):  # prompts growing by the reply and a 6-token observation each turn
        reply = [100 + 10 * k + i for i in range(3)]
        turns.append(Turn(prompt_ids=list(prompt), completion_ids=reply, logprobs=[-0.1 * (k + 1)] * 3))
        prompt += reply + [50 + k] * 6
    g = TrajectoryGroup(task_id="t", trajectories=[traj(1.0, turns, 0), traj(0.0, turns[:1], 1)], policy_version=0)
    merged = trajectory_datums(g)
    per_turn = [sequence_datum(seq, 0.5) for seq in merge_turns(turns, merge=False)]
    assert len(merged) == 2 and len(per_turn) == 8

    def terms(datums) -> list[tuple]:
        return sorted((t, lp, a) for d in datums for t, lp, a in zip(*inputs(d).values()) if a != 0)

    assert terms(merged[:1]) == terms(per_turn) and len(terms(per_turn)) == 24
    sent = sum(d.model_input.length for d in merged[:1])
    assert sent == len(turns[-1].prompt_ids) + 3 - 1  # the last prompt and reply, once
    assert sum(d.model_input.length for d in per_turn) == sum(len(t.prompt_ids) + 2 for t in turns) > 4 * sent


def test_advantages_scale() -> None:
    scaled = trajectory_datums(group(), scale=0.5)
    assert inputs(scaled[0])["advantages"] == pytest.approx([0.0, 0.0, 0.15, 0.15, 0.0, 0.0, 0.15, 0.15, 0.15])
    assert inputs(scaled[1])["advantages"] == pytest.approx([0.0, -0.15])
    assert inputs(scaled[0])["logprobs"] == inputs(trajectory_datums(group())[0])["logprobs"]


def test_constant_groups_carry_no_datums_unless_asked() -> None:
    g = group()
    for t in g.trajectories:
        t.reward = 0.5
    assert trajectory_datums(g) == []
    kept = trajectory_datums(g, keep_zero_advantage=True)
    assert len(kept) == 2 and all(not any(inputs(d)["advantages"]) for d in kept)


# ---- a fake service: records the calls, answers with the SDK's futures and result types -------


def done(value):
    future: Future = Future()
    future.set_result(value)
    return AwaitableConcurrentFuture(future)


class FakeSampler:
    def __init__(self, log: list, version: int, reply: list[int]):
        self.log, self.version, self.reply = log, version, reply

    def sample(self, prompt, num_samples, sampling_params):
        self.log.append(("sample", self.version, prompt.to_ints(), sampling_params))
        seq = tinker.SampledSequence(stop_reason="stop", sequence_id="s0",
                                     tokens_np=np.array(self.reply, dtype=np.int32),
                                     logprobs_np=np.full(len(self.reply), -0.5, dtype=np.float32))
        return done(tinker.SampleResponse(sequences=[seq]))


class FakeTraining:
    def __init__(self, log: list, tokenizer=None, reply: list[int] | None = None):
        self.log, self.tokenizer, self.reply, self.published = log, tokenizer, reply or [], 0

    def forward_backward(self, data, loss_fn):
        self.log.append(("forward_backward", data, loss_fn))
        outputs = [{"logprobs": tinker.TensorData.from_numpy(np.full(d.model_input.length, -0.5, np.float32))}
                   for d in data]
        return done(tinker.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs,
                                                 metrics={"loss:sum": 1.5}))

    def optim_step(self, params):
        self.log.append(("optim_step", params))
        return done(tinker.OptimStepResponse(metrics={"grad_norm": 0.25}))

    def save_weights_and_get_sampling_client(self):
        self.published += 1
        self.log.append(("save_weights_and_get_sampling_client",))
        return done(FakeSampler(self.log, self.published, self.reply))

    def save_state(self, name, overwrite=False):
        self.log.append(("save_state", name, overwrite))
        return done(tinker.types.SaveWeightsResponse(path=f"tinker://run-1/weights/{name}"))

    def get_tokenizer(self):
        self.log.append(("get_tokenizer",))
        return self.tokenizer


class FakeService:
    def __init__(self, tokenizer=None, reply: list[int] | None = None):
        self.log: list = []
        self.tokenizer, self.reply = tokenizer, reply

    def _training(self):
        return FakeTraining(self.log, self.tokenizer, self.reply)

    def create_lora_training_client(self, base_model, rank):
        self.log.append(("create_lora_training_client", base_model, rank))
        return done(self._training())

    def create_training_client_from_state_with_optimizer(self, path):
        self.log.append(("create_training_client_from_state_with_optimizer", path))
        return done(self._training())

    def create_training_client_from_state(self, path):
        self.log.append(("create_training_client_from_state", path))
        return done(self._training())


def names(log: list) -> list[str]:
    return [entry[0] for entry in log]


def test_train_step_calls_and_stats() -> None:
    service = FakeService()
    backend = TinkerBackend(config(), service_client=service)
    assert service.log == []  # nothing is created until it is needed
    stats = backend.train_step([group()])
    assert names(service.log) == ["create_lora_training_client", "forward_backward", "optim_step",
                                  "save_weights_and_get_sampling_client"]
    assert service.log[0][1:] == ("Qwen/Qwen3-8B", 16)
    _, data, loss_fn = service.log[1]
    assert loss_fn == "importance_sampling" and len(data) == 2
    expected = trajectory_datums(group(), scale=1 / 6)  # token mean over the batch's 6 completion tokens
    assert [d.model_input.to_ints() for d in data] == [d.model_input.to_ints() for d in expected]
    assert [inputs(d) for d in data] == [inputs(d) for d in expected]
    assert inputs(data[0])["advantages"] == pytest.approx([0.0, 0.0, 0.05, 0.05, 0.0, 0.0, 0.05, 0.05, 0.05])
    params = service.log[2][1]
    assert isinstance(params, tinker.AdamParams)
    assert (params.learning_rate, params.grad_clip_norm, params.weight_decay) == (4e-5, 0.5, 0.0)
    assert backend.step == stats.step == 1 and backend.sampler.version == 1
    assert stats.datums == 2 and stats.tokens == 6 and stats.extra["active_tokens"] == 6
    assert (stats.extra["turns"], stats.extra["sequences"], stats.extra["forward_tokens"]) == (3, 2, 9 + 2)
    assert stats.loss == 1.5 and stats.extra["optim/grad_norm"] == 0.25
    # sampling logprobs (-0.5, -0.25, -1, -2, -3, -0.125) against the learner's -0.5 on each
    assert stats.extra["kl_sample_train"] == pytest.approx((0 + 0.25 - 0.5 - 1.5 - 2.5 + 0.375) / 6)

    backend.train_step([group()])  # the same training run, a second published sampler
    assert names(service.log)[4:] == ["forward_backward", "optim_step", "save_weights_and_get_sampling_client"]
    assert backend.step == 2 and backend.sampler.version == 2


def constant_group(reward: float):
    """group()'s trajectories, every one with the same reward: no advantage anywhere."""
    g = group()
    for t in g.trajectories:
        t.reward = reward
    return g


def test_zero_advantage_turns_count_in_the_mean_but_are_not_sent() -> None:
    service = FakeService()
    backend = TinkerBackend(config(), service_client=service)
    stats = backend.train_step([group(), constant_group(0.5)])
    data = service.log[1][1]
    assert len(data) == 2 and stats.tokens == 12 and stats.datums == 4 and stats.extra["active_tokens"] == 6
    assert inputs(data[0])["advantages"][:4] == pytest.approx([0.0, 0.0, 0.3 / 12, 0.3 / 12])


def test_nothing_to_learn_makes_no_call() -> None:
    service = FakeService()
    backend = TinkerBackend(config(), service_client=service)
    stats = backend.train_step([constant_group(1.0)])
    assert service.log == [] and backend.step == 0 and stats.extra["skipped"] == 1.0
    assert stats.datums == 2 and stats.tokens == 6 and stats.extra["active_tokens"] == 0


def test_save_resume_and_warm_start(tmp_path) -> None:
    service = FakeService()
    backend = TinkerBackend(config(), service_client=service)
    backend.train_step([group()])
    backend.save(str(tmp_path / "ckpt"))
    assert service.log[-1] == ("save_state", "ait-step-000001", True)
    record = json.loads((tmp_path / "ckpt" / "tinker.json").read_text())
    assert record["state_path"] == "tinker://run-1/weights/ait-step-000001" and record["step"] == 1

    again = FakeService()
    resumed = TinkerBackend(config(), service_client=again)
    resumed.load(str(tmp_path / "ckpt"))
    assert names(again.log) == ["create_training_client_from_state_with_optimizer",
                                "save_weights_and_get_sampling_client"]  # no fresh LoRA run is created
    assert again.log[0][1] == "tinker://run-1/weights/ait-step-000001" and resumed.step == 1
    resumed.train_step([group()])
    assert resumed.step == 2

    # Warm start (weights only, step 0): from a save directory or a tinker:// path, also via the config.
    for source in (str(tmp_path / "ckpt"), "tinker://run-1/weights/ait-step-000001"):
        warm = FakeService()
        started = TinkerBackend(config(init_checkpoint=source), service_client=warm)
        assert names(warm.log) == ["create_training_client_from_state", "save_weights_and_get_sampling_client"]
        assert warm.log[0][1] == "tinker://run-1/weights/ait-step-000001" and started.step == 0

    with pytest.raises(CheckpointError, match="Qwen/Qwen3-8B"):
        TinkerBackend(config("Qwen/Qwen3-4B"), service_client=FakeService()).load(str(tmp_path / "ckpt"))
    with pytest.raises(CheckpointError, match="tinker.json"):
        TinkerBackend(config(), service_client=FakeService()).load(str(tmp_path / "nowhere"))


def test_policy_samples_the_published_weights_and_records_tokens() -> None:
    from transformers import AutoTokenizer

    from ait.train.tiny import tiny_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    reply = tokenizer('<tool_call>\n{"name": "read_file", "arguments": {"path": "job.toml"}}\n</tool_call><|im_end|>',
                      add_special_tokens=False)["input_ids"]
    service = FakeService(tokenizer=tokenizer, reply=reply)
    backend = TinkerBackend(config(temperature=0.7, max_new_tokens=64), service_client=service)
    policy = backend.policy()
    assert names(service.log) == ["create_lora_training_client", "save_weights_and_get_sampling_client",
                                  "get_tokenizer"]  # the SDK's tokenizer for the base model
    assert policy.version == 0 and policy.name == "tinker:Qwen/Qwen3-8B"

    messages = [Message(role="system", content="sys"), Message(role="user", content="go")]
    message = policy.act(messages, TOOL_SCHEMAS)
    _, version, prompt, params = service.log[-1]
    assert version == 1 and prompt == policy.render(messages, TOOL_SCHEMAS)
    assert isinstance(params, tinker.SamplingParams)
    assert params.temperature == 0.7 and params.max_tokens == 64 and params.stop == [tokenizer.eos_token_id]
    assert [(c.name, c.arguments) for c in message.tool_calls] == [("read_file", {"path": "job.toml"})]
    assert message.tokens.prompt_ids == prompt and message.tokens.completion_ids == reply
    assert message.tokens.logprobs == [-0.5] * len(reply) and message.tokens.temperature == 0.7
    assert message.usage.model == "Qwen/Qwen3-8B" and message.usage.usd is None  # priced by the meter
    assert message.usage.prompt_tokens == len(prompt) and message.usage.completion_tokens == len(reply)

    backend.train_step([group()])
    newer = backend.policy(temperature=0.0, seed=7)
    assert newer.version == 1 and newer.client.version == 2 and policy.client.version == 1  # old one keeps v0
    assert newer.temperature == 0.0 and newer.seed == 7 and newer.seed != policy.seed
    assert newer.tokenizer is policy.tokenizer and newer.tokenizer_lock is policy.tokenizer_lock
    assert names(service.log).count("get_tokenizer") == 1


def test_an_episode_through_the_harness_is_metered_and_traced(tmp_path) -> None:
    from fakes import TASK
    from transformers import AutoTokenizer

    from ait.evals.baselines import BaselineStore
    from ait.harness.episode import run_episode
    from ait.harness.types import EpisodeConfig, StopReason
    from ait.metering import Ledger
    from ait.spec import load_spec
    from ait.train.tiny import tiny_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    reply = tokenizer("Nothing to do.<|im_end|>", add_special_tokens=False)["input_ids"]
    backend = TinkerBackend(config(), service_client=FakeService(tokenizer=tokenizer, reply=reply))
    result = run_episode(load_spec(TASK), TASK, backend.policy(), EpisodeConfig(max_turns=3, max_nudges=1),
                         runs_dir=tmp_path / "runs", baselines=BaselineStore(tmp_path / "b.json"))
    assert result.stop_reason is StopReason.no_submission and result.turns == 2
    events = [json.loads(x) for x in (Path(result.run_dir) / "trajectory.jsonl").read_text().splitlines()]
    replies = [e for e in events if e["kind"] == "message" and e["role"] == "assistant"]
    assert [e["tokens"]["completion_ids"] for e in replies] == [reply, reply]
    ledger = Ledger(tmp_path / "runs" / "costs.jsonl").entries()
    assert len(ledger) == 2 and all(e["usd"] == 0.0 and e["usd_source"] == "unpriced" for e in ledger)


@pytest.mark.parametrize("text, sequences", [
    ('<tool_call>\n{"name": "read_file", "arguments": {"path": "job.toml"}}\n</tool_call><|im_end|>', 1),
    ("Nothing to do.<|im_end|>", 1),
    # The chat template drops an earlier reply's reasoning from the history it re-renders: every turn
    # is a sequence of its own.
    ('<think>\nfirst look\n</think>\n\n<tool_call>\n{"name": "read_file", "arguments": {"path": "job.toml"}}'
     '\n</tool_call><|im_end|>', 3),
])
def test_a_harness_episode_merges_when_its_history_re_renders_token_for_token(tmp_path, text, sequences) -> None:
    """The policy renders every prompt from the messages (ait.policy.hf_policy), so turns merge only
    when a reply, parsed and rendered back into the history, is the same tokens as sampled."""
    import threading

    from fakes import TASK
    from transformers import AutoTokenizer

    from ait.evals.baselines import BaselineStore
    from ait.harness.episode import run_episode
    from ait.harness.types import EpisodeConfig
    from ait.outer.backends.sequences import merge_turns
    from ait.outer.rollouts import Recorder
    from ait.spec import load_spec
    from ait.train.tiny import tiny_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    reply = tokenizer(text, add_special_tokens=False)["input_ids"]
    backend = TinkerBackend(config(), service_client=FakeService(tokenizer=tokenizer, reply=reply))
    policy = Recorder(backend.policy(), threading.Event())
    run_episode(load_spec(TASK), TASK, policy, EpisodeConfig(max_turns=3, max_nudges=2),
                runs_dir=tmp_path / "runs", baselines=BaselineStore(tmp_path / "b.json"))
    assert len(policy.turns) == 3
    assert [s.turns for s in merge_turns(policy.turns)] == [3 // sequences] * sequences


def test_missing_key_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    with pytest.raises(TinkerUnavailable, match="TINKER_API_KEY"):
        TinkerBackend(config())
