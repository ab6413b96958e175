"""How often an untrained base model solves candidate rungs, greedily (as the hidden eval decodes) and sampled
(as GRPO rolls out): which rung leaves a job room to move it.

    python bench/base_rates.py --rungs RUNGS.json [--model smollm2-135m] [--n 16] [--samples 4]
        [--temperatures 1.0,0.7] [--turns 1] [--max-new-tokens 64] [--json out.json]

RUNGS.json: {name: [family, {knob: value, ...}]} (the family's defaults for knobs it leaves out). Examples come
from a public seed (never the hidden set) and go through the hidden eval's own rollout code (ait.evals.rollout:
the family's eval format, its tools where the format lists them, its scorer); --turns and --max-new-tokens cap
the format's turns and reply length (a CPU pays for every token). Per rung: the greedy score and how often a
greedy reply has an 'Answer:' line; then, for each temperature, the same over --samples draws per example, and
the share of examples whose draws disagree (GRPO's advantage is zero in a group whose rewards are all equal, so
this is the share of prompts a job learns from). Runs on the GPU when there is one. docs/cpu-learning.md has
what SmolLM2-135M-Instruct did on a CPU.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time

ANSWER_LINE = re.compile(r"answer\**\s*[:=]", re.IGNORECASE)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rungs", required=True, help="JSON {name: [family, {knob: value}]}")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--n", type=int, default=16, help="examples per rung")
    p.add_argument("--samples", type=int, default=4, help="draws per example at each temperature")
    p.add_argument("--temperatures", default="1.0,0.7")
    p.add_argument("--turns", type=int, default=None, help="cap on the eval format's turns")
    p.add_argument("--max-new-tokens", type=int, default=None, help="cap on the eval format's reply length")
    p.add_argument("--seed", type=int, default=7, help="the examples' public seed")
    p.add_argument("--sample-seed", type=int, default=0, help="the draws' seed")
    p.add_argument("--threads", type=int, default=2, help="CPU threads")
    p.add_argument("--json", default=None)
    args = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ait.evals.rollout import final_response, run_conversations
    from ait.families import get_family
    from ait.chat.renderers import prepare_tokenizer, stop_ids
    from ait.train.decode import Decoder
    from ait.train.models import resolve_base_model

    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    path = resolve_base_model(args.model).path
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, use_safetensors=True).to(device).eval()
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path))
    decoder = Decoder(model, stop_ids=stop_ids(tokenizer, model), pad_id=tokenizer.pad_token_id)
    noise = torch.Generator(device=device).manual_seed(args.sample_seed)  # one stream, rungs and temperatures in order
    temperatures = [float(t) for t in args.temperatures.split(",") if t.strip()]

    def answered(conv) -> bool:
        return bool(ANSWER_LINE.search(final_response(conv)))

    with open(args.rungs) as f:
        rungs = json.load(f)
    out = {}
    for name, (family_name, knobs) in rungs.items():
        family = get_family(family_name)
        d = family.difficulty(knobs)
        fmt = family.eval_format(d)
        fmt = fmt.model_copy(update={"max_turns": min(fmt.max_turns, args.turns or fmt.max_turns),
                                     "max_new_tokens": min(fmt.max_new_tokens, args.max_new_tokens or fmt.max_new_tokens)})
        rng = random.Random(args.seed)
        examples = [family.example(rng, d) for _ in range(args.n)]
        t0 = time.monotonic()
        greedy = run_conversations(model, tokenizer, family, fmt, examples, batch_size=64)
        g = [float(family.score(final_response(c), e.answer)) for c, e in zip(greedy, examples)]
        row = {"family": family_name, "difficulty": d.model_dump(), "n": args.n, "turns": fmt.max_turns,
               "max_new_tokens": fmt.max_new_tokens, "tools": [t.name for t in fmt.tools],
               "greedy": sum(g) / len(g), "greedy_answer_line": sum(map(answered, greedy)) / len(greedy),
               "greedy_seconds": round(time.monotonic() - t0, 1),
               "greedy_replies": [{"gold": e.answer, "score": v, "reply": final_response(c)[:300]}
                                  for c, e, v in list(zip(greedy, examples, g))[:4]]}
        for temperature in temperatures:
            t0 = time.monotonic()
            drawn_from = examples * args.samples

            def sample(prompts, max_new_tokens, temperature=temperature):
                return [s.ids for s in decoder.generate(prompts, max_new_tokens, temperature=temperature, generator=noise)]

            drawn = run_conversations(model, tokenizer, family, fmt, drawn_from, batch_size=64, generate=sample)
            s = [float(family.score(final_response(c), e.answer)) for c, e in zip(drawn, drawn_from)]
            row[f"T{temperature}"] = {
                "samples": args.samples, "score": sum(s) / len(s), "answer_line": sum(map(answered, drawn)) / len(drawn),
                "prompts_with_spread": sum(len(set(s[i::args.n])) > 1 for i in range(args.n)) / args.n,
                "seconds": round(time.monotonic() - t0, 1),
                "replies": [{"gold": e.answer, "score": v, "reply": final_response(c)[:300]}
                            for c, e, v in list(zip(drawn, drawn_from, s))[:4]]}
        out[name] = row
        brief = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()
                 if k in ("greedy", "greedy_answer_line", "greedy_seconds")}
        for temperature in temperatures:
            t = row[f"T{temperature}"]
            brief[f"T{temperature}"] = {k: round(t[k], 3) for k in ("score", "answer_line", "prompts_with_spread")}
        print(json.dumps({"rung": name, **brief}), flush=True)
        for r in row["greedy_replies"][:3]:
            print(f"    greedy, gold {r['gold']!r}, score {r['score']}: {r['reply'][:160]!r}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "device": device, "seed": args.seed, "sample_seed": args.sample_seed,
                       "temperatures": temperatures, "rungs": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
