"""Prefix reuse in the decoding server (ait.train.decode_prefix): a conversation's next call prefills only
its new tokens, on top of the KV its previous call left, and samples what a fresh prefill would."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ait.train.decode import Decoder, Request
from ait.train.decode_prefix import PrefixStore, common_prefix

VOCAB = 97


@pytest.fixture(scope="module", params=["sdpa", "grouped"])
def model(request):
    """Both attentions a sampler runs with: transformers' sdpa and ours (the outer loop's, the eval's)."""
    from ait.train.attention import grouped_attention_name

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      initializer_range=0.5, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                      attn_implementation="sdpa" if request.param == "sdpa" else grouped_attention_name())
    return LlamaForCausalLM(cfg).eval()


def reference(model, prompt, max_new, temperature, generator):
    """Full forward each step, no cache: the tokens and logprobs a fresh prefill samples."""
    ids, out, logprobs = list(prompt), [], []
    for _ in range(max_new):
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float() / temperature, -1)
        u = torch.rand(len(logp), generator=generator)
        tok = int((logp - torch.log(-torch.log(u.clamp(1e-20, 1.0)))).argmax())
        out.append(tok)
        logprobs.append(float(logp[tok]))
        ids.append(tok)
    return out, logprobs


def serve(dec, requests):
    dec.submit(requests)
    done = []
    while dec.busy:
        done += dec.step()
    return done


def tokens(n, seed):
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_a_conversations_next_call_prefills_only_its_new_tokens_and_samples_as_fresh(model):
    store = PrefixStore(2**30, min_tokens=8)
    dec = Decoder(model, stop_ids=[], pad_id=0, cache_bucket=16, min_rows=4, geometric=True, max_batch=4,
                  prefixes=store)
    system = tokens(40, 1)  # shared by both conversations, as an agent's system prompt and tools are
    first = [Request(system + tokens(12, 10 + i), 6, 0.8, generator=torch.Generator().manual_seed(i))
             for i in range(2)]
    serve(dec, first[:1])
    before = dec.stats["prefill_tokens"]
    serve(dec, first[1:])  # it shares the first's system prompt: only its own 12 tokens are forwarded
    assert dec.stats["prefill_tokens"] - before == 12 and store.stats["tokens_reused"] == 40
    assert store.stats["saved"] == 2 and store.stats["hits"] == 1
    for i, r in enumerate(first):
        assert (r.ids, pytest.approx(r.logprobs, abs=1e-4)) == reference(model, r.prompt, 6, 0.8,
                                                                         torch.Generator().manual_seed(i))
    # Each stored sequence: the prompt and the fed reply tokens (the last one sampled was never fed).
    assert sorted(len(e.tokens) for e in store.entries.values()) == [52 + 5, 52 + 5]
    before = dec.stats["prefill_tokens"]
    nxt = []
    for i, r in enumerate(first):  # the next turn: the whole conversation, a tool result and a new header
        prompt = r.prompt + r.ids + tokens(7, 20 + i)
        nxt.append(Request(prompt, 9, 0.8, generator=torch.Generator().manual_seed(100 + i)))
    serve(dec, nxt)
    # Only what follows each stored sequence was forwarded: the last reply token and the 7 new ones.
    assert dec.stats["prefill_tokens"] - before == 2 * (1 + 7)
    assert store.stats["tokens_reused"] == 40 + 2 * (52 + 5)
    for i, r in enumerate(nxt):
        ids, logprobs = reference(model, r.prompt, 9, 0.8, torch.Generator().manual_seed(100 + i))
        assert r.ids == ids
        assert r.logprobs == pytest.approx(logprobs, abs=1e-4)
    # The longer sequences replaced the ones they extend: two entries, not four.
    assert len(store.entries) == 2 and sorted(len(e.tokens) for e in store.entries.values()) == [65 + 8, 65 + 8]


def test_without_a_store_every_prompt_is_prefilled_whole(model):
    dec = Decoder(model, stop_ids=[], pad_id=0, cache_bucket=16, min_rows=4, geometric=True, max_batch=4)
    r = Request(tokens(30, 3), 4, 0.8, generator=torch.Generator().manual_seed(0))
    serve(dec, [r])
    again = Request(r.prompt + r.ids + tokens(5, 4), 4, 0.8, generator=torch.Generator().manual_seed(1))
    before = dec.stats["prefill_tokens"]
    serve(dec, [again])
    assert dec.stats["prefill_tokens"] - before == len(again.prompt)


