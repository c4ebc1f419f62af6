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


# ---- version 2: levels, profiles, references, registries, profile lists ---------------------

def _copy_spec(tmp_path):
    import shutil
    dst = tmp_path / "spec"
    shutil.copytree(spec.spec_dir(), dst)
    return dst


def _edit(path, old, new):
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def _one_document(tmp_path, text):
    (tmp_path / "README.md").write_text("# x\n")
    (tmp_path / "01-encapsulation.md").write_text(text)
    return tmp_path


def test_levels_must_match_content(tmp_path):
    _one_document(
        tmp_path,
        "**WIRE-1** (MUST, Compat) *Mixed.* It MUST do a and SHOULD do b. Test: wire.\n\n"
        "**WIRE-2** (MUST, Compat) *Permission.* It MUST do a and MAY do b. Test: wire.\n\n"
        "**WIRE-3** (MAY, Compat) *Quoted.* A `MUST` clause is quoted; a device MAY do it. "
        "Test: inspect.\n\n"
        "**WIRE-4** (MUST) *No profile.* It MUST. Test: wire.\n\n"
        "**WIRE-5** (MUST, Gold) *Unknown profile.* It MUST. Test: wire.\n")
    text = "\n".join(spec.lint(tmp_path))
    assert "WIRE-1: a MUST clause with a SHOULD" in text
    assert "WIRE-2:" not in text and "WIRE-3:" not in text
    assert "WIRE-4: profile '(none)'" in text and "WIRE-5: profile 'Gold'" in text


def test_every_clause_has_a_profile_and_options_are_tagged():
    tags = {c.id: c.profile for c in spec.clauses()}
    assert set(tags.values()) == set(spec.PROFILE_TAGS)
    assert tags["MP-1"] == "MULTIPATH" and tags["CC-8"] == "CREDIT" and tags["CC-11"] == "DELAY_TS"
    assert tags["CC-13"] == "CNP_EXT" and tags["SACK-1"] == "Base" and tags["WIRE-1"] == "Compat"
    # a MUST clause never holds a recommendation
    assert all("SHOULD" not in c.normative.replace("`SHOULD`", "") for c in spec.clauses()
               if c.level == "MUST")


def test_lint_catches_a_citation_of_a_missing_clause(tmp_path):
    root = _copy_spec(tmp_path)
    _edit(root / "03-rc-transport.md", "(EM-1 has every cause)", "(EM-99 has every cause)")
    assert any("cites EM-99, which is not a clause" in p for p in spec.lint(root))


def test_lint_checks_registries_against_the_codec(tmp_path):
    root = _copy_spec(tmp_path)
    reg = root / "11-registries.md"
    _edit(reg, "| 0xE2 | MR_PROBE | assigned |", "| 0xE2 | MR_PROBE_X | assigned |")
    _edit(reg, "| 0x04 | MULTIPATH | assigned |", "| 0x04 | MULTIPATH | unassigned |")
    _edit(reg, "| 0x40 | OOO | assigned | SACK-2 |\n", "")
    _edit(reg, "| 0xE3–0xEF | — | unassigned | EXT-1 |", "| 0xE3–0xEF | WILD | assigned | EXT-1 |")
    _edit(reg, "| `bad_tver` | BAD_TVER | assigned |", "| `bad_tvr` | BAD_TVER | assigned |")
    text = "\n".join(spec.lint(root))
    assert "0xE2 is MR_PROBE in the codec, not MR_PROBE_X" in text
    assert "0x04 is unassigned but the codec uses it as MULTIPATH" in text
    assert "the codec's 0x40 OOO is not registered" in text
    assert "an assigned row names one value, not a range" in text
    assert "'bad_tvr' BAD_TVER is assigned but the codec does not use it" in text
    assert "the codec's 'bad_tver' BAD_TVER is not registered" in text
    _edit(reg, "### Registry: cm-types", "### Registry: cm-typos")
    text = "\n".join(spec.lint(root))
    assert "no registry 'cm-types'" in text and "unknown registry" in text


def test_registries_cover_their_space(tmp_path):
    root = _copy_spec(tmp_path)
    _edit(root / "11-registries.md", "| 0x82–0x9F | — (CNP class) | reserved | HDR-4 |\n", "")
    assert any("registry opcodes: 30 values of its space have no row (first 0x82)" in p
               for p in spec.lint(root))


def test_lint_keeps_the_profile_lists_equal_to_the_tags(tmp_path):
    root = _copy_spec(tmp_path)
    _edit(root / "12-conformance.md", "Clauses: MP-1, MP-3", "Clauses: MP-3, SACK-1")
    text = "\n".join(spec.lint(root))
    assert "profile multipath: listed but not tagged MULTIPATH: SACK-1; tagged MULTIPATH but " \
           "not listed: MP-1" in text
    _edit(root / "05-metaroce-mode.md", "**MP-4** (MUST, MULTIPATH)", "**MP-4** (MUST, Base)")
    assert any("tagged Base but not listed: MP-4" in p for p in spec.lint(root))


def test_cli_lists_a_profiles_clauses(capsys):
    assert main(["spec", "clauses", "--profile", "compat", "--json"]) == 0
    compat = {d["id"]: d["profile"] for d in json.loads(capsys.readouterr().out)}
    assert set(compat.values()) == {"Compat"} and "WIRE-1" in compat and "SACK-1" not in compat
    assert main(["spec", "clauses", "--profile", "credit", "--json"]) == 0
    credit = {d["profile"] for d in json.loads(capsys.readouterr().out)}
    assert credit == {"Compat", "Base", "CREDIT"}


def test_every_compat_clause_says_where_it_comes_from(tmp_path):
    """Section 12.5: each Compat clause is RoCEv2, a RoCEv2 choice, MetaRoCE or the document;
    a MUST clause is never a MetaRoCE addition (PROF-3)."""
    from metaroce.spec import profiles
    table, problems = profiles.origins(spec.spec_dir())
    compat = {c.id for c in spec.clauses() if c.profile == "Compat"}
    assert problems == [] and set(table) == compat
    assert {r["origin"] for r in table.values()} <= set(profiles.ORIGINS)
    assert table["RESP-12"]["origin"] == "RoCEv2" and table["RESP-17"]["origin"] == "MetaRoCE"
    root = _copy_spec(tmp_path)
    _edit(root / "12-conformance.md", "| RESP-12 | MUST | RoCEv2 |", "| RESP-12 | MUST | MetaRoCE |")
    _edit(root / "12-conformance.md", "| VER-1 | MUST | RoCEv2 | IBTA ch. 9: TVer 0 |\n", "")
    text = "\n".join(spec.lint(root))
    assert "RESP-12 is a MUST clause marked MetaRoCE" in text
    assert "VER-1 (Compat) has no origin in section 12.5" in text
