"""The fast GRPO trainer: advantages, the loss mask, token-space tool rollouts, and a real run."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ait.chat.renderers import prepare_tokenizer
from ait.job.types import TrainConfig
from ait.train.decode import Decoder, Sample
from ait.train.fast_grpo import advantages, microbatches, policy_loss
from ait.train.request import TrainOutput
from ait.chat.renderers import stop_ids
from ait.train.rollouts import Rollout, rollout_batch
from ait.train.tiny import tiny_model_path


class Calc:
    def reset(self, info):
        self.calls = 0

    def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: left operand
            b: right operand
        """
        self.calls += 1
        return str(a + b)


SURFACE = SimpleNamespace(env_class=Calc, tools={"add": Calc.add})


class ScriptedDecoder:
    """Replies from a script, recording the prompts it was given (stands in for ait.train.decode)."""

    def __init__(self, tok, replies):
        self.tok, self.replies, self.prompts = tok, list(replies), []

    check_every, generator = 1, None

    def reply(self, prompt, max_new_tokens):
        self.prompts.append(prompt)
        ids = self.tok(self.replies.pop(0), add_special_tokens=False)["input_ids"][:max_new_tokens]
        return Sample(ids=ids, logprobs=[-0.5] * len(ids), stopped=ids[-1] in stop_ids(self.tok))

    def generate(self, prompts, max_new_tokens, temperature, top_p, generator):
        return [self.reply(p, max_new_tokens) for p in prompts]

    # the continuous API: every waiting request is answered at the next step, in the order it came
    waiting: list = []

    @property
    def busy(self):
        return bool(self.waiting)

    def submit(self, requests):
        self.waiting = self.waiting + list(requests)

    def step(self):
        done, self.waiting = self.waiting, []
        for r in done:
            s = self.reply(r.prompt, r.max_new_tokens)
            r.ids, r.logprobs, r.stopped = s.ids, s.logprobs, s.stopped
        return done

    def abort(self):
        self.waiting = []

    run = Decoder.run  # the engine's own loop over this fake's submit/step


def tok():
    return prepare_tokenizer(AutoTokenizer.from_pretrained(tiny_model_path()))


def row():
    return {"prompt": [{"role": "system", "content": "Use add."}, {"role": "user", "content": "2+3?"}],
            "answer": "5", "info": json.dumps({})}


@pytest.mark.parametrize("continuous", [True, False], ids=["continuous", "turn_by_turn"])
def test_tool_turns_continue_in_token_space_and_only_samples_are_trained(continuous):
    t = tok()
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
    dec = ScriptedDecoder(t, [call, "Answer: 5<|im_end|>"])
    [r] = rollout_batch(dec, t, SURFACE, [row()], max_completion_length=200, max_turns=2, temperature=1.0,
                        top_p=1.0, max_length=4096, continuous=continuous)
    assert r.tool_calls == 1 and r.tool_errors == 0 and r.final == "Answer: 5" and not r.truncated
    assert [m["role"] for m in r.messages] == ["assistant", "tool", "assistant"] and r.messages[1]["content"] == "5"
    # The second turn's prompt is the first turn's sequence, extended, never re-rendered.
    first_reply = t(call, add_special_tokens=False)["input_ids"]
    assert dec.prompts[1][:r.prompt_len + len(first_reply)] == dec.prompts[0] + first_reply
    tail = t.decode(dec.prompts[1][r.prompt_len + len(first_reply):])
    assert "5" in tail and tail.rstrip().endswith("assistant")
    sampled = [i for i, s in zip(r.ids[r.prompt_len:], r.sampled) if s]
    assert sampled == first_reply + t("Answer: 5<|im_end|>", add_special_tokens=False)["input_ids"]
    assert len(r.logprobs) == len(r.sampled) == len(r.ids) - r.prompt_len
    assert all(lp == 0.0 for lp, s in zip(r.logprobs, r.sampled) if not s)


