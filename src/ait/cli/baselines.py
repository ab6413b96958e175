"""`ait baselines`: frozen untrained scores."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from ait.cli.common import console, err, fail, load_task

app = typer.Typer(help="Frozen untrained scores (best_pre) per family and base model.", no_args_is_help=True)


@app.command("seed")
def baselines_seed(task: list[str] = typer.Option(..., "--task", help="TaskSpec path or name (repeatable)."),
                   model: list[str] = typer.Option(None, "--model", help="Base model (repeatable; default: all allowed)."),
                   eval_size: Optional[int] = typer.Option(None, help="Hidden examples (default: the spec's)."),
                   force: bool = typer.Option(False, "--force", help="Re-measure and replace frozen entries.")) -> None:
    """Measure and freeze best_pre for every task × base model given."""
    from rich.progress import Progress

    from ait.evals.baselines import Baseline, BaselineStore, scoring_setup
    from ait.evals.hidden import eval_fingerprint
    from ait.evals.hidden_eval import scoring_code_digest

    store = BaselineStore()
    pairs = []
    for t in task:
        spec, path = load_task(t)
        for m in model or spec.constraints.allowed_base_models:
            pairs.append((spec, path, m))
    from ait.evals.runner import EvalFailed, scratch_eval
    from ait.train.models import ModelResolutionError, resolve_base_model

    failures = 0
    code = scoring_code_digest()
    with Progress(console=err) as progress:
        bar = progress.add_task("seeding baselines", total=len(pairs))
        for spec, path, m in pairs:
            n = eval_size or spec.hidden_eval_size
            fingerprint = eval_fingerprint(spec, n)
            try:
                model = resolve_base_model(m)
                setup = scoring_setup(spec, model.path, code)
                frozen = store.get(spec.family, model.sha256, fingerprint, setup)
                if frozen and not force:
                    console.print(f"{spec.family} × {m}: frozen at {frozen.best_pre:.4f} (n={frozen.n}); "
                                  "--force re-measures")
                else:
                    report = scratch_eval(spec, model, n=n)
                    b = store.freeze(Baseline(family=spec.family, base_model=m, weights_sha256=model.sha256,
                                              fingerprint=fingerprint, setup=setup, best_pre=report.pre, n=n),
                                     force=force)
                    console.print(f"{spec.family} × {m}: best_pre {b.best_pre:.4f} (n={n}) frozen")
            except (ModelResolutionError, EvalFailed) as e:
                failures += 1
                err.print(f"[red]{spec.family} × {escape(m)}: {escape(str(e).strip().splitlines()[-1])}[/]",
                          highlight=False)
            progress.advance(bar)
    if failures:
        fail(f"{failures} of {len(pairs)} baselines were not measured (see above)")


@app.command("show")
def baselines_show(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show the frozen baselines table."""
    from ait.evals.baselines import BaselineStore

    store = BaselineStore()
    try:
        entries = store.all()
    except ValueError as e:
        fail(str(e))
    if as_json:
        print(json.dumps([b.model_dump() for b in entries], indent=2))
        return
    table = Table("family", "base model", "weights", "untrained score", "n", "hidden set", "scoring setup",
                  title=str(store.path))
    for b in entries:
        table.add_row(b.family, escape(b.base_model), (b.weights_sha256 or "(legacy, unused)")[:12],
                      f"{b.best_pre:.4f}", str(b.n), b.fingerprint, b.setup or "(legacy, unused)")
    console.print(table)
