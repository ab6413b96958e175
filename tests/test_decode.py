"""The static-cache sampler: the same tokens as transformers' generate, exact logprobs, stop tokens."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ait.train.decode import Decoder, bucket_batch, sample_tokens

VOCAB = 97


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.5, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    return LlamaForCausalLM(cfg).eval()


def prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (5, 1, 9, 3, 7)]


def test_greedy_matches_generate_with_left_padding(model):
    dec = Decoder(model, stop_ids=[1], pad_id=0)
    out = dec.generate(prompts(), 12, temperature=0.0)
    for p, s in zip(prompts(), out):
        ref = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                             max_new_tokens=12, do_sample=False, eos_token_id=1, pad_token_id=0)[0, len(p):].tolist()
        assert s.ids == ref[:len(s.ids)] and len(s.ids) >= 1
        assert len(set(s.ids)) > 1  # a degenerate model would make the comparison vacuous


def test_sampled_logprobs_are_those_of_the_model(model):
    dec = Decoder(model, stop_ids=[1], pad_id=0)
    out = dec.generate(prompts(), 10, temperature=0.7, generator=torch.Generator().manual_seed(3))
    for p, s in zip(prompts(), out):
        with torch.no_grad():
            logits = model(torch.tensor([p + s.ids])).logits[0].float() / 0.7
        lp = torch.log_softmax(logits, -1)
        expected = [lp[len(p) - 1 + i, t].item() for i, t in enumerate(s.ids)]
        assert s.logprobs == pytest.approx(expected, abs=1e-4)


def test_rows_stop_at_their_stop_token_and_the_cache_is_reused(model):
    greedy = Decoder(model, stop_ids=[1], pad_id=0).generate(prompts(), 6)
    stop = greedy[0].ids[2]  # make row 0's third token a stop token
    dec = Decoder(model, stop_ids=[stop], pad_id=0)
    first = dec.generate(prompts(), 6)
    assert first[0].ids == greedy[0].ids[:3] and first[0].stopped
    assert all(not s.stopped or s.ids[-1] == stop for s in first)
    again = dec.generate(prompts(), 6)  # same shape: the slot (cache) is reused, results identical
    assert [s.ids for s in again] == [s.ids for s in first] and len(dec.slots) == 1


def test_top_p_keeps_only_the_nucleus():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.05, 0.05]]))
    seen = {int(sample_tokens(logits, 1.0, 0.8, torch.Generator().manual_seed(i))[0]) for i in range(200)}
    assert seen == {0, 1}
    tok, lp = sample_tokens(logits.repeat(2, 1), 0.0, 1.0, None)
    assert tok.tolist() == [0, 0] and lp[0].item() == pytest.approx(torch.log(torch.tensor(0.6)).item(), abs=1e-5)


def test_batch_buckets():
    assert [bucket_batch(n) for n in (1, 2, 3, 5, 16, 17, 64, 200)] == [1, 2, 4, 8, 16, 32, 64, 208]


def test_gumbel_sampling_draws_from_the_softmax():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1]])).repeat(4000, 1)
    tokens, lp = sample_tokens(logits, 1.0, 1.0, torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=3).float() / 4000
    assert torch.allclose(freq, torch.tensor([0.6, 0.3, 0.1]), atol=0.03)
    assert torch.allclose(lp.exp(), torch.tensor([0.6, 0.3, 0.1])[tokens], atol=1e-5)


def test_diverged_weights_raise_a_clear_error(model):
    import copy

    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.lm_head.weight.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="non-finite logits"):
        Decoder(broken, stop_ids=[1], pad_id=0).generate(prompts(), 4, temperature=1.0)
