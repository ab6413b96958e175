"""Outer-loop sampling speed, one run, same batch: the local backend's sampling model as it was (a
deepcopy of the peft model, each adapted layer running its LoRA path) against as it is (a plain
copy with the adapter merged into its weights), both through the decoding engine; and the merged
model through the engine against transformers' `generate` (what HFPolicy sampled with before).

    python bench/outer_sampler_speed.py [--model tiny] [--batch 16] [--tokens 64] [--lora-r 32] [--json PATH]
    python bench/outer_sampler_speed.py --like qwen2.5-0.5b   # random weights of that shape, no download
    python bench/outer_sampler_speed.py --smoke               # CPU: the tiny model, 4 rows, 8 tokens

The engine runs as the SamplingEngine drives it (ait.train.decode.Decoder, continuous API, CUDA
graphs on a GPU) with random prompts, temperature 1, per-row seeded generators and no stop
token, so every row decodes --tokens tokens; generate samples the same batch (left-padded,
temperature 1, exactly --tokens tokens). Decode tokens/s = rows x (tokens - 1) / (time of the
whole batch - time of a 1-token batch, i.e. the prefill). Prints each arrangement's figures,
the ratios, and how far peft_copy and merged agree (same seeds: same tokens up to rounding;
logprob gap on the common prefix).
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
import warnings
from pathlib import Path

import torch

from ait.outer.backends.local import LocalBackend
from ait.outer.config import OuterConfig
from ait.train.decode import Decoder, Request

# Random-weight stand-ins of known shapes (decode speed depends on the shape, not the weights).
SHAPES = {
    "qwen2.5-0.5b": {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                     "max_position_embeddings": 32768, "tie_word_embeddings": True},
    "qwen2.5-1.5b": {"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
                     "max_position_embeddings": 32768, "tie_word_embeddings": True},
}


def random_model(shape: str, dest: Path, dtype: torch.dtype) -> str:
    """A randomly initialised model of a known shape, with the tiny model's tokenizer, saved to dest."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ait.train.tiny import tiny_model_path

    spec = dict(SHAPES[shape])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec, bos_token_id=None, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(dest)
    AutoTokenizer.from_pretrained(tiny_model_path()).save_pretrained(dest)
    return str(dest)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(decoder, prompts: list[list[int]], tokens: int, pad_id: int, seed: int) -> tuple[float, list]:
    device = decoder.model.device
    requests = []
    for i, p in enumerate(prompts):
        g = torch.Generator(device=device)
        g.manual_seed(seed + i)
        requests.append(Request(p, tokens, 1.0, generator=g))
    sync(device)
    t = time.perf_counter()
    decoder.submit(requests)
    while decoder.busy:
        decoder.step()
    sync(device)
    return time.perf_counter() - t, [(r.ids, r.logprobs) for r in requests]


GENERATE = object()  # a marker: sample with transformers' generate


