"""What a test needs that `make setup` (tools/setup.sh) installs: a Python module, the built fast
path, a program. On a developer's machine without it the test is skipped, with the reason. Under
CI=true it fails: setup installs every test dependency there, so a missing one is a broken setup,
and a suite that skips it would pass without testing."""

from __future__ import annotations

import importlib
import os
import shutil

import pytest


def in_ci() -> bool:
    """CI=true (or 1, yes, anything but empty/0/false/no) in the environment."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(what: str, why: str):
    """Skip (or, under CI, fail) the calling test or module: `what` is missing."""
    msg = f"{what} is missing: {why}"
    if in_ci():
        pytest.fail(f"{msg} (CI: make setup installs every test dependency, so this is a "
                    f"failure, not a skip)", pytrace=False)
    pytest.skip(msg, allow_module_level=True)


def require(module: str, why: str):
    """Import and return `module`; missing: skip, or fail under CI."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing(module, f"{why} ({exc})")


def require_tool(name: str, why: str) -> str:
    """The path of program `name` on PATH; missing: skip, or fail under CI."""
    path = shutil.which(name)
    if path is None:
        missing(name, why)
    return path
