"""Recompute an episode's reward from its run directory and the baselines store, without ait's code.

    python scripts/recompute_reward.py RUN_DIR [--baselines FILE] [--json]

Reads only plain files: RUN_DIR/episode.json (submissions, the scored job, the hidden set's
fingerprint), RUN_DIR/job_result.json (the scored job's result), RUN_DIR/manifest.json (the
reward weights), RUN_DIR/workspace/task.json (allowed base models, time budget, attempts) and
the baselines store (default RUN_DIR/../baselines.json, else AIT_HOME's). It implements the
reward as DESIGN.md states it, independently of ait.reward, prints each component beside the
recorded one, and exits 1 if any differs. A job that died (not an infra failure) is scored by the
manifest's [reward] dead_job rule: "zero" (the default, and the only rule of runs recorded before it
existed) or "untrained" (post = the job's own pre, else its base model's frozen baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

EPS = 1e-6


def clip(x: float, lo: float, hi: float) -> float:
    return max(lo, min(hi, x))


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def scores_from_store(store: dict, family: str, fingerprint: str, allowed: list[str], excluded: list[str],
                      setups: dict | None = None) -> dict:
    """The allowed models' (those this install had) frozen untrained scores on the set, each under the
    scoring setup the episode recorded for it (`setups`; runs recorded before setups existed name
    none); best_pre is their max."""
    scores: dict[str, float] = {}
    for b in store.get("baselines", []):
        if b.get("family") != family or b.get("fingerprint") != fingerprint or not b.get("weights_sha256"):
            continue
        name = b["base_model"]
        if name not in allowed or name in excluded or (setups and b.get("setup") != setups.get(name)):
            continue
        if name in scores and scores[name] != b["best_pre"]:
            raise SystemExit(f"the store holds two scores for {name} on this set (re-pointed weights?): "
                             "pass a store with one")
        scores[name] = b["best_pre"]
    return scores


def recompute(run_dir: Path, store: dict) -> dict:
    episode = load(run_dir / "episode.json")
    job = load(run_dir / "job_result.json") if (run_dir / "job_result.json").exists() else None
    weights = load(run_dir / "manifest.json")["config"]["reward"]
    spec = load(run_dir / "workspace" / "task.json")
    K = spec["max_submission_attempts"]
    subs = episode["submissions"]
    parseable = any(s["parseable"] for s in subs)
    valid = [s["attempt"] for s in subs if s["report"]["valid"]]
    k = min(valid) if valid else None
    if not parseable:
        return {"total": weights["no_submission"]}
    validation = 1.0 - (k - 1) / K if k else 0.0
    baseline = episode.get("baseline") or {}  # recorded for a finished job, and a dead one under "untrained"
    scores = {}
    if job and baseline:
        scores = scores_from_store(store, spec["family"], baseline["fingerprint"],
                                   spec["constraints"]["allowed_base_models"], list(baseline.get("excluded", {})),
                                   baseline.get("setups"))
        if missing := sorted(set(baseline.get("scores", {})) - set(scores)):  # the store cannot say
            setups = baseline.get("setups") or {}
            raise SystemExit("cannot recompute: the baselines store holds no frozen score for "
                             + ", ".join(f"{m} (setup {setups.get(m, '?')})" for m in missing)
                             + f" on hidden set {baseline['fingerprint']}, which the episode's best_pre used; "
                             "pass the store it was scored with (--baselines)")
    best_pre = max(scores.values()) if scores else None
    quality = speed = uplift = 0.0
    post = job["post"] if job and job["ok"] else None
    if post is not None and best_pre is not None:
        uplift = clip((post - best_pre) / max(1.0 - best_pre, EPS), -1.0, 1.0)
        quality = 0.25 * post + 0.75 * uplift
        if job.get("train_seconds") is not None:
            speed = clip(1.0 - job["train_seconds"] / spec["constraints"]["time_budget_s"], 0.0, 1.0)
    rule = dead_post = None
    if job and not job["ok"] and job.get("fail_reason") != "infra":  # the job died: its own doing
        rule = "zero"
        pre = job["pre"] if job.get("pre") is not None else scores.get(job.get("base_model"))
        if weights.get("dead_job", "zero") == "untrained" and pre is not None and best_pre is not None:
            rule, dead_post = "untrained", pre  # scored as if it had not trained; no speed credit
            uplift = clip((pre - best_pre) / max(1.0 - best_pre, EPS), -1.0, 1.0)
            quality = 0.25 * pre + 0.75 * uplift
    total = weights["validation"] * validation + weights["job_quality"] * quality + weights["train_speed"] * speed
    return {"total": total, "validation": validation, "job_quality": quality, "train_speed": speed,
            "uplift_term": uplift, "post": post, "best_pre": best_pre, "dead_job_rule": rule,
            "dead_job_post": dead_post}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--baselines", type=Path, default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    store_path = args.baselines or next((c for c in (args.run_dir.parent / "baselines.json",
                                                     Path(os.environ.get("AIT_HOME", Path.home() / ".ait"))
                                                     / "baselines.json") if c.exists()), None)
    store = load(store_path) if store_path else {"baselines": []}
    mine = recompute(args.run_dir, store)
    recorded = load(args.run_dir / "episode.json")["reward"]
    if "dead_job_rule" not in recorded:  # recorded before the rule was: it could only be "zero"
        mine = {k: v for k, v in mine.items() if not k.startswith("dead_job")}
    mismatches = {k: (v, recorded.get(k)) for k, v in mine.items() if recorded.get(k) != v}
    if args.json:
        print(json.dumps({"recomputed": mine, "recorded": {k: recorded.get(k) for k in mine},
                          "store": str(store_path), "match": not mismatches}, indent=2))
    else:
        for key, value in mine.items():
            flag = "" if recorded.get(key) == value else f"   MISMATCH: recorded {recorded.get(key)!r}"
            print(f"{key:<12} {value!r}{flag}")
        print("match: exact" if not mismatches else f"match: NO ({len(mismatches)} differ)")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
