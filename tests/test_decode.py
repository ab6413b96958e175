"""The static-cache sampler: the same tokens as transformers' generate, exact logprobs, stop tokens."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ait.train.decode import Decoder
from ait.train.decode_cache import bucket_batch
from ait.train.decode_sample import sample_tokens

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


# ---- the engine against a reference loop without cache ------------------------------------------

def reference(model, prompt, max_new, temperature=0.0, top_p=1.0, generator=None, stop=(), block=None):
    """Step-by-step sampling with a full forward pass each step (no cache, no padding, no mask).
    Noise: one vector a step from `generator`, or row `block[0]` of a [block[1], vocab] draw (a batch's
    shared generator)."""
    ids, out, logprobs = list(prompt), [], []
    for _ in range(max_new):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].float()
        if temperature <= 0:
            logp = torch.log_softmax(logits, -1)
            tok = int(logp.argmax())
        else:
            logp = torch.log_softmax(logits / temperature, -1)
            if top_p < 1.0:
                probs, order = logp.exp().sort(descending=True)
                keep = order[(probs.cumsum(0) - probs) <= top_p]
                logp = torch.full_like(logp, float("-inf")).index_fill(0, keep, 0.0) + logp
                logp = torch.log_softmax(logp, -1)
            u = (torch.rand(len(logp), generator=generator) if block is None
                 else torch.rand(block[1], len(logp), generator=generator)[block[0]])
            tok = int((logp - torch.log(-torch.log(u.clamp(1e-20, 1.0)))).argmax())
        out.append(tok)
        logprobs.append(float(logp[tok]))
        ids.append(tok)
        if tok in stop:
            break
    return out, logprobs


def gen(seed):
    return torch.Generator().manual_seed(seed)


def drive(dec, schedule):
    """Submit schedule[step] before that step; step until idle. Returns the finished requests in order."""
    done, step = [], 0
    while dec.busy or any(s >= step for s in schedule):
        dec.submit(schedule.get(step, []))
        done += dec.step()
        step += 1
    return done


def joining_requests(temperature, top_p=1.0):
    g = torch.Generator().manual_seed(5)
    lengths = [20, 3, 1, 30, 12, 7, 25]
    max_new = [10, 60, 40, 14, 5, 33, 20]
    return [dict(prompt=torch.randint(3, VOCAB, (n,), generator=g).tolist(), max_new_tokens=m,
                 temperature=temperature if i % 3 else (0.0 if temperature == 0 else 1.3), top_p=top_p, seed=i)
            for i, (n, m) in enumerate(zip(lengths, max_new))]


@pytest.mark.parametrize("min_rows", [1, 8])
@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (0.8, 1.0), (1.0, 0.9)])
def test_engine_equals_a_reference_loop_with_joins_leaves_compaction_and_growth(model, temperature, top_p, min_rows):
    from ait.train.decode import Request

    specs = joining_requests(temperature, top_p)
    first = specs[1]
    # a stop token that row 1 samples at its fifth token: it leaves early, others may stop on it too
    stop = {reference(model, first["prompt"], 5, first["temperature"], first["top_p"], gen(first["seed"]))[0][4]}
    requests = [Request(s["prompt"], s["max_new_tokens"], s["temperature"], s["top_p"], generator=gen(s["seed"]))
                for s in specs]
    dec = Decoder(model, stop_ids=stop, pad_id=0, cache_bucket=16, min_rows=min_rows, geometric=min_rows > 1)
    # rows join a running batch (other lengths, other ages) and leave it at their own ends
    done = drive(dec, {0: requests[:1], 5: requests[1:2], 9: requests[2:3], 30: requests[3:5], 45: requests[5:]})
    assert len(done) == len(requests) and not dec.busy
    assert dec.stats["relayouts"] >= 2 and dec.slot.cache_len > 32  # rows moved, the cache grew
    if dec.geometric:  # a server's shorter caches are never used again once it grew: none is kept
        assert list(dec.slots) == [(dec.slot.rows, dec.slot.cache_len)]
    for s, r in zip(specs, requests):
        ids, logprobs = reference(model, s["prompt"], s["max_new_tokens"], s["temperature"], s["top_p"],
                                  gen(s["seed"]), stop)
        assert r.ids == ids
        assert r.logprobs == pytest.approx(logprobs, abs=1e-4)
        assert r.stopped == (ids[-1] in stop)
    assert requests[1].stopped and len(requests[1].ids) <= 5
    assert len({tuple(r.ids) for r in requests}) == len(requests)


def test_a_reply_does_not_depend_on_its_batch_mates(model):
    from ait.train.decode import Request

    def mine():
        return Request(list(range(10, 22)), 30, 1.0, generator=gen(7))

    alone = mine()
    drive(Decoder(model, stop_ids=[], pad_id=0), {0: [alone]})
    crowd = mine()
    others = [Request(list(range(3, 3 + n)), m, 1.0, generator=gen(n)) for n, m in ((40, 5), (2, 50), (9, 12))]
    drive(Decoder(model, stop_ids=[], pad_id=0, cache_bucket=16), {0: others[:1], 2: [crowd, others[1]], 6: others[2:]})
    assert crowd.ids == alone.ids and crowd.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    # the generator drew exactly one vector per token generated, whatever the batch-mates did
    assert torch.equal(crowd.generator.get_state(), alone.generator.get_state())


def test_a_greedy_request_leaves_its_generator_untouched(model):
    from ait.train.decode import Request

    r = Request([5, 6, 7], 8, 0.0, generator=gen(3))
    drive(Decoder(model, stop_ids=[], pad_id=0), {0: [r, Request([9, 9], 8, 1.0, generator=gen(4))]})
    assert torch.equal(r.generator.get_state(), gen(3).get_state())


def test_generate_with_a_shared_generator_equals_the_reference(model):
    """generate(): one [rows, vocab] draw a step from the batch's generator (rows padded to a bucket)."""
    ps = prompts()
    out = Decoder(model, stop_ids=[1], pad_id=0).generate(ps, 15, temperature=0.9, generator=gen(11))
    rows = bucket_batch(len(ps))
    for i, (p, s) in enumerate(zip(ps, out)):
        ids, logprobs = reference(model, p, 15, 0.9, generator=gen(11), stop={1}, block=(i, rows))
        # the reference draws a whole block per step for its row alone: replay the stream for row i
        assert s.ids == ids and s.logprobs == pytest.approx(logprobs, abs=1e-4)


