"""tests/_deps.py: a missing test dependency skips on a developer's machine and fails under CI."""

import os
import subprocess
import sys

import _deps
import pytest

ABSENT = "metaroce_no_such_module_for_the_deps_test"


@pytest.mark.parametrize("ci", ["true", "1", "yes", "TRUE"])
def test_a_missing_module_fails_under_ci(monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match=f"{ABSENT} is missing: for a reason"):
        _deps.require(ABSENT, "for a reason")


@pytest.mark.parametrize("ci", [None, "", "0", "false", "no"])
def test_a_missing_module_skips_elsewhere(monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match=f"{ABSENT} is missing: for a reason"):
        _deps.require(ABSENT, "for a reason")


def test_a_present_module_is_returned(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert _deps.require("json", "stdlib") is __import__("json")
    assert _deps.require_tool("sh", "a shell") == __import__("shutil").which("sh")


def test_a_missing_program_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="is missing: a program"):
        _deps.require_tool("metaroce-no-such-program", "a program")


def _run_module_level(tmp_path, ci: str | None):
    """A test file that requires an absent module at import time, run by pytest as CI would."""
    (tmp_path / "test_needs_absent.py").write_text(
        f"from _deps import require\nmod = require({ABSENT!r}, 'x')\n\ndef test_x():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def test_a_run_with_a_missing_dependency_fails_under_ci(tmp_path):
    r = _run_module_level(tmp_path, "true")
    assert r.returncode != 0, r.stdout
    assert f"{ABSENT} is missing" in r.stdout and "1 error" in r.stdout, r.stdout


def test_a_run_with_a_missing_dependency_skips_elsewhere(tmp_path):
    r = _run_module_level(tmp_path, None)
    assert r.returncode == 5, r.stdout                 # pytest's "no tests ran": the module skipped
    assert "1 skipped" in r.stdout, r.stdout
