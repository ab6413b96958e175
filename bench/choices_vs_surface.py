"""Do the agent's jobs move toward what the surface says is better? The arc's choices read against it.

    python bench/choices_vs_surface.py --metrics RUN/metrics.jsonl [--metrics ...] \
        --surface docs/measurements/surface-h200-s12/surface.json [--surface ...] [--json OUT]

Each metrics row counts a family's jobs by the surface's names (`families.F.variants`, from
ait.policy.job_variants.variant_name). Each surface file's summary gives a cell's job_quality (the
reward's term) and uplift per (family, variant); a later file's cell replaces an earlier one's (families
were recalibrated between runs: pass the files oldest first). Per step it prints, per family, the mean
job_quality the surface measured for the jobs the agent chose (jobs whose variant was never measured are
counted apart, as coverage), and the family's best measured variant. The summary compares the first
steps' mean with the last steps' (issue 34's goal: choices moving toward the better cells).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def surface_cells(paths: list[Path]) -> dict[tuple[str, str], dict[str, float]]:
    """{(family, variant): {"job_quality", "uplift", "n"}}: the mean over a file's seeds; later files win."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for path in paths:
        summary = json.loads(path.read_text()).get("summary") or {}
        per_file: dict[tuple[str, str], list[dict]] = {}
        for family, fam in summary.items():
            for cell in fam.get("cells") or []:
                if cell.get("job_quality") is not None:
                    per_file.setdefault((family, cell["variant"]), []).append(cell)
        for key, cells in per_file.items():
            out[key] = {"job_quality": sum(c["job_quality"] for c in cells) / len(cells),
                        "uplift": sum(c.get("uplift") or 0.0 for c in cells) / len(cells), "n": len(cells),
                        "source": str(path)}
    return out


def metric_rows(paths: list[Path]) -> list[dict]:
    """The arc's rows in step order, one per step (a step written by two machines: the later file's)."""
    by_step: dict[int, dict] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                by_step[int(row["step"])] = row
    return [by_step[s] for s in sorted(by_step)]


def step_reading(row: dict, cells: dict[tuple[str, str], dict[str, float]]) -> dict:
    families = {}
    for family, figures in sorted((row.get("families") or {}).items()):
        chosen = figures.get("variants") or {}
        measured = {v: k for v, k in chosen.items() if (family, v) in cells}
        jobs = sum(chosen.values())
        value = (sum(cells[(family, v)]["job_quality"] * k for v, k in measured.items()) / sum(measured.values())
                 if measured else None)
        best = max(((v, c["job_quality"]) for (f, v), c in cells.items() if f == family), key=lambda t: t[1],
                   default=(None, None))
        families[family] = {"jobs": jobs, "measured_jobs": sum(measured.values()), "surface_job_quality": value,
                            "chosen": chosen, "best_variant": best[0], "best_job_quality": best[1]}
    measured = [(f["surface_job_quality"], f["measured_jobs"]) for f in families.values() if f["measured_jobs"]]
    total = sum(k for _, k in measured)
    return {"step": row["step"], "families": families,
            "surface_job_quality": sum(v * k for v, k in measured) / total if total else None,
            "measured_jobs": total, "jobs": sum(f["jobs"] for f in families.values())}


def mean_se2(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    mu = sum(values) / len(values)
    if len(values) < 2:
        return mu, None
    var = sum((v - mu) ** 2 for v in values) / (len(values) - 1)
    return mu, 2 * math.sqrt(var / len(values))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--metrics", type=Path, action="append", required=True, help="an arc's metrics.jsonl (repeat)")
    ap.add_argument("--surface", type=Path, action="append", required=True, help="a surface.json, oldest first (repeat)")
    ap.add_argument("--window", type=int, default=3, help="steps at each end the summary compares (3)")
    ap.add_argument("--json", type=Path, help="write the reading here")
    a = ap.parse_args(argv)
    for p in a.metrics + a.surface:
        if not p.is_file():
            ap.error(f"{p}: no such file")
    cells = surface_cells(a.surface)
    rows = metric_rows(a.metrics)
    if not rows:
        ap.error("the metrics files hold no step")
    readings = [step_reading(r, cells) for r in rows]
    for r in readings:
        value = "–" if r["surface_job_quality"] is None else f"{r['surface_job_quality']:+.3f}"
        print(f"step {r['step']}: surface job_quality of the chosen jobs {value} "
              f"({r['measured_jobs']}/{r['jobs']} jobs on a measured cell)")
        for family, f in r["families"].items():
            chosen = ", ".join(f"{v} x{k}" for v, k in f["chosen"].items()) or "no job"
            best = f"best measured {f['best_variant']} {f['best_job_quality']:+.3f}" if f["best_variant"] else "no cell"
            value = "–" if f["surface_job_quality"] is None else f"{f['surface_job_quality']:+.3f}"
            print(f"  {family}: {value}  [{chosen}]  ({best})")
    # Per-job values, so the two ends' difference carries a noise estimate over the jobs.
    per_job = [[cells[(fam, v)]["job_quality"] for fam, f in r["families"].items() for v, k in f["chosen"].items()
                if (fam, v) in cells for _ in range(k)] for r in readings]
    w = min(a.window, len(readings) // 2) or 1
    first, last = mean_se2(sum(per_job[:w], [])), mean_se2(sum(per_job[-w:], []))
    summary = {"steps": len(readings), "window": w, "first": first, "last": last}
    if first[0] is not None and last[0] is not None:
        print(f"first {w} step(s): {first[0]:+.3f} (2 SE {first[1] if first[1] is None else round(first[1], 3)}), "
              f"last {w}: {last[0]:+.3f} (2 SE {last[1] if last[1] is None else round(last[1], 3)}), "
              f"difference {last[0] - first[0]:+.3f}")
    if a.json:
        a.json.write_text(json.dumps({"readings": readings, "summary": summary,
                                      "surface": {f"{f}/{v}": c for (f, v), c in sorted(cells.items())}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
