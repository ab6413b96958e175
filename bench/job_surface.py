"""The job-quality surface: what each job an agent can write does to its base model, with null controls.

    python bench/job_surface.py --json surface.json [--families calc_chain,...] [--variants ...]
                                [--pack 8] [--eval-n 200] [--deadline-s 1200] [--repeat reference:1]
    python bench/job_surface.py --table a.json [b.json ...] [--json merged.json]   # tables of finished runs

For each training family, the reference job and its variants (ait.policy.job_variants: base model,
learning rate, steps, num_generations, temperature, loss_type, the partial-credit reward) and the
null jobs (learning_rate 0, max_steps 0; one per base model) run for real through run_job: the
sandboxed fast GRPO trainer, its checkpoint, the hidden eval of pre and post on the same n examples.
K jobs share the GPU (CUDA MPS when the jobs' daemon runs). Cells start in priority order (controls
and the reference job first, then one variant of every family at a time, then repeats) and no cell
starts after --deadline-s, so a run cut short still covers every family evenly.

Per cell: pre, post, the paired uplift post − pre with 2 SE, job_quality (the reward's formula with
best_pre = the highest untrained score among the base models measured here), train seconds. The
null check: a control's post − pre must be within its paired 2 SE (and, with greedy decoding of
identical weights, exactly 0). Every finished cell is appended to --json at once.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ait.compute.local import LocalExecutor, slot_envs
from ait.evals.hidden import eval_fingerprint
from ait.evals.paired import paired, quality_slope
from ait.job import task_tools
from ait.job.config import parse_job_config
from ait.job.types import Job, JobResult
from ait.policy.job_variants import REFERENCE_MODEL, VARIANTS, Variant, null_of, resolve_variant, variant_job
from ait.reward import job_quality
from ait.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
TRAINING_FAMILIES = ["calc_chain", "dispatch", "ledger", "multi_hop", "string_pipeline"]
console = Console(width=max(140, Console().width))


def cells(families: list[str], names: list[str], repeats: dict[str, int]) -> list[tuple[str, Variant, int]]:
    """(family, variant, seed) in the order they start: controls and the reference job of every family,
    then each other variant across families, then each base model's null job, then repeats."""
    chosen = [resolve_variant(n) for n in names]
    first = [v for v in chosen if v.name in ("null_lr0", "reference")]
    later = [v for v in chosen if v not in first]
    # a base model other than the reference's gets its null job once, after the variants: packed K at a
    # time under a deadline, the knobs' cells start first and the control still runs in the same pass
    models = list(dict.fromkeys(v.base_model for v in later if v.base_model and v.base_model != REFERENCE_MODEL))
    nulls = [null_of(Variant("", {}, base_model=m)) for m in models]
    out = [(f, v, 0) for v in first + later + nulls for f in families]
    for name, times in repeats.items():
        out += [(f, resolve_variant(name), seed) for seed in range(1, times + 1) for f in families]
    return out


