"""The local backend's train step on the same multi-turn transcripts, per turn and merged, in one run:
tokens forwarded and seconds per step for each, and the ratios.

    python bench/outer_step_tokens.py [--groups 2] [--group-size 4] [--turns 8,12] [--repeats 3] [--json PATH]
    python bench/outer_step_tokens.py --like qwen2.5-0.5b --prompt 2000   # GPU, random weights of that shape
    python bench/outer_step_tokens.py --smoke   # 1 group x 2 episodes x 3 turns, 1 repeat

per_turn is `train_step(groups, merge=False)`: one forward and backward pass per assistant turn over
its whole prompt + reply, how steps ran before turns were merged (the same per-token loss; the old
code projected one extra logit row per turn and dropped it). merged is `train_step(groups)`: an
episode's turns whose prompts extend the sequence so far are one pass (ait.outer.backends.sequences).

The transcripts are synthetic, shaped like the arc's: the first prompt is the calc_chain task's real
opening (system prompt, tool schemas, task: ~1,600 tokens with the tiny model's tokenizer) unless
--prompt sets a length; then per turn a reply (85% of 8-48 tokens, 15% of 100-200: mostly tool calls,
a few files) and an observation (a tool result, 20-120 tokens); each prompt is the previous prompt +
reply + observation, as the harness's conversation grows. Token ids, sampling logprobs and rewards
are random: the step's cost depends on the lengths, not on what the tokens say. Every episode's
prompts extend each other, the best case for merging; in real episodes a re-rendered history (an
earlier reply's <think> block dropped, a tool result shortened to fit) starts a new sequence.

Each repeat runs both modes, alternating which goes first (ABBA), after one untimed warm-up step of
each; a step is a real AdamW step with the sampler refresh, so the weights move between steps.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ait.outer.backends.local import LocalBackend  # noqa: E402
from ait.outer.config import OuterConfig  # noqa: E402
from ait.outer.types import Trajectory, TrajectoryGroup, Turn  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "examples" / "tasks" / "calc_chain.json"


def opening_prompt(backend: LocalBackend) -> list[int]:
    """The calc_chain task's first prompt as the policy renders it."""
    from ait.harness.episode import opening_messages
    from ait.harness.tools import TOOL_SCHEMAS
    from ait.spec import load_spec

    return backend.policy(seed=0).render(opening_messages(load_spec(TASK)), TOOL_SCHEMAS)


def transcript(rng: random.Random, prompt: list[int], turns: int, vocab: int, max_len: int) -> list[Turn]:
    """One episode's turns: each prompt the last prompt + reply + observation, under max_len tokens."""
    out: list[Turn] = []
    prompt = list(prompt)
    for _ in range(turns):
        n = rng.randint(100, 200) if rng.random() < 0.15 else rng.randint(8, 48)
        if len(prompt) + n > max_len:
            break
        reply = [rng.randrange(vocab) for _ in range(n)]
        out.append(Turn(prompt_ids=list(prompt), completion_ids=reply,
                        logprobs=[-rng.uniform(0.05, 3.0) for _ in range(n)]))
        prompt += reply + [rng.randrange(vocab) for _ in range(rng.randint(20, 120))]
    return out


def make_groups(rng: random.Random, prompt: list[int], args: argparse.Namespace, vocab: int,
                max_len: int) -> list[TrajectoryGroup]:
    lo, hi = map(int, args.turns.split(","))
    groups = []
    for g in range(args.groups):
        trajectories = [Trajectory(episode_id=f"g{g}e{e}", task_id=f"t{g}", family="calc_chain",
                                   turns=transcript(rng, prompt, rng.randint(lo, hi), vocab, max_len),
                                   reward=rng.random())
                        for e in range(args.group_size)]
        groups.append(TrajectoryGroup(task_id=f"t{g}", trajectories=trajectories, policy_version=0))
    return groups


