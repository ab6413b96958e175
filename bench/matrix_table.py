"""The base-model x K matrix of one `bench/gpu.sh matrix` run, as a table and as packing rows.

    python bench/matrix_table.py RESULTS_DIR [--rows-out rows.json] [--usd-per-gpu-hour 3.5]

Reads RESULTS_DIR/matrix-MODEL-kK.json (bench/inner_job.py's JSON: K = 1 is the standard job alone,
one after another with --repeat; K > 1 is --pack K) and prints one markdown row per (model, K):
jobs/hour, its ratio to the same model's first job alone, the slowest job's time against that
job's, $/job and the peak GPU memory of one job. Every job of a row pays one warm-start zygote
start (a slot's first job does), so the ratio compares like with like. --rows-out writes the rows
in src/ait/compute/pack_measurements.json's format (the worker's admission reads them).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

NAME = re.compile(r"^matrix-(?P<model>.+)-k(?P<k>\d+)\.json$")


def alone(data: dict) -> list[dict]:
    """The K = 1 jobs of a --repeat run, in order (side_by_side/{family}/fast#i)."""
    jobs = data.get("side_by_side", {})
    return [jobs[k] for k in sorted(jobs, key=lambda k: int(k.rsplit("#", 1)[-1]) if "#" in k else 0)]


def rows_for(results: Path, usd_per_hour: float) -> list[dict]:
    found: dict[str, dict[int, dict]] = {}
    for path in sorted(results.glob("matrix-*.json")):
        m = NAME.match(path.name)
        if m:
            found.setdefault(m["model"], {})[int(m["k"])] = json.loads(path.read_text())
    rows = []
    for model, by_k in found.items():
        first = alone(by_k.get(1, {}))
        base = first[0] if first and first[0].get("ok") else None
        for k, data in sorted(by_k.items()):
            if k == 1:
                for i, job in enumerate(first):
                    if not job.get("ok"):
                        rows.append({"model": model, "k": 1, "run": i + 1, "ok": 0, "jobs": 1,
                                     "error": (job.get("error") or "")[-200:]})
                        continue
                    per_hour = 3600 / job["total_s"]
                    rows.append({"model": model, "k": 1, "run": i + 1, "jobs": 1, "ok": 1, "mps": None,
                                 "wall_s": job["total_s"], "jobs_per_hour": per_hour,
                                 "vs_alone": per_hour / (3600 / base["total_s"]) if base else None,
                                 "slowest_vs_alone": job["total_s"] / base["total_s"] if base else None,
                                 "s_per_step": job["s_per_step"], "usd_per_job": usd_per_hour / per_hour,
                                 "peak_gib": job.get("peak_gpu_gb")})
                continue
            for key, pack in data.get("pack", {}).items():
                totals = [j["total_s"] for j in pack["per_job"] if j.get("ok")]
                per_hour = pack["jobs_per_hour"]
                rows.append({"model": model, "k": k, "run": key, "jobs": pack["jobs"], "ok": pack["ok"],
                             "mps": pack["mps_thread_percentage"], "wall_s": pack["wall_s"],
                             "jobs_per_hour": per_hour,
                             "vs_alone": per_hour / (3600 / base["total_s"]) if base and per_hour else None,
                             "slowest_vs_alone": max(totals) / base["total_s"] if base and totals else None,
                             "s_per_step": max((j["s_per_step"] for j in pack["per_job"] if j.get("ok")), default=None),
                             "usd_per_job": usd_per_hour / per_hour if per_hour else None,
                             "peak_gib": pack["peak_gpu_gb_per_job"], "errors": pack.get("errors", [])})
    return rows


def fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path)
    p.add_argument("--rows-out", type=Path, default=None)
    p.add_argument("--usd-per-gpu-hour", type=float, default=3.50)
    p.add_argument("--gpu", default="NVIDIA H200")
    p.add_argument("--source", default=None, help="the committed folder the rows cite (default: RESULTS_DIR)")
    args = p.parse_args()
    rows = rows_for(args.results, args.usd_per_gpu_hour)
    if not rows:
        print(f"no matrix-*.json under {args.results}", file=sys.stderr)
        return 1
    print("| base model | K | MPS % | jobs ok | wall s | jobs/hour | × first alone | slowest job × alone "
          "| s/step (slowest) | $/job | peak GiB/job |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if not r.get("ok"):
            print(f"| {r['model']} | {r['k']} | - | 0/{r['jobs']} | - | - | - | - | - | - | - |")
            continue
        label = f"{r['k']}" + (f" (job {r['run']})" if r["k"] == 1 else "")
        print(f"| {r['model']} | {label} | {fmt(r['mps'], 'd') if r['mps'] else '-'} | {r['ok']}/{r['jobs']} | "
              f"{fmt(r['wall_s'])} | {fmt(r['jobs_per_hour'])} | {fmt(r['vs_alone'], '.2f')} | "
              f"{fmt(r['slowest_vs_alone'], '.2f')} | {fmt(r['s_per_step'], '.2f')} | {fmt(r['usd_per_job'], '.4f')} | "
              f"{fmt(r['peak_gib'])} |")
    if args.rows_out:
        folder = (args.source or str(args.results)).rstrip("/")
        best: dict[tuple[str, int], dict] = {}
        for r in rows:  # one row per (model, K): K = 1 from its steady-state (last) job, packs as measured
            if r.get("ok") and r["ok"] == r["jobs"]:
                best[(r["model"], r["k"])] = r
        out = [{"gpu": args.gpu, "model": m, "jobs_per_gpu": k, "mps_thread_percentage": r["mps"],
                "jobs_per_hour": round(r["jobs_per_hour"], 1), "peak_gib_per_job": round(r["peak_gib"], 2),
                "source": f"{folder}/matrix-{m}-k{k}.json"} for (m, k), r in best.items()]
        args.rows_out.write_text(json.dumps(out, indent=1) + "\n")
        print(f"{len(out)} packing rows -> {args.rows_out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
