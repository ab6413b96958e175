"""Read what a base model does on a family's eval: its conversations, scored as the hidden eval scores them.

    python bench/eval_transcripts.py --task examples/tasks/ledger.json --model qwen2.5-coder-0.5b \
        [--n 16] [--seed 7] [--set inline=true] [--json out.json] [--wordings bench/dispatch_wordings.json]

The examples are drawn from the family with a public seed (never the hidden set), rolled out with the
hidden eval's own code (ait.evals.rollout: greedy, the family's tools, the spec's eval format) and
scored by the family's scorer. Prints the score, how the conversations ended (answered, tool calls,
turns used) and the first conversations in full: the tool to find out why a family scores 0.
--wordings FILE (JSON: {name: [[old, new], ...]}) also scores each rewording of the same examples'
questions (every `old` replaced by its `new`; "as_shipped": []), one model load for all: a prompt is
tried here before a family's text changes.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter

from ait.evals.rollout import final_response, run_conversations
from ait.families import get_family
from ait.spec import build_spec, load_spec


def parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def reword(example, replacements: list[list[str]]):
    prompt = example.prompt
    for old, new in replacements:
        if old not in prompt:
            raise SystemExit(f"--wordings: {old[:60]!r} is not in the question {prompt[:80]!r}")
        prompt = prompt.replace(old, new)
    return example.model_copy(update={"prompt": prompt})


def ending(conv) -> str:
    last = conv[-1]
    if last["role"] == "tool":
        return "turns ran out"
    return "answered" if "answer" in (last.get("content") or "").lower() else "replied without an answer line"


def score_examples(model, tokenizer, family, spec, examples, label: str, show: int) -> dict:
    """Roll out and score `examples`; print the summary line and the first `show` conversations."""
    t0 = time.monotonic()
    convs = run_conversations(model, tokenizer, family, spec.eval_format, examples, batch_size=64)
    seconds = time.monotonic() - t0
    scores = [float(family.score(final_response(c), ex.answer)) for c, ex in zip(convs, examples)]
    n, mean = len(scores), sum(scores) / len(scores)
    se = (mean * (1 - mean) / max(n - 1, 1)) ** 0.5
    calls = Counter(m["name"] for c in convs for m in c if m["role"] == "tool")
    print(f"{spec.family} on {label}: score {mean:.3f} ± {2 * se:.3f} (2 SE, n = {n}, {seconds:.0f} s); "
          f"endings {dict(Counter(ending(c) for c in convs))}; tool calls {dict(calls)}")
    for conv, ex, s in list(zip(convs, examples, scores))[:show]:
        print(f"\n--- gold {ex.answer}, score {s}")
        for m in conv[1:]:
            extra = f" calls {json.dumps(m['tool_calls'])}" if m.get("tool_calls") else ""
            print(f"[{m['role']}] {(m.get('content') or '').strip()[:600]}{extra}")
    return {"score": mean, "score_2se": 2 * se, "n": n, "seconds": seconds,
            "conversations": [{"gold": ex.answer, "score": s, "conversation": c}
                              for c, ex, s in zip(convs, examples, scores)]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True, help="a task spec JSON (examples/tasks/<family>.json)")
    p.add_argument("--model", default="qwen2.5-coder-0.5b", help="a base model name or alias")
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--set", action="append", default=[], help="difficulty KEY=VALUE (JSON value), repeatable")
    p.add_argument("--show", type=int, default=3, help="conversations printed in full")
    p.add_argument("--json", default=None, help="write every conversation and score here")
    p.add_argument("--wordings", default=None, help="JSON {name: [[old, new], ...]}: reworded questions to score too")
    args = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ait.chat.renderers import prepare_tokenizer
    from ait.train.models import resolve_base_model

    spec = load_spec(args.task)
    if args.set:
        difficulty = dict(spec.difficulty)
        for kv in args.set:
            key, _, value = kv.partition("=")
            difficulty[key] = parse_value(value)
        spec = build_spec(spec.family, task_id=spec.id, difficulty=difficulty, constraints=spec.constraints)
    family = get_family(spec.family)
    d = family.difficulty(spec.difficulty)
    rng = random.Random(args.seed)
    examples = [family.example(rng, d) for _ in range(args.n)]

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    path = resolve_base_model(args.model).path
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, use_safetensors=True).to(device).eval()
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path))
    wordings = {"as_shipped": []}
    if args.wordings:
        with open(args.wordings) as f:
            wordings.update(json.load(f))
    results = {}
    for name, replacements in wordings.items():
        reworded = [reword(ex, replacements) for ex in examples]
        results[name] = score_examples(model, tokenizer, family, spec, reworded, f"{args.model} [{name}]",
                                       args.show if name == "as_shipped" or args.wordings else 0)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"family": spec.family, "model": args.model, "difficulty": spec.difficulty, "n": len(examples),
                       "seed": args.seed, "wordings": wordings, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
