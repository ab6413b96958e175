"""ait.train.attention.grouped_sdpa: the same attention as transformers' SDPA path, without
copying key/value heads, for decode (one query) and for full sequences under explicit masks."""

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ait.train.attention import GROUPED_SDPA, grouped_attention_name, grouped_sdpa
from ait.train.decode import Decoder
from ait.train.tiny import tiny_model_path


class Layer:
    is_causal = True

    def __init__(self, groups: int):
        self.num_key_value_groups = groups


def inputs(groups: int, t: int, length: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b, kv_heads, d = 3, 2, 8
    q = torch.randn(b, kv_heads * groups, t, d, generator=g)
    k = torch.randn(b, kv_heads, length, d, generator=g)
    v = torch.randn(b, kv_heads, length, d, generator=g)
    mask = torch.rand(b, 1, t, length, generator=g) > 0.4
    mask[..., 0] = True  # every query sees something
    return q, k, v, mask


@pytest.mark.parametrize("t", [1, 5])
@pytest.mark.parametrize("groups", [1, 3])
def test_grouped_sdpa_matches_transformers_sdpa_under_bool_and_float_masks(groups, t):
    q, k, v, mask = inputs(groups, t, length=11)
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    for m in (mask, additive):
        ours, _ = grouped_sdpa(Layer(groups), q, k, v, m, scaling=0.3)
        theirs, _ = sdpa_attention_forward(Layer(groups), q, k, v, m, scaling=0.3)
        assert ours.shape == theirs.shape == (3, t, q.shape[1], 8)
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)


def test_grouped_sdpa_hands_what_it_does_not_cover_to_transformers():
    q, k, v, mask = inputs(3, 4, length=4)
    # no mask: causal attention through transformers' own path
    ours, _ = grouped_sdpa(Layer(3), q, k, v, None)
    theirs, _ = sdpa_attention_forward(Layer(3), q, k, v, None)
    torch.testing.assert_close(ours, theirs)
    # a per-head mask cannot be folded into the query axis
    per_head = mask.expand(3, 6, 4, 4).clone()
    per_head[:, 1] = True
    ours, _ = grouped_sdpa(Layer(3), q, k, v, per_head)
    theirs, _ = sdpa_attention_forward(Layer(3), q, k, v, per_head)
    torch.testing.assert_close(ours, theirs)


def test_a_model_gives_the_same_logits_and_samples_with_grouped_attention():
    path = tiny_model_path()
    sdpa = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()
    grouped = AutoModelForCausalLM.from_pretrained(path, attn_implementation=grouped_attention_name()).eval()
    assert grouped.config._attn_implementation == GROUPED_SDPA
    assert grouped.config.num_attention_heads > grouped.config.num_key_value_heads  # the tiny model uses GQA
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]])
    attn = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        a = sdpa(input_ids=ids, attention_mask=attn).logits
        b = grouped(input_ids=ids, attention_mask=attn).logits
    torch.testing.assert_close(a[1], b[1], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(a[0, 2:], b[0, 2:], atol=1e-5, rtol=1e-4)
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    out_a = Decoder(sdpa, stop_ids=[1], pad_id=0).generate(prompts, 12)
    out_b = Decoder(grouped, stop_ids=[1], pad_id=0).generate(prompts, 12)
    assert [s.ids for s in out_a] == [s.ids for s in out_b]
    for x, y in zip(out_a, out_b):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
