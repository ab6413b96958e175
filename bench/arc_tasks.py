"""Task specs and an outer config for a short GPU arc, at the difficulty a calibration chose.

    python bench/arc_tasks.py --calibration CAL.json --config configs/outer/h200_mini.toml \
        --out-dir /root/results/arc-tasks [--max-steps 30] [--time-budget 180]

Writes one TaskSpec per family in the config (examples/tasks/<family>.json rebuilt at the
calibration's chosen difficulty, so the inner jobs train problems the base models can
partly solve and uplift is measurable), with the inner-job bounds tightened so an outer step
fits a short GPU lease, and a copy of the outer config whose `tasks` / `heldout_tasks` point
at them. Prints the new config's path.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path

from ait.spec import build_spec, load_spec


def calibrated_spec(task_path: Path, chosen: dict | None, max_steps: int, time_budget: float):
    spec = load_spec(task_path)
    constraints = spec.constraints.model_copy(update={"max_steps": min(spec.constraints.max_steps, max_steps),
                                                      "time_budget_s": min(spec.constraints.time_budget_s, time_budget)})
    difficulty = chosen if chosen is not None else spec.difficulty
    return build_spec(spec.family, task_id=spec.id, difficulty=difficulty, constraints=constraints)


def toml_value(v) -> str:
    return json.dumps(v)  # strings, numbers, booleans and lists of them read the same in TOML


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calibration", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--max-steps", type=int, default=30)
    p.add_argument("--time-budget", type=float, default=180.0)
    args = p.parse_args()
    cal = json.loads(Path(args.calibration).read_text())["families"]
    config_path = Path(args.config)
    text = config_path.read_text()
    config = tomllib.loads(text)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    new = {}
    for key in ("tasks", "heldout_tasks"):
        paths = []
        for task in config.get(key, []):
            spec = load_spec(Path(task))
            chosen = cal.get(spec.family, {}).get("chosen", {}).get("difficulty")
            spec = calibrated_spec(Path(task), chosen, args.max_steps, args.time_budget)
            path = out / Path(task).name
            path.write_text(spec.model_dump_json(indent=2))
            paths.append(str(path.resolve()))
            print(f"{spec.family}: {spec.difficulty}")
        new[key] = paths
    lines = text.splitlines()
    body = []
    skipping = False
    for line in lines:  # drop the top-level tasks/heldout_tasks entries (possibly multi-line lists)
        stripped = line.strip()
        if not skipping and any(stripped.startswith(f"{k} ") or stripped.startswith(f"{k}=") for k in new):
            skipping = not stripped.rstrip().endswith("]") or stripped.count("[") > stripped.count("]")
            continue
        if skipping:
            skipping = not stripped.endswith("]")
            continue
        body.append(line)
    head = [f"{k} = {toml_value(v)}" for k, v in new.items()]
    config_out = out / config_path.name
    config_out.write_text("\n".join(head + body) + "\n")
    tomllib.loads(config_out.read_text())  # still valid TOML
    print(config_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
