"""Task family registry. Held-out families are never picked for training.

ait.spec builds a family's TaskSpec (`build_spec`) and checks a spec file against this registry
(`check_spec`); the families never import ait.spec (the eval-format models they build come from
ait.contract), so there is no import cycle between the two.
"""

from __future__ import annotations

from ait.families.base import Example, Family, ToolCall
from ait.families.calc_chain import CalcChain
from ait.families.dispatch import Dispatch
from ait.families.ledger import Ledger
from ait.families.multi_hop import MultiHop
from ait.families.string_pipeline import StringPipeline
from ait.families.triage import Triage

FAMILIES: dict[str, Family] = {
    f.name: f for f in [CalcChain(), MultiHop(), StringPipeline(), Ledger(), Dispatch(), Triage()]
}


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown task family {name!r}; known: {', '.join(sorted(FAMILIES))}") from None


def training_families() -> list[str]:
    """Families the outer loop may train on (held-out ones excluded)."""
    return sorted(name for name, f in FAMILIES.items() if not f.held_out)


__all__ = ["Example", "FAMILIES", "Family", "ToolCall", "get_family", "training_families"]
