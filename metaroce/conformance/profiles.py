"""Conformance profiles (spec section 12) in the suite: which profile each test belongs to in each
mode, which modes a profile's run needs, and a run's results and clause coverage per profile.

A test run in compat mode checks Compat-only. A test run in MetaRoCE mode checks MetaRoCE-Base,
or the option whose clause it cites. A profile's results are those of its own tests and of the
profiles it builds on (MetaRoCE-Base = the compat-mode run + its own MetaRoCE-mode tests)."""

from __future__ import annotations

from .. import spec
from ..spec.profiles import BY_KEY, BY_TAG, PROFILES

KEYS = tuple(p.key for p in PROFILES)


def closure(key: str) -> set[str]:
    """The profile and those it builds on."""
    return {key, *BY_KEY[key].builds_on}


def modes_for(key: str) -> tuple[str, ...]:
    """The connection modes a profile's run needs: compat mode only for Compat-only, both for
    MetaRoCE-Base and every option (they build on Compat-only)."""
    return ("roce",) if key == "compat" else ("roce", "metaroce")


def _tags() -> dict[str, str]:
    return {c.id: c.profile for c in spec.clauses()}


def case_profile(case, mode: str, tags: dict | None = None) -> str:
    """The profile a test checks in a mode."""
    if mode == "roce":
        return "compat"
    tags = tags if tags is not None else _tags()
    options = sorted({tags.get(cl) for cl in case.clauses} - {"Compat", "Base", None})
    return BY_TAG[options[0]].key if options else "base"


def in_profile(case, mode: str, key: str, tags: dict | None = None) -> bool:
    return mode in case.modes and case_profile(case, mode, tags) in closure(key)


def summarize(reports) -> dict[str, dict]:
    """{profile key: counts, ok, the tests that ran} over runs of one or both modes. A profile
    appears when its closure's modes all ran; `ok` means no failure or error (warnings — failed
    SHOULD clauses — and skips are allowed)."""
    from .catalogue import cases  # noqa: PLC0415 (catalogue imports the runner's helpers)
    by_id = {c.id: c for c in cases()}
    tags = _tags()
    ran = {r.mode for r in reports}
    out: dict[str, dict] = {}
    for key in KEYS:
        if not set(modes_for(key)) <= ran:
            continue
        counts = {"passed": 0, "failed": 0, "warned": 0, "skipped": 0, "error": 0}
        tests = []
        for rep in reports:
            for r in rep.results:
                c = by_id.get(r.id)
                if c is not None and in_profile(c, rep.mode, key, tags):
                    counts[r.status] += 1
                    tests.append(f"{rep.mode}:{r.id}")
        errors = [rep.error for rep in reports if rep.error]
        out[key] = {"title": BY_KEY[key].title, **counts, "tests": tests,
                    "ok": not errors and not counts["failed"] and not counts["error"]}
    return out
