"""Calibrate family difficulty to real base models: untrained hidden-eval scores per level.

    python bench/calibrate.py --model qwen2.5-coder-0.5b --model smollm2-135m \
        [--family calc_chain ...] [--n 200] [--out docs/calibration.json]

For each family, levels run from hardest (the current default) to easiest; the first
model given is the reference: the ladder stops at the hardest level where its score is
at least --low, and that level is chosen (0.2-0.7 is the target band). Every model is
then scored at the chosen level. Scores use the hidden eval's own code (greedy,
family tools, family scorer) with the weights untrained. Prints a table and writes JSON
with n, the seed's fingerprint and each level's knobs; `--store FILE` also freezes the
chosen level's scores into a baselines store file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoModelForCausalLM, AutoTokenizer

from ait.evals.baselines import Baseline, BaselineStore, scoring_setup
from ait.evals.hidden import eval_fingerprint, hidden_examples
from ait.evals.hidden_eval import score
from ait.families import FAMILIES
from ait.spec import Constraints, build_spec
from ait.chat.renderers import prepare_tokenizer
from ait.train.models import resolve_base_model

# Easiest first; the family's current default is always appended as the hardest level. The
# `inline` rungs state the tools' data in the question: the models in scope (0.1-0.5B) cannot yet
# drive multi-turn tool use, and scored 0.0 on every tools-only rung of these families.
LADDERS: dict[str, list[dict]] = {
    "calc_chain": [{"n_ops": 1, "operators": "+", "operand_max": 99}, {"n_ops": 1, "operators": "+-*", "operand_max": 99},
                   {"n_ops": 2, "operators": "+-", "operand_max": 50}, {"n_ops": 2, "operators": "+-", "operand_max": 99},
                   {"n_ops": 2, "operators": "+-*", "operand_max": 99}, {"n_ops": 3, "operators": "+-*", "operand_max": 99}],
    "multi_hop": [{"hops": 1, "n_people": 8, "n_relations": 2, "n_attributes": 2, "n_similar": 0, "inline": True},
                  {"hops": 2, "n_people": 8, "n_relations": 2, "n_attributes": 2, "n_similar": 0, "inline": True},
                  {"hops": 2, "n_people": 12, "n_relations": 2, "n_attributes": 2, "n_similar": 4, "inline": True},
                  {"hops": 1, "n_people": 8, "n_similar": 0}, {"hops": 1, "n_people": 16, "n_similar": 2},
                  {"hops": 1, "n_people": 24, "n_similar": 4}, {"hops": 2, "n_people": 12, "n_similar": 2}],
    "string_pipeline": [{"n_transforms": 1, "min_length": 4, "max_length": 6, "ops": ["reverse", "upper", "lower"],
                         "inline": True},
                        {"n_transforms": 1, "min_length": 6, "max_length": 10, "ops": ["reverse", "upper", "lower"],
                         "inline": True},
                        {"n_transforms": 1, "min_length": 6, "max_length": 10, "inline": True},
                        {"n_transforms": 2, "min_length": 6, "max_length": 10, "inline": True},
                        {"n_transforms": 1, "min_length": 6, "max_length": 10},
                        {"n_transforms": 1, "min_length": 10, "max_length": 16},
                        {"n_transforms": 2, "min_length": 8, "max_length": 12},
                        {"n_transforms": 2, "min_length": 10, "max_length": 16}],
    "ledger": [{"n_accounts": 2, "min_transactions": 1, "max_transactions": 2, "fee_frequency": 0.0,
                "overdraft_probability": 0.0, "questions": "balance", "inline": True},
               {"n_accounts": 2, "min_transactions": 2, "max_transactions": 4, "fee_frequency": 0.0,
                "overdraft_probability": 0.0, "questions": "balance", "inline": True},
               {"n_accounts": 2, "min_transactions": 4, "max_transactions": 6, "fee_frequency": 0.0,
                "overdraft_probability": 0.1, "questions": "balance,net_change", "inline": True},
               {"n_accounts": 2, "min_transactions": 2, "max_transactions": 4, "fee_frequency": 0.0,
                "overdraft_probability": 0.0, "questions": "balance"},
               {"n_accounts": 2, "min_transactions": 4, "max_transactions": 6, "fee_frequency": 0.0,
                "overdraft_probability": 0.1, "questions": "balance,net_change"},
               {"n_accounts": 3, "min_transactions": 4, "max_transactions": 6},
               {"n_accounts": 3, "min_transactions": 6, "max_transactions": 8}],
    "dispatch": [{"n_rules": 2, "conditions_per_rule": 1, "n_attributes": 2, "near_misses": 0, "inline": True},
                 {"n_rules": 3, "conditions_per_rule": 2, "n_attributes": 3, "near_misses": 1, "inline": True},
                 {"n_rules": 5, "conditions_per_rule": 3, "n_attributes": 5, "near_misses": 2, "inline": True},
                 {"n_rules": 2, "conditions_per_rule": 1, "near_misses": 0},
                 {"n_rules": 3, "conditions_per_rule": 1, "near_misses": 0},
                 {"n_rules": 3, "conditions_per_rule": 2, "near_misses": 1},
                 {"n_rules": 4, "conditions_per_rule": 2, "near_misses": 1},
                 {"n_rules": 5, "conditions_per_rule": 3, "near_misses": 2}],
    "triage": [{"n_services": 4, "depth": 1, "n_distractor_deploys": 1, "n_background_deploys": 0, "log_noise": 0,
                "inline": True},
               {"n_services": 5, "depth": 1, "n_distractor_deploys": 2, "n_background_deploys": 1, "log_noise": 0,
                "inline": True},
               {"n_services": 5, "depth": 2, "n_distractor_deploys": 2, "n_background_deploys": 1, "log_noise": 1,
                "inline": True},
               {"n_services": 4, "depth": 1, "n_distractor_deploys": 1, "n_background_deploys": 0, "log_noise": 0},
               {"n_services": 4, "depth": 1, "n_distractor_deploys": 1, "n_background_deploys": 1, "log_noise": 1},
               {"n_services": 4, "depth": 1, "n_distractor_deploys": 2, "n_background_deploys": 1, "log_noise": 1},
               {"n_services": 5, "depth": 2, "n_distractor_deploys": 2, "n_background_deploys": 2, "log_noise": 1}],
}

CONSTRAINTS = Constraints(allowed_base_models=["tiny"], max_steps=1, max_group_size=2, max_prompts_per_step=1,
                          max_completion_tokens=8, max_turns=1, time_budget_s=1, min_dataset_rows=1,
                          max_dataset_rows=1)


def levels(family: str) -> list[dict]:
    """Hardest first: the default, then the ladder from its hardest rung down (each validated)."""
    f = FAMILIES[family]
    default = f.difficulty().model_dump()
    out = [default] + [f.difficulty(knobs).model_dump() for knobs in reversed(LADDERS.get(family, []))]
    unique = []
    for d in out:
        if d not in unique:
            unique.append(d)
    return unique


class Scorer:
    def __init__(self, name: str):
        self.name = name
        self.resolved = resolve_base_model(name)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(self.resolved.path, dtype=dtype).to(device).eval()
        self.tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(self.resolved.path))

    def __call__(self, family: str, difficulty: dict, n: int) -> tuple[float, str, float]:
        spec = build_spec(family, difficulty=difficulty, constraints=CONSTRAINTS)
        t = time.monotonic()
        value, _ = score(self.model, self.tokenizer, spec, hidden_examples(spec, n), 256)
        return value, eval_fingerprint(spec, n), time.monotonic() - t


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", required=True, help="first = reference model for the choice")
    p.add_argument("--family", action="append", help="default: all six")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--low", type=float, default=0.2)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--store", default=None, help="freeze the chosen level's scores into this baselines file")
    args = p.parse_args()
    console = Console(width=160)
    families = args.family or sorted(FAMILIES)
    scorers = [Scorer(m) for m in args.model]
    ref, others = scorers[0], scorers[1:]
    results = {"n": args.n, "models": {s.name: {"source": s.resolved.source, "sha256": getattr(s.resolved, "sha256", None)}
                                       for s in scorers}, "families": {}}
    for family in families:
        tried = []
        chosen = None
        for level, knobs in enumerate(levels(family)):
            value, fp, secs = ref(family, knobs, args.n)
            tried.append({"difficulty": knobs, "score": value, "seconds": secs})
            console.print(f"{family} level -{level}: {ref.name} {value:.3f} ({secs:.1f}s) {knobs}")
            chosen = {"difficulty": knobs, "fingerprint": fp, "scores": {ref.name: value}}
            if value >= args.low:
                break
        for s in others:
            value, _, secs = s(family, chosen["difficulty"], args.n)
            chosen["scores"][s.name] = value
            console.print(f"{family} chosen level: {s.name} {value:.3f} ({secs:.1f}s)")
        results["families"][family] = {"tried": tried, "chosen": chosen}
        if args.store:
            store = BaselineStore(args.store)
            by_name = {s.name: s.resolved for s in scorers}
            spec = build_spec(family, difficulty=chosen["difficulty"], constraints=CONSTRAINTS)
            for model, value in chosen["scores"].items():
                store.freeze(Baseline(family=family, base_model=model, weights_sha256=by_name[model].sha256,
                                      fingerprint=chosen["fingerprint"], setup=scoring_setup(spec, by_name[model].path),
                                      best_pre=value, n=args.n), force=True)
    table = Table(title=f"untrained hidden-eval score at the chosen difficulty (n={args.n})")
    table.add_column("family")
    for s in scorers:
        table.add_column(s.name, justify="right")
    table.add_column("difficulty")
    for family, r in results["families"].items():
        c = r["chosen"]
        table.add_row(family, *[f"{c['scores'][s.name]:.3f}" for s in scorers], json.dumps(c["difficulty"]))
    console.print(table)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
