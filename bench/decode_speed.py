"""Sampling speed: transformers' generate against the decoding engine (ait.train.decode: its batch
API `Decoder.generate`, as training rollouts and the hidden eval use it, and its continuous API,
as the agent sampler uses it; eager and CUDA-graph), and transformers' SDPA attention against
ait.train.attention.grouped_sdpa (no KV-head copies) in the graph decoder.

    python bench/decode_speed.py --model smollm2-135m [--batch 64] [--new-tokens 128] [--json PATH]
    python bench/decode_speed.py --smoke          # CPU: the tiny model, a few rows and tokens

Same prompts, same greedy decoding: prints tokens/s of each variant, the ratios to generate, and
whether the greedy outputs agree (bf16 numerics may flip a near-tie late in a row).
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ait.train.attention import grouped_attention_name
from ait.train.decode import Decoder, Request
from ait.train.models import resolve_base_model


def timed(fn, device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--json", default=None, help="also write the figures to this file")
    p.add_argument("--smoke", action="store_true", help="the tiny model, 4 rows, 16 tokens (a CPU check)")
    args = p.parse_args()
    if args.smoke:
        args.model, args.batch, args.new_tokens = "tiny", 4, 16
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    path = resolve_base_model(args.model).path
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    texts = [tok.apply_chat_template([{"role": "user", "content": f"Count from {i} to {i + 40}, one per line."}],
                                     tokenize=False, add_generation_prompt=True) for i in range(args.batch)]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    # No stop token: every variant generates exactly new_tokens per row (a fair tokens/s).
    never = [model.config.vocab_size + 1]

    def hf():
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                 do_sample=False, pad_token_id=tok.pad_token_id)
        return out[:, enc["input_ids"].shape[1]:].tolist()

    def decoder_run(graphs: bool):
        dec = Decoder(model, stop_ids=never, pad_id=tok.pad_token_id, cuda_graphs=graphs)
        if graphs:
            _, capture = timed(lambda: dec.generate(prompts, 8), device)  # includes the one-time capture
            print(f"  (graph capture and first call: {capture:.2f}s)")
        return lambda: [s.ids for s in dec.generate(prompts, args.new_tokens)]

    def continuous_run(graphs: bool):
        """The same prompts as requests of a continuous server (min_rows = the batch, read every step)."""
        dec = Decoder(model, stop_ids=never, pad_id=tok.pad_token_id, cuda_graphs=graphs, min_rows=args.batch)

        def go(n):
            requests = [Request(p, n) for p in prompts]
            dec.submit(requests)
            while dec.busy:
                dec.step()
            return [r.ids for r in requests]
        go(8)  # capture
        return lambda: go(args.new_tokens)

    grouped = grouped_attention_name()
    variants = [("hf_generate", "sdpa", None), ("decode_eager", "sdpa", False), ("decode_eager_grouped", grouped, False),
                ("continuous_eager_grouped", grouped, "continuous_eager")]
    if device.type == "cuda":
        variants += [("decode_graphs", "sdpa", True), ("decode_graphs_grouped", grouped, True),
                     ("continuous_graphs_grouped", grouped, "continuous_graphs")]
    results = {}
    for name, attention, graphs in variants:
        # The attention function is looked up from the config at each forward: switch it in place.
        model.config._attn_implementation = attention
        if isinstance(graphs, str):
            fn = continuous_run(graphs == "continuous_graphs")
        else:
            fn = hf if graphs is None else decoder_run(graphs)
        fn()  # warm-up
        out, secs = timed(fn, device)
        results[name] = (out, secs)
        print(f"{name:22s} {secs:7.3f}s  {args.batch * args.new_tokens / secs:10.0f} tokens/s")
    best = min((secs, name) for name, (_, secs) in results.items() if name != "hf_generate")
    print(f"engine / generate: x{results['hf_generate'][1] / best[0]:.2f} tokens/s ({best[1]})")
    if "decode_graphs" in results:
        print(f"grouped attention / sdpa, graph decoder: "
              f"x{results['decode_graphs'][1] / results['decode_graphs_grouped'][1]:.2f} tokens/s")
    base = results["hf_generate"]
    rows = {}
    for name, (out, secs) in results.items():
        same = sum(a == b for a, b in zip(out, base[0]))
        first = sum(a[:16] == b[:16] for a, b in zip(out, base[0]))
        print(f"{name:22s} speed-up x{base[1] / secs:5.2f}  identical rows {same}/{len(out)}  "
              f"(first 16 tokens identical: {first}/{len(out)})")
        rows[name] = {"seconds": secs, "tokens_per_s": args.batch * args.new_tokens / secs,
                      "vs_generate": base[1] / secs, "identical_rows": same, "identical_first16": first}
    if args.json:
        import json
        from pathlib import Path

        Path(args.json).write_text(json.dumps({"model": args.model, "batch": args.batch,
                                               "new_tokens": args.new_tokens, "device": str(device),
                                               "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
                                               "torch": torch.__version__, "best_engine": best[1],
                                               "engine_vs_generate": results["hf_generate"][1] / best[0],
                                               "variants": rows}, indent=2))


if __name__ == "__main__":
    main()