def run_generate(model, prompts: list[list[int]], tokens: int, pad_id: int) -> tuple[float, list]:
    device = model.device
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    sync(device)
    t = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=pad_id)
    sync(device)
    return time.perf_counter() - t, [(row, []) for row in out[:, width:].tolist()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="tiny, an alias, a local directory or a hub id")
    ap.add_argument("--like", choices=sorted(SHAPES), help="random weights of this shape instead of --model")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64, help="tokens decoded per row")
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens per row")
    ap.add_argument("--lora-r", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each; the fastest counts")
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--smoke", action="store_true", help="the tiny model, 4 rows, 8 tokens, prompt 32, one repeat")
    args = ap.parse_args()
    if args.smoke:
        args.model, args.like, args.batch, args.tokens, args.prompt, args.repeats = "tiny", None, 4, 8, 32, 1

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if args.like:
            model = random_model(args.like, Path(tmp) / args.like,
                                 torch.bfloat16 if device.startswith("cuda") else torch.float32)
        backend = LocalBackend(OuterConfig(
            policy={"model": model, "sample_batch_size": args.batch, "max_new_tokens": args.tokens},
            trainer={"device": device, "lora_r": args.lora_r, "lora_alpha": 2 * args.lora_r}))
        try:
            bench(backend, args)
        finally:
            backend.close()


def bench(backend: LocalBackend, args: argparse.Namespace) -> None:
    # A trained-looking adapter: lora_B is zero at init, which would make the merge trivial.
    torch.manual_seed(1)
    with torch.no_grad():
        for name, q in backend.params.items():
            if "lora_B" in name:
                q.normal_(0.0, 2e-3)
    backend.refresh_sampler()
    merged = backend.engine.model
    with warnings.catch_warnings():  # deepcopy reads a deprecated property of the peft model
        warnings.simplefilter("ignore", FutureWarning)
        old = copy.deepcopy(backend.model).eval()  # the sampling model as it was built before
    for q in old.parameters():
        q.requires_grad_(False)
    old.config.use_cache = True
    device = merged.device
    vocab = min(len(backend.tokenizer), merged.config.vocab_size)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, vocab, (args.prompt,), generator=gen).tolist() for _ in range(args.batch)]
    pad = backend.engine.pad_id
    models = {"peft_copy": Decoder(old, stop_ids=[], pad_id=pad, max_batch=args.batch, min_rows=args.batch),
              "merged": Decoder(merged, stop_ids=[], pad_id=pad, max_batch=args.batch, min_rows=args.batch),
              "merged_generate": GENERATE}
    for m in models.values():  # warm up (allocator, kernels' first launches, the engine's graph capture)
        if m is GENERATE:
            run_generate(merged, prompts, 4, pad)
        else:
            run(m, prompts, args.tokens, pad, 0)
    full: dict[str, list[float]] = {k: [] for k in models}
    prefill: dict[str, list[float]] = {k: [] for k in models}
    outputs = {}
    for _ in range(args.repeats):  # alternate so that drift in a shared machine hits both alike
        for k, m in models.items():
            go = (lambda n: run_generate(merged, prompts, n, pad)) if m is GENERATE else (
                lambda n, m=m: run(m, prompts, n, pad, 0))
            prefill[k].append(go(1)[0])
            seconds, outputs[k] = go(args.tokens)
            full[k].append(seconds)
    results = {}
    for k in models:
        decode = max(min(full[k]) - min(prefill[k]), 1e-9)
        results[k] = {"decode_tok_s": args.batch * (args.tokens - 1) / decode,
                      "ms_per_step": 1000 * decode / (args.tokens - 1),
                      "prefill_s": min(prefill[k]), "total_s": min(full[k])}
    same, gaps = 0, []
    for (a_ids, a_lp), (b_ids, b_lp) in zip(outputs["peft_copy"], outputs["merged"]):
        n = next((i for i, (x, y) in enumerate(zip(a_ids, b_ids)) if x != y), min(len(a_ids), len(b_ids)))
        same += n
        gaps.extend(abs(x - y) for x, y in zip(a_lp[:n], b_lp[:n]))
    dtype = str(next(merged.parameters()).dtype).removeprefix("torch.")
    name = args.like or args.model
    print(f"model {name} ({dtype}, {device}), LoRA r={args.lora_r} on "
          f"{len(backend.merger.merges)} layers, batch {args.batch}, prompt {args.prompt}, {args.tokens} tokens")
    for k, r in results.items():
        print(f"  {k:10s} {r['decode_tok_s']:10.1f} decode tok/s  {r['ms_per_step']:8.2f} ms/step  "
              f"(prefill {r['prefill_s']:.3f} s, whole batch {r['total_s']:.3f} s)")
    ratio = results["merged"]["decode_tok_s"] / results["peft_copy"]["decode_tok_s"]
    print(f"  merged / peft_copy decode speed: {ratio:.2f}x")
    vs_generate = results["merged"]["decode_tok_s"] / results["merged_generate"]["decode_tok_s"]
    whole_vs_generate = results["merged_generate"]["total_s"] / results["merged"]["total_s"]
    print(f"  engine / generate (merged model): {vs_generate:.2f}x decode speed, {whole_vs_generate:.2f}x whole batch")
    total = sum(len(ids) for ids, _ in outputs["merged"])
    print(f"  agreement: {same}/{total} tokens identical before the first difference per row; "
          f"max |logprob gap| there {max(gaps, default=0.0):.2e}, mean {sum(gaps) / max(len(gaps), 1):.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": name, "dtype": dtype, "device": str(device),
                                               "batch": args.batch, "tokens": args.tokens, "prompt": args.prompt,
                                               "lora_r": args.lora_r, "ratio": ratio, "engine_vs_generate": vs_generate,
                                               "engine_vs_generate_whole_batch": whole_vs_generate,
                                               "results": results,
                                               "same_tokens": same, "total_tokens": total,
                                               "max_logprob_gap": max(gaps, default=0.0)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
