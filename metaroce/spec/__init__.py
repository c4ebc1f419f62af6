"""The MetaRoCE specification (docs/spec) as data: clauses with their level, profile and test
kind, the registries, the conformance profiles, and the lint that keeps them consistent."""

from pathlib import Path

from .clauses import (LEVELS, PREFIX_FILES, PROFILE_TAGS, TEST_KINDS, Clause, SpecError,
                      spec_dir, spec_files)
from .lint import load
from .profiles import BY_KEY as PROFILES_BY_KEY
from .profiles import PROFILES

__all__ = ["Clause", "LEVELS", "PREFIX_FILES", "PROFILES", "PROFILES_BY_KEY", "PROFILE_TAGS",
           "SpecError", "TEST_KINDS", "clauses", "lint", "load", "spec_dir", "spec_files"]


def clauses(root: Path | None = None) -> list[Clause]:
    return load(root)[0]


def lint(root: Path | None = None) -> list[str]:
    return load(root)[1]
