"""Write src/ait/tasks/*.json (examples/tasks links there) from the families (the committed files are this script's output).

    python scripts/make_task_specs.py            # rewrite them
    python scripts/make_task_specs.py --check    # exit 1 if any committed file differs
"""

from __future__ import annotations

import sys
from pathlib import Path

from ait.families import FAMILIES
from ait.spec import Constraints, build_spec

OUT = Path(__file__).resolve().parents[1] / "src" / "ait" / "tasks"
MODELS = ["tiny", "smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B"]
CPU_TASK = "calc_chain_cpu"
CPU_RUNG = {"n_ops": 1, "operators": "+", "operand_max": 9, "calculator": False}
CPU_EVAL_N = 100
CPU_BUDGET_S = 900.0


def constraints(time_budget_s: float = 600.0) -> Constraints:
    return Constraints(allowed_base_models=MODELS, max_steps=200, max_group_size=16, max_prompts_per_step=16,
                       max_completion_tokens=512, max_turns=8, time_budget_s=time_budget_s,
                       min_dataset_rows=32, max_dataset_rows=20_000)


def specs() -> dict[str, str]:
    # Each family at its calibrated rung (Family.calibrated): weak but not hopeless for the base
    # models in scope, so an untrained score leaves room for uplift.
    out = {name: build_spec(name, difficulty=dict(f.calibrated) or None, constraints=constraints())
           for name, f in FAMILIES.items()}
    # A fast variant for smoke runs: shorter chains, a smaller hidden set, a tighter budget.
    out["calc_chain_fast"] = build_spec("calc_chain", task_id="calc_chain_fast", difficulty={"n_ops": 2},
                                        constraints=constraints(time_budget_s=120.0), hidden_eval_size=64)
    # The default episode (`ait episode` with no --task): a real model that gets better on a laptop's CPU.
    # SmolLM2-135M-Instruct adds single digits right but never writes the Answer line; no calculator is
    # offered (with one listed it writes code instead of answering), and the prompts stay short, since a
    # CPU pays for every prompt token of every rollout (docs/cpu-learning.md).
    out[CPU_TASK] = build_spec("calc_chain", task_id=CPU_TASK, difficulty=CPU_RUNG, hidden_eval_size=CPU_EVAL_N,
                               constraints=constraints(time_budget_s=CPU_BUDGET_S).model_copy(
                                   update={"allowed_base_models": ["smollm2-135m", "tiny"]}))
    return {name: spec.model_dump_json(indent=2) + "\n" for name, spec in out.items()}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, text in specs().items():
        path = OUT / f"{name}.json"
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale task specs (run scripts/make_task_specs.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
