"""Continuous batching in the agent sampler: a request joins the running batch and leaves when its
reply ends, replies match sampling alone, weight swaps wait for running rows, errors stay local."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ait.outer.batching import RunningBatch
from ait.outer.sampler import Request, SamplingEngine, generate_batch
from ait.train.tiny import tiny_model_path


@pytest.fixture(scope="module")
def model_and_tokenizer():
    path = tiny_model_path()
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


PROMPTS = [[5, 6, 7], list(range(10, 40)), [9, 10, 11, 12], list(range(3, 60, 2))]


def alone(model, prompt, seed, max_new, temperature=1.0, stop=frozenset()):
    return generate_batch(model, [Request(prompt, temperature, max_new, gen(seed))], 0, set(stop))[0]


def test_rows_that_join_mid_flight_sample_as_if_alone(model_and_tokenizer):
    model, _ = model_and_tokenizer
    batch = RunningBatch(model, pad_id=0, stop_ids=set())
    requests = [Request(p, 1.0 if i % 2 == 0 else 0.0, 6 + 3 * i, gen(i)) for i, p in enumerate(PROMPTS)]
    batch.admit(requests[:1])
    done = []
    for step in range(40):
        if step in (2, 4):  # later requests join a batch that is already decoding, with other cache lengths
            batch.admit(requests[1:3] if step == 2 else requests[3:])
        done += batch.step() if len(batch) else []
    assert len(done) == 4 and not len(batch)
    by_request = {id(r.request): r for r in done}
    for i, (req, prompt) in enumerate(zip(requests, PROMPTS)):
        ids, logprobs = alone(model, prompt, i, 6 + 3 * i, temperature=req.temperature)
        row = by_request[id(req)]
        assert row.ids == ids and row.logprobs == pytest.approx(logprobs, abs=1e-4)
        assert torch.equal(req.generator.get_state(), gen(i).manual_seed(i).get_state()) is (req.temperature == 0)


def test_a_finished_row_leaves_and_the_cache_shrinks(model_and_tokenizer):
    model, _ = model_and_tokenizer
    batch = RunningBatch(model, pad_id=0, stop_ids=set())
    batch.admit([Request(list(range(3, 80)), 1.0, 2, gen(0)), Request([5, 6], 1.0, 10, gen(1))])
    width = batch.mask.shape[1]
    assert batch.step() == [] and len(batch) == 2
    left = batch.step()
    assert [len(r.ids) for r in left] == [2] and len(batch) == 1
    # only the short row remains: the long prompt's columns are gone from its mask and cache
    assert batch.mask.shape[1] < width and batch.mask.shape[1] == batch.cache.layers[0].keys.shape[2] == 2 + 2  # prompt + two fed tokens


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
    assert after[0] != expected[0][:20]


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
