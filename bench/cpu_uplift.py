"""Does a real model get better in the default episode's job? Pre, post and their paired difference on the
hidden eval, for one task and the job the reference agent writes for it, with the seconds it took.

    python bench/cpu_uplift.py [--task smollm2_upper] [--n 200] [--json out.json]
        [--set KNOB=VALUE ...] [--train KEY=VALUE ...] [--base-model M] [--seed S] [--device cpu|auto]
        [--threads T]

The job (job.toml and env.py, as the reference agent writes them for the task: ait.policy.job_variants.agent_job)
runs through run_job, as in an episode: the sandboxed training process, then the sandboxed hidden eval of the
base weights (pre) and the trained checkpoint (post) on the same n hidden examples. Prints pre, post, post − pre
± 2 SE (paired, per example: ait.evals.paired), n, the hidden set's fingerprint (never its seed), train seconds
(the trainer's own clock over its steps), total seconds (run_job's clock: process starts, model loads, training,
both evals) and this script's wall time. --set and --train turn a knob of the task or of the job (a sweep);
--device cpu hides the GPU (the default on a machine without one); --threads is the CPU share the job's two
processes split (default: every usable core, as an episode gives them). The untrained score is cached in
AIT_HOME after the first run on a hidden set: later runs' total seconds leave pre out (cached_pre says so).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def with_knobs(spec, knobs: dict):
    """The spec at other difficulty knobs (a sweep's rung), rebuilt by its family as scripts/make_task_specs.py does."""
    from ait.spec import build_spec

    return build_spec(spec.family, task_id=spec.id, difficulty={**spec.difficulty, **knobs},
                      constraints=spec.constraints, hidden_eval_size=spec.hidden_eval_size)


def with_train(job_toml: str, overrides: dict) -> str:
    """job.toml with [train] keys set (replaced in place, or appended: [train] is the file's last table)."""
    from ait.policy.job_variants import toml_value

    for key, value in overrides.items():
        line = f"{key} = {toml_value(value)}"
        job_toml, n = re.subn(rf"^{re.escape(key)}\s*=.*$", line, job_toml, count=1, flags=re.MULTILINE)
        if n == 0:
            job_toml = job_toml.rstrip("\n") + f"\n{line}\n"
    return job_toml


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default=None, help="a TaskSpec path or name (default: the default episode's task)")
    p.add_argument("--n", type=int, default=None, help="hidden examples (default: the spec's hidden_eval_size)")
    p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE", help="a difficulty knob (JSON value)")
    p.add_argument("--train", action="append", default=[], metavar="KEY=VALUE", help="a job.toml [train] key")
    p.add_argument("--base-model", default=None, help="the model the reference agent trains (default: its choice)")
    p.add_argument("--seed", type=int, default=None, help="the job's training seed (default: the job's own)")
    p.add_argument("--device", choices=["cpu", "auto"], default="cpu")
    p.add_argument("--threads", type=int, default=None, help="CPU threads the job may use (default: all usable)")
    p.add_argument("--label", default="", help="a name for this run in the JSON")
    p.add_argument("--json", default=None, help="write the result (per-example scores included) here")
    p.add_argument("--keep", default=None, help="keep the run directory here (default: deleted)")
    args = p.parse_args(argv)
    t_start = time.monotonic()

    from ait.cli.episode import default_task
    from ait.compute.run_job import run_job, usable_cores
    from ait.evals.hidden import eval_fingerprint
    from ait.evals.paired import paired
    from ait.job import task_tools
    from ait.job.config import parse_job_config
    from ait.job.types import Job
    from ait.policy.job_variants import agent_job
    from ait.cli.common import find_task
    from ait.spec import load_spec

    task_path = find_task(args.task or default_task()[0])
    spec = load_spec(task_path)
    knobs = {k: parse_value(v) for k, v in (kv.partition("=")[::2] for kv in args.set)}
    train = {k: parse_value(v) for k, v in (kv.partition("=")[::2] for kv in args.train)}
    if args.seed is not None:
        train["seed"] = args.seed
    if knobs:
        spec = with_knobs(spec, knobs)
    n = args.n or spec.hidden_eval_size
    variant, model, files = agent_job(spec.family, spec.constraints, base_model=args.base_model, task_id=spec.id)
    job_toml = with_train(files["job.toml"], train)

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="cpu-uplift-"))
    work.mkdir(parents=True, exist_ok=True)
    ws, run_dir = work / "workspace", work / "run"
    shutil.rmtree(ws, ignore_errors=True)
    ws.mkdir(parents=True)
    spec_path = work / "task.json"
    spec_path.write_text(spec.model_dump_json(indent=2))
    (ws / "task.json").write_text(spec.model_dump_json(indent=2))  # the reference env reads its knobs
    (ws / "job.toml").write_text(job_toml)
    (ws / "env.py").write_text(files["env.py"])
    task_tools.install(ws, spec.family)
    config = parse_job_config(job_toml, spec.constraints)
    job = Job(job_id=f"cpu-uplift-{int(time.time())}", run_dir=str(run_dir), workspace=str(ws), task_path=str(spec_path),
              config=config, time_budget_s=spec.constraints.time_budget_s, eval_size=n, trainer="fast")
    env = {"CUDA_VISIBLE_DEVICES": ""} if args.device == "cpu" else {}
    threads = args.threads or usable_cores()
    env["OMP_NUM_THREADS"] = str(threads)
    fingerprint = eval_fingerprint(spec, n)
    import tomllib

    print(f"{spec.id} ({spec.family} {json.dumps(spec.difficulty)}), job {variant} on {model}: "
          f"{json.dumps(tomllib.loads(job_toml)['train'])}; n = {n}, hidden set {fingerprint}, {threads} threads, "
          f"device {args.device}", flush=True)
    load_before = os.getloadavg()
    r = run_job(job, extra_env=env)
    wall = time.monotonic() - t_start
    host = {"cpus": os.cpu_count(), "usable_cores": usable_cores(), "loadavg_before": load_before,
            "loadavg_after": os.getloadavg()}  # a shared machine's other work shows here
    out = {"label": args.label, "task": spec.id, "family": spec.family, "difficulty": spec.difficulty,
           "base_model": model, "job_toml": job_toml, "n": n, "fingerprint": fingerprint, "threads": threads,
           "device": args.device, "host": host, "ok": r.ok, "fail_reason": r.fail_reason.value if r.fail_reason else None,
           "error": None if r.ok else (r.error or "")[-2000:], "pre": r.pre, "post": r.post,
           "train_seconds": r.train_seconds, "total_seconds": r.total_seconds, "wall_seconds": wall,
           "cached_pre": bool(r.metrics.get("eval/pre_cached")), "outputs_changed": r.outputs_changed,
           "reward_first": r.metrics.get("train/reward_first"), "reward_last": r.metrics.get("train/reward_last"),
           "metrics": {k: v for k, v in r.metrics.items() if k.startswith(("train/", "eval/"))},
           "pre_scores": r.pre_scores, "post_scores": r.post_scores}
    if r.ok and r.pre_scores and r.post_scores:
        d = paired(r.pre_scores, r.post_scores)
        out.update(diff=d.diff, diff_2se=2 * d.se, changed=d.changed, beyond_noise=d.beyond_noise)
        print(f"pre {r.pre:.3f}  post {r.post:.3f}  post - pre {d.diff:+.3f} ± {2 * d.se:.3f} (2 SE, paired, n = {d.n}; "
              f"{'beyond' if d.beyond_noise else 'within'} noise)  hidden set {fingerprint}  train {r.train_seconds:.0f} s  "
              f"total {r.total_seconds:.0f} s{' (pre cached)' if out['cached_pre'] else ''}  wall {wall:.0f} s", flush=True)
    else:
        print(f"job failed ({out['fail_reason']}): {out['error']}", file=sys.stderr, flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if r.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
