"""`ait eval`: benchmark an agent on task families, with error bars; `ait eval compare A B`."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ait.cli import common
from ait.cli.common import console, err, fail, load_task

HELP = """Benchmark an agent: N episodes per task, run concurrently (inner jobs through the executor),
then per task and overall the mean and two standard errors of the reward and each component,
the valid rate, job failures, base-model choice, tokens, USD and time (infra errors counted
apart). Writes OUT/results.json and OUT/report.html; `--resume OUT` finishes an eval that was
killed or interrupted without running its finished episodes again.

    ait eval --policy reference --tasks calc_chain_fast dispatch --episodes 2
    ait eval compare OUT_A OUT_B        per-task differences with their noise, paired by episode
                                        where both evals played the same ones
"""


class Stoppable:
    """A policy that ends its episode at the next turn once the eval is stopping (Ctrl-C)."""

    def __init__(self, inner, stopping: threading.Event):
        self.inner, self.stopping = inner, stopping
        self.name, self.settings = inner.name, getattr(inner, "settings", {})

    def reset(self, spec) -> None:
        self.inner.reset(spec)

    def act(self, messages, tools):
        from ait.harness.types import PolicyStop, StopReason

        if self.stopping.is_set():
            raise PolicyStop(StopReason.interrupted, "the eval was interrupted")
        return self.inner.act(messages, tools)


def all_tasks() -> list[str]:
    """One shipped spec per family (the family's own name; variants such as calc_chain_fast left out)."""
    from ait.families import FAMILIES
    from ait.tasks import SHIPPED

    return [f for f in sorted(FAMILIES) if (SHIPPED / f"{f}.json").is_file()]


def eval_command(ctx: typer.Context,
                 policy: str = typer.Option("reference", help="The agent: reference[:N], openai:MODEL or hf:PATH."),
                 base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible endpoint of an openai: policy."),
                 tasks: list[str] = typer.Option(None, "--tasks", help="Task names or paths (more may follow as "
                                                 "arguments), or `all`: one per family."),
                 episodes: int = typer.Option(2, min=1, max=1000, help="Episodes per task."),
                 concurrency: int = typer.Option(1, min=1, max=64, help="Episodes at once."),
                 executor: Optional[str] = typer.Option(None, help="How inner jobs run: inline (default), queue, local or ray."),
                 budget_usd: Optional[float] = typer.Option(None, min=0.0, help="Stop starting episodes past this."),
                 eval_size: Optional[int] = typer.Option(None, min=1, help="Hidden examples per job."),
                 temperature: Optional[float] = typer.Option(None, min=0.0, max=2.0, help="LLM sampling temperature."),
                 max_tokens: Optional[int] = typer.Option(None, min=1, help="Most tokens an LLM policy may reply with."),
                 request_timeout: Optional[float] = typer.Option(None, min=0.1, help="Seconds an openai: request may "
                                                                 "take before it is retried (default 120)."),
                 salvage_tool_calls: bool = typer.Option(False, "--salvage-tool-calls", help="openai: read tool calls "
                                                         "a model writes as text (bare JSON, <tool_call> tags)."),
                 config: Optional[Path] = typer.Option(None, help="EpisodeConfig TOML for every episode (as `ait "
                                                       "episode --config`); the flags override it."),
                 max_turns: Optional[int] = typer.Option(None, min=1, max=1000, help="Policy turns per episode "
                                                         "(default 40)."),
                 episode_timeout: Optional[float] = typer.Option(None, min=1.0, help="Wall-clock limit per episode "
                                                                 "(seconds; scored as it stood)."),
                 out: Optional[Path] = typer.Option(None, help="Output directory (default runs/eval-<time>)."),
                 resume: Optional[Path] = typer.Option(None, help="Finish the eval in this directory (its plan)."),
                 as_json: bool = typer.Option(False, "--json", help="Print results.json instead of the table.")) -> None:
    extra = list(ctx.args)
    if extra[:1] == ["compare"]:
        if len(extra) != 3:
            fail("usage: ait eval compare OUT_A OUT_B")
        compare_command(Path(extra[1]), Path(extra[2]), as_json)
        return
    if extra and any(a.startswith("-") for a in extra):
        fail(f"unknown option {next(a for a in extra if a.startswith('-'))} (see `ait eval --help`)")
    from pydantic import ValidationError

    from ait.agent_eval.types import EvalPlan

    if resume is not None:
        plan, out = load_plan(resume), resume
    else:
        names = [t for group in (tasks or []) + extra for t in group.split(",") if t]
        names = all_tasks() if names in ([], ["all"]) else names
        from ait.configs import ConfigError, load_config
        from ait.harness.types import EpisodeConfig

        try:
            episode_cfg = load_config(config, EpisodeConfig) if config else None
            plan = EvalPlan(policy=policy, base_url=base_url, temperature=temperature, max_tokens=max_tokens,
                            request_timeout_s=request_timeout, salvage_tool_calls=salvage_tool_calls, tasks=names,
                            episodes=episodes, concurrency=concurrency, executor=executor, budget_usd=budget_usd,
                            eval_size=eval_size, max_turns=max_turns, episode_timeout_s=episode_timeout,
                            episode=episode_cfg)
        except ConfigError as e:
            fail(str(e))
        except ValidationError as e:
            from ait.cli.episode import flag_errors

            fail(flag_errors(e))
        out = out or Path("runs") / f"eval-{time.strftime('%Y%m%d-%H%M%S')}"
        if (out / "plan.json").exists() and load_plan(out) != plan:
            fail(f"{out} holds another eval's plan: pick a new --out, or --resume {out}")
    run_plan(plan, out, as_json)


def policy_factory(plan):
    """(a fresh policy per episode, what to call when the eval is over). A local model (hf:) is loaded
    once, here, and every episode's policy shares it and its sampling engine: loading it from several
    threads at once races on torch's process-wide default dtype (seen on an H200: bf16 and fp32 weights
    mixed in one model, "mat1 and mat2 must have the same dtype"), one copy of the weights serves every
    episode, and one engine decodes their replies together."""
    first = plan.make()  # an EvalPlan is the PolicySettings `ait episode` reads too
    close = getattr(first, "close", lambda: None)
    if problem := getattr(first, "preflight", lambda: None)():  # an openai: endpoint that cannot serve
        close()
        raise ValueError(problem)
    if plan.policy.startswith("hf:"):
        from ait.policy.hf_policy import HFPolicy

        name, loaded = plan.policy.split(":", 1)[1], (first.model, first.tokenizer)
        return (lambda: HFPolicy(name, loaded=loaded, temperature=first.temperature,
                                 max_new_tokens=first.max_new_tokens, engine=first.engine)), close
    return plan.make, close


def load_plan(out: Path):
    from pydantic import ValidationError

    from ait.agent_eval.types import EvalPlan

    try:
        return EvalPlan.model_validate_json((out / "plan.json").read_text())
    except FileNotFoundError:
        fail(f"{out} holds no eval (no plan.json): pass the directory an `ait eval` wrote")
    except (ValidationError, ValueError) as e:
        fail(f"{out / 'plan.json'} is not an eval plan: {str(e).splitlines()[0]}")


def run_plan(plan, out: Path, as_json: bool) -> None:
    from ait.agent_eval.report import write_eval_report
    from ait.agent_eval.runner import finished, run_eval
    from ait.cli.episode import progress_reporter, writable_dir
    from ait.compute.executors import make_executor
    from ait.harness.episode import run_episode
    from ait.sandbox import SandboxUnavailable, require_isolation

    specs = [load_task(t) for t in plan.tasks]
    close_policy = lambda: None  # noqa: E731
    try:
        new_policy, close_policy = policy_factory(plan)  # fails now, not once per episode
        require_isolation()
    except (ValueError, SandboxUnavailable) as e:
        close_policy()
        fail(str(e))
    writable_dir(out, "--out")
    (out / "plan.json").write_text(plan.model_dump_json(indent=2))
    done = sum(finished(out / "runs" / f"{spec.id}-{i:03d}") is not None for spec, _ in specs
               for i in range(plan.episodes))
    if done:
        err.print(f"resuming: {done} of {len(specs) * plan.episodes} episodes already finished in "
                  f"{escape(str(out))}", highlight=False, soft_wrap=True)

    config = plan.episode_config()
    stopping = threading.Event()
    try:
        jobs = make_executor(config)  # one pool for every episode of the eval (they run at once)
    except RuntimeError as e:  # e.g. --executor ray without Ray installed
        close_policy()
        fail(str(e))

    def play(spec, path, runs, run_id):
        return run_episode(spec, path, Stoppable(new_policy(), stopping), config, runs_dir=runs, run_id=run_id,
                           executor=jobs)

    try:
        with progress_reporter(f"eval of {plan.policy}: {len(specs)} task(s) x {plan.episodes}",
                               quiet=as_json) as report:
            results = run_eval(plan, specs, out, play, on_event=report, stopping=stopping)
    except KeyboardInterrupt:
        common.interrupt_reported = True
        err.print(f"[yellow]interrupted[/]: finished episodes kept in {escape(str(out))}; "
                  f"`ait eval --resume {escape(str(out))}` runs the rest", highlight=False, soft_wrap=True)
        raise typer.Exit(130) from None
    finally:
        jobs.close()
        close_policy()
    report: Path | None = None
    try:
        report = write_eval_report(results, out / "report.html")
    except RuntimeError as e:  # the plots failed: the table and results.json still stand
        err.print(f"[yellow]no report.html[/]: {escape(str(e))}", highlight=False)
    if as_json:
        print(results.model_dump_json(indent=2))
    else:
        print_results(results, out, report)
    if results.stopped:
        raise typer.Exit(1)


def print_results(results, out: Path, report: Path | None) -> None:
    """The summary table and where the files are; `report` None: no report was written (never named)."""
    from ait.agent_eval.report import fmt

    table = Table("task", "n", "infra", "reward", "validation", "job quality", "uplift", "speed", "valid rate",
                  "job failures", "USD", title=f"{escape(results.plan.policy)}: mean±2SE", title_justify="left")
    for name, s in [*results.per_task.items(), ("all tasks", results.overall)]:
        table.add_row(escape(name), str(s.episodes), str(s.infra_errors), fmt(s.reward), fmt(s.validation),
                      fmt(s.job_quality), fmt(s.uplift_term), fmt(s.train_speed), fmt(s.valid_rate),
                      fmt(s.job_failure_rate), f"{s.usd:.4f}")
    wide = console if console.is_terminal else Console(width=200)  # a log keeps the whole table
    wide.print(table)
    models = ", ".join(f"{escape(m)} {v:.0%}" for m, v in results.overall.base_models.items()) or "-"
    stops = ", ".join(f"{k} {v}" for k, v in results.overall.stop_reasons.items())
    console.print(f"base models: {models}; stop reasons: {stops}; tokens {results.overall.prompt_tokens:,} prompt, "
                  f"{results.overall.completion_tokens:,} completion; wall per episode "
                  f"{(results.overall.wall_s.mean or 0):.1f}s", highlight=False)
    if left := results.overall.best_pre_left_out:  # the rewards' scale depends on what this install has
        names = ", ".join(sorted(left))
        console.print(f"best_pre left out {len(left)} allowed model(s) here: {escape(names)} "
                      "(results.json says why)", highlight=False, soft_wrap=True)
    state = f"stopped ({results.stopped}) after {len(results.episodes)} of {results.planned}" if results.stopped \
        else f"{len(results.episodes)} episodes"
    where = f"results in {escape(str(out / 'results.json'))}"
    where += f", report in {escape(str(report))}" if report else " (no report.html)"
    console.print(f"{state}; {where}", highlight=False)


def compare_command(a_dir: Path, b_dir: Path, as_json: bool) -> None:
    from ait.agent_eval.compare import compare, different_best_pre, pairing, same_evaluation
    from ait.agent_eval.types import EvalResults

    loaded = []
    for d in (a_dir, b_dir):
        try:
            loaded.append(EvalResults.model_validate_json((d / "results.json").read_text()))
        except (OSError, ValueError) as e:
            fail(f"{d / 'results.json'} cannot be read as eval results ({type(e).__name__})")
    if why := different_best_pre(*loaded):
        fail(f"cannot compare: {why}")
    diffs = compare(*loaded)
    warnings = [w for w in [same_evaluation(*loaded, a_dir, b_dir)] if w]
    for w in warnings:  # on stderr in both modes: --json's stdout stays one document
        err.print(f"[yellow]warning:[/] {escape(w)}", highlight=False, soft_wrap=True)
    if as_json:
        print(json.dumps({"warnings": warnings, "differences": [d.model_dump() for d in diffs]}, indent=2))
        return
    table = Table("task", "quantity", "A", "B", "B − A", "± 2 SE", "verdict", "compared",
                  title=f"A = {escape(loaded[0].plan.policy)} ({escape(str(a_dir))}), "
                        f"B = {escape(loaded[1].plan.policy)} ({escape(str(b_dir))})", title_justify="left")
    for d in diffs:
        table.add_row(escape(d.task), d.key, signed(d.a), signed(d.b), signed(d.delta),
                      "-" if d.noise is None else f"{d.noise:.3f}", d.verdict, pairing(d))
    (console if console.is_terminal else Console(width=200)).print(table)
    overall = diffs[-1]  # "all tasks"
    how = (f"paired by episode (task, run id) over {overall.pairs} pairs"
           + (f", {overall.left_out} episode(s) without a partner left out" if overall.left_out else "")
           if overall.paired else "unpaired (no common episodes to pair): independent samples, Welch SE")
    console.print(f"all tasks {how}; 2 SE never below the binomial 2 SE at p = 1/(2n)", highlight=False,
                  soft_wrap=True)


def signed(x: float | None) -> str:
    return "-" if x is None else f"{x:+.3f}"