@pytest.mark.parametrize("continuous", [True, False], ids=["continuous", "turn_by_turn"])
def test_budget_truncates_and_broken_calls_answer_errors(continuous):
    t = tok()
    bad = '<tool_call>\n{"name": "mul", "arguments": {"a": 2}}\n</tool_call><|im_end|>'
    dec = ScriptedDecoder(t, [bad, "x " * 300])
    [r] = rollout_batch(dec, t, SURFACE, [row()], max_completion_length=60, max_turns=3, temperature=1.0,
                        top_p=1.0, max_length=4096, continuous=continuous)
    assert r.tool_errors == 1 and r.messages[1]["content"].startswith("error: unknown tool")
    assert r.truncated and r.completion_tokens == 60


@pytest.mark.parametrize("continuous", [True, False], ids=["continuous", "turn_by_turn"])
def test_a_group_renders_its_prompt_once_and_rollouts_stay_independent(monkeypatch, continuous):
    """Rows of a GRPO group are one row object: its chat template is rendered once per step, yet each
    rollout owns its token list (one rollout's tool turn must not leak into its siblings)."""
    t = tok()
    renders = []
    real = type(t).apply_chat_template

    def counting(self, conversation, *args, **kwargs):
        renders.append(conversation)
        return real(self, conversation, *args, **kwargs)

    monkeypatch.setattr(type(t), "apply_chat_template", counting)
    shared, other = row(), row()
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
    dec = ScriptedDecoder(t, [call, "Answer: 5<|im_end|>", "Answer: 6<|im_end|>", "Answer: 5<|im_end|>"])
    a, b, c = rollout_batch(dec, t, SURFACE, [shared, shared, other], max_completion_length=200, max_turns=2,
                            temperature=1.0, top_p=1.0, max_length=4096, continuous=continuous)
    prompts = [m for m in renders if m is shared["prompt"] or m is other["prompt"]]  # (tool turns render too)
    assert len(prompts) == 2  # two distinct rows, three rollouts
    assert a.ids[:a.prompt_len] == b.ids[:b.prompt_len] == c.ids[:c.prompt_len]
    assert a.tool_calls == 1 and b.tool_calls == 0 and len(a.ids) > len(b.ids)
    assert a.ids is not b.ids and (a.final, b.final, c.final) == ("Answer: 5", "Answer: 5", "Answer: 6")


def test_advantages_follow_scale_rewards():
    r = torch.tensor([1.0, 0.0, 0.5, 0.5])
    assert advantages(r, 2, "none").tolist() == [0.5, -0.5, 0.0, 0.0]
    g = advantages(r, 2, "group")
    assert g[0] == pytest.approx(0.5 / (torch.tensor([1.0, 0.0]).std().item() + 1e-4)) and g[2] == 0.0


def test_microbatches_respect_the_token_budget():
    rs = [Rollout(row={}, ids=[1] * n, prompt_len=1) for n in (10, 50, 20, 40, 30)]
    groups = microbatches(rs, budget=80)
    assert sorted(i for g in groups for i in g) == list(range(5))
    assert all(max(len(rs[i].ids) for i in g) * len(g) <= 80 for g in groups)


def test_loss_gradient_is_the_policy_gradient_on_sampled_tokens_only():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=torch.float32)
    cfg = TrainConfig(max_steps=1, learning_rate=1e-3, num_generations=2, max_completion_length=8)
    ids = list(range(5, 17))
    a = Rollout(row={}, ids=ids, prompt_len=6, sampled=[True, True, False, False, True, True], logprobs=[0.0] * 6)
    b = Rollout(row={}, ids=ids[:9], prompt_len=6, sampled=[True, True, True], logprobs=[0.0] * 3)
    adv = torch.tensor([1.0, -0.5])
    policy_loss(model, [a, b], adv, cfg, torch.device("cpu"), torch.autocast("cpu", enabled=False), None, None)
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    # By hand: dapo loss = -(sum of A * logp over sampled tokens) / sampled tokens.
    total = 0
    for r, adv_r in ((a, 1.0), (b, -0.5)):
        logp = torch.log_softmax(model(torch.tensor([r.ids])).logits[0, :-1].float(), -1)
        for pos, (tid, s) in enumerate(zip(r.ids[r.prompt_len:], r.sampled)):
            if s:
                total = total - adv_r * logp[r.prompt_len - 1 + pos, tid]
    (total / 7).backward()
    for n, p in model.named_parameters():
        if p.grad is not None:
            assert torch.allclose(got[n], p.grad, atol=1e-5), n


