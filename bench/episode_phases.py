"""Where an outer step's seconds go: each episode's wall time split into the agent's sampling, the probes,
the inner jobs (queued and running) and the rest, read from the episodes' own trajectories.

    python bench/episode_phases.py RUN_DIR [--json OUT.json]

RUN_DIR is an outer run (`ait train`: RUN_DIR/episodes/*/trajectory.jsonl and metrics.jsonl) or any
directory holding episode run directories. Per episode, from its trajectory.jsonl:

    llm_s        the agent's sampling (episode_end's time/llm_s: every policy call's wall time)
    probe_s      the probes' seconds (each `probe` event's own clock)
    job_s        the inner jobs' wall seconds on their executor (each `job` event's cost.wall_s)
    job_wait_s   from a probe's end to its job's end, less the job's wall time: waiting for a GPU slot
    baseline_s   scoring's best_pre: the allowed models' untrained evals on this machine's hidden set, or
                 the wait for another episode's (one at a time: ait.evals.best_pre); each `baseline` event
    other_s      the rest of the episode's wall time (tools, the harness, rendering)

A step waits for its slowest group, and a group for its slowest episode: the table gives the mean over
episodes and the slowest episode's split, and per step (metrics.jsonl) the loop's own phases
(seconds_by_phase: waiting for groups, the agent's training step, held-out, checkpoint).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PHASES = ("llm_s", "probe_s", "job_s", "job_wait_s", "baseline_s", "other_s")


def episode_phases(trajectory: Path) -> dict | None:
    """The phases of one episode, or None when it has not ended (no episode_end event)."""
    events = [json.loads(line) for line in trajectory.read_text().splitlines() if line.strip()]
    if not events or events[-1].get("kind") != "episode_end":
        return None
    end = events[-1]
    wall = end["t"] - events[0]["t"]
    probes = [e for e in events if e.get("kind") == "probe"]
    jobs = [e for e in events if e.get("kind") == "job"]
    probe_s = sum(float(e.get("seconds") or 0.0) for e in probes)
    job_s = sum(float((e.get("cost") or {}).get("wall_s") or 0.0) for e in jobs)
    probe_end = {e.get("attempt"): e["t"] for e in probes}
    wait = 0.0
    for e in jobs:  # a job starts after its attempt's probe; its wall time on the executor excludes the queue
        if e.get("attempt") in probe_end:
            wait += max(0.0, e["t"] - probe_end[e["attempt"]] - float((e.get("cost") or {}).get("wall_s") or 0.0))
    llm = float(end.get("time/llm_s") or 0.0)
    baseline = sum(float(e.get("seconds") or 0.0) for e in events if e.get("kind") == "baseline")
    row = {"episode": trajectory.parent.name, "wall_s": wall, "llm_s": llm, "probe_s": probe_s, "job_s": job_s,
           "job_wait_s": wait, "baseline_s": baseline, "stop_reason": end.get("stop_reason"), "jobs": len(jobs)}
    row["other_s"] = max(0.0, wall - llm - probe_s - job_s - wait - baseline)
    return row


def summarize(rows: list[dict]) -> dict:
    if not rows:
        return {"episodes": 0}
    slowest = max(rows, key=lambda r: r["wall_s"])
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in ("wall_s",) + PHASES}
    share = {k: mean[k] / mean["wall_s"] if mean["wall_s"] else 0.0 for k in PHASES}
    return {"episodes": len(rows), "mean": mean, "share_of_mean_wall": share, "slowest": slowest}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--json", type=Path, default=None, help="write the episodes, the summary and the steps here")
    args = p.parse_args()
    if not args.run_dir.is_dir():
        print(f"error: {args.run_dir} is not a directory", file=sys.stderr)
        return 1
    rows = [r for t in sorted(args.run_dir.rglob("trajectory.jsonl")) if (r := episode_phases(t)) is not None]
    summary = summarize(rows)
    metrics = args.run_dir / "metrics.jsonl"
    steps = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    steps = [{"step": s["step"], "seconds": s["seconds"], **s.get("seconds_by_phase", {})} for s in steps]
    if not rows:
        print(f"no finished episode under {args.run_dir}")
    else:
        m, s = summary["mean"], summary["slowest"]
        print(f"{summary['episodes']} episodes: mean wall {m['wall_s']:.1f} s")
        for k in PHASES:
            print(f"  {k:11s} mean {m[k]:7.1f} s ({summary['share_of_mean_wall'][k]:5.1%})   slowest episode {s[k]:7.1f} s")
        print(f"  slowest: {s['episode']} {s['wall_s']:.1f} s ({s['stop_reason']}, {s['jobs']} job(s))")
    for st in steps:
        rest = ", ".join(f"{k} {v:.1f}" for k, v in st.items() if k not in ("step", "seconds"))
        print(f"step {st['step']}: {st['seconds']:.1f} s" + (f" ({rest})" if rest else ""))
    if args.json:
        args.json.write_text(json.dumps({"run_dir": str(args.run_dir), "summary": summary, "steps": steps,
                                         "episodes": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
