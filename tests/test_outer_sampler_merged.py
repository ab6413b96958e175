"""The local backend's sampling model: a plain (non-peft) copy of the base with the adapter merged into
its weights, refreshed in place; it computes what the peft training model computes. And the decode
loop's per-row generators: a row draws noise only while it generates."""

from __future__ import annotations

import copy

import pytest
import torch
from test_outer_loss import sampled_turns

from ait.outer.backends.local import LocalBackend
from ait.outer.backends.lora_merge import LoraMerge
from ait.outer.backends.loss import completion_logprobs
from ait.outer.config import OuterConfig
from ait.outer.types import Trajectory, TrajectoryGroup
from ait.train.decode import Decoder, Request
from ait.train.tiny import tiny_model_path


def make_backend(**trainer) -> LocalBackend:
    torch.manual_seed(0)
    return LocalBackend(OuterConfig(policy={"model": "tiny", "max_new_tokens": 16, "temperature": 1.0},
                                    trainer={"device": "cpu", "lora_r": 4, "lora_alpha": 8, "learning_rate": 1e-2,
                                             **trainer}))


@pytest.fixture(scope="module")
def backend() -> LocalBackend:
    b = make_backend()
    yield b
    b.close()


def logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


def test_the_sampler_is_a_plain_model() -> None:
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTunerLayer
    from transformers import AutoModelForCausalLM

    b = make_backend(gradient_checkpointing=True)
    try:
        sampler = b.engine.model
        assert not isinstance(sampler, PeftModel)
        assert not any(isinstance(m, BaseTunerLayer) for m in sampler.modules())
        assert not any("lora" in n or "base_layer" in n for n, _ in sampler.named_parameters())
        assert not any(q.requires_grad for q in sampler.parameters()) and not sampler.training
        assert sampler.config.use_cache and not b.model.config.use_cache
        assert not any(getattr(m, "gradient_checkpointing", False) for m in sampler.modules())
        plain = AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=torch.float32)
        assert {n: q.shape for n, q in sampler.named_parameters()} == {n: q.shape for n, q in plain.named_parameters()}
        assert b.merger.merges  # every adapted layer has its twin
        assert len(b.merger.merges) == sum(1 for m in b.model.modules() if isinstance(m, BaseTunerLayer))
    finally:
        b.close()


def test_after_a_train_step_the_sampler_computes_the_training_model(backend: LocalBackend) -> None:
    good, bad = sampled_turns(backend, [1, 2])
    ids = good.prompt_ids + good.completion_ids
    identity = {n: (id(q), q.data_ptr()) for n, q in backend.engine.model.named_parameters()}
    before = logits(backend.engine.model, ids)
    adapter = backend.adapter_state()
    backend.train_step([TrajectoryGroup(task_id="t", trajectories=[
        Trajectory(episode_id="g", task_id="t", family="calc_chain", turns=[good], reward=0.6, policy_version=0),
        Trajectory(episode_id="b", task_id="t", family="calc_chain", turns=[bad], reward=-0.1, policy_version=0)],
        policy_version=0)])
    assert any(not torch.equal(adapter[k], v) for k, v in backend.adapter_state().items())
    assert not backend.model.training
    sampled, trained = logits(backend.engine.model, ids), logits(backend.model, ids)
    assert torch.allclose(sampled, trained, atol=1e-5, rtol=1e-5)  # the merge is right
    assert (sampled - before).abs().max() > 1e-3  # ... and the step moved it: the check can tell
    with backend.model.disable_adapter():
        assert (sampled - logits(backend.model, ids)).abs().max() > 1e-3  # not the bare base either
    # Refreshed in place: the same tensors, new contents.
    assert identity == {n: (id(q), q.data_ptr()) for n, q in backend.engine.model.named_parameters()}
    # A reply sampled now is replayed by the training model with the recorded logprobs.
    turn = sampled_turns(backend, [7])[0]
    with torch.no_grad():
        replay = completion_logprobs(backend.model, turn.prompt_ids, turn.completion_ids, 1.0)
    assert replay.tolist() == pytest.approx(turn.logprobs, abs=1e-4)