def reference_job(tmp_path, **train):
    import shutil
    from pathlib import Path

    from ait.job.config import parse_job_config
    from ait.job.types import Job

    root = Path(__file__).resolve().parents[1]
    ws = tmp_path / "ws"
    shutil.copytree(root / "src" / "ait" / "policy" / "reference_jobs" / "calc_chain", ws)
    text = (ws / "job.toml").read_text()
    for key, value in train.items():
        text = text.replace("[train]\n", f"[train]\n{key} = {value}\n", 1)
    (tmp_path / "run" / "job").mkdir(parents=True)
    return Job(job_id="t", run_dir=str(tmp_path / "run"), workspace=str(ws),
               task_path=str(root / "examples" / "tasks" / "calc_chain.json"), config=parse_job_config(text, None),
               time_budget_s=600)


@pytest.mark.parametrize("lora", [False, True])
def test_a_real_run_with_a_bf16_sampling_copy_updates_weights(tmp_path, monkeypatch, lora):
    """The GPU arrangement (fp32 trained weights or adapters, a bf16 sampler refreshed each step), on CPU."""
    from safetensors.torch import load_file

    from ait.train import fast_grpo

    refreshed = []
    original = fast_grpo.SamplingCopy.refresh
    monkeypatch.setattr(fast_grpo.SamplingCopy, "refresh", lambda self: (refreshed.append(1), original(self)))
    job = reference_job(tmp_path)
    if lora:
        from ait.job.types import LoraConfig

        job.config.train.lora = LoraConfig(r=4, lora_alpha=8)
    out = fast_grpo.train(job, str(tiny_model_path()), sampling_dtype=torch.bfloat16)
    assert out.steps == 4 and len(refreshed) == 4
    assert out.metrics["train/generated_tokens_total"] > 0
    trained = load_file(f"{out.checkpoint}/model.safetensors")
    base = load_file(f"{tiny_model_path()}/model.safetensors")
    assert any(not torch.equal(trained[k], base[k]) for k in base)


def test_cached_continuation_equals_a_fresh_render():
    from ait.train.rollouts import Continuation, tool_schemas

    t = tok()
    cont = Continuation(t, tool_schemas(SURFACE))
    stop = stop_ids(t)[0]
    calls = [{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]
    for content in ("3", "error: bad {json} \\n <tool_response>", "x" * 50):
        results = [{"role": "tool", "name": "add", "content": content}]
        assert cont(stop, calls, results) == t(cont.render(stop, calls, results), add_special_tokens=False)["input_ids"]
    assert cont.cache[(stop, ("add",))] is not None  # the template copies results verbatim: cached


def test_a_non_finite_gradient_skips_the_step_instead_of_poisoning_the_weights(tmp_path, monkeypatch):
    """One NaN loss (a diverged batch) must leave the weights as they were and be counted."""
    from safetensors.torch import load_file

    from ait.train import fast_grpo

    real_loss = fast_grpo.policy_loss

    def nan_loss(model, *args, **kwargs):
        stats = real_loss(model, *args, **kwargs)
        next(p for p in model.parameters() if p.requires_grad).grad.fill_(float("nan"))
        return stats

    monkeypatch.setattr(fast_grpo, "policy_loss", nan_loss)
    out = fast_grpo.train(reference_job(tmp_path), str(tiny_model_path()))
    assert out.metrics["train/skipped_nonfinite_steps"] == out.steps == 4
    assert "train/grad_norm" not in out.metrics  # every step's norm was NaN: no mean, not a NaN mean
    assert all(math.isfinite(v) for v in out.metrics.values())
    TrainOutput.model_validate_json(out.model_dump_json())  # what run_job reads back
    trained = load_file(f"{out.checkpoint}/model.safetensors")
    base = load_file(f"{tiny_model_path()}/model.safetensors")
    assert all(torch.equal(trained[k], base[k]) for k in base)


def test_scoring_a_padded_batch_equals_scoring_each_rollout_alone():
    """Rows of very different lengths (the short row's window reaches into its left padding):
    every sampled token's logprob equals an unpadded forward of that rollout alone, and nothing
    is NaN, not even at masked positions."""
    from contextlib import nullcontext

    from ait.train.fast_grpo import score_batch

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(), attn_implementation="sdpa").eval()
    short = Rollout(row={}, ids=[5, 6, 7, 8], prompt_len=2, sampled=[True, True])
    long = Rollout(row={}, ids=list(range(10, 40)), prompt_len=3, sampled=[True, False] * 13 + [True])
    with torch.no_grad():
        logprobs, mask = score_batch(model, [short, long], torch.device("cpu"), nullcontext())
        assert torch.isfinite(logprobs).all()
        for row, r in enumerate([short, long]):
            alone, _ = score_batch(model, [r], torch.device("cpu"), nullcontext())
            n = len(r.ids) - r.prompt_len
            got = logprobs[row, -n:][mask[row, -n:]]
            want = alone[0][torch.tensor(r.sampled)]
            assert torch.allclose(got, want, atol=1e-5)


