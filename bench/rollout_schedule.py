"""Multi-turn training rollouts, turn by turn against continuous: decode steps, prefill tokens, seconds.

    python bench/rollout_schedule.py --model qwen2.5-coder-0.5b --family ledger [--batches 2]
        [--prompts 2] [--gens 8] [--max-completion-length 128] [--temperature 1.0] [--json out.json]

The family's reference job (its env.py, task_tools.py and the example task's task.json) gives the tools
and the dataset rows; a GRPO step's worth of rows (prompts x gens) is rolled out by
ait.train.rollouts.rollout_batch both ways, alternately, on the same rows with the same seed, in one
run (the machine's noise hits both). Turn by turn, each turn waits for its longest reply; continuous,
a row whose tool results are in rejoins the running batch at once. On a GPU a decode step of a small
model costs about the same whatever the rows (a CUDA graph replay), so the decode steps are what the
schedule changes; prefill tokens are the price of rejoining. Prints each batch and the totals' ratios.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def workspace(family: str, out: Path) -> Path:
    ws = out / f"ws-{family}"
    shutil.copytree(ROOT / "src" / "ait" / "policy" / "reference_jobs" / family, ws, symlinks=False)
    shutil.copy(ROOT / "examples" / "tasks" / f"{family}.json", ws / "task.json")
    return ws


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-0.5b", help="a base model alias or path (ait.train.models)")
    p.add_argument("--family", default="ledger")
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--gens", type=int, default=8)
    p.add_argument("--max-completion-length", type=int, default=128)
    p.add_argument("--max-turns", type=int, default=None, help="default: the reference job's max_tool_calling_iterations")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ait.chat.renderers import prepare_tokenizer, stop_ids
    from ait.job.config import load_job_config
    from ait.job.env_loader import import_env, read_surface
    from ait.train.decode import Decoder
    from ait.train.models import resolve_base_model
    from ait.train.request import build_rows
    from ait.train.rollouts import rollout_batch

    out = Path(tempfile.mkdtemp(prefix="ait-rollout-schedule-"))
    ws = workspace(args.family, out)
    sys.path.insert(0, str(ws))
    surface, errors = read_surface(import_env(ws / "env.py"))
    if surface is None:
        raise SystemExit("; ".join(errors))
    cfg = load_job_config(ws / "job.toml").train
    max_turns = cfg.max_tool_calling_iterations if args.max_turns is None else args.max_turns
    cfg = cfg.model_copy(update={"dataset_size": max(cfg.dataset_size, args.prompts * args.batches)})
    rows = build_rows(surface, cfg)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    path = resolve_base_model(args.model).path
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    decoder = Decoder(model, stop_ids=stop_ids(tokenizer, model), pad_id=tokenizer.pad_token_id)
    max_length = int(getattr(model.config, "max_position_embeddings", 4096) or 4096)

    picked = random.Random(args.seed).sample(range(len(rows)), args.prompts * args.batches)
    results: dict[str, list[dict]] = {"turn_by_turn": [], "continuous": []}
    print(f"{args.family} on {args.model} ({device.type}): {args.batches} batches of {args.prompts} prompts x "
          f"{args.gens}, <= {args.max_completion_length} tokens, <= {max_turns} tool turns, T {args.temperature}")
    for b in range(args.batches):
        batch = [rows[i] for i in picked[b * args.prompts:(b + 1) * args.prompts] for _ in range(args.gens)]
        for name in results:  # alternately, on the same rows and the same seed
            before = dict(decoder.stats)
            generator = torch.Generator(device=device).manual_seed(args.seed + b)
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.monotonic()
            rollouts = rollout_batch(decoder, tokenizer, surface, batch, max_completion_length=args.max_completion_length,
                                     max_turns=max_turns, temperature=args.temperature, top_p=1.0,
                                     max_length=max_length, generator=generator, continuous=name == "continuous")
            if device.type == "cuda":
                torch.cuda.synchronize()
            row = {"batch": b, "seconds": time.monotonic() - t,
                   "decode_steps": decoder.stats["decode_steps"] - before["decode_steps"],
                   "prefill_tokens": decoder.stats["prefill_tokens"] - before["prefill_tokens"],
                   "completion_tokens": sum(r.completion_tokens for r in rollouts),
                   "tool_calls": sum(r.tool_calls for r in rollouts),
                   "turns": sum(sum(m["role"] == "assistant" for m in r.messages) for r in rollouts),
                   "truncated": sum(r.truncated for r in rollouts)}
            results[name].append(row)
            print(f"batch {b} {name:12s} {row['seconds']:7.1f} s  decode steps {row['decode_steps']:5d}  "
                  f"prefill tokens {row['prefill_tokens']:6d}  completion tokens {row['completion_tokens']:5d}  "
                  f"assistant turns {row['turns']:3d}  tool calls {row['tool_calls']:3d}  truncated {row['truncated']}",
                  flush=True)
    total = {name: {k: sum(r[k] for r in rs) for k in rs[0] if k != "batch"} for name, rs in results.items()}
    ratio = {k: total["turn_by_turn"][k] / total["continuous"][k] for k in ("seconds", "decode_steps")
             if total["continuous"][k]}
    print("total: " + "; ".join(f"{n}: {t['seconds']:.1f} s, {t['decode_steps']} decode steps, "
                                f"{t['prefill_tokens']} prefill tokens" for n, t in total.items()))
    print("turn by turn / continuous: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items()))
    if args.json:
        args.json.write_text(json.dumps({"family": args.family, "model": args.model, "device": device.type,
                                         "prompts": args.prompts, "gens": args.gens, "batches": args.batches,
                                         "max_completion_length": args.max_completion_length, "max_turns": max_turns,
                                         "temperature": args.temperature, "results": results, "total": total,
                                         "ratio_turn_by_turn_over_continuous": ratio}, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
