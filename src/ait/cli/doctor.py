"""`ait doctor`: what this host can do (sandbox layers, devices, versions)."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from ait.cli.common import console


def doctor(as_json: bool = typer.Option(False, "--json", help="Print JSON."),
           refresh: bool = typer.Option(False, "--refresh", help="Detect again instead of using the cache.")) -> None:
    """Show which sandbox layers are active here, and why the others are not."""
    from ait.runs import versions
    from ait.sandbox import unsafe_allowed
    from ait.sandbox.detect import cached_capabilities

    import json

    from ait.sandbox.types import FILESYSTEM_LAYERS

    from ait.home import HomeError, ait_home

    caps = cached_capabilities(refresh=refresh)
    missing = [layer for layer in caps.layers if layer.name in FILESYSTEM_LAYERS and not layer.active]
    try:
        home = {"path": str(ait_home()), "ok": True, "problem": None}
    except HomeError as e:
        home = {"path": None, "ok": False, "problem": e.strerror}
    verdict = "runs" if caps.isolating else ("runs unconfined (--unsafe-no-sandbox)" if unsafe_allowed() else "refused")
    if as_json:
        print(json.dumps({**caps.model_dump(), "agent_code": verdict, "ait_home": home,
                          "filesystem_layers_missing": {layer.name: layer.detail for layer in missing}}, indent=2))
        return
    table = Table("layer", "active", "isolating", "detail", title=f"sandbox on kernel {caps.kernel}")
    for layer in caps.layers:
        table.add_row(layer.name, "[green]yes[/]" if layer.active else "[red]no[/]",
                      "yes" if layer.isolating else "", layer.detail)
    console.print(table)
    why = "; ".join(f"{layer.name}: {layer.detail}" for layer in missing)
    if caps.isolating:
        console.print("[green]agent code runs confined on this host[/]"
                      + (f" (missing, not needed: {escape(why)})" if missing else ""))
    elif unsafe_allowed():
        console.print(f"[yellow]no layer confines the file system ({escape(why)}); running agent code anyway "
                      "(--unsafe-no-sandbox)[/]")
    else:
        console.print(f"[red]no layer confines the file system ({escape(why)}): agent code is refused unless "
                      "--unsafe-no-sandbox is given. Landlock needs Linux >= 5.13 with landlock in the LSM list; "
                      "a private root needs mount and PID namespaces (root, or unprivileged user namespaces).[/]")
    if home["ok"]:
        console.print(f"AIT_HOME {escape(home['path'])} is writable")
    else:
        console.print(f"[red]{escape(home['problem'])}[/] (episodes, workers and baselines need it)")
    v = versions()
    console.print("versions: " + ", ".join(f"{k} {v[k]}" for k in ("python", "torch", "transformers", "trl")))
