"""The agent sampler on the same simulated episodes in one run: transformers' generate (one call
per reply, episodes' threads calling it at once on the shared model: how HFPolicy sampled before),
and the decoding engine's SamplingEngine in static batches and continuously.

    python bench/outer_continuous_batching.py [--episodes 12] [--turns 6] [--model tiny] [--json PATH]
    python bench/outer_continuous_batching.py --like qwen2.5-0.5b --episodes 12   # GPU, random weights
    python bench/outer_continuous_batching.py --smoke   # CPU: the tiny model, 3 episodes x 2 short turns

Each simulated episode is a thread that asks the engine for T replies in turn, its prompt growing
by each reply (as an agent's conversation does). Reply lengths follow the arc's mix: most turns
are short tool calls, a few are whole files. A reply's length is its request's max_new_tokens
(no stop token), so both arrangements generate exactly the same tokens; only the waiting differs.
Static: requests that wait together decode as one batch until its longest reply ends.
Continuous: a reply leaves the batch when it ends and a new request joins at the next step.
Generate: each request alone, as long as its reply (min_new_tokens = max_new_tokens).
Prints wall time, generated tokens/s and the ratios.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ait.outer.sampler import SamplingEngine  # noqa: E402


def lengths(rng: random.Random, turns: int, short: tuple[int, int], long: tuple[int, int], p_long: float) -> list[int]:
    return [rng.randint(*long) if rng.random() < p_long else rng.randint(*short) for _ in range(turns)]


class GenerateSampler:
    """SamplingEngine's surface over transformers' generate: one call per request, in the caller's thread."""

    def __init__(self, model, tok):
        self.model, self.batches = model, 0
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0

    def sample(self, prompt, temperature, n, generator):
        ids = torch.tensor([prompt], device=self.model.device)
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                      temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=n,
                                      min_new_tokens=n, pad_token_id=self.pad_id)
        self.batches += 1
        return out[0, len(prompt):].tolist(), []

    def close(self):
        pass


def run(engine: SamplingEngine, plans: list[list[int]], prompt_len: int, vocab: int, seed: int) -> float:
    def episode(i: int) -> None:
        rng = random.Random(seed + i)
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
        g = torch.Generator(device=engine.model.device).manual_seed(seed + i)
        for n in plans[i]:
            ids, _ = engine.sample(prompt, 1.0, n, g)
            prompt = prompt + ids + [rng.randrange(3, vocab) for _ in range(8)]  # the tool result

    threads = [threading.Thread(target=episode, args=(i,)) for i in range(len(plans))]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if engine.model.device.type == "cuda":
        torch.cuda.synchronize()
    return time.monotonic() - start


def main() -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="tiny, or a path / alias ait.train.models resolves")
    p.add_argument("--like", default=None, help="random weights of a known shape (see outer_sampler_speed.py)")
    p.add_argument("--episodes", type=int, default=12)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--prompt", type=int, default=256, help="opening prompt tokens")
    p.add_argument("--short", default="8,48", help="short reply length range")
    p.add_argument("--long", default="200,400", help="long reply length range")
    p.add_argument("--p-long", type=float, default=0.15)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    p.add_argument("--no-generate", action="store_true", help="leave out the generate baseline (it is slow)")
    p.add_argument("--smoke", action="store_true", help="the tiny model, 3 episodes x 2 turns, short replies")
    args = p.parse_args()
    if args.smoke:
        args.model, args.like, args.episodes, args.turns, args.prompt = "tiny", None, 3, 2, 32
        args.short, args.long = "4,8", "16,24"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.like:
        from outer_sampler_speed import random_model

        path = random_model(args.like, Path(tempfile.mkdtemp(prefix="ait-bench-cb-")), dtype)
    else:
        from ait.train.models import resolve_base_model

        path = resolve_base_model(args.model).path
    from ait.train.attention import grouped_attention_name

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=grouped_attention_name())
    model = model.to(device).eval()
    tok = AutoTokenizer.from_pretrained(path)
    rng = random.Random(args.seed)
    short, long = tuple(map(int, args.short.split(","))), tuple(map(int, args.long.split(",")))
    plans = [lengths(rng, args.turns, short, long, args.p_long) for _ in range(args.episodes)]
    tokens = sum(map(sum, plans))
    vocab = min(model.config.vocab_size, len(tok))
    results = {}
    arrangements = [("static", False), ("continuous", True), ("static_again", False)]
    if not args.no_generate:
        arrangements.insert(0, ("generate", None))
    for name, continuous in arrangements:
        if continuous is None:
            engine = GenerateSampler(model, tok)
        else:
            engine = SamplingEngine(model, tok, max_batch=args.episodes, continuous=continuous)
            engine.stop_ids = set()  # replies end at their max_new_tokens only: every arrangement makes the same tokens
        run(engine, [[4]] * min(2, args.episodes), 16, vocab, args.seed)  # warm-up
        wall = run(engine, plans, args.prompt, vocab, args.seed)
        engine.close()
        results[name] = {"wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall, "prefills": engine.batches}
        print(f"{name:13s} {wall:8.2f}s  {tokens / wall:9.0f} tokens/s  ({engine.batches} prefills)")
    static = min(results["static"]["wall_s"], results["static_again"]["wall_s"])
    results["ratio"] = static / results["continuous"]["wall_s"]
    print(f"continuous / static speed-up: x{results['ratio']:.2f} ({args.episodes} episodes x {args.turns} turns, "
          f"{tokens} tokens, device {device.type})")
    if "generate" in results:
        results["continuous_vs_generate"] = results["generate"]["wall_s"] / results["continuous"]["wall_s"]
        print(f"continuous engine / generate speed-up: x{results['continuous_vs_generate']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), **results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
