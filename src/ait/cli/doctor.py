"""`ait doctor`: what this host can do (sandbox layers, devices, versions)."""

from __future__ import annotations

import typer
from rich.table import Table

from ait.cli.common import console


def doctor(as_json: bool = typer.Option(False, "--json", help="Print JSON."),
           refresh: bool = typer.Option(False, "--refresh", help="Detect again instead of using the cache.")) -> None:
    """Show which sandbox layers are active here, and why the others are not."""
    from ait.runs import versions
    from ait.sandbox import unsafe_allowed
    from ait.sandbox.detect import cached_capabilities

    caps = cached_capabilities(refresh=refresh)
    if as_json:
        print(caps.model_dump_json(indent=2))
        return
    table = Table("layer", "active", "isolating", "detail", title=f"sandbox on kernel {caps.kernel}")
    for layer in caps.layers:
        table.add_row(layer.name, "[green]yes[/]" if layer.active else "[red]no[/]",
                      "yes" if layer.isolating else "", layer.detail)
    console.print(table)
    if caps.isolating:
        console.print("[green]agent code runs isolated on this host[/]")
    elif unsafe_allowed():
        console.print("[yellow]no isolating layer; running agent code anyway (--unsafe-no-sandbox)[/]")
    else:
        console.print("[red]no isolating layer: agent code will be refused unless --unsafe-no-sandbox is given[/]")
    v = versions()
    console.print("versions: " + ", ".join(f"{k} {v[k]}" for k in ("python", "torch", "transformers", "trl")))
