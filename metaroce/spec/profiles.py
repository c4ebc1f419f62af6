"""Conformance profiles (docs/spec/12-conformance.md): Compat-only, MetaRoCE-Base and the
options. A clause's tag names the smallest profile it belongs to; a profile holds the clauses
of its own tag and of the profiles it builds on. The document lists each profile's own clauses
on a ``Clauses:`` line, which the lint keeps equal to the tags."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FILE = "12-conformance.md"


@dataclass(frozen=True)
class Profile:
    key: str            # the CLI name (metaroce conformance run --profile KEY)
    tag: str            # the clause tag (**ID** (LEVEL, TAG))
    title: str
    builds_on: tuple    # keys of the profiles it includes
    capability: str | None = None   # the CMETH capability bit that enables it


PROFILES = (
    Profile("compat", "Compat", "Compat-only", ()),
    Profile("base", "Base", "MetaRoCE-Base", ("compat",)),
    Profile("multipath", "MULTIPATH", "MetaRoCE option MULTIPATH", ("compat", "base"),
            "MULTIPATH"),
    Profile("credit", "CREDIT", "MetaRoCE option CREDIT", ("compat", "base"), "CREDIT"),
    Profile("delay_ts", "DELAY_TS", "MetaRoCE option DELAY_TS", ("compat", "base"), "DELAY_TS"),
    Profile("cnp_ext", "CNP_EXT", "MetaRoCE option CNP_EXT", ("compat", "base"), "CNP_EXT"),
)
BY_KEY = {p.key: p for p in PROFILES}
BY_TAG = {p.tag: p for p in PROFILES}

_HEAD = re.compile(r"^### Profile: .*\(`(?P<key>[a-z_]+)`\)\s*$")
_LIST = re.compile(r"^Clauses: (?P<ids>.*)$")


def tags_of(key: str) -> set[str]:
    """The clause tags a profile holds (its own and those of the profiles it builds on)."""
    p = BY_KEY[key]
    return {p.tag} | {BY_KEY[k].tag for k in p.builds_on}


def clauses_of(key: str, clauses) -> list:
    tags = tags_of(key)
    return [c for c in clauses if c.profile in tags]


def listed(root: Path) -> tuple[dict[str, list[str]], list[str]]:
    """{profile key: clause ids listed in the document}, and problems reading it."""
    path = root / FILE
    if not path.is_file():
        return {}, [f"{FILE}: missing (the conformance profiles)"]
    out: dict[str, list[str]] = {}
    problems: list[str] = []
    key = None
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = _HEAD.match(line)
        if m:
            key = m["key"]
            if key not in BY_KEY:
                problems.append(f"{FILE}:{n}: unknown profile {key!r}")
            continue
        m = _LIST.match(line)
        if m and key:
            out[key] = [i.strip() for i in m["ids"].split(",") if i.strip()]
            key = None
    return out, problems


def check(root: Path, clauses) -> list[str]:
    lists, problems = listed(root)
    for p in PROFILES:
        own = [c.id for c in clauses if c.profile == p.tag]
        if p.key not in lists:
            problems.append(f"{FILE}: profile {p.key} has no 'Clauses:' list")
            continue
        got = lists[p.key]
        extra = [i for i in got if i not in own]
        missing = [i for i in own if i not in got]
        if extra or missing:
            problems.append(f"{FILE}: profile {p.key}: listed but not tagged {p.tag}: "
                            f"{', '.join(extra) or '-'}; tagged {p.tag} but not listed: "
                            f"{', '.join(missing) or '-'}")
    return problems


def listing(clauses) -> str:
    """The Clauses: lines of every profile, as the document holds them (for editing)."""
    return "\n".join(f"{p.key}: Clauses: " + ", ".join(c.id for c in clauses if c.profile == p.tag)
                     for p in PROFILES)
