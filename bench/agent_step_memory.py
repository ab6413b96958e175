"""The agent's training-step memory: one merged agent sequence forwarded and backpropagated through the
outer loop's LoRA model (ait.outer.backends.local), the vocabulary projection in chunks (the default,
ait.outer.backends.loss.LOGIT_CHUNK_ELEMENTS) against all target positions at once (how it was done
before), in one process, alternating. Prints each variant's peak GPU memory above what was allocated
before the step, its seconds, and the ratio of the peaks.

    python bench/agent_step_memory.py --model qwen2.5-coder-1.5b --tokens 24000 --targets 5000 [--json OUT]
    python bench/agent_step_memory.py --smoke          # CPU, the tiny model: runs, no memory figures

The sequence is random token ids; its targets are spread over it in turns of --turn-tokens each (an
episode's replies between its tool results), as ait.outer.backends.sequences merges them. The arc's
step 3 (H100, 2026-12-07) forwarded 20 sequences of 13.3k tokens on average with 1.1k targets each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def targets_for(tokens: int, targets: int, turn_tokens: int) -> list[int]:
    """`targets` positions in turns of `turn_tokens`, evenly spaced over the sequence's second half onward."""
    turns = max(1, targets // turn_tokens)
    gap = max(turn_tokens, (tokens - 1) // (turns + 1))
    out: list[int] = []
    for i in range(turns):
        start = tokens - 1 - (turns - i) * gap + 1
        out.extend(range(max(1, start), max(1, start) + turn_tokens))
    return sorted({p for p in out if 0 < p < tokens})[:targets]


def step(model, tokens: list[int], targets: list[int], chunk_elements: int, device: str) -> dict:
    import torch

    from ait.outer.backends.loss import importance_sampling_loss, sequence_logprobs

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    logp = sequence_logprobs(model, tokens, targets, 1.0, chunk_elements)
    loss = importance_sampling_loss(logp, logp.detach().tolist(), 1.0) / len(targets)
    loss.backward()
    out = {"seconds": 0.0}
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        out["peak_gib"] = (torch.cuda.max_memory_allocated() - before) / 2**30
    out["seconds"] = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--tokens", type=int, default=24_000)
    ap.add_argument("--targets", type=int, default=5_000)
    ap.add_argument("--turn-tokens", type=int, default=250)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default=None)
    ap.add_argument("--smoke", action="store_true", help="CPU, the tiny model, a short sequence")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    from ait.outer.backends.local import LocalBackend, default_device
    from ait.outer.backends.loss import LOGIT_CHUNK_ELEMENTS
    from ait.outer.config import OuterConfig

    if args.smoke:
        args.model, args.tokens, args.targets, args.turn_tokens, args.device = "tiny", 600, 200, 20, "cpu"
    device = args.device or default_device()
    config = OuterConfig(policy={"model": args.model},
                         trainer={"device": device, "lora_r": 8, "lora_alpha": 16, "gradient_checkpointing": True})
    backend = LocalBackend(config)
    model = backend.model
    model.train()
    vocab = model.get_output_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (args.tokens,), generator=gen).tolist()
    targets = targets_for(args.tokens, args.targets, args.turn_tokens)
    variants = {"chunked": LOGIT_CHUNK_ELEMENTS, "all_at_once": 2**62}
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    step(model, tokens, targets, LOGIT_CHUNK_ELEMENTS, device)  # warm-up: kernels, allocator
    for _ in range(args.repeats):
        for name, elements in variants.items():
            runs[name].append(step(model, tokens, targets, elements, device))
    result = {"model": args.model, "device": device, "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None,
              "tokens": args.tokens, "targets": len(targets), "vocab": vocab, "chunk_elements": LOGIT_CHUNK_ELEMENTS,
              "repeats": args.repeats, "variants": {}}
    for name, rs in runs.items():
        row = {"seconds_median": statistics.median(r["seconds"] for r in rs)}
        if "peak_gib" in rs[0]:
            row["peak_gib_max"] = max(r["peak_gib"] for r in rs)
        result["variants"][name] = row
        print(f"{name:12s} " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()))
    c, a = result["variants"]["chunked"], result["variants"]["all_at_once"]
    result["seconds_ratio"] = c["seconds_median"] / a["seconds_median"]
    if "peak_gib_max" in c:
        result["peak_ratio"] = c["peak_gib_max"] / a["peak_gib_max"]
    print(f"chunked / all at once: seconds {result['seconds_ratio']:.2f}x"
          + (f", peak memory {result['peak_ratio']:.2f}x" if "peak_ratio" in result else " (no GPU: no memory figures)"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    backend.close()


if __name__ == "__main__":
    main()