def test_load_and_warm_start_refresh_the_merged_sampler(backend: LocalBackend, tmp_path) -> None:
    with torch.no_grad():  # a distinctly non-zero adapter
        for q in backend.params.values():
            q.add_(torch.randn_like(q) * 0.05)
    backend.refresh_sampler()
    backend.save(str(tmp_path / "ckpt"))
    ids = sampled_turns(backend, [3])[0].prompt_ids
    expected = logits(backend.engine.model, ids)
    assert torch.allclose(expected, logits(backend.model, ids), atol=1e-5, rtol=1e-5)
    for how in ("load", "warm_start"):
        other = make_backend()
        try:
            assert (logits(other.engine.model, ids) - expected).abs().max() > 1e-3
            getattr(other, how)(str(tmp_path / "ckpt"))
            assert torch.allclose(logits(other.engine.model, ids), expected, atol=1e-5, rtol=1e-5), how
        finally:
            other.close()


def perturb_and_compare(peft_model, merger: LoraMerge, plain, ids: list[int]) -> None:
    with torch.no_grad():
        for q in peft_model.parameters():
            if q.requires_grad:
                q.add_(torch.randn_like(q) * 0.05)
    merger.merge()
    peft_model.eval()
    assert torch.allclose(logits(plain, ids), logits(peft_model, ids), atol=1e-5, rtol=1e-5)


def test_an_adapter_on_a_tied_lm_head_leaves_the_embeddings_alone() -> None:
    b = make_backend(lora_target_modules=["q_proj", "lm_head"])
    try:
        sampler = b.engine.model
        base = b.model.get_base_model()
        assert base.lm_head.base_layer.weight is base.model.embed_tokens.weight  # tied in the base
        ids = sampled_turns(b, [4])[0].prompt_ids
        perturb_and_compare(b.model, b.merger, sampler, ids)
        assert sampler.lm_head.weight is not sampler.model.embed_tokens.weight
        assert torch.equal(sampler.model.embed_tokens.weight, base.model.embed_tokens.weight)
        assert not torch.equal(sampler.lm_head.weight, base.lm_head.base_layer.weight)
    finally:
        b.close()


def test_modules_to_save_are_copied() -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=torch.float32)
    plain = copy.deepcopy(base).eval()
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["v_proj", "down_proj"],
                                            modules_to_save=["norm"], task_type="CAUSAL_LM"))
    merger = LoraMerge(model, plain)
    assert merger.copies and all(attr == "weight" for _, attr, _ in merger.copies)
    perturb_and_compare(model, merger, plain, list(range(5, 40)))
    assert torch.equal(plain.model.norm.weight, model.get_base_model().model.norm.modules_to_save["default"].weight)


def test_a_row_draws_noise_only_while_it_generates(backend: LocalBackend) -> None:
    """A reply that stops early leaves its generator where it would be had it sampled alone, so the episode's
    next turn does not depend on its batch-mates."""
    model = backend.engine.model

    def gen(seed: int) -> torch.Generator:
        g = torch.Generator()
        g.manual_seed(seed)
        return g

    short, long = [5, 6, 7], [9, 10, 11, 12]

    def run(requests, stop):
        dec = Decoder(model, stop_ids=stop, pad_id=0)
        dec.submit(requests)
        while dec.busy:
            dec.step()
        return requests

    first = run([Request(short, 12, 1.0, generator=gen(1))], set())[0].ids
    stop = {first[2]}  # the short request stops at its third token
    alone, = run([Request(short, 12, 1.0, generator=gen(1))], stop)
    a, b = run([Request(short, 12, 1.0, generator=gen(1)), Request(long, 12, 1.0, generator=gen(2))], stop)
    assert len(alone.ids) <= 3 and len(b.ids) > len(alone.ids)  # the batch-mate went on after the short one stopped
    assert a.ids == alone.ids and a.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    assert torch.equal(a.generator.get_state(), alone.generator.get_state())