def test_generate_refills_rows_beyond_max_batch(model):
    ps = prompts() * 2
    out = Decoder(model, stop_ids=[1], pad_id=0, max_batch=3, cache_bucket=16).generate(ps, 12)
    for p, s in zip(ps, out):
        assert s.ids == reference(model, p, 12, stop={1})[0]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_compaction_then_growth_keep_every_row_exact(model, temperature):
    """A (20 + 10 tokens) sizes the cache at 32 columns; B (3 + 60) joins at column 25. When A has left
    and the write column reaches 32, B's 10 columns move to the front (compaction); at 32 again, B
    spans the whole cache and moves into a longer one (growth). C joins after both."""
    from ait.train.decode import Request

    a = Request(list(range(40, 60)), 10, temperature, generator=gen(1))
    b = Request([7, 8, 9], 60, temperature, generator=gen(2))
    c = Request(list(range(20, 35)), 20, temperature, generator=gen(3))
    dec = Decoder(model, stop_ids=[], pad_id=0, cache_bucket=16, min_rows=8)
    drive(dec, {0: [a], 5: [b], 40: [c]})
    assert dec.stats["compactions"] == 1 and dec.stats["relayouts"] == 3 and dec.slot.cache_len > 32
    for r, seed in ((a, 1), (b, 2), (c, 3)):
        ids, logprobs = reference(model, r.prompt, r.max_new_tokens, temperature, generator=gen(seed))
        assert r.ids == ids and r.logprobs == pytest.approx(logprobs, abs=1e-4)


def test_the_names_that_moved_out_of_decode_are_still_importable_from_it():
    """decode.py was split (decode_cache, decode_sample); callers outside the package import from the old path."""
    from ait.train import decode, decode_cache, decode_sample

    assert decode.bucket_batch is decode_cache.bucket_batch and decode.cache_kwarg is decode_cache.cache_kwarg
    assert (decode.gumbel, decode.nucleus, decode.sample_tokens) == (
        decode_sample.gumbel, decode_sample.nucleus, decode_sample.sample_tokens)