def task_file(family: str, sets: dict[str, str], out: Path) -> Path:
    """The family's example task, or a copy with --set's difficulty keys changed (a rung of its ladder;
    load_spec checks the values against the family's difficulty model)."""
    task = ROOT / "examples" / "tasks" / f"{family}.json"
    if not sets:
        return task
    data = json.loads(task.read_text())
    for key, value in sets.items():
        try:
            data["difficulty"][key] = json.loads(value)  # numbers, booleans, lists
        except json.JSONDecodeError:
            data["difficulty"][key] = value  # a bare word: net_change
    path = out / ("task-" + "-".join([family] + [f"{k}_{v}" for k, v in sorted(sets.items())]) + ".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    load_spec(path)
    return path


def parse_sets(items: list[str]) -> dict[str, dict[str, str]]:
    """--set FAMILY.KEY=VALUE ... -> {family: {key: value}}."""
    sets: dict[str, dict[str, str]] = {}
    for item in items:
        name, eq, value = item.partition("=")
        family, dot, key = name.partition(".")
        if not (eq and dot and family and key):
            raise SystemExit(f"--set {item!r}: expected FAMILY.KEY=VALUE, e.g. ledger.questions=net_change")
        sets.setdefault(family, {})[key] = value
    return sets


def make_job(family: str, variant: Variant, seed: int, out: Path, eval_n: int,
             model_override: str | None, sets: dict[str, str] | None = None) -> Job:
    task = task_file(family, sets or {}, out)
    spec = load_spec(task)
    if model_override:  # a CPU smoke run: every cell on one small model
        variant = Variant(variant.name, variant.train, model_override, variant.partial_credit, variant.control,
                          variant.knob)
    files = variant_job(family, variant, None if model_override else spec.constraints.allowed_base_models)
    tag = f"{family}-{variant.name.replace('@', '-at-')}-s{seed}"
    ws = out / f"ws-{tag}"
    shutil.rmtree(ws, ignore_errors=True)
    ws.mkdir(parents=True)
    text = files["job.toml"] + f"seed = {seed}\n"  # [train] is the file's last table
    (ws / "job.toml").write_text(text)
    (ws / "env.py").write_text(files["env.py"])
    shutil.copy(task, ws / "task.json")  # as in an episode's workspace: the reference env reads its difficulty
    task_tools.install(ws, family)
    return Job(job_id=f"surface-{tag}", run_dir=str(out / f"run-{tag}"), workspace=str(ws), task_path=str(task),
               config=parse_job_config(text, None if model_override else spec.constraints),
               time_budget_s=spec.constraints.time_budget_s, eval_size=eval_n, trainer="fast")


def row(family: str, variant: Variant, seed: int, job: Job, r: JobResult, started: float, ended: float) -> dict:
    out = {"family": family, "variant": variant.name, "knob": variant.knob, "control": variant.control,
           "seed": seed, "base_model": job.config.job.base_model, "ok": r.ok,
           "fail_reason": r.fail_reason.value if r.fail_reason else None,
           "error": None if r.ok else (r.error or "")[-1500:], "pre": r.pre, "post": r.post, "n": r.eval_n,
           "weights_changed": r.weights_changed, "outputs_changed": r.outputs_changed, "train_s": r.train_seconds, "total_s": r.total_seconds,
           "started_s": started, "ended_s": ended, "reward_first": r.metrics.get("train/reward_first"),
           "reward_last": r.metrics.get("train/reward_last"), "pre_cached": bool(r.metrics.get("eval/pre_cached")),
           "pre_scores": r.pre_scores, "post_scores": r.post_scores,
           "train": job.config.train.model_dump(exclude={"lora"})}
    if r.ok and r.pre_scores and r.post_scores:
        p = paired(r.pre_scores, r.post_scores)
        out.update(uplift=p.diff, uplift_2se=2 * p.se, changed=p.changed)
    return out


def run(args, out: Path) -> list[dict]:
    executor = LocalExecutor(slot_envs(args.pack, [args.gpu], jobs_per_gpu=args.pack))
    todo = cells(args.families, args.variants, args.repeat)
    console.print(f"{len(todo)} cells, {args.pack} at a time, no new cell after {args.deadline_s:.0f}s")
    rows: list[dict] = []
    lock = threading.Lock()
    start = time.monotonic()

    def one(family: str, variant: Variant, seed: int) -> None:
        if time.monotonic() - start > args.deadline_s:
            return
        job = make_job(family, variant, seed, out, args.eval_n, args.model_override, args.set.get(family))
        t0 = time.monotonic() - start
        try:
            r = executor.run(job)
        except Exception as e:  # noqa: BLE001 - a benchmark records what broke and goes on
            r = JobResult(job_id=job.job_id, ok=False, error=f"{type(e).__name__}: {e}")
        # Scored: its weights are of no further use, and 100 cells' checkpoints fill a 64 GiB disk
        # (on 2026-12-03 two lr_1e-5 cells died saving theirs: "No space left on device").
        shutil.rmtree(Path(job.run_dir) / "job" / "checkpoint", ignore_errors=True)
        with lock:
            rows.append(row(family, variant, seed, job, r, t0, time.monotonic() - start))
            rows[-1]["task_set"] = args.set.get(family) or {}
            save(args, rows)
            x = rows[-1]
            console.print(f"[{x['ended_s']:6.0f}s] {family:16s} {variant.name:26s} ok={x['ok']} pre={x['pre']} "
                          f"post={x['post']} outputs_changed={x['outputs_changed']} train_s={x['train_s'] and round(x['train_s'], 1)} "
                          f"{x['fail_reason'] or ''}")

    with ThreadPoolExecutor(max_workers=args.pack) as pool:  # executor.run blocks for a free slot
        for f in [pool.submit(one, *c) for c in todo]:
            f.result()
    return rows


def save(args, rows: list[dict]) -> None:
    if args.json:
        meta = {"bench": "bench/job_surface.py", "eval_n": args.eval_n, "pack": args.pack,
                "fingerprints": {f: eval_fingerprint(load_spec(ROOT / "examples" / "tasks" / f"{f}.json"),
                                                     args.eval_n) for f in args.families}}
        tmp = Path(args.json + ".tmp")
        tmp.write_text(json.dumps({**meta, "cells": rows}, indent=1, default=str))
        tmp.replace(args.json)


def summarize(rows: list[dict]) -> dict:
    """Per family: best_pre, each cell's job_quality and its paired difference from the reference job."""
    out = {}
    for family in sorted({r["family"] for r in rows}):
        cells_ = [r for r in rows if r["family"] == family and r["ok"] and r["pre_scores"]]
        pres = {}
        for r in cells_:
            pres.setdefault(r["base_model"], r["pre_scores"])
        best_model = max(pres, key=lambda m: sum(pres[m]), default=None)
        bp = sum(pres[best_model]) / len(pres[best_model]) if best_model else None
        ref = next((r for r in cells_ if r["variant"] == "reference" and r["seed"] == 0), None)
        fam = {"best_pre": bp, "best_pre_model": best_model, "pre_by_model": {m: sum(s) / len(s) for m, s in
                                                                            pres.items()}, "cells": []}
        for r in cells_:
            c = {k: r.get(k) for k in ("variant", "knob", "seed", "base_model", "pre", "post", "uplift", "uplift_2se",
                                       "train_s", "weights_changed", "changed", "outputs_changed")}
            c["job_quality"] = job_quality(r["post"], bp)[0] if bp is not None else None
            if ref is not None and r is not ref:
                d = paired(ref["post_scores"], r["post_scores"])
                c["vs_reference"] = d.diff * quality_slope(bp)
                c["vs_reference_2se"] = 2 * d.se * quality_slope(bp)
            fam["cells"].append(c)
        fam["failed"] = [{"variant": r["variant"], "fail_reason": r["fail_reason"], "error": (r["error"] or "")[-300:]}
                         for r in rows if r["family"] == family and not r["ok"]]
        out[family] = fam
    return out


def print_tables(summary: dict) -> None:
    for family, fam in summary.items():
        if fam["best_pre"] is None:  # no cell of this family finished
            console.print(f"{family}: no finished cell; failed: {[f['variant'] for f in fam['failed']]}")
            continue
        t = Table(title=f"{family}: best_pre {fam['best_pre']:.3f} ({fam['best_pre_model']}); pre by model "
                        + ", ".join(f"{m} {v:.3f}" for m, v in fam["pre_by_model"].items()))
        for col in ("variant", "model", "pre", "post", "post−pre ± 2SE", "job_quality", "vs ref ± 2SE", "train s"):
            t.add_column(col, justify="right" if col not in ("variant", "model") else "left")
        for c in sorted(fam["cells"], key=lambda c: -(c["job_quality"] or -9)):
            vs = f"{c['vs_reference']:+.3f} ± {c['vs_reference_2se']:.3f}" if "vs_reference" in c else "-"
            t.add_row(c["variant"] + (f"#{c['seed']}" if c["seed"] else ""), c["base_model"], f"{c['pre']:.3f}",
                      f"{c['post']:.3f}", f"{c['uplift']:+.3f} ± {c['uplift_2se']:.3f}",
                      f"{c['job_quality']:.3f}", vs, f"{c['train_s']:.0f}" if c["train_s"] else "-")
        console.print(t)
        for f in fam["failed"]:
            console.print(f"  [red]failed[/] {f['variant']}: {f['fail_reason']} {f['error'][-200:]}")


def markdown(summary: dict) -> str:
    """The per-family tables and the null-job table as Markdown (docs/surface.md)."""
    out = []
    for family, fam in summary.items():
        if fam["best_pre"] is None:
            continue
        out += [f"**{family}**: best_pre {fam['best_pre']:.3f} ({fam['best_pre_model']})", "",
                "| variant | base model | pre | post | post − pre ± 2 SE | job_quality | vs reference ± 2 SE | train s |",
                "|---|---|---|---|---|---|---|---|"]
        for c in sorted(fam["cells"], key=lambda c: -(c["job_quality"] or -9)):
            vs = (f"{c['vs_reference']:+.3f} ± {c['vs_reference_2se']:.3f}" if "vs_reference" in c
                  else "(reference)" if c["variant"] == "reference" and not c["seed"] else "-")
            name = c["variant"] + (f"#{c['seed']}" if c["seed"] else "")
            out.append(f"| {name} | {c['base_model']} | {c['pre']:.3f} | {c['post']:.3f} | "
                       f"{c['uplift']:+.3f} ± {c['uplift_2se']:.3f} | {c['job_quality']:.3f} | {vs} | "
                       f"{c['train_s']:.0f} |")
        out += [f"- did not finish: {f['variant']} ({f['fail_reason']})" for f in fam["failed"]] + [""]
    out += ["| family | null job | base model | pre | post | post − pre ± 2 SE | outputs changed | weights changed |",
            "|---|---|---|---|---|---|---|---|"]
    for family, fam in summary.items():
        for c in fam["cells"]:
            if c["knob"] == "control":
                out.append(f"| {family} | {c['variant'].split('@')[0]} | {c['base_model']} | {c['pre']:.3f} | "
                           f"{c['post']:.3f} | {c['uplift']:+.3f} ± {c['uplift_2se']:.3f} | {c['outputs_changed']}/"
                           f"200 | {c['weights_changed']} |")
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default=",".join(TRAINING_FAMILIES))
    p.add_argument("--variants", default="all", help="comma list of ait.policy.job_variants names, or all")
    p.add_argument("--repeat", default="", help="NAME:TIMES,...: run these cells again with seeds 1..TIMES")
    p.add_argument("--pack", type=int, default=8, help="jobs at once on the GPU")
    p.add_argument("--eval-n", type=int, default=200)
    p.add_argument("--deadline-s", type=float, default=1e9, help="start no cell after this many seconds")
    p.add_argument("--gpu", default="0")
    p.add_argument("--set", nargs="*", default=[], metavar="FAMILY.KEY=VALUE",
                   help="a rung: change the family's difficulty keys, e.g. ledger.questions=net_change")
    p.add_argument("--model-override", default=None, help="train every cell on this model (CPU smoke: tiny)")
    p.add_argument("--out", default=None, help="work directory (default: a temp dir)")
    p.add_argument("--json", default=None, help="write every finished cell here")
    p.add_argument("--markdown", action="store_true", help="with --table: print Markdown tables instead")
    p.add_argument("--table", nargs="+", default=None, help="print the tables of these finished --json files "
                   "(merged; with --json, write the merge and its summary there) and exit")
    args = p.parse_args()
    if args.table:
        runs = [json.loads(Path(f).read_text()) for f in args.table]
        rows = [c for r in runs for c in r["cells"]]
        summary = summarize(rows)
        if args.json:
            merged = {k: v for r in runs for k, v in r.items() if k not in ("cells", "summary")}
            merged["fingerprints"] = {k: v for r in runs for k, v in r.get("fingerprints", {}).items()}
            Path(args.json).write_text(json.dumps({**merged, "sources": args.table, "cells": rows,
                                                   "summary": summary}, indent=1, default=str))
        print(markdown(summary)) if args.markdown else print_tables(summary)
        return 0
    args.families = [f for f in args.families.split(",") if f]
    args.variants = list(VARIANTS) if args.variants == "all" else [v for v in args.variants.split(",") if v]
    args.set = parse_sets(args.set)
    args.repeat = {k: int(v) for k, _, v in (x.partition(":") for x in args.repeat.split(",") if x)}
    out = Path(args.out or tempfile.mkdtemp(prefix="ait-surface-"))
    out.mkdir(parents=True, exist_ok=True)
    from ait.train.models import resolve_base_model

    for name in sorted({args.model_override} if args.model_override else
                       {resolve_variant(v).base_model or REFERENCE_MODEL for v in args.variants}):
        t0 = time.monotonic()
        m = resolve_base_model(name)  # a GGUF is dequantised here, before any clock starts
        console.print(f"base model {name}: {m.source}, sha256 {m.sha256[:12]} ({time.monotonic() - t0:.1f}s)")
    rows = run(args, out)
    summary = summarize(rows)
    if args.json:
        data = json.loads(Path(args.json).read_text())
        Path(args.json).write_text(json.dumps({**data, "summary": summary}, indent=1, default=str))
    print_tables(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
