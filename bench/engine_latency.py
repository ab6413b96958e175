"""One agent call's latency through the sampling engine on the 1.5B agent, alone and with company: a prompt
of P random tokens, a reply of exactly N tokens (no stop token). Prints prefill and decode figures.

    python bench/engine_latency.py [--model qwen2.5-coder-1.5b] [--prompt 8000] [--new 31] [--concurrent 1 8 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--prompt", type=int, nargs="+", default=[2000, 8000, 20000])
    ap.add_argument("--new", type=int, default=31)
    ap.add_argument("--concurrent", type=int, nargs="+", default=[1, 8, 16])
    ap.add_argument("--plain-sdpa", action="store_true",
                    help="transformers' sdpa (a KV copy per query head at each masked step), not the sampler's grouped one")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ait.chat.renderers import prepare_tokenizer
    from ait.train.decode_batch import SamplingEngine
    from ait.train.models import resolve_base_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    path = resolve_base_model(args.model).path
    tok = prepare_tokenizer(AutoTokenizer.from_pretrained(path))
    from ait.train.attention import grouped_attention_name

    attention = "sdpa" if args.plain_sdpa else grouped_attention_name()  # the outer loop's sampler: grouped
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if device == "cuda" else torch.float32,
                                                 use_safetensors=True, attn_implementation=attention).to(device).eval()
    engine = SamplingEngine(model, tok, max_batch=16)
    engine.stop_ids = set()
    vocab = model.config.vocab_size
    rows = []

    def call(p: int, seed: int) -> float:
        g = torch.Generator(device=device).manual_seed(seed)
        ids = torch.randint(0, vocab, (p,), generator=torch.Generator().manual_seed(seed)).tolist()
        t0 = time.perf_counter()
        out, _ = engine.sample(ids, 1.0, args.new, g)
        assert len(out) == args.new
        return time.perf_counter() - t0

    call(args.prompt[0], 0)  # warm-up
    for p in args.prompt:
        for c in args.concurrent:
            before = dict(engine.decoder.stats)
            t0 = time.perf_counter()
            with ThreadPoolExecutor(c) as pool:
                lat = list(pool.map(lambda i: call(p, 100 + i), range(c)))
            wall = time.perf_counter() - t0
            stats = {k: engine.decoder.stats[k] - before.get(k, 0) for k in engine.decoder.stats}
            row = {"attention": attention, "prompt": p, "concurrent": c, "new": args.new, "wall_s": round(wall, 3),
                   "median_latency_s": round(statistics.median(lat), 3), "cache_len": engine.decoder.slot.cache_len,
                   **stats}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    engine.close()


if __name__ == "__main__":
    main()
