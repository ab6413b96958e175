"""`ait tasks`: list, show and sample task specs."""

from __future__ import annotations

import json

import typer
from rich.markup import escape
from rich.table import Table

from ait.cli.common import err, console, fail, load_task, tasks_dirs

app = typer.Typer(help="List and inspect task specs.", no_args_is_help=True)


@app.command("list")
def tasks_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the shipped task specs."""
    from ait.families import FAMILIES
    from ait.spec import SpecError, load_spec

    seen, rows = set(), []
    for d in tasks_dirs():
        for p in sorted(d.glob("*.json")):
            if p.stem in seen:
                continue
            seen.add(p.stem)
            try:
                s = load_spec(p)
            except SpecError as e:  # one broken file in a tasks dir does not hide the others
                err.print(f"[yellow]skipped[/] {escape(str(e))}", highlight=False, soft_wrap=True)
                continue
            rows.append({"name": p.stem, "family": s.family, "held_out": FAMILIES[s.family].held_out,
                         "path": str(p), "models": s.constraints.allowed_base_models})
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table("name", "family", "held out", "base models", "path")
    for r in rows:
        table.add_row(r["name"], r["family"], "yes" if r["held_out"] else "", ", ".join(r["models"]), r["path"])
    console.print(table)


@app.command("show")
def tasks_show(name: str, as_json: bool = typer.Option(False, "--json", help="Print the TaskSpec JSON.")) -> None:
    """Show one task spec: description, eval format, constraints, dev examples."""
    spec, path = load_task(name)
    if as_json:
        print(spec.model_dump_json(indent=2))
        return
    console.print(f"[bold]{spec.id}[/] ({spec.family}) — {path}\n{spec.description}\n")
    console.print(f"[bold]difficulty[/] {spec.difficulty}")
    console.print(f"[bold]system prompt[/] {spec.eval_format.system_prompt}")
    for t in spec.eval_format.tools:
        params = ", ".join(f"{p.name}: {p.type}" for p in t.parameters)
        console.print(f"[bold]tool[/] {t.name}({params}) — {t.description}")
    console.print(f"[bold]answer format[/] {spec.eval_format.answer_format}")
    console.print(f"[bold]constraints[/] {spec.constraints.model_dump()}")
    from ait.train.models import model_availability

    for model in spec.constraints.allowed_base_models:  # the probe rejects a job on one that is not
        why = model_availability(model)
        state = "[green]available here[/]" if why is None else f"[yellow]not available here[/]: {escape(why)}"
        console.print(f"[bold]base model[/] {escape(model)} — {state}")
    for ex in spec.dev_examples:
        console.print(f"[dim]dev[/] {ex.prompt} → {ex.answer}")


@app.command("sample")
def tasks_sample(family: str = typer.Argument(..., help="Family name (see `ait tasks list`)."),
                 n: int = typer.Option(3, "--n", min=1, max=100, help="How many examples."),
                 seed: int = typer.Option(0, help="Generator seed (public; never the hidden one)."),
                 as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Print generated examples with their gold tool trace (each call and what the tool returned)."""
    import random

    from ait.families import get_family

    try:
        fam = get_family(family)
    except KeyError as e:
        fail(str(e.args[0]))
    rng, d = random.Random(seed), fam.difficulty()
    samples = []
    for _ in range(n):
        ex = fam.example(rng, d)
        trace = [{"tool": c.name, "arguments": c.arguments, "result": fam.call_tool(ex.world, c)}
                 for c in fam.gold_trace(ex)]
        samples.append({"prompt": ex.prompt, "answer": ex.answer, "trace": trace})
    if as_json:
        print(json.dumps(samples, indent=2))
        return
    for i, s in enumerate(samples, 1):
        console.print(f"[bold]#{i}[/] {s['prompt']}", highlight=False)
        for step in s["trace"]:
            args = ", ".join(f"{k}={v!r}" for k, v in step["arguments"].items())
            console.print(f"   {step['tool']}({args}) → {step['result']}", highlight=False)
        console.print(f"   [green]Answer: {s['answer']}[/]\n", highlight=False)
