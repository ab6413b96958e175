"""The agent's sampling, replayed: how fast the outer loop's sampling engine serves an arc's agent calls
(their prompt and reply lengths as recorded) on a GPU of its own, against what the arc recorded while the
same GPU held its packed jobs and the agent's training step.

    python bench/agent_sampling.py --extract RUN_DIR --out CALLS.json   # the calls of an `ait train` run
    python bench/agent_sampling.py --calls CALLS.json --model qwen2.5-coder-1.5b [--episodes 16] [--json OUT]
    python bench/agent_sampling.py --smoke                              # CPU: the tiny model, short calls

Each episode is a thread that makes its calls in order through one shared SamplingEngine (continuous
batching, CUDA graphs on a GPU), as the outer loop's episodes do. A prompt has the recorded length: the
episode's previous prompt and reply, then random token ids (a fresh random prompt where the recorded one is
shorter than that: history re-rendered); a reply runs to exactly its recorded length (no stop token), so the
engine does the same prefill and decode work the arc's calls did. `--compare-prefix GIB` also replays alone
with prefix reuse (ait.train.decode_prefix), where a turn prefills only what is new. Between calls no time passes (`--gaps`: the recorded
time between an episode's calls, i.e. its tools and jobs, passes as a sleep). Prints the replayed and the
recorded per-call latency (median) and completion tokens a second over all episodes, and their ratio:
near 1, the engine itself is the step's sampling cost; well above 1, what shares the GPU with it is.

What shares it, one suspect at a time: `--beside-processes K` replays beside K other processes that keep
the GPU busy with matmuls, each with a CUDA context of its own, as the arc's packed jobs are (under the
jobs' MPS daemon when AIT_JOBS_MPS_PIPE_DIRECTORY is set, as ait.compute.local starts them; this process
stays out of it, as the agent does, so the two contexts are time-sliced); `--compare-streams` replays
beside another thread's load on this process's default stream (the agent's training step), the engine on
the shared stream and then on its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def extract(run_dir: Path) -> dict:
    """Per episode (by start time), each agent call's start offset, latency, prompt and reply tokens."""
    episodes = []
    for trajectory in sorted(run_dir.glob("episodes/*/trajectory.jsonl")):
        calls = []
        for line in trajectory.read_text().splitlines():
            r = json.loads(line)
            usage = r.get("usage")
            if r.get("kind") == "message" and r.get("role") == "assistant" and usage:
                calls.append({"t": r["t"] - usage["latency_s"], "latency_s": usage["latency_s"],
                              "prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"]})
        if calls:
            episodes.append({"episode": trajectory.parent.name, "calls": calls})
    episodes.sort(key=lambda e: e["calls"][0]["t"])
    t0 = episodes[0]["calls"][0]["t"] if episodes else 0.0
    for e in episodes:
        for c in e["calls"]:
            c["t"] = round(c["t"] - t0, 3)
    return {"run_dir": str(run_dir), "episodes": episodes}


def summary(episodes: list[dict], key: str = "latency_s") -> dict:
    """Median latency, and completion tokens a second over the span from the first call's start to the
    last call's end."""
    calls = [c for e in episodes for c in e["calls"]]
    if not calls:
        return {"calls": 0}
    start = min(c["t"] for c in calls)
    end = max(c["t"] + c[key] for c in calls)
    tokens = sum(c["completion_tokens"] for c in calls)
    return {"calls": len(calls), "median_latency_s": statistics.median(c[key] for c in calls),
            "completion_tokens": tokens, "prompt_tokens": sum(c["prompt_tokens"] for c in calls),
            "span_s": end - start, "tokens_per_s": tokens / max(end - start, 1e-9)}


