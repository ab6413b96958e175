"""Running N episodes per task, concurrently, resumably, within a budget.

    OUT/plan.json            the plan (a resume must run the same one)
    OUT/runs/<task>-<i>/     each episode's run directory (episode.json once it finished)
    OUT/runs/costs.jsonl     the ledger every episode writes (and the budget is read from)
    OUT/results.json         the summaries, written when the eval stops

An episode is identified by its place in the plan (`<task>-<i>`): a resumed eval keeps every
episode whose episode.json says it finished and runs the others again from scratch (a run
directory left without one, by a SIGKILL say, is removed first).
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

from ait.agent_eval.stats import summarize
from ait.agent_eval.types import EpisodeRow, EvalPlan, EvalResults
from ait.harness.types import EpisodeResult
from ait.spec import TaskSpec

Play = Callable[[TaskSpec, Path, Path, str], EpisodeResult]
"""play(spec, task_path, runs_dir, run_id) -> the finished episode's result."""


def row_of(result: EpisodeResult) -> EpisodeRow:
    r, job = result.reward, result.job
    return EpisodeRow(task_id=result.task_id, run_id=result.run_id, stop_reason=result.stop_reason.value,
                      infra_error=result.stop_reason.value == "infra_error", reward=r.total, validation=r.validation,
                      job_quality=r.job_quality, uplift_term=r.uplift_term, train_speed=r.train_speed,
                      valid=r.valid_attempt is not None, job_ran=job is not None,
                      job_failed=job is not None and not job.ok, base_model=job.base_model if job else None,
                      prompt_tokens=result.cost.prompt_tokens, completion_tokens=result.cost.completion_tokens,
                      usd=result.cost.total_usd, wall_s=result.wall_seconds,
                      best_pre_models=sorted(result.baseline.scores) if result.baseline else None,
                      best_pre_left_out=dict(result.baseline.excluded) if result.baseline else {})


def finished(run_dir: Path) -> EpisodeRow | None:
    """The row of an episode that ran to its end (an interrupted one is run again)."""
    try:
        result = EpisodeResult.model_validate_json((run_dir / "episode.json").read_text())
    except (OSError, ValueError):
        return None
    return None if result.stop_reason.value == "interrupted" else row_of(result)


def warm_imports() -> None:
    """Import what episodes import, once, before several threads run them: transformers resolves its
    names lazily, and two threads importing at once can see a half-built module (an ImportError of
    `PreTrainedTokenizerFast` was seen that way)."""
    import transformers

    for name in ("PreTrainedTokenizerFast", "AutoTokenizer", "AutoModelForCausalLM", "AutoConfig"):
        getattr(transformers, name)
    import ait.evals.best_pre  # noqa: F401
    import ait.probe.runner  # noqa: F401
    import ait.train.tiny  # noqa: F401


def ledger_usd(path: Path) -> float:
    try:
        return sum(json.loads(line).get("usd") or 0.0 for line in path.read_text().splitlines() if line.strip())
    except (OSError, ValueError):
        return 0.0


def run_eval(plan: EvalPlan, specs: list[tuple[TaskSpec, Path]], out: Path, play: Play,
             on_event: Callable[[str], None] = lambda _m: None,
             stopping: threading.Event | None = None) -> EvalResults:
    """Every planned episode not yet finished in `out`, `plan.concurrency` at a time; stops starting
    new ones once the ledger reaches the budget. Ctrl-C (KeyboardInterrupt) stops it: `stopping` is
    set (the policies `play` makes end their episodes at the next turn, as interrupted), the jobs
    in flight are killed, finished episodes stay, the others run again on a resume, and the
    partial results are written before the interrupt goes on."""
    stopping = stopping or threading.Event()
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    slots = [(spec, path, f"{spec.id}-{i:03d}") for spec, path in specs for i in range(plan.episodes)]
    rows: dict[str, EpisodeRow] = {}
    todo = []
    for spec, path, run_id in slots:
        row = finished(runs / run_id)
        if row is not None:
            rows[run_id] = row
        else:
            shutil.rmtree(runs / run_id, ignore_errors=True)  # a dead attempt's leftovers
            todo.append((spec, path, run_id))
    stopped: str | None = None
    lock = threading.Lock()

    def over_budget() -> bool:
        return plan.budget_usd is not None and ledger_usd(runs / "costs.jsonl") >= plan.budget_usd

    if plan.concurrency > 1 and todo:
        warm_imports()
    pool = ThreadPoolExecutor(max_workers=plan.concurrency, thread_name_prefix="ait-eval")
    running: dict[Future, str] = {}
    try:
        queue = list(todo)
        while queue or running:
            while queue and len(running) < plan.concurrency and not stopped:
                if over_budget():
                    stopped = "budget"
                    on_event(f"budget of ${plan.budget_usd:g} reached: no new episodes")
                    break
                spec, path, run_id = queue.pop(0)
                running[pool.submit(play, spec, path, runs, run_id)] = run_id
            if not running:
                break
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in done:
                run_id = running.pop(fut)
                result = fut.result()  # an episode never raises on its own; a bug should be seen
                with lock:
                    rows[run_id] = row_of(result)
                on_event(f"{len(rows)}/{len(slots)} {run_id}: {result.stop_reason.value}, "
                         f"reward {result.reward.total:+.3f}")
            if stopped:
                queue.clear()
    except KeyboardInterrupt:
        from ait.compute import processes

        stopped = "interrupted"
        stopping.set()
        processes.kill_all()
        on_event(f"interrupted: stopping {len(running)} running episode(s)")
        for fut in wait(list(running), timeout=120).done:
            try:
                fut.result()  # recorded as interrupted: run again on a resume
            except BaseException:  # noqa: BLE001 - the interrupt is what matters now
                pass
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        results = build_results(plan, rows, specs, len(slots), stopped)
        (out / "results.json").write_text(results.model_dump_json(indent=2))
    return results


def build_results(plan: EvalPlan, rows: dict[str, EpisodeRow], specs: list[tuple[TaskSpec, Path]], planned: int,
                  stopped: str | None) -> EvalResults:
    ordered = sorted(rows.values(), key=lambda r: r.run_id)
    per_task = {spec.id: summarize([r for r in ordered if r.task_id == spec.id]) for spec, _ in specs}
    return EvalResults(plan=plan, per_task=per_task, overall=summarize(ordered), episodes=ordered, planned=planned,
                       stopped=stopped)