def test_training_turns_off_cudnn_attention(tmp_path):
    """cuDNN's SDPA backward returns NaN under masks at widths of 64 mod 128 on H100/H200
    (pytorch/pytorch#196678): a training process must not use it."""
    from ait.train import fast_grpo

    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        fast_grpo.train(reference_job(tmp_path), str(tiny_model_path()))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


def test_continuous_rollouts_on_the_real_decoder_build_what_turn_by_turn_builds(monkeypatch):
    """The real engine, greedy: every row's first reply is taken as a call of `add` (the tiny model cannot
    write one), so each row rejoins after its tool turn, continuously or turn by turn. Both schedules give
    every row the same tokens, masks and tool turns; continuous never decodes more steps."""
    from ait.chat.renderers import HFRenderer
    from ait.chat.types import ToolCall

    from ait.train.rollouts import tool_schemas

    t = tok()
    rows = [row(), row()]
    rows[1]["prompt"][1]["content"] = "7+8? Think it through."
    prompts = [HFRenderer(t).build_generation_prompt(r["prompt"], tool_schemas(SURFACE)) for r in rows]
    real_parse = HFRenderer.parse_response

    def parse(self, ids, prefix, **kwargs):
        content, calls = real_parse(self, ids, prefix, **kwargs)
        if list(prefix) in prompts:  # a row's first reply: as if it called add(2, 3)
            return content, [ToolCall(name="add", arguments={"a": 2, "b": 3})]
        return content, calls

    monkeypatch.setattr(HFRenderer, "parse_response", parse)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=torch.float32).eval()
    out = {}
    for continuous in (False, True):
        # a third of the vocabulary stops a reply: the random tiny model's replies end at varied lengths
        decoder = Decoder(model, stop_ids=range(0, model.config.vocab_size, 3), pad_id=t.pad_token_id)
        rs = rollout_batch(decoder, t, SURFACE, [rows[0], rows[0], rows[1]], max_completion_length=40, max_turns=2,
                           temperature=0.0, top_p=1.0, max_length=4096, continuous=continuous)
        out[continuous] = (rs, decoder.stats["decode_steps"])
    (turns, steps_t), (cont, steps_c) = out[False], out[True]
    for a, b in zip(turns, cont):
        assert a.tool_calls == b.tool_calls == 1
        assert a.ids == b.ids and a.sampled == b.sampled and a.truncated == b.truncated
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert len(a.sampled) == len(a.ids) - a.prompt_len and 0 < a.completion_tokens <= 40
    assert steps_c <= steps_t
