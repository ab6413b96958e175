"""Continuous batching in the agent sampler (ait.train.decode_batch.SamplingEngine on the decoding
engine): a request joins the running batch and leaves when its reply ends, replies match sampling
alone, weight swaps wait for running rows, errors stay local."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ait.outer.sampler import SamplingEngine
from ait.train.decode import Decoder, Request
from ait.train.tiny import tiny_model_path
from tests.test_decode import drive, reference


@pytest.fixture(scope="module")
def model_and_tokenizer():
    path = tiny_model_path()
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


PROMPTS = [[5, 6, 7], list(range(10, 40)), [9, 10, 11, 12], list(range(3, 60, 2))]


def alone(model, prompt, seed, max_new, temperature=1.0, stop=frozenset()):
    """The reference: step-by-step sampling without a cache, full forward each step."""
    return reference(model, prompt, max_new, temperature, generator=gen(seed), stop=set(stop))


def test_rows_that_join_mid_flight_sample_as_if_alone(model_and_tokenizer):
    model, _ = model_and_tokenizer
    dec = Decoder(model, stop_ids=[], pad_id=0, min_rows=8)
    requests = [Request(p, 6 + 3 * i, 1.0 if i % 2 == 0 else 0.0, generator=gen(i)) for i, p in enumerate(PROMPTS)]
    # later requests join a batch that is already decoding, with other cache lengths
    done = drive(dec, {0: requests[:1], 2: requests[1:3], 4: requests[3:]})
    assert len(done) == 4 and not dec.busy
    for i, (req, prompt) in enumerate(zip(requests, PROMPTS)):
        ids, logprobs = alone(model, prompt, i, 6 + 3 * i, temperature=req.temperature)
        assert req.ids == ids and req.logprobs == pytest.approx(logprobs, abs=1e-4)
        assert torch.equal(req.generator.get_state(), gen(i).get_state()) is (req.temperature == 0)


def test_a_finished_row_frees_its_slot_at_once(model_and_tokenizer):
    model, _ = model_and_tokenizer
    dec = Decoder(model, stop_ids=[], pad_id=0)
    short, long = Request(list(range(3, 80)), 2, 1.0, generator=gen(0)), Request([5, 6], 10, 1.0, generator=gen(1))
    dec.submit([short, long])
    assert dec.step() == [] and dec.live == 2
    assert dec.step() == [short] and dec.live == 1  # left after its 2nd token, before the next forward
    row = dec.rows.index(None)
    newcomer = Request([8, 9, 10], 3, 0.0)
    dec.submit([newcomer])
    dec.step()
    assert dec.rows[row] is newcomer  # the next request takes the freed row
    drive(dec, {})
    assert long.ids == alone(model, [5, 6], 1, 10)[0] and newcomer.ids == alone(model, [8, 9, 10], 0, 3, 0.0)[0]


def test_a_short_reply_is_not_held_back_by_a_long_one(model_and_tokenizer):
    model, tok = model_and_tokenizer
    engine = SamplingEngine(model, tok, max_batch=8)
    finished_at: dict[str, float] = {}

    def ask(name: str, prompt: list[int], max_new: int, delay: float) -> None:
        time.sleep(delay)
        engine.sample(prompt, 1.0, max_new, gen(len(name)))
        finished_at[name] = time.monotonic()

    long = threading.Thread(target=ask, args=("long", [5, 6, 7], 600, 0.0))
    short = threading.Thread(target=ask, args=("s", [9, 10], 3, 0.2))  # arrives while the long one decodes
    long.start(), short.start()
    long.join(), short.join()
    engine.close()
    assert finished_at["s"] < finished_at["long"]
    assert engine.batches == 2  # the short request was prefilled on its own and joined the running batch


def test_a_weight_swap_waits_for_running_rows_and_new_requests_wait_for_it(model_and_tokenizer):
    model, tok = model_and_tokenizer
    engine = SamplingEngine(model, tok, max_batch=8)
    expected = alone(model, [5, 6, 7], 3, 200)
    result = {}
    t = threading.Thread(target=lambda: result.update(old=engine.sample([5, 6, 7], 1.0, 200, gen(3))))
    t.start()
    time.sleep(0.1)
    saved = {k: v.clone() for k, v in model.state_dict().items()}

    def update(m):
        result["swapped_while_running"] = engine.active
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(0.5)

    engine.refresh(update, version=1)
    t.join()
    after = engine.sample([5, 6, 7], 1.0, 20, gen(3))
    engine.close()
    model.load_state_dict(saved)
    assert result["swapped_while_running"] == 0 and engine.version == 1
    assert result["old"][0] == expected[0]  # the running reply finished on the weights it started with
    # A later request sampled from the new weights: its first token's logprob moved. (Not its tokens: with
    # Gumbel-max noise shared by seed, a random tiny model's flat logits can pick the same 20 tokens.)
    assert abs(after[1][0] - expected[1][0]) > 1e-4, (after[1][:3], expected[1][:3])


def test_a_bad_request_fails_alone_and_the_engine_keeps_serving(model_and_tokenizer):
    model, tok = model_and_tokenizer
    engine = SamplingEngine(model, tok, max_batch=8)
    with pytest.raises(IndexError):
        engine.sample([model.config.vocab_size + 5], 1.0, 4, gen(0))  # a token id outside the vocabulary
    ids, logprobs = engine.sample([5, 6, 7], 0.0, 5, gen(0))
    engine.close()
    assert ids == alone(model, [5, 6, 7], 0, 5, temperature=0.0)[0] and len(logprobs) == len(ids)


def test_a_failing_forward_pass_fails_the_running_rows_but_not_the_replies_already_done(model_and_tokenizer):
    model, tok = model_and_tokenizer
    engine = SamplingEngine(model, tok, max_batch=8)
    real_forward = model.forward
    calls = {"n": 0}

    def flaky(*args, **kwargs):  # the prefill and first decode steps work, then the device "fails"
        calls["n"] += 1
        if calls["n"] > 4:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real_forward(*args, **kwargs)

    results: dict[str, object] = {}

    def ask(name, max_new):
        try:
            results[name] = engine.sample([5, 6, 7], 1.0, max_new, gen(1))
        except RuntimeError as e:
            results[name] = e

    model.forward = flaky
    try:
        threads = [threading.Thread(target=ask, args=("short", 2)), threading.Thread(target=ask, args=("long", 50))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "a reply was lost: its episode waits forever"
    finally:
        model.forward = real_forward
    assert isinstance(results["long"], RuntimeError) and "illegal memory access" in str(results["long"])
    ids = engine.sample([5, 6, 7], 0.0, 3, gen(0))[0]  # the engine serves the next request
    engine.close()
    assert len(ids) == 3 and engine.active == 0
