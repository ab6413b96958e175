"""How much the warm-started agent's jobs differ inside a group: the spread the outer GRPO step learns from.

    python bench/warmstart_spread.py --config configs/outer/h200_qwen15.toml --episodes 16
    python bench/warmstart_spread.py --config configs/outer/cpu_tiny.toml --episodes 4 \\
        --warm-steps 4 --max-new-tokens 256                   # the CPU smoke check: about 5 minutes

Builds the config's warm start (ait.outer.warmstart.build_warm_start, cached under AIT_HOME/warmstart),
then plays N episodes of every training task with the warm-started policy, as the outer loop plays a
group (ait.outer.rollouts.play: real probes, real inner jobs, the config's [episode] table and
sampling temperature), and reports per task (one outer group):

    submitted          episodes that called submit_job; their last submission's job.toml is the job
    distinct_triples   distinct (base model, learning rate, max steps) among those jobs
    within_group_std   population std of the group's job_quality (all N episodes)

--variants-per-task 0 builds the warm start of before the job variants (the reference job alone), for a
before/after comparison on the same seeds. Prints a table and writes it all as JSON (--out). On CPU the
tiny agent's jobs mostly fail validation: that is counted, not hidden.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ait.configs import load_config
from ait.outer.backends import make_backend
from ait.outer.config import OuterConfig
from ait.outer.executors import job_executor
from ait.outer.loop import episode_config, resolve_tasks
from ait.outer.rollouts import play
from ait.outer.spread import job_spread
from ait.outer.tasks import training_tasks
from ait.outer.warmstart import build_warm_start


def submitted_job(run_dir: Path, attempts: int) -> str | None:
    """The job.toml of the episode's last submission (what it ran, or would have run), if any."""
    if not attempts:
        return None
    path = run_dir / "submissions" / str(attempts) / "workspace" / "job.toml"
    return path.read_text(errors="replace") if path.is_file() else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="an outer config TOML (configs/outer/*.toml)")
    p.add_argument("--episodes", type=int, default=16, help="episodes per training task (one group)")
    p.add_argument("--warm-steps", type=int, default=None, help="SFT steps (default: [warmstart] steps, else 20)")
    p.add_argument("--variants-per-task", type=int, default=None,
                   help="override [warmstart] variants_per_task (0: the reference job alone)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="override [policy] max_new_tokens (cpu_tiny's 32 fits no reference turn)")
    p.add_argument("--tasks", nargs="*", default=None, help="task ids to play (default: every training task)")
    p.add_argument("--out", default="runs/warmstart-spread", help="directory: episodes/ and spread.json")
    args = p.parse_args()

    config = load_config(args.config, OuterConfig)
    if args.max_new_tokens:
        config = config.model_copy(update={"policy": config.policy.model_copy(
            update={"max_new_tokens": args.max_new_tokens})})
    w = config.warmstart
    steps = args.warm_steps if args.warm_steps is not None else (w.steps or 20)
    per_task = args.variants_per_task if args.variants_per_task is not None else w.variants_per_task
    tasks = [(s, path) for s, path in training_tasks(resolve_tasks(config.tasks))
             if not args.tasks or s.id in args.tasks]
    if not tasks:
        print("no training task selected", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    t0 = time.monotonic()
    warm = build_warm_start(config, [s for s, _ in tasks], steps=steps, learning_rate=w.learning_rate,
                            batch_size=w.batch_size, base_models=w.base_models, variants_per_task=per_task,
                            per_model_variant=w.model_variant_transcripts)
    note = json.loads((warm / "warmstart.json").read_text())
    print(f"warm start {warm} ({time.monotonic() - t0:.0f} s): {len(note.get('variants', []))} transcripts, "
          f"{note['examples']} examples, loss {note['loss_first']} -> {note['loss_last']}")
    config = config.model_copy(update={"policy": config.policy.model_copy(update={"init_checkpoint": str(warm)})})
    executor, config = job_executor(config, print)
    backend = make_backend(config)
    episodes_cfg = episode_config(config, out)
    stopping = threading.Event()

    def one(group: int, member: int, spec, path) -> tuple[str, object]:
        seed = (config.seed * 1_000_003 + group * 1009 + member) % 2**63  # as GroupSampler seeds a member
        run_id = f"{spec.id}-{member:03d}-{secrets.token_hex(2)}"
        return spec.id, play(backend, spec, path, episodes_cfg, out / "episodes", run_id, seed, stopping,
                             executor=executor)

    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=config.concurrency) as pool:
            futures = [pool.submit(one, k, m, spec, path)
                       for k, (spec, path) in enumerate(tasks) for m in range(args.episodes)]
            played = [f.result() for f in futures]
    finally:
        backend.close()
        executor.close()
    wall = time.monotonic() - t0

    report = {"config": args.config, "episodes_per_task": args.episodes, "warm_start": str(warm),
              "warm_start_note": note, "wall_s": round(wall, 1), "tasks": {}}
    for spec, _ in tasks:
        results = [e.result for tid, e in played if tid == spec.id]
        jobs = [j for r in results if (j := submitted_job(Path(r.run_dir), len(r.submissions))) is not None]
        quality = [r.reward.job_quality for r in results]
        row = job_spread(jobs, {spec.id: quality})
        row.update(family=spec.family, episodes=len(results), submitted=len(jobs),
                   valid=sum(any(s.report.valid for s in r.submissions) for r in results),
                   job_quality_mean=sum(quality) / len(quality) if quality else None,
                   reward_mean=sum(r.reward.total for r in results) / len(results) if results else None,
                   stop_reasons=sorted({r.stop_reason.value for r in results}))
        report["tasks"][spec.id] = row
    every = [j for tid, e in played if (j := submitted_job(Path(e.result.run_dir), len(e.result.submissions)))]
    report["overall"] = job_spread(every, {tid: [e.result.reward.job_quality for t, e in played if t == tid]
                                           for tid in report["tasks"]})
    (out / "spread.json").write_text(json.dumps(report, indent=2, default=str) + "\n")

    print(f"{'task':<18} {'family':<16} {'eps':>4} {'subm':>5} {'valid':>5} {'triples':>7} {'jq std':>7}")
    for tid, r in report["tasks"].items():
        std = "-" if r["within_group_std"] is None else f"{r['within_group_std']:.3f}"
        print(f"{tid:<18} {r['family']:<16} {r['episodes']:>4} {r['submitted']:>5} {r['valid']:>5} "
              f"{r['distinct_triples']:>7} {std:>7}")
    o = report["overall"]
    std = "-" if o["within_group_std"] is None else f"{o['within_group_std']:.3f}"
    print(f"overall: {o['jobs']} submitted jobs, {o['distinct_triples']} distinct triples, mean within-group "
          f"std of job_quality {std}; {wall:.0f} s of episodes -> {out / 'spread.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
