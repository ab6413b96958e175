"""The hidden eval's multi-turn rollouts, turn by turn against continuous: decode steps, seconds, and
whether the conversations are the same.

    python bench/eval_schedule.py --model qwen2.5-coder-0.5b --family ledger [--n 32] [--repeats 2]
        [--batch-size 256] [--json out.json]

Examples come from the family's example task (examples/tasks/FAMILY.json: its difficulty and eval
format) with a seed of this run's own, never the hidden set's. ait.evals.rollout.run_conversations
rolls them out greedily both ways, alternately, in one run (the machine's noise hits both): lock step
(every turn waits for the slowest conversation's reply) and continuous (a conversation whose tool
results are in rejoins the running batch at once, the eval's default). Prints each repeat, the
medians' ratio, and how many conversations differ (greedy: none should, on one device).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-0.5b", help="a base model alias or path (ait.train.models)")
    p.add_argument("--family", default="ledger")
    p.add_argument("--n", type=int, default=32, help="examples")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ait.chat.renderers import prepare_tokenizer, stop_ids
    from ait.evals.rollout import run_conversations
    from ait.families import get_family
    from ait.spec import load_spec
    from ait.train.decode import Decoder
    from ait.train.models import resolve_base_model

    spec = load_spec(ROOT / "examples" / "tasks" / f"{args.family}.json")
    family = get_family(spec.family)
    difficulty = family.difficulty(spec.difficulty)
    rng = random.Random(args.seed)
    examples = [family.example(rng, difficulty) for _ in range(args.n)]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    path = resolve_base_model(args.model).path
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    fmt = spec.eval_format
    print(f"{args.family} on {args.model} ({device.type}): {args.n} examples, max_turns {fmt.max_turns}, "
          f"max_new_tokens {fmt.max_new_tokens}, batch {args.batch_size}", flush=True)

    def decoder() -> Decoder:
        return Decoder(model, stop_ids=stop_ids(tokenizer, model), pad_id=tokenizer.pad_token_id,
                       max_batch=args.batch_size)

    runs: dict[str, list[dict]] = {"lock_step": [], "continuous": []}
    convs: dict[str, list] = {}
    for repeat in range(args.repeats):
        for name in ("lock_step", "continuous") if repeat % 2 == 0 else ("continuous", "lock_step"):
            d = decoder()
            kwargs = ({"generate": lambda prompts, n, d=d: [s.ids for s in d.generate(prompts, n, temperature=0.0)]}
                      if name == "lock_step" else {"decoder": d})
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            out = run_conversations(model, tokenizer, family, fmt, examples, args.batch_size, **kwargs)
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t
            convs.setdefault(name, out)
            turns = sum(sum(m["role"] == "assistant" for m in c) for c in out)
            runs[name].append({"seconds": seconds, "decode_steps": d.stats["decode_steps"],
                               "prefill_tokens": d.stats["prefill_tokens"], "turns": turns})
            print(f"  repeat {repeat} {name:10s} {seconds:7.1f} s  {d.stats['decode_steps']:5d} decode steps  "
                  f"{d.stats['prefill_tokens']:7d} prefill tokens  {turns} turns", flush=True)
    differ = sum(a != b for a, b in zip(convs["lock_step"], convs["continuous"]))
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("seconds", "decode_steps", "prefill_tokens")}
           for k, v in runs.items()}
    print(f"medians: lock step {med['lock_step']['seconds']:.1f} s / {med['lock_step']['decode_steps']:.0f} steps, "
          f"continuous {med['continuous']['seconds']:.1f} s / {med['continuous']['decode_steps']:.0f} steps: "
          f"{med['lock_step']['seconds'] / med['continuous']['seconds']:.2f}x faster, "
          f"{med['lock_step']['decode_steps'] / max(med['continuous']['decode_steps'], 1):.2f}x fewer decode steps; "
          f"{differ} of {args.n} conversations differ")
    if args.json:
        args.json.write_text(json.dumps({"family": args.family, "model": args.model, "device": device.type,
                                         "n": args.n, "batch_size": args.batch_size, "runs": runs, "medians": med,
                                         "conversations_differ": differ,
                                         "command": " ".join(["python", "bench/eval_schedule.py", *sys.argv[1:]])},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