def test_matches_need_min_tokens_and_leave_the_last_prompt_token_to_forward(model):
    store = PrefixStore(2**30, min_tokens=16)
    dec = Decoder(model, stop_ids=[], pad_id=0, cache_bucket=16, min_rows=2, geometric=True, max_batch=2,
                  prefixes=store)
    r = Request(tokens(30, 5), 3, 0.8, generator=torch.Generator().manual_seed(0))
    serve(dec, [r])
    stored = next(iter(store.entries.values())).tokens.tolist()
    assert store.match(tokens(30, 6)) is None  # nothing in common
    assert store.match(stored[:10] + tokens(20, 7)) is None  # 10 < min_tokens
    entry, n = store.match(stored)  # the same sequence again: all but its last token
    assert n == len(stored) - 1
    assert store.match(stored[:20] + [0])[1] == 20


def test_the_budget_evicts_least_recently_used_and_a_too_large_sequence_is_not_kept(model):
    layers_bytes = 2 * 2 * 2 * 8 * 4  # 2 layers x (K, V) x 2 kv heads x head_dim 8 x float32, per token
    store = PrefixStore(100 * layers_bytes, min_tokens=4)
    dec = Decoder(model, stop_ids=[], pad_id=0, cache_bucket=16, min_rows=2, geometric=True, max_batch=2,
                  prefixes=store)
    a, b, c = (Request(tokens(40, s), 2, 0.8, generator=torch.Generator().manual_seed(s)) for s in (11, 12, 13))
    serve(dec, [a])
    serve(dec, [b])
    assert store.nbytes == 2 * 41 * layers_bytes and len(store.entries) == 2
    store.match(a.prompt)  # a is used: b is now the least recent
    serve(dec, [c])
    assert store.stats["evicted"] == 1 and len(store.entries) == 2
    kept = [e.tokens.tolist()[:40] for e in store.entries.values()]
    assert b.prompt not in kept and a.prompt in kept and c.prompt in kept
    huge = Request(tokens(120, 14), 2, 0.8, generator=torch.Generator().manual_seed(14))
    serve(dec, [huge])
    assert not any(len(e.tokens) > 100 for e in store.entries.values())  # 121 tokens are over the budget
    store.clear()
    assert not store.entries and store.nbytes == 0
    with pytest.raises(ValueError, match="budget"):
        PrefixStore(-1)


def test_common_prefix():
    a = np.array([1, 2, 3, 4])
    assert common_prefix(a, np.array([1, 2, 9])) == 2
    assert common_prefix(a, np.array([1, 2, 3, 4, 5])) == 4
    assert common_prefix(a, np.array([], dtype=np.int64)) == 0


def test_new_weights_clear_the_engines_store():
    from ait.train.decode_batch import SamplingEngine
    from ait.train.tiny import tiny_model_path
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    m = AutoModelForCausalLM.from_pretrained(path).eval()
    engine = SamplingEngine(m, tok, max_batch=2, prefix_cache_gib=0.01)
    try:
        engine.prefixes.min_tokens = 4
        engine.sample(list(range(5, 40)), 1.0, 3, torch.Generator().manual_seed(0))
        assert len(engine.prefixes.entries) == 1
        engine.refresh(lambda model: None, version=1)
        assert not engine.prefixes.entries and engine.prefixes.stats["cleared"] == 1
    finally:
        engine.close()
    with pytest.raises(ValueError, match="prefix_cache_gib"):
        SamplingEngine(m, tok, max_batch=2, prefix_cache_gib=-1)


def test_the_engines_counters_show_a_conversations_reuse():
    """The figures each outer step reports (trainer/sampler_*): a call that extends the previous call's
    prompt and reply prefills only its new tokens, and the rest are counted as served from the store."""
    from ait.train.decode_batch import SamplingEngine
    from ait.train.tiny import tiny_model_path
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    m = AutoModelForCausalLM.from_pretrained(path).eval()
    for gib in (0.01, 0.0):
        engine = SamplingEngine(m, tok, max_batch=2, prefix_cache_gib=gib)
        engine.decoder.stop_ids = []  # the reply is exactly its max_new_tokens, so it is fed whole
        try:
            if engine.prefixes is not None:
                engine.prefixes.min_tokens = 4
            first = list(range(5, 40))
            reply, _ = engine.sample(first, 1.0, 3, torch.Generator().manual_seed(0))
            before = engine.counters()
            engine.sample(first + reply + list(range(50, 60)), 1.0, 3, torch.Generator().manual_seed(1))
            after = engine.counters()
        finally:
            engine.close()
        prefilled = after["prefill_tokens"] - before["prefill_tokens"]
        reused = after["prefix_tokens_reused"] - before["prefix_tokens_reused"]
        assert after["generated_tokens"] - before["generated_tokens"] == 3
        if gib:  # the store holds the first prompt and the reply's fed tokens (all but the last)
            assert reused >= len(first) and prefilled + reused == len(first) + len(reply) + 10
        else:
            assert reused == 0 and prefilled == len(first) + len(reply) + 10
