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