def replay(engine, episodes: list[dict], vocab: int, gaps: bool, seed: int = 0) -> list[dict]:
    """Each episode's calls through `engine` from a thread of its own; returns the episodes with each call's
    replayed start (`t`) and latency (`replayed_s`)."""
    import torch

    out = [{"episode": e["episode"], "calls": []} for e in episodes]
    start = time.monotonic()

    total, finished, lock = sum(len(e["calls"]) for e in episodes), [0], threading.Lock()

    def run(i: int) -> None:
        calls = episodes[i]["calls"]
        rng = torch.Generator().manual_seed(seed + i)
        before: list[int] = []
        for k, c in enumerate(calls):
            if gaps and k:
                time.sleep(max(0.0, c["t"] - (calls[k - 1]["t"] + calls[k - 1]["latency_s"])))
            # As an episode's turns do: the whole conversation so far, then what is new (a tool result, the next
            # header), where the recorded length allows it; otherwise (history re-rendered) a fresh prompt.
            new = c["prompt_tokens"] - len(before)
            head = before if before and new > 0 else []
            prompt = head + torch.randint(vocab, (c["prompt_tokens"] - len(head),), generator=rng).tolist()
            t = time.monotonic()
            ids, _ = engine.sample(prompt, 1.0, c["completion_tokens"], torch.Generator(device=engine.model.device)
                                   .manual_seed(seed + 1000 * i + k))
            if len(ids) != c["completion_tokens"]:
                raise RuntimeError(f"episode {i}, call {k}: {len(ids)} tokens replayed, {c['completion_tokens']} recorded")
            out[i]["calls"].append({**c, "t": t - start, "replayed_s": time.monotonic() - t})
            before = prompt + ids
            with lock:  # a line now and then: a replay that stalls shows where
                finished[0] += 1
                if finished[0] % 50 == 0 or finished[0] == total:
                    print(f"    {finished[0]}/{total} calls, {time.monotonic() - start:.1f} s", flush=True)

    # One thread per episode; map re-raises what any of them raised (a replay that failed is no figure).
    with ThreadPoolExecutor(max_workers=max(1, len(episodes))) as pool:
        list(pool.map(run, range(len(episodes))))
    return out


def scaled(episodes: list[dict], prompt_cap: int, reply_cap: int) -> list[dict]:
    """The same calls, lengths capped (the CPU smoke run)."""
    return [{**e, "calls": [{**c, "prompt_tokens": min(c["prompt_tokens"], prompt_cap),
                             "completion_tokens": max(1, min(c["completion_tokens"], reply_cap))}
                            for c in e["calls"]]} for e in episodes]


def load_hog(device, stop, depth: int) -> None:
    """Another thread's GPU work on the default stream, as the outer loop's training step enqueues it:
    `depth` large matmuls at a time (about 1.5 ms each on an H100), then a wait on that stream alone."""
    import torch

    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(depth):
            a @ a
        torch.cuda.current_stream(device).synchronize()


HOG_PROCESS = """import torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("ready", flush=True)
while True:
    for _ in range(16):
        a @ a
    torch.cuda.synchronize()
"""


def hog_processes(k: int) -> list[subprocess.Popen]:
    """K processes that keep the GPU busy (matmuls), each its own CUDA context, started and ready (their
    context made) before this returns; under the jobs' MPS daemon when AIT_JOBS_MPS_PIPE_DIRECTORY is set."""
    from ait.compute.local import JOBS_MPS_ENV

    env = dict(os.environ)
    if pipe := os.environ.get(JOBS_MPS_ENV):
        env["CUDA_MPS_PIPE_DIRECTORY"] = pipe
    hogs = [subprocess.Popen([sys.executable, "-c", HOG_PROCESS], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True) for _ in range(k)]
    for h in hogs:
        if h.stdout.readline().strip() != "ready":
            stop_processes(hogs)
            raise RuntimeError("a GPU load process failed to start")
    return hogs


