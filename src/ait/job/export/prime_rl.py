"""The prime-rl config (`rl.toml`) for an exported job, and the TOML writer it needs."""

from __future__ import annotations

import json
import re
from typing import Any

from ait.job.export.mapping import SOURCE, PrimeRLPlan, Row

EMPTY = object()
"""A table written empty: it turns on a sub-config with prime-rl's defaults."""

ENABLED_TABLES = {
    "inference": "start prime-rl's vLLM inference server for the rollouts, as ait samples them itself",
    "ckpt": "keep the trained weights at the end, as ait does",
}
PACKAGE_KEYS = {f"{SOURCE}.env.taskset.dataset_size", f"{SOURCE}.env.taskset.seed"}
"""Keys of the exported taskset's own config (AitJobTasksetConfig), not of prime-rl's or verifiers' base models."""


def rl_toml(plan: PrimeRLPlan, slug: str, env_dir: str) -> str:
    """The whole rl.toml: a header naming every job.toml setting without a counterpart, then the config."""
    lines = [
        f"# prime-rl config for the ait job {slug!r}, written by `ait job export --to prime-rl` from its job.toml.",
        f"# Run from a checkout of prime-rl (github.com/PrimeIntellect-ai/prime-rl, `uv sync` there): install the",
        f"# environment first (`uv pip install ./{env_dir}`), then: `uv run rl @ rl.toml`.",
        "# NOTES.md beside this file maps every job.toml setting to its prime-rl field.",
    ]
    unmapped = plan.unmapped
    if unmapped:
        lines.append("#")
        lines.append("# job.toml settings with no prime-rl counterpart (not carried):")
        lines += [f"#   {r.key} = {_comment_value(r.value)}: {r.note}" for r in unmapped]
    else:
        lines.append("# Every job.toml setting has a prime-rl counterpart.")
    lines.append("")
    values = dict(plan.values)
    comments = dict(plan.comments)
    for table, why in ENABLED_TABLES.items():
        values[table] = EMPTY
        comments[table] = why
    lines += emit_toml(values, comments, arrays={SOURCE})
    return "\n".join(lines).rstrip() + "\n"


def _comment_value(value: Any) -> str:
    return " ".join(toml_value(value).split()) if value is not None else "(not set)"


# ------------------------------------------------------------------------------------ TOML

BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_key(key: str) -> str:
    return key if BARE_KEY.match(key) else toml_string(key)


def toml_string(text: str) -> str:
    out = []
    for ch in text:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch in "\b\t\n\f\r":
            out.append({"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{value} has no TOML form here")
        text = repr(value)
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}: {json.dumps(value, default=str)}")


def emit_toml(values: dict[str, Any], comments: dict[str, str] | None = None,
              arrays: set[str] = frozenset()) -> list[str]:
    """Dotted keys -> TOML lines. Tables come in the order their first key does; `arrays` are tables
    written as one `[[...]]` entry (give its keys contiguously: a sub-table written after another
    table still belongs to the entry, but reads badly); EMPTY values are empty tables; comments go at
    the end of their key's line (or above an empty table)."""
    comments = comments or {}
    tables: dict[str, list[tuple[str, Any]]] = {}
    for dotted, value in values.items():
        if value is EMPTY:
            tables.setdefault(dotted, [])
            continue
        table, _, leaf = dotted.rpartition(".")
        tables.setdefault(table, []).append((leaf, value))
    order: list[str] = [""] if "" in tables else []  # top-level keys come before any [table]
    for table in tables:  # an array's [[header]] comes before its first sub-table
        for array in arrays:
            if table.startswith(array + ".") and array not in order:
                order.append(array)
                tables.setdefault(array, [])
        if table not in order:
            order.append(table)
    lines: list[str] = []
    for table in order:
        entries = tables[table]
        if table:
            dotted_header = ".".join(toml_key(part) for part in table.split("."))
            if lines:
                lines.append("")
            if not entries and table in comments:
                lines.append(f"# {comments[table]}")
            lines.append(f"[[{dotted_header}]]" if table in arrays else f"[{dotted_header}]")
        for leaf, value in entries:
            full = f"{table}.{leaf}" if table else leaf
            comment = f"  # {comments[full]}" if full in comments else ""
            lines.append(f"{toml_key(leaf)} = {toml_value(value)}{comment}")
    return lines


def notes_markdown(title: str, rows: list[Row], intro: str, target_name: str) -> str:
    """NOTES.md: the mapping of every job.toml setting, then the ones with no counterpart."""
    lines = [f"# {title}", "", intro, "",
             f"| job.toml key | value | set in job.toml | {target_name} | status | note |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r.key}` | {_md(_comment_value(r.value))} | {'yes' if r.set_in_job else 'default'} | "
                     f"{_md(r.target) if r.target else '-'} | {r.status} | {_md(r.note)} |")
    unmapped = [r for r in rows if r.status == "unmapped"]
    lines += ["", "## Settings with no counterpart", ""]
    if unmapped:
        lines += [f"- `{r.key}` = {_md(_comment_value(r.value))}: {_md(r.note)}" for r in unmapped]
    else:
        lines.append("None: every setting of this job.toml carries over (see the notes on approximate ones).")
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
