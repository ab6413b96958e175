#!/usr/bin/env python3
"""Replay the harness's loop rules on recorded episodes: where would they have stopped, and what would
that have saved?

    python bench/replay_stuck.py extract RUNS_DIR > calls.jsonl   # from episodes' trajectory.jsonl files
    python bench/replay_stuck.py replay calls.jsonl [--max-repeated-errors N] [--json]

`extract` keeps, per episode, each tool call (tool, raw arguments, a digest and the head of its result) and
each turn's time and tokens: small enough to commit (docs/measurements/arc15-h200-s11/heldout-calls.jsonl
is the 1.5B agent's held-out set of 2026-12-02). `replay` runs the harness's own code over it: the repeat
counter (ait.harness.tools.RepeatedErrors) with EpisodeConfig's max_repeated_errors, and the argument
unwrapping (ait.harness.tools.as_arguments). An episode whose first changed call is one the unwrapping
now accepts is reported as diverging there: what the agent would have done next is not in the record.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from ait.harness.tools import RepeatedErrors, as_arguments
from ait.harness.types import EpisodeConfig


def extract(runs_dir: Path) -> list[dict]:
    out = []
    for path in sorted(runs_dir.glob("*/trajectory.jsonl")):
        events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        start = events[0]["t"]
        turns, calls, end = [], [], {}
        for e in events:
            if e["kind"] == "message" and e.get("role") == "assistant":
                usage = e.get("usage") or {}
                turns.append({"turn": e["turn"], "t": round(e["t"] - start, 3), "seconds": e.get("seconds"),
                              "prompt_tokens": usage.get("prompt_tokens", 0),
                              "completion_tokens": usage.get("completion_tokens", 0)})
                calls += [{"turn": e["turn"], "id": c["id"], "name": c["name"], "arguments": c["arguments"]}
                          for c in e["tool_calls"]]
            elif e["kind"] == "tool_result":
                for c in calls:
                    if c["id"] == e["call_id"] and "result_sha" not in c:
                        c["result_sha"] = hashlib.sha256(e["content"].encode()).hexdigest()[:16]
                        c["result_head"] = e["content"][:160]
                        c["t_done"] = round(e["t"] - start, 3)
            elif e["kind"] == "episode_end":
                end = {"stop_reason": e["stop_reason"], "reward": e["reward/total"], "t_end": round(e["t"] - start, 3)}
        out.append({"run": path.parent.name, **end, "turns": turns, "calls": calls})
    return out


def replay(episodes: list[dict], max_repeated: int) -> dict:
    rows = []
    for ep in episodes:
        counter, stop_turn, diverges = RepeatedErrors(), None, None
        for c in ep["calls"]:
            if "result_sha" not in c:
                continue
            if isinstance(c["arguments"], str) and isinstance(as_arguments(c["name"], c["arguments"]), dict):
                diverges = c["turn"]  # now accepted: the record says nothing about what follows
                break
            # The digest stands in for the result text (equal digests, equal texts).
            result = c["result_head"] if not c["result_head"].startswith("error") else "error " + c["result_sha"]
            if max_repeated and counter.record(c["name"], c["arguments"], result) >= max_repeated:
                stop_turn = c["turn"]
                break
        done = [t for t in ep["turns"] if stop_turn is None or t["turn"] <= stop_turn]
        until = next((c["t_done"] for c in ep["calls"] if c["turn"] == stop_turn and "t_done" in c), None)
        rows.append({
            "run": ep["run"], "stop_reason": ep.get("stop_reason"), "reward": ep.get("reward"),
            "turns": len(ep["turns"]), "prompt_tokens": sum(t["prompt_tokens"] for t in ep["turns"]),
            "seconds": ep.get("t_end"), "stuck_at_turn": stop_turn, "diverges_at_turn": diverges,
            "replayed_turns": len(done), "replayed_prompt_tokens": sum(t["prompt_tokens"] for t in done),
            "replayed_seconds": until if stop_turn is not None else ep.get("t_end")})
    total = {k: sum(r[k] or 0 for r in rows) for k in ("turns", "replayed_turns", "prompt_tokens",
                                                          "replayed_prompt_tokens")}
    total.update(episodes=len(rows), stuck=sum(r["stuck_at_turn"] is not None for r in rows),
                 diverging=sum(r["diverges_at_turn"] is not None for r in rows),
                 slowest_s=max((r["seconds"] or 0) for r in rows),
                 replayed_slowest_s=max((r["replayed_seconds"] or 0) for r in rows))
    return {"max_repeated_errors": max_repeated, "total": total, "episodes": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("extract", help="episodes' trajectories -> calls.jsonl (stdout)")
    ex.add_argument("runs_dir", type=Path)
    rp = sub.add_parser("replay", help="replay the loop rules over calls.jsonl")
    rp.add_argument("calls", type=Path)
    rp.add_argument("--max-repeated-errors", type=int, default=EpisodeConfig().max_repeated_errors)
    rp.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.cmd == "extract":
        for ep in extract(args.runs_dir):
            sys.stdout.write(json.dumps(ep) + "\n")
        return
    episodes = [json.loads(line) for line in args.calls.read_text().splitlines() if line.strip()]
    out = replay(episodes, args.max_repeated_errors)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{'run':12} {'stop':18} {'reward':>6} {'turns':>5} {'stuck@':>6} {'diverge@':>8} "
          f"{'prompt tok':>10} {'replayed':>9} {'s':>6} {'replayed':>8}")
    for r in out["episodes"]:
        print(f"{r['run']:12} {r['stop_reason']:18} {r['reward']:6.3f} {r['turns']:5} {r['stuck_at_turn'] or '-':>6} "
              f"{r['diverges_at_turn'] or '-':>8} {r['prompt_tokens']:10} {r['replayed_prompt_tokens']:9} "
              f"{r['seconds']:6.0f} {r['replayed_seconds']:8.0f}")
    t = out["total"]
    print(f"max_repeated_errors={out['max_repeated_errors']}: {t['stuck']} of {t['episodes']} episodes stop as stuck, "
          f"{t['diverging']} diverge (a call now unwrapped); turns {t['turns']} -> {t['replayed_turns']}, prompt tokens "
          f"{t['prompt_tokens']} -> {t['replayed_prompt_tokens']}, slowest episode {t['slowest_s']:.0f} s -> "
          f"{t['replayed_slowest_s']:.0f} s")


if __name__ == "__main__":
    main()