def stop_processes(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()


def run_variant(model, tokenizer, episodes: list[dict], *, max_batch: int, gaps: bool, own_stream: bool,
                hog_depth: int, processes: int = 0, prefix_cache_gib: float = 0.0) -> list[dict]:
    """One engine (own stream or the default one), warmed up, then the replay; with hog_depth > 0, beside
    load_hog on the default stream; with processes > 0, beside that many hog_processes."""
    import torch

    from ait.train.decode_batch import SamplingEngine

    engine = SamplingEngine(model, tokenizer, max_batch=max_batch, own_stream=own_stream,
                            prefix_cache_gib=prefix_cache_gib)
    engine.stop_ids = set()  # every reply runs to its recorded length
    vocab = model.config.vocab_size
    # Warm-up: the graphs and the cache sizes the replay will need (the longest prompt), the allocator.
    longest = max(c["prompt_tokens"] + c["completion_tokens"] for e in episodes for c in e["calls"])
    replay(engine, scaled(episodes, 64, 4) + [{"episode": "longest", "calls": [
        {"t": 0.0, "latency_s": 0.0, "prompt_tokens": longest - 2, "completion_tokens": 2}]}], vocab, gaps=False, seed=999)
    stop, hog = threading.Event(), None
    if hog_depth > 0:
        hog = threading.Thread(target=load_hog, args=(model.device, stop, hog_depth), daemon=True)
        hog.start()
    others = hog_processes(processes) if processes > 0 else []
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    if engine.prefixes is not None:
        engine.prefixes.clear()  # the warm-up's replies are no one's prefix
    try:
        return replay(engine, episodes, vocab, gaps=gaps)
    finally:
        stop.set()
        if hog is not None:
            hog.join()
        stop_processes(others)
        engine.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--extract", type=Path, help="an `ait train` run directory: write its agent calls to --out")
    p.add_argument("--out", type=Path, help="where --extract writes the calls")
    p.add_argument("--calls", type=Path, help="the calls to replay (--extract's output)")
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--episodes", type=int, default=16, help="the first N episodes by start (the arc's first wave)")
    p.add_argument("--max-batch", type=int, default=16, help="the engine's rows (policy.sample_batch_size)")
    p.add_argument("--gaps", action="store_true", help="sleep the recorded time between an episode's calls")
    p.add_argument("--compare-streams", action="store_true",
                   help="GPU: also replay beside another thread's default-stream load, the engine on the default "
                        "stream and then on its own (policy.sampler_stream)")
    p.add_argument("--hog-depth", type=int, default=64, help="matmuls the load enqueues between its waits")
    p.add_argument("--beside-processes", type=int, default=0, metavar="K",
                   help="GPU: also replay beside K processes that keep the GPU busy, as K packed jobs do")
    p.add_argument("--compare-prefix", type=float, default=0.0, metavar="GIB",
                   help="also replay alone with GIB of prefix reuse (policy.prefix_cache_gib): a turn prefills "
                        "only what is new since the episode's last one")
    p.add_argument("--smoke", action="store_true", help="CPU: the tiny model, 4 short episodes")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    if args.extract:
        if not args.out:
            p.error("--extract needs --out")
        data = extract(args.extract)
        args.out.write_text(json.dumps(data) + "\n")
        print(f"{sum(len(e['calls']) for e in data['episodes'])} calls of {len(data['episodes'])} episodes -> {args.out}")
        return

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ait.chat.renderers import prepare_tokenizer
    from ait.train.models import resolve_base_model

    if args.smoke:
        model_name = "tiny"
        episodes = [{"episode": f"e{i}", "calls": [{"t": 0.5 * k, "latency_s": 0.1, "prompt_tokens": 40 + 7 * k,
                                                    "completion_tokens": 5 + k} for k in range(3)]} for i in range(4)]
    elif args.calls:
        model_name = args.model
        episodes = json.loads(args.calls.read_text())["episodes"][:args.episodes]
    else:
        p.error("give --calls (or --extract, or --smoke)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.compare_streams and device != "cuda":
        p.error("--compare-streams needs a GPU (CUDA streams)")
    if args.beside_processes and device != "cuda":
        p.error("--beside-processes needs a GPU (its processes load it)")
    if args.beside_processes < 0:
        p.error(f"--beside-processes is a number of processes, not {args.beside_processes}")
    path = resolve_base_model(model_name).path
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path))
    from ait.train.attention import grouped_attention_name

    # As the outer loop's sampler loads it (ait.outer.backends.local): grouped attention, no KV copy per head.
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if device == "cuda" else torch.float32,
                                                 use_safetensors=True,
                                                 attn_implementation=grouped_attention_name()).to(device).eval()
    variants = [("alone", False, 0, 0, 0.0)]
    if args.compare_prefix > 0:
        variants += [("alone, prefix reuse", False, 0, 0, args.compare_prefix)]
    from ait.compute.local import JOBS_MPS_ENV

    mps = "under the jobs' MPS daemon" if os.environ.get(JOBS_MPS_ENV) else "time-sliced, no MPS"
    if args.beside_processes:
        variants += [(f"beside {args.beside_processes} processes ({mps})", False, 0, args.beside_processes, 0.0)]
    if args.compare_streams:
        variants += [("beside a load, shared stream", False, args.hog_depth, 0, 0.0),
                     ("beside a load, own stream", True, args.hog_depth, 0, 0.0)]
    recorded = summary(episodes)
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    figures = {"model": model_name, "device": gpu, "episodes": len(episodes), "gaps": args.gaps,
               "max_batch": args.max_batch, "hog_depth": args.hog_depth, "beside_processes": args.beside_processes,
               "recorded": recorded, "replayed": {}}
    for name, own, depth, processes, prefix_gib in variants:
        print(f"  {name}:", flush=True)
        replayed = run_variant(model, tokenizer, episodes, max_batch=args.max_batch, gaps=args.gaps, own_stream=own,
                               hog_depth=depth, processes=processes, prefix_cache_gib=prefix_gib)
        figures["replayed"][name] = summary(replayed, "replayed_s")
        print(f"  {name}: {figures['replayed'][name]['span_s']:.1f} s", flush=True)
        if args.json:  # after each variant: a run cut short by its time limit keeps what it measured
            args.json.write_text(json.dumps(figures, indent=2) + "\n")
    ours = figures["replayed"]["alone"]
    print(f"{model_name} on {gpu}: {len(episodes)} episodes, {ours['calls']} calls, "
          f"{ours['prompt_tokens']} prompt and {ours['completion_tokens']} completion tokens")
    for name, s in [("recorded in the arc", recorded), *figures["replayed"].items()]:
        print(f"  {name:30s} median latency {s['median_latency_s']:7.2f} s   {s['tokens_per_s']:8.1f} "
              f"completion tokens/s   span {s['span_s']:7.1f} s")
    figures["latency_ratio"] = recorded["median_latency_s"] / max(ours["median_latency_s"], 1e-9)
    print(f"  the arc's calls took {figures['latency_ratio']:.2f}x the median latency alone"
          + ("" if args.gaps else " (tokens a second compare with the arc's only with --gaps: its span holds "
             "its tools and jobs too)"))
    if args.compare_prefix > 0:
        reuse = figures["replayed"]["alone, prefix reuse"]
        figures["prefix_reuse_speedup"] = ours["span_s"] / max(reuse["span_s"], 1e-9)
        print(f"  prefix reuse: the replay's span {figures['prefix_reuse_speedup']:.2f}x as short, median latency "
              f"{reuse['median_latency_s'] / max(ours['median_latency_s'], 1e-9):.2f}x")
    beside = [k for k in figures["replayed"] if k.startswith("beside ") and "processes" in k]
    if beside:
        slow = figures["replayed"][beside[0]]["median_latency_s"] / max(ours["median_latency_s"], 1e-9)
        figures["processes_slowdown"] = slow
        print(f"  {beside[0]}: {slow:.2f}x the median latency alone")
    if args.compare_streams:
        shared, own = (figures["replayed"][k]["span_s"] for k in ("beside a load, shared stream",
                                                                    "beside a load, own stream"))
        figures["own_stream_speedup"] = shared / max(own, 1e-9)
        print(f"  beside the load, its own stream replays {figures['own_stream_speedup']:.2f}x as fast as the shared one")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
