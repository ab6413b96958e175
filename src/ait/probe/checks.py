"""The probe's verdict: trusted checks over the child's observations (no agent code here)."""

from __future__ import annotations

from ait.probe.types import Observations, ProbeCheck, ProbeError
from ait.spec import TaskSpec

MAX_ERRORS = 8
MIN_DISTINCT_FRACTION = 0.9  # near-duplicate datasets teach little and inflate dataset_size


def verdict(obs: Observations, spec: TaskSpec, dataset_size: int) -> list[ProbeError]:
    errors: list[ProbeError] = []

    def add(check: ProbeCheck, message: str) -> None:
        errors.append(ProbeError(check=check, message=message))

    if obs.import_error:
        add(ProbeCheck.env_import, obs.import_error)
        return errors
    for problem in obs.surface_errors:
        add(ProbeCheck.surface, problem)
    if obs.surface_errors:
        return errors[:MAX_ERRORS]

    check_tools(obs, spec, add)
    check_dataset(obs, spec, dataset_size, add)
    check_rewards(obs, add)
    if obs.dry_run_error and not errors:  # only news when everything else passed
        add(ProbeCheck.dry_run, f"dry-run rollout with the tiny model: {obs.dry_run_error}")
    return errors[:MAX_ERRORS]


def check_tools(obs: Observations, spec: TaskSpec, add) -> None:
    wanted = {t.name: t for t in spec.eval_format.tools}
    missing = sorted(set(wanted) - set(obs.tool_names))
    extra = sorted(set(obs.tool_names) - set(wanted))
    if missing:
        add(ProbeCheck.tools, f"Environment lacks tool(s) {missing}: define a method for each tool in task.json")
    if extra:
        add(ProbeCheck.tools, f"Environment has public method(s) {extra} that are not tools in task.json: "
            "rename them with a leading underscore or remove them")
    for t in obs.tools:
        if t.name not in wanted:  # observations are untrusted: ignore names the spec does not have
            continue
        expected = [p.name for p in wanted[t.name].parameters]
        if t.parameters != expected:
            add(ProbeCheck.tools, f"tool {t.name} takes {t.parameters}; task.json's interface is {expected}")
            continue
        if t.schema_error:
            add(ProbeCheck.tools, f"tool {t.name}: no JSON schema can be built ({t.schema_error}); give every "
                "parameter a type hint and document it in an Args: section of the docstring")
        if t.error:
            add(ProbeCheck.tool_call, f"tool {t.name}(**{wanted[t.name].example}) raised {t.error}")
        elif t.result_type not in ("str", "int", "float"):
            add(ProbeCheck.tool_call, f"tool {t.name} returned {t.result_type}; return text (a str)")


def check_dataset(obs: Observations, spec: TaskSpec, dataset_size: int, add) -> None:
    c = spec.constraints
    if obs.dataset_error:
        add(ProbeCheck.dataset, f"build_dataset({dataset_size}, seed) failed: {obs.dataset_error}")
        return
    for problem in obs.dataset_malformed:
        add(ProbeCheck.dataset, f"malformed {problem}")
    if obs.dataset_count != dataset_size:
        add(ProbeCheck.dataset, f"build_dataset({dataset_size}, seed) returned {obs.dataset_count} rows; "
            f"return exactly n rows")
    if obs.dataset_wellformed < c.min_dataset_rows:
        add(ProbeCheck.dataset, f"only {obs.dataset_wellformed} well-formed rows; the task needs at least "
            f"{c.min_dataset_rows}")
    if obs.dataset_wellformed and obs.dataset_distinct < MIN_DISTINCT_FRACTION * obs.dataset_wellformed:
        add(ProbeCheck.dataset, f"only {obs.dataset_distinct} distinct prompts among {obs.dataset_wellformed} "
            f"rows; at least {MIN_DISTINCT_FRACTION:.0%} must be distinct")


def check_rewards(obs: Observations, add) -> None:
    if not obs.rewards:
        return  # no rows to score with: the dataset errors already say why
    varied = False
    for r in obs.rewards:
        if r.errors:
            add(ProbeCheck.reward, f"reward {r.name} raised {r.errors[0]} on a sample completion")
        if r.bad_values:
            add(ProbeCheck.reward, f"reward {r.name} {r.bad_values[0]}; return a float in [0, 1]")
        if r.values and max(r.values) - min(r.values) > 1e-9:
            varied = True
    if not varied and all(not r.errors and not r.bad_values for r in obs.rewards):
        add(ProbeCheck.reward, "every reward function returned the same value for right, wrong and empty "
            "completions: a constant reward gives GRPO no signal")
