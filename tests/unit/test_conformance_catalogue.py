"""The conformance catalogue against the spec: clause IDs exist, every MUST clause is covered
or explained, --only selects by test ID, group and clause."""

from metaroce import spec
from metaroce.conformance import report
from metaroce.conformance.catalogue import cases
from metaroce.conformance.runner import select


def test_cited_clauses_exist_and_ids_are_unique():
    ids = {c.id for c in spec.clauses()}
    tests = cases()
    assert len({t.id for t in tests}) == len(tests)
    for t in tests:
        assert t.clauses and set(t.clauses) <= ids, t.id
        assert t.title, t.id


def test_every_must_clause_is_covered_or_explained():
    cov = report.coverage()
    assert cov["missing"] == []
    assert cov["covered"] + cov["not_testable"] == cov["must_total"] == \
        sum(1 for c in spec.clauses() if c.level == "MUST")
    # an explanation is never given for a clause a test covers
    assert not set(report.NOT_TESTABLE) & {cl for t in cases() for cl in t.clauses}
    assert all(len(r) > 20 for r in report.NOT_TESTABLE.values())


def test_only_matches_ids_groups_and_clauses():
    assert [c.id for c in select("hdr.icrc", "roce")] == ["hdr.icrc"]
    assert {c.group for c in select("access", "roce")} == {"access"}
    by_clause = select("COMPAT-2", "roce")
    assert by_clause and all("COMPAT-2" in c.clauses for c in by_clause)
    assert select("COMPAT-2", "metaroce") == [c for c in by_clause if "metaroce" in c.modes]
    assert {c.id for c in select("sack-*", "metaroce")} >= {"psn.gap_sack", "psn.window_edge"}
    assert select("nothing.here", "roce") == []


# ---- profiles (spec section 12) -------------------------------------------------------------

def test_every_profile_is_covered_or_explained():
    from metaroce.conformance.profiles import KEYS
    for key in KEYS:
        cov = report.coverage(profile=key)
        assert cov["missing"] == [], key
        assert cov["must_total"] == cov["covered"] + cov["not_testable"]
    assert report.coverage(profile="compat")["must_total"] < \
        report.coverage(profile="base")["must_total"] < report.coverage()["must_total"]


def test_tests_belong_to_the_profile_of_their_mode_and_clauses():
    from metaroce.conformance.profiles import case_profile, modes_for
    by_id = {c.id: c for c in cases()}
    assert case_profile(by_id["hdr.icrc"], "roce") == "compat"
    assert case_profile(by_id["hdr.icrc"], "metaroce") == "base"
    assert case_profile(by_id["psn.gap_sack"], "metaroce") == "base"
    assert modes_for("compat") == ("roce",) and modes_for("multipath") == ("roce", "metaroce")
    compat = select(None, "roce", "compat")
    assert compat == select(None, "roce") and "psn.gap_nak" in {c.id for c in compat}
    assert select(None, "metaroce", "compat") == []
    assert {c.id for c in select(None, "metaroce", "base")} >= {"psn.gap_sack", "hdr.icrc"}
    assert select("access.*", "metaroce", "base") == [c for c in select(None, "metaroce", "base")
                                                      if c.id.startswith("access.")]


def test_profile_results_fold_the_modes_together():
    """Compat-only is the compat-mode run; MetaRoCE-Base adds the MetaRoCE-mode run; a failed
    SHOULD clause is a warning, never a failure."""
    from metaroce.conformance.runner import Result, RunReport
    roce = RunReport("x", "roce", results=[
        Result("hdr.icrc", "hdr", [], "", "passed"),
        Result("hdr.udp_checksum", "hdr", [], "", "warned", "WIRE-15")])
    mr = RunReport("x", "metaroce", results=[Result("psn.gap_sack", "psn", [], "", "failed",
                                                    "SACK-2")])
    table = report.profile_table([roce])
    assert set(table) == {"compat"} and table["compat"]["ok"]
    assert table["compat"]["warned"] == 1 and roce.exit_code == 0
    table = report.profile_table([roce, mr])
    assert table["compat"]["ok"] and not table["base"]["ok"] and not table["multipath"]["ok"]
    assert table["base"]["passed"] == 1 and table["base"]["failed"] == 1
    assert "metaroce:psn.gap_sack" in table["base"]["tests"]
    assert "roce:hdr.icrc" in table["multipath"]["tests"]
    md = report.profiles_md(table)
    assert "MetaRoCE-Base (`base`) | **FAIL**" in md and "Compat-only (`compat`) | **pass**" in md


def test_a_failure_names_its_clause_origin_and_text():
    """A report's failure or warning says what it rests on: the clause, where it comes from
    (spec 12.5) and the clause's own text, in summary.md and junit.xml."""
    from metaroce.conformance.runner import Result, RunReport, _name_clause, _origins
    clauses, origins = {c.id: c for c in spec.clauses()}, _origins()
    fail = Result("imm.oversize", "imm", ["SEQ-2"], "", "passed", "SEQ-2", "NAK 0x63")
    _name_clause(fail, clauses["SEQ-2"], origins["SEQ-2"])
    warn = Result("rnr.nak", "rnr", ["RESP-17"], "", "passed", "RESP-17", "a NAK 0x60")
    _name_clause(warn, clauses["RESP-17"], origins["RESP-17"])
    assert (fail.status, fail.origin, warn.status, warn.origin) == \
        ("failed", "RoCEv2", "warned", "MetaRoCE")
    assert "IBTA" in fail.basis and "longer than the receive buffer" in fail.spec_text
    assert "\n" not in fail.spec_text and "Test:" not in fail.spec_text
    rep = RunReport("x", "roce", results=[fail, warn, Result("hdr.icrc", "hdr", [], "",
                                                              "passed")])
    md = report.summary_md(rep, report.coverage(rep.results))
    part = md.split("## What the failures and warnings rest on")[1].split("## Clause")[0]
    assert "`imm.oversize` fails on **SEQ-2** — RoCEv2: IBTA" in part
    assert f"> {fail.spec_text}" in part and "`rnr.nak` warns (SHOULD) on **RESP-17**" in part
    assert "hdr.icrc" not in part
    assert "longer than the receive buffer" in report.junit_xml(rep)
