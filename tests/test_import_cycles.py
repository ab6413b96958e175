"""No import cycles in src/ait, counting the imports inside functions.

A function-local import only hides a cycle until the day someone hoists it: the graph here
has an edge for every `import` and `from ... import` anywhere in a module's source (module
level, functions, `if TYPE_CHECKING:` blocks alike). Names are resolved the way Python
resolves them: relative imports against the importing module's package, `from pkg import
name` to the submodule `pkg.name` when one exists (else to `pkg`), `import a.b.c` to the
longest prefix that is a module of ait. Importing a submodule also runs its parent
packages' `__init__`; those implicit edges are not counted (every package whose `__init__`
imports a submodule would otherwise be a cycle), so a package `__init__` that pulls in a
module which imports the package back by name is still caught, through that explicit edge.

Reading source with `ast` imports nothing, so this runs in well under a second.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "ait"



def import_origin(node: ast.ImportFrom, here: str) -> str:
    """The absolute module a `from ... import` names, its dots resolved against `here` (the package the
    importing module sits in)."""
    if not node.level:
        return node.module or ""
    base = here
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{node.module}" if node.module else base

def modules(src: Path = SRC, package: str = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's __init__)."""
    found = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def import_graph(src: Path = SRC, package: str = PACKAGE) -> dict[str, dict[str, list[int]]]:
    """module -> {imported module of the package -> line numbers of the imports}."""
    mods = modules(src, package)

    def owner(name: str) -> str | None:  # the longest prefix of `name` that is one of our modules
        while name:
            if name in mods:
                return name
            name = name.rpartition(".")[0]
        return None

    graph: dict[str, dict[str, list[int]]] = {}
    for name, (path, is_package) in mods.items():
        here = name if is_package else name.rpartition(".")[0]
        targets: list[tuple[str, int]] = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets += [(alias.name, node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                origin = import_origin(node, here)
                for alias in node.names:
                    sub = f"{origin}.{alias.name}"
                    targets.append((sub if sub in mods else origin, node.lineno))
        edges = graph.setdefault(name, {})
        for target, line in targets:
            resolved = owner(target)
            if resolved is None or resolved == name:
                continue  # outside ait, or a module naming itself
            lines = edges.setdefault(resolved, [])
            if line not in lines:
                lines.append(line)
    return graph


def find_cycles(graph: dict[str, dict[str, list[int]]]) -> list[tuple[list[str], list[str]]]:
    """Per strongly connected component of more than one module: one shortest cycle through it,
    as a closed path [a, ..., a], and all its members."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan; the graph is a few hundred modules, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)

    cycles = []
    for component in components:
        members = set(component)
        start = min(component)
        # the shortest way back to `start` inside the component (breadth-first)
        came_from: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in came_from:
            nxt = []
            for v in frontier:
                for w in sorted(graph.get(v, {})):
                    if w in members and w not in came_from:
                        came_from[w] = v
                        nxt.append(w)
            frontier = nxt
        path = [start]
        while (prev := came_from[path[-1]]) != start:
            path.append(prev)
        cycles.append(([start, *reversed(path[1:]), start], sorted(component)))
    return cycles


def describe(cycle: list[str], members: list[str], graph: dict[str, dict[str, list[int]]]) -> str:
    lines = [f"  {a} -> {b}  (line {', '.join(map(str, graph[a][b]))})" for a, b in zip(cycle, cycle[1:])]
    if len(members) > len(cycle) - 1:
        lines.append(f"  (one cycle of several among: {', '.join(members)})")
    return "\n".join(lines)


def test_the_graph_sees_every_kind_of_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import A\n")
    (pkg / "a.py").write_text("A = 1\ndef f():\n    from . import b\n")
    (pkg / "b.py").write_text("from pkg.sub import c\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("import pkg.sub.d as d\n")
    (pkg / "sub" / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import A\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg"] == {"pkg.a": [1]}
    assert graph["pkg.a"] == {"pkg.b": [3]}  # function-local, relative, `from pkg import module`
    assert graph["pkg.b"] == {"pkg.sub.c": [1]}
    assert graph["pkg.sub.c"] == {"pkg.sub.d": [1]}
    assert graph["pkg.sub.d"] == {"pkg.a": [3]}  # relative two levels up, under TYPE_CHECKING
    assert find_cycles(graph) == [(["pkg.a", "pkg.b", "pkg.sub.c", "pkg.sub.d", "pkg.a"],
                                   ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.sub.d"])]


def test_ait_has_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 50, f"found only {len(graph)} modules under {SRC / PACKAGE}"
    cycles = find_cycles(graph)
    assert not cycles, "import cycles in src/ait (function-local imports count):\n" + "\n\n".join(
        describe(cycle, members, graph) for cycle, members in cycles)
