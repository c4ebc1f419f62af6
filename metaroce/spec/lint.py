"""`metaroce spec lint`: everything that keeps the specification implementable and consistent.

- clause structure: identifier, level, profile tag and Test: sentence of every clause, and a
  level that matches the clause's keywords (clauses.parse);
- references: every clause identifier mentioned anywhere in the documents exists;
- registries: every registry value is used by the codec or reserved (registries.check);
- profiles: the clause lists of docs/spec/12-conformance.md equal the clauses' tags.
"""

from __future__ import annotations

import re
from pathlib import Path

from . import profiles, registries
from .clauses import PREFIX_FILES, Clause, parse, spec_dir

_REF = re.compile(r"\b(?P<id>(?P<prefix>[A-Z]{2,8})-[1-9][0-9]*)\b")


def references(root: Path, ids: set[str]) -> list[str]:
    """Mentions of clause identifiers (a known prefix and a number) that name no clause."""
    problems = []
    for path in sorted(root.glob("*.md")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in _REF.finditer(line):
                if m["prefix"] in PREFIX_FILES and m["id"] not in ids:
                    problems.append(f"{path.name}:{n}: cites {m['id']}, which is not a clause")
    return problems


def load(root: Path | None = None) -> tuple[list[Clause], list[str]]:
    """All clauses in document order, and every lint problem found (empty when clean)."""
    root = root or spec_dir()
    clauses, problems = parse(root)
    problems += references(root, {c.id for c in clauses})
    problems += registries.check(root)
    problems += profiles.check(root, clauses)
    return clauses, problems