def machine() -> str:
    """The CPU's model name (Linux), or the GPU's when the step runs on one."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def sync(backend: LocalBackend) -> None:
    if str(backend.device).startswith("cuda"):
        torch.cuda.synchronize()


def timed_step(backend: LocalBackend, groups: list[TrajectoryGroup], merge: bool) -> dict[str, float]:
    cuda = str(backend.device).startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    sync(backend)
    t0 = time.perf_counter()
    stats = backend.train_step(groups, merge=merge)
    sync(backend)
    row = {"seconds": time.perf_counter() - t0, "forward_tokens": stats.extra["forward_tokens"],
           "sequences": float(stats.datums), "turns": stats.extra["turns"], "loss": stats.loss}
    if cuda:
        row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return row


def summary(rows: list[dict[str, float]], prefix: str) -> dict[str, float]:
    seconds = [r["seconds"] for r in rows]
    out = {f"{prefix}/forward_tokens": rows[0]["forward_tokens"], f"{prefix}/sequences": rows[0]["sequences"],
           f"{prefix}/seconds_mean": statistics.mean(seconds), f"{prefix}/seconds_min": min(seconds),
           f"{prefix}/seconds_stdev": statistics.stdev(seconds) if len(seconds) > 1 else 0.0}
    if "peak_gib" in rows[0]:
        out[f"{prefix}/peak_gib"] = max(r["peak_gib"] for r in rows)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="tiny, or a path / alias ait.train.models resolves")
    p.add_argument("--like", default=None, help="random weights of a known shape (see outer_sampler_speed.py)")
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--turns", default="8,12", help="turns per episode, a range")
    p.add_argument("--prompt", type=int, default=0, help="opening prompt tokens (0: the calc_chain task's own)")
    p.add_argument("--max-len", type=int, default=4000, help="a transcript stops before its sequence passes this")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="CPU threads (the tiny model's matmuls gain nothing from more)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    p.add_argument("--smoke", action="store_true", help="1 group x 2 episodes x 3 turns, 1 repeat")
    args = p.parse_args()
    if args.smoke:
        args.groups, args.group_size, args.turns, args.repeats = 1, 2, "3,3", 1
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]  # a shared machine's other work slows both modes alike (ABBA order)
    model = args.model
    if args.like:
        from outer_sampler_speed import random_model

        dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
        model = random_model(args.like, Path(tempfile.mkdtemp(prefix="ait-bench-step-")), dtype)
    config = OuterConfig(policy={"model": model, "temperature": 1.0},
                         trainer={"lora_r": 16, "lora_alpha": 32, "learning_rate": 1e-5})
    torch.manual_seed(args.seed)
    backend = LocalBackend(config)
    try:
        rng = random.Random(args.seed)
        vocab = min(backend.model.config.vocab_size, len(backend.tokenizer))
        prompt = ([rng.randrange(vocab) for _ in range(args.prompt)] if args.prompt else opening_prompt(backend))
        groups = make_groups(rng, prompt, args, vocab, args.max_len)
        turns = [len(t.turns) for g in groups for t in g.trajectories]
        for merge in (False, True):  # warm-up: allocator, kernels, first-call costs
            timed_step(backend, groups, merge)
        rows: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for r in range(args.repeats):
            for merge in ((False, True) if r % 2 == 0 else (True, False)):
                rows[merge].append(timed_step(backend, groups, merge))
                print(f"repeat {r} {'merged' if merge else 'per_turn'}: {rows[merge][-1]}", file=sys.stderr)
    finally:
        backend.close()
    out = {"bench": "outer_step_tokens", "model": args.like or args.model, "device": str(backend.device),
           "machine": machine(), "cpus": os.cpu_count(), "torch_threads": args.threads,
           "load_average/before": load_before, "load_average/after": os.getloadavg()[0],
           "repeats": args.repeats, "groups": args.groups, "group_size": args.group_size,
           "episodes/turns_min": min(turns), "episodes/turns_max": max(turns),
           "episodes/turns_total": sum(turns), "episodes/first_prompt_tokens": len(prompt),
           "episodes/last_sequence_tokens_max": max(len(t.turns[-1].prompt_ids) + len(t.turns[-1].completion_ids)
                                                    for g in groups for t in g.trajectories),
           "episodes/completion_tokens": sum(len(u.completion_ids) for g in groups for t in g.trajectories
                                             for u in t.turns),
           **summary(rows[False], "per_turn"), **summary(rows[True], "merged")}
    out["ratio/forward_tokens"] = out["per_turn/forward_tokens"] / out["merged/forward_tokens"]
    out["ratio/seconds_mean"] = out["per_turn/seconds_mean"] / out["merged/seconds_mean"]
    out["ratio/seconds_min"] = out["per_turn/seconds_min"] / out["merged/seconds_min"]
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
