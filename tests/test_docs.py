"""Every figure is backed: the README's times, ratios and percentages each appear in docs/claims.md
(which names their source), and every file README.md or docs/*.md cites exists in the repo."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURE = re.compile(r"(?:±)?\d[\d,.]*\s?(?:s|ms|x|%|minutes)\b")
CITED = re.compile(r"[\w./*-]+\.(?:json|jsonl|log|csv|txt|png)\b")
# Paths the docs name that are made at run time, or stand for a user's own file.
RUNTIME = ("AIT_HOME/", "runs/", "/root/", "EPISODE.", "NAME.", "/N/", "OUT/")


def test_every_readme_figure_is_listed_with_its_source():
    claims = (ROOT / "docs" / "claims.md").read_text()
    figures = {m.group(0) for m in FIGURE.finditer((ROOT / "README.md").read_text())}
    assert figures, "the pattern found no figure at all: it is broken"
    missing = sorted(f for f in figures if f not in claims)
    assert not missing, f"README figures with no source in docs/claims.md: {missing}"


def test_every_cited_file_exists():
    files = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
             if p.is_file() and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)]
    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for cited in {m.group(0) for m in CITED.finditer(doc.read_text())}:
            if any(marker in cited for marker in RUNTIME) or (ROOT / cited).exists():
                continue
            pattern = re.compile(re.escape(cited).replace(r"\*", ".*") + "$")
            if not any(pattern.search(f) and (f == cited or f.endswith("/" + cited.lstrip("/")) or "*" in cited)
                       for f in files):
                missing.append(f"{doc.name}: {cited}")
    assert not missing, f"cited files that do not exist: {missing}"
