"""GPU paths (pytest -m gpu on a CUDA machine; skipped elsewhere): grouped attention under bf16
and CUDA graphs, continuous batching under CUDA graphs, and a fast GRPO job that trains with finite
losses. CI has no GPU; these run in the GPU sessions (bench/gpu.sh gpu-tests)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from ait.train.attention import grouped_attention_name
from ait.train.decode import Decoder
from ait.train.tiny import tiny_model_path

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def tiny(attention: str) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=torch.bfloat16,
                                                attn_implementation=attention).cuda().eval()


def test_grouped_attention_matches_sdpa_in_bf16_and_under_cuda_graphs():
    sdpa, grouped = tiny("sdpa"), tiny(grouped_attention_name())
    ids = torch.randint(3, 200, (8, 40), device="cuda")
    mask = torch.ones_like(ids)
    mask[::2, :7] = 0  # left padding on half the rows
    with torch.no_grad():
        a = sdpa(input_ids=ids, attention_mask=mask).logits.float()
        b = grouped(input_ids=ids, attention_mask=mask).logits.float()
    valid = mask.bool()
    torch.testing.assert_close(a[valid], b[valid], atol=3e-2, rtol=3e-2)
    prompts = [list(range(5, 5 + n)) for n in (3, 9, 17, 30)]
    eager = Decoder(grouped, stop_ids=[], pad_id=0, cuda_graphs=False).generate(prompts, 24)
    graphs = Decoder(grouped, stop_ids=[], pad_id=0, cuda_graphs=True)
    replayed = graphs.generate(prompts, 24)
    assert graphs.stats["graphs_captured"] == 1
    assert [s.ids for s in eager] == [s.ids for s in replayed]


def test_continuous_batching_under_cuda_graphs_samples_as_if_alone():
    """Rows join a running batch, leave it, and the cache is compacted and grown, all under CUDA graphs
    (one per cache length): each reply equals the same request decoded alone, eagerly."""
    from ait.train.decode import Request

    model = tiny(grouped_attention_name())
    prompts = [[5, 6, 7], list(range(10, 60)), [9, 10, 11, 12], list(range(20, 40))]

    def gen(seed):
        return torch.Generator(device="cuda").manual_seed(seed)

    def run(dec, schedule):
        step = 0
        while dec.busy or any(s >= step for s in schedule):
            dec.submit(schedule.get(step, []))
            dec.step()
            step += 1

    requests = [Request(p, 12 + 20 * (i % 2), 0.0 if i == 0 else 1.0, generator=gen(i)) for i, p in enumerate(prompts)]
    graphs = Decoder(model, stop_ids=[], pad_id=0, cuda_graphs=True, cache_bucket=16, min_rows=4)
    run(graphs, {0: requests[:1], 3: requests[1:3], 20: requests[3:]})
    assert graphs.stats["graphs_captured"] >= 2 and graphs.stats["relayouts"] >= 2
    for i, (req, p) in enumerate(zip(requests, prompts)):
        alone = Request(p, req.max_new_tokens, req.temperature, generator=gen(i))
        run(Decoder(model, stop_ids=[], pad_id=0, cuda_graphs=False), {0: [alone]})
        same = next((k for k, (a, b) in enumerate(zip(req.ids, alone.ids)) if a != b), len(alone.ids))
        assert same >= min(8, len(alone.ids))  # bf16: a near-tie may flip late in a row
        assert req.logprobs[:same] == pytest.approx(alone.logprobs[:same], abs=5e-2)


def test_the_engine_on_its_own_stream_samples_what_the_default_stream_does_beside_a_load():
    """policy.sampler_stream: the same seeds give the same greedy replies on the engine's own stream as on
    the default one, while another thread keeps the default stream busy; weights swapped in by refresh
    (on the caller's stream) are what the next replies are sampled from."""
    import threading

    from transformers import AutoTokenizer

    from ait.train.decode_batch import SamplingEngine

    model = tiny(grouped_attention_name())
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    prompts = [list(range(5, 5 + n)) for n in (3, 9, 17, 30)]

    def replies(engine):
        return [engine.sample(p, 0.0, 16, torch.Generator(device="cuda").manual_seed(i))[0]
                for i, p in enumerate(prompts)]

    shared, own = SamplingEngine(model, tokenizer, own_stream=False), SamplingEngine(model, tokenizer, own_stream=True)
    assert shared.stream is None and own.stream is not None
    stop = threading.Event()

    def load():
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        while not stop.is_set():
            for _ in range(16):
                a @ a
            torch.cuda.current_stream().synchronize()

    hog = threading.Thread(target=load)
    hog.start()
    try:
        assert replies(own) == replies(shared)
        before = replies(own)
        own.refresh(lambda m: [q.data.mul_(0.5) for q in m.parameters()], version=1)  # other weights
        assert own.version == 1 and replies(own) != before
    finally:
        stop.set()
        hog.join()
        shared.close()
        own.close()


def test_a_fast_grpo_job_trains_on_the_gpu_with_finite_losses(tmp_path):
    import math

    from ait.train.fast_grpo import train
    from tests.test_fast_grpo import reference_job

    job = reference_job(tmp_path)
    out = train(job, str(tiny_model_path()))
    assert out.steps == job.config.train.max_steps and out.metrics["train/skipped_nonfinite_steps"] == 0.0
    assert math.isfinite(out.metrics["train/loss"]) and out.metrics["train/graphs_captured"] >= 1
    assert out.metrics["train/peak_gpu_memory_gb"] > 0


def test_a_capped_agent_frees_its_cache_before_it_runs_out_and_stops_at_its_cap():
    """ait.compute.gpu_memory.cap_process_memory: at the cap, cached blocks are given back and the allocation
    retried (fragmentation costs a flush, not a neighbour's memory); past the cap, the process itself fails."""
    from ait.compute.gpu_memory import cap_process_memory

    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved(0) / 2**30  # what earlier tests of this process still hold
    try:
        assert cap_process_memory("cuda:0", base + 4.0) is not None
        block = torch.empty(3 * 2**30, dtype=torch.uint8, device="cuda")
        del block  # cached by the allocator, not given back
        assert torch.cuda.memory_reserved(0) >= 3 * 2**30
        bigger = torch.empty(int(3.5 * 2**30), dtype=torch.uint8, device="cuda")  # 3 cached + 3.5 > 4: flush
        assert torch.cuda.memory_reserved(0) / 2**30 <= base + 4.0
        del bigger
        with pytest.raises(torch.cuda.OutOfMemoryError):
            torch.empty(5 * 2**30, dtype=torch.uint8, device="cuda")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        torch.cuda.empty_cache()


def test_prefix_reuse_on_the_gpu_serves_a_conversation_from_pinned_host_memory_under_cuda_graphs():
    """The server's prefix store on CUDA: KV copied out to pinned host memory asynchronously (an event marks
    it), back in for the next turn, which prefills only its new tokens and samples, under CUDA graphs, what
    an engine without the store samples (float32: no rounding between decode-step and prefill KV)."""
    from ait.train.decode import Request
    from ait.train.decode_prefix import PrefixStore

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=torch.float32,
                                                 attn_implementation=grouped_attention_name()).cuda().eval()

    def conversation(store):
        dec = Decoder(model, stop_ids=[], pad_id=0, min_rows=4, max_batch=4, geometric=True, prefixes=store)
        turns, prompt = [], list(range(5, 205))
        for k in range(3):
            r = Request(prompt, 12, 1.0, generator=torch.Generator(device="cuda").manual_seed(k))
            dec.submit([r])
            while dec.busy:
                dec.step()
            turns.append(r.ids)
            prompt = prompt + r.ids + list(range(300 + 20 * k, 320 + 20 * k))
        return turns, dec

    plain, _ = conversation(None)
    store = PrefixStore(2**28, min_tokens=16)
    reused, dec = conversation(store)
    assert reused == plain
    assert store.stats["hits"] == 2 and store.stats["tokens_reused"] >= 2 * 200
    entry = next(iter(store.entries.values()))
    assert entry.keys[0].is_pinned() and entry.ready is not None and entry.ready.query()
    assert dec.stats["graphs_captured"] >= 1
