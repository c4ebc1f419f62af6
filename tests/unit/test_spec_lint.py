"""The specification's clauses are well-formed, unique, and exported by `metaroce spec`."""

import json
import re

from metaroce import spec
from metaroce.cli import main


def test_spec_has_no_lint_problems():
    clauses, problems = spec.load()
    assert problems == []
    assert len(clauses) >= 100


def test_clause_ids_are_unique_and_well_formed():
    ids = [c.id for c in spec.clauses()]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"[A-Z]{2,8}-[1-9][0-9]*", i) for i in ids)
    assert {i.split("-")[0] for i in ids} == set(spec.PREFIX_FILES)


def test_every_clause_has_a_level_and_a_test_kind():
    for c in spec.clauses():
        assert c.level in spec.LEVELS and c.level in c.text
        assert c.tests and set(c.tests) <= set(spec.TEST_KINDS), c.id
        assert "Test:" in c.text


def test_readme_indexes_every_document_and_prefix():
    root = spec.spec_dir()
    readme = (root / "README.md").read_text()
    rows = re.findall(r"^\| \[([\w.-]+\.md)\]\([\w.-]+\) \|[^|]+\| ([^|]+) \|$", readme, re.M)
    listed = {name: set(re.findall(r"`([A-Z]+)`", prefixes)) for name, prefixes in rows}
    assert set(listed) == {p.name for p in spec.spec_files()}
    owners = {}
    for prefix, name in spec.PREFIX_FILES.items():
        owners.setdefault(name, set()).add(prefix)
    assert listed == owners


def test_lint_catches_broken_clauses(tmp_path):
    (tmp_path / "README.md").write_text("# x\n")
    (tmp_path / "01-encapsulation.md").write_text(
        "**WIRE-1** (MUST) *Ok.* A sender MUST do it. Test: wire — check.\n\n"
        "**WIRE-1** (MUST) *Dup.* It MUST. Test: peer.\n\n"
        "**WIRE-2** (SHOULD) *Wrong level.* It MUST. Test: wire.\n\n"
        "**WIRE-3** (MAY) *No test.* It MAY.\n\n# heading\n\n"
        "**WIRE-04** (MUST) *Leading zero.* It MUST. Test: wire.\n\n"
        "**SEC-1** (MUST) *Wrong file.* It MUST. Test: bogus.\n\n"
        "**Wire5** (MUST) *typo.* It MUST. Test: wire.\n\n**WIRE-6**(MUST) no space\n")
    problems = spec.lint(tmp_path)
    text = "\n".join(problems)
    for needle in ("duplicate", "labelled SHOULD", "no 'Test:'", "malformed id",
                   "belongs in 07-security.md", "Test: must start", "malformed clause start"):
        assert needle in text, needle


def test_cli_clauses_json_and_lint(capsys):
    assert main(["spec", "clauses", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert isinstance(doc, list) and doc[0]["id"] == "WIRE-1"
    assert {"id", "title", "text", "file", "level"} <= doc[0].keys()
    assert [d["id"] for d in doc] == [c.id for c in spec.clauses()]
    assert main(["spec", "clauses", "--prefix", "sack"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("SACK-1") and "WIRE-" not in out
    assert main(["spec", "lint", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["problems"] == []
