"""No module of ait reaches into another ait package's private names.

A package is the first folder under src/ait (ait.compute, ait.outer, ...); a top-level module
(ait/reward.py) is a package of its own. A `_`-prefixed name (not a dunder) is private to the
package that defines it: another package may neither import it (`from ait.compute.local import
_shared`, or a private module `ait.x._impl`) nor reach it as an attribute (`local._shared` where
`local` came from `ait.compute`, `ait.compute.local._shared`, `getattr(local, "_shared")`).
Writing another package's private state is hidden wiring: pass the thing in instead.

Like tests/test_import_cycles.py this reads source with `ast` (imports inside functions count)
and imports nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_import_cycles import import_origin

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "ait"


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def package_of(module: str, package: str = PACKAGE) -> str:
    """'ait.compute.local' -> 'ait.compute'; 'ait.reward' -> 'ait.reward'; 'ait' -> 'ait'."""
    return ".".join(module.split(".")[:2]) if module.startswith(package + ".") else module


def module_name(path: Path, src: Path) -> tuple[str, bool]:
    """(dotted module name, whether it is a package's __init__)."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def dotted(node: ast.AST) -> list[str] | None:
    """`a.b.c` as ['a', 'b', 'c']; None for anything but a chain of names."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def violations(source: str, module: str, is_package: bool = False, package: str = PACKAGE) -> list[str]:
    """'line N: what' for every private name of another package of `package` that `source` (the
    module `module`) imports or reaches as an attribute."""
    own = package_of(module, package)
    here = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(source)

    def foreign(origin: str) -> bool:
        return (origin == package or origin.startswith(package + ".")) and package_of(origin, package) != own

    # Every name an import binds anywhere in the module (functions too) -> the dotted thing it names.
    bound: dict[str, str] = {}
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if foreign(alias.name) and any(private(p) for p in alias.name.split(".")[1:]):
                    found.append(f"line {node.lineno}: import {alias.name}")
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    bound[root] = root  # `import a.b` binds `a`; attribute chains resolve through it
        elif isinstance(node, ast.ImportFrom):
            origin = import_origin(node, here)
            if not foreign(origin):
                for alias in node.names:
                    bound.setdefault(alias.asname or alias.name, f"{origin}.{alias.name}")
                continue
            if any(private(p) for p in origin.split(".")[1:]):
                found.append(f"line {node.lineno}: from {origin} import ...")
            for alias in node.names:
                if private(alias.name):
                    found.append(f"line {node.lineno}: from {origin} import {alias.name}")
                bound[alias.asname or alias.name] = f"{origin}.{alias.name}"

    def reached(chain: list[str]) -> str | None:
        """The dotted name a chain of names resolves to through the module's imports."""
        if chain[0] not in bound:
            return None
        return ".".join([bound[chain[0]], *chain[1:]])

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            chain = dotted(node.value)
            origin = reached(chain) if chain else None
            if origin is not None and foreign(origin):
                found.append(f"line {node.lineno}: {'.'.join(chain)}.{node.attr}  ({origin}.{node.attr})")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and private(node.args[1].value)):
            chain = dotted(node.args[0])
            origin = reached(chain) if chain else None
            if origin is not None and foreign(origin):
                found.append(f"line {node.lineno}: {node.func.id}({'.'.join(chain)}, {node.args[1].value!r})")
    return found


def test_the_check_sees_every_way_in():
    def check(source: str, module: str = "ait.outer.loop", is_package: bool = False) -> list[str]:
        return violations(source, module, is_package)

    assert check("from ait.compute.local import _shared\n") == ["line 1: from ait.compute.local import _shared"]
    assert check("from ait.compute.local import _shared as pool\n")
    assert check("def f():\n    from ait.compute import local\n    local._shared = 1\n") == [
        "line 3: local._shared  (ait.compute.local._shared)"]
    assert check("import ait.compute.local as local\nwith local._shared_lock:\n    pass\n")
    assert check("import ait.compute.local\nx = ait.compute.local._shared\n")
    assert check("from ait.compute import local\nx = getattr(local, '_shared')\n")
    assert check("from ait.compute.local import LocalExecutor\nLocalExecutor._start\n")
    assert check("from ..compute import local\nlocal._shared\n", "ait.outer.loop")  # relative
    assert check("from . import reward\nreward._term\n", "ait.harness", is_package=True) == []  # ait.harness.reward
    assert check("from .. import reward\nreward._term\n", "ait.harness.episode")  # ait.reward: another package
    assert check("from ait.x._impl import thing\n")  # a private module
    assert check("import ait.x._impl\n")
    assert check("from ait.reward import _term\n", "ait.harness.episode")  # a top-level module is a package
    # Allowed: dunders, a package's own private names, other libraries' private names.
    assert check("from ait.compute import local\nlocal.__name__\n") == []
    assert check("from ait.compute.local import _shared\nfrom ait.compute import local\nlocal._shared\n",
                 "ait.compute.executors") == []
    assert check("import os\nos._exit(1)\nfrom threading import _shutdown\n") == []
    assert check("from ait.reward import _term\n", "ait.reward") == []


def test_no_package_of_ait_touches_another_ones_private_names():
    paths = sorted((SRC / PACKAGE).rglob("*.py"))
    assert len(paths) > 50, f"found only {len(paths)} modules under {SRC / PACKAGE}"
    found = []
    for path in paths:
        module, is_package = module_name(path, SRC)
        found += [f"{path.relative_to(SRC)}: {v}" for v in violations(path.read_text(encoding="utf-8"), module,
                                                                      is_package)]
    assert not found, "private names of another ait package (pass the thing in instead):\n  " + "\n  ".join(found)
