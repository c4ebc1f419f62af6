"""The conformance suite against Linux rxe (Compat-only, compat mode), through the rxe adapter:
endpoints made on demand in the guest with pyverbs, so every test has its own.

What rxe (Debian bookworm's kernel) does differently is pinned here, each with the clause it
violates; docs/conformance/rxe.md explains each from the specification. A change of rxe's
behaviour, or of the suite, shows up as a difference from these tables."""

import pytest

from metaroce.conformance.adapters import RxeAdapter
from metaroce.conformance.runner import run

pytestmark = pytest.mark.root

# test -> the clause it fails on, where rxe 6.1 departs from a MUST of Compat-only
RXE_FAILS = {
    "imm.oversize": "SEQ-2",       # a SEND longer than the receive: NAK 0x63, not 0x61
    "req.forged_ack": "RESP-12",   # its requester completes a WRITE on an ACK beyond its PSNs
}
# SHOULD clauses rxe does not follow (reported as warnings, PROF-1)
RXE_WARNS = {"hdr.udp_checksum": "WIRE-15", "rnr.nak": "RESP-17"}
RXE_SKIPS = {"cc.cnp_gen"}         # rxe generates no CNP (COMPAT-4: optional)


def test_conformance_suite_against_rxe(rxe_lab):
    view = rxe_lab[0]                  # the tester is h2: h1's eth0 has our device on it
    rep = run(RxeAdapter("roce", lab=view.name, tester_host="h2"), profile="compat")
    assert not rep.error, rep.error
    res = {r.id: r for r in rep.results}
    failed = {r.id: r.clause for r in rep.results if r.status == "failed"}
    assert failed == RXE_FAILS, {k: res[k].message for k in failed}
    assert {r.id: r.clause for r in rep.results if r.status == "warned"} == RXE_WARNS
    assert {r.id for r in rep.results if r.status == "skipped"} == RXE_SKIPS
    assert not [r for r in rep.results if r.status == "error"]
    for r in rep.results:
        if r.status in ("failed", "warned"):     # each names its clause and the text it rests on
            assert r.clause and r.origin in ("RoCEv2", "RoCEv2 choice", "MetaRoCE"), r
            assert r.spec_text and r.basis, r
    assert res["imm.oversize"].origin == "RoCEv2" and res["req.forged_ack"].origin == "RoCEv2"
    assert "longer than the receive buffer is a fatal invalid-request error" in \
        res["imm.oversize"].spec_text
    assert "MUST discard responses whose PSN is not within its outstanding range" in \
        res["req.forged_ack"].spec_text
    # the clauses' permitted alternatives rxe takes are named
    assert "NAK 0x61" in res["hdr.pad"].message and "class J" in res["imm.invalidate"].message
    # no test ran on an endpoint an earlier test had left unusable
    gone: set[str] = set()
    for r in rep.results:
        assert not gone & set(r.endpoints), (r.id, r.endpoints, gone)
        gone |= {x.split(":")[0] for x in r.retired}
    assert len([r for r in rep.results if r.status == "passed"]) >= 35
