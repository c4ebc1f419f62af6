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
    Profile("csum", "CSUM", "MetaRoCE option CSUM", ("compat", "base"), "CSUM"),
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
    problems += check_origins(root, clauses)
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


ORIGINS = ("RoCEv2", "RoCEv2 choice", "MetaRoCE", "document")
_ORIGIN_HEAD = "## 12.5 "
_ORIGIN_ROW = re.compile(r"^\| (?P<id>[A-Z]+-\d+) \| (?P<level>[A-Z]+) \| (?P<origin>[^|]+?) \| "
                         r"(?P<basis>[^|]+?) \|\s*$")


def origins(root: Path) -> tuple[dict[str, dict], list[str]]:
    """{clause id: {"origin", "basis", "level"}} from section 12.5 (where each Compat clause
    comes from: RoCEv2, a choice RoCEv2 allows, MetaRoCE, or the document), and problems."""
    path = root / FILE
    out: dict[str, dict] = {}
    problems: list[str] = []
    inside = False
    if not path.is_file():
        return out, problems           # (listed() reports the missing document)
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("## "):
            inside = line.startswith(_ORIGIN_HEAD)
            continue
        m = _ORIGIN_ROW.match(line) if inside else None
        if not m:
            continue
        if m["origin"] not in ORIGINS:
            problems.append(f"{FILE}:{n}: {m['id']}: origin {m['origin']!r} is not one of "
                            f"{', '.join(ORIGINS)}")
        if m["id"] in out:
            problems.append(f"{FILE}:{n}: {m['id']} listed twice in 12.5")
        out[m["id"]] = {"origin": m["origin"], "basis": m["basis"], "level": m["level"]}
    return out, problems


def check_origins(root: Path, clauses) -> list[str]:
    """Every Compat clause has an origin, with its level; no MUST clause asks more than RoCEv2
    (PROF-3)."""
    if not (root / FILE).is_file():
        return []
    table, problems = origins(root)
    compat = {c.id: c for c in clauses if c.profile == BY_KEY["compat"].tag}
    for cid, c in compat.items():
        row = table.get(cid)
        if row is None:
            problems.append(f"{FILE}: {cid} (Compat) has no origin in section 12.5")
            continue
        if row["level"] != c.level:
            problems.append(f"{FILE}: 12.5 gives {cid} level {row['level']}, the clause is "
                            f"{c.level}")
        if c.level == "MUST" and row["origin"] == "MetaRoCE":
            problems.append(f"{FILE}: {cid} is a MUST clause marked MetaRoCE: PROF-3 makes an "
                            f"addition to RoCEv2 a SHOULD clause or a Base one")
    problems += [f"{FILE}: 12.5 lists {cid}, which is not a Compat clause"
                 for cid in table if cid not in compat]
    return problems


def listing(clauses) -> str:
    """The Clauses: lines of every profile, as the document holds them (for editing)."""
    return "\n".join(f"{p.key}: Clauses: " + ", ".join(c.id for c in clauses if c.profile == p.tag)
                     for p in PROFILES)
