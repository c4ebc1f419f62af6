"""The conformance suite (issue 8) against the reference implementation in both modes, against
deliberately broken builds of its data path (each must be caught on its clause), and through the
manual adapter against our own daemon driven only by a JSON description, as a third party would
drive theirs. No lab namespace outlives a test."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from verbs_util import daemons, ip_of, lab_pair

from metaroce.conformance import report
from metaroce.conformance.adapters import ReferenceAdapter
from metaroce.conformance.runner import run
from metaroce.lab import core

METAROCE = [sys.executable, "-m", "metaroce.cli"]

# Deviations of the reference data path the suite finds. It found four (TVer, P_Key, PadCnt
# were not checked; a responder-side fatal error did not flush posted receives), all fixed in
# bpf/nic/nic.bpf.c and metaroce/nic/device.py; a new one goes here with its clause while open.
# Spec version 2 (issue 23) found four more (a CNP with another P_Key dropped, SEND with
# invalidate dropped silently, segmentation lengths unchecked, no CNP for a CE-marked packet
# that is also ACKed), all fixed in bpf/nic/nic.bpf.c.
KNOWN: dict[str, str] = {}


def _namespaces(prefix: str) -> list:
    """Namespaces of labs whose name starts with prefix (other runs may have their own)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [n.split()[0] for n in out.splitlines() if n.startswith(f"mr-{prefix}")]


class Tracking(ReferenceAdapter):
    """The reference adapter, remembering the lab it created."""
    labs: list = []

    def open(self):
        side = super().open()
        Tracking.labs.append(self.lab_name)
        return side


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for mode in ("roce", "metaroce"):
        rep = run(Tracking(mode))
        out[mode] = (rep, report.write(rep, str(tmp_path_factory.mktemp(mode))))
    assert len(Tracking.labs) == 2
    for lab in Tracking.labs:
        assert _namespaces(lab) == [], "the suite left lab namespaces behind"
    return out


@pytest.mark.parametrize("mode", ["roce", "metaroce"])
def test_reference_passes(runs, mode):
    rep, _ = runs[mode]
    assert not rep.error
    bad = {r.id: f"{r.status} {r.clause}: {r.message}" for r in rep.results
           if r.status not in ("passed", "warned") and r.id not in KNOWN}
    assert bad == {}
    for r in rep.results:
        if r.id in KNOWN and r.status == "failed":
            assert r.clause == KNOWN[r.id], r.message
    assert len(rep.results) >= 40
    ids = {r.id for r in rep.results}
    assert ("psn.gap_nak" in ids) == (mode == "roce") and ("psn.gap_sack" in ids) == (mode != "roce")


def test_reference_passes_every_profile_it_claims(runs):
    """Spec section 12: the profiles the reference claims pass (known deviations aside), the
    results fold both modes together, and no claimed profile has an unexplained MUST clause."""
    table = report.profile_table([runs["roce"][0], runs["metaroce"][0]])
    assert set(ReferenceAdapter.claims) <= set(table)
    for key in ReferenceAdapter.claims:
        p = table[key]
        assert p["missing"] == [], key
        failing = {t.split(":", 1)[1] for t in p["tests"]} & {
            r.id for rep, _ in runs.values() for r in rep.results if r.status in ("failed", "error")}
        assert failing <= set(KNOWN), (key, failing)
        assert p["ok"] == (not failing), key
    assert table["compat"]["passed"] + table["compat"]["failed"] < table["base"]["passed"] + \
        table["base"]["failed"]
    assert all(t.startswith("roce:") for t in table["compat"]["tests"])


def test_reports_and_coverage(runs):
    rep, paths = runs["roce"]
    suite = ET.parse(paths["junit.xml"]).getroot()
    assert int(suite.get("tests")) == len(rep.results)
    assert int(suite.get("failures")) == rep.counts["failed"]
    failed = [tc.get("name") for tc in suite.iter("testcase") if tc.find("failure") is not None]
    assert set(failed) <= set(KNOWN)
    cov = json.load(open(paths["coverage.json"]))
    assert cov["missing"] == [] and cov["must_total"] == cov["covered"] + cov["not_testable"]
    assert cov["covered"] >= 70
    assert cov["clauses"]["ICRC-1"]["results"]["hdr.icrc"] == "passed"
    md = open(paths["summary.md"]).read()
    assert "## Clause coverage" in md and "`hdr.icrc`" in md


def test_selftest_catches_every_mutant():
    from metaroce.conformance.selftest import MUTANTS, selftest
    doc = selftest()
    assert _namespaces("cs") == [] or all(not n.startswith(f"mr-cs{os.getpid() % 1000}")
                                          for n in _namespaces("cs"))
    assert [m["name"] for m in doc["mutants"]] == [m.name for m in MUTANTS]
    missed = [(m["name"], m["expected_clause"], m["caught_by"], m["error"])
              for m in doc["mutants"] if not m["caught"]]
    assert missed == []


def cli(*args, check=None):
    env = {**os.environ,
           "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(__file__)))}
    p = subprocess.run(METAROCE + list(args), capture_output=True, text=True, env=env, timeout=120)
    if check is not None:
        assert p.returncode == check, p.stderr + p.stdout
    return p


def test_manual_adapter_through_the_json_file(lab_name, tmp_path):
    """A third party's workflow: endpoints made and connected with `metaroce qp`, described in a
    file, tested with `--dut manual`."""
    view = lab_pair(lab_name)
    ns1, ns2 = (view.plan.node(h).netns for h in ("h1", "h2"))
    tester = {"netns": ns1, "iface": "eth0", "ip": ip_of(view, "h1"), "qpn": 0x0C0FFE,
              "psn": 0xFFFF00, "mtu": 1024}
    (tmp_path / "tester.json").write_text(json.dumps(tester))
    with daemons(view, hosts=("h2",)):
        eps = []
        for access in ["local_write,remote_write,remote_read,remote_atomic"] * 4 + \
                ["local_write,remote_read"]:
            ep = json.loads(cli("qp", "create", "--dev", "eth0", "--netns", ns2, "--access",
                                access, "--json", check=0).stdout)
            cli("qp", "connect", str(ep["qpn"]), "--dev", "eth0", "--netns", ns2, "--remote",
                str(tmp_path / "tester.json"), "--json", check=0)
            eps.append(ep)
        desc = tmp_path / "dut.json"
        desc.write_text(json.dumps({"tester": tester, "endpoints": eps}))
        p = cli("conformance", "run", "--dut", "manual", "--description", str(desc),
                "--report", str(tmp_path / "rep"), "--json")
        doc = json.loads(p.stdout)
        res = {r["id"]: r for r in doc["results"]}
        failed = {k: v["message"] for k, v in res.items()
                  if v["status"] in ("failed", "error") and k not in KNOWN}
        assert failed == {}
        assert p.returncode == (1 if any(res[k]["status"] == "failed" for k in KNOWN if k in res)
                                else 0)
        # wire-only checks ran; the ones needing the reference's hooks were skipped
        for tid in ("hdr.icrc", "psn.ack", "psn.duplicate", "psn.gap_nak", "read.segments",
                    "atomic.duplicate", "access.rkey", "access.flags", "neg.audit"):
            assert res[tid]["status"] == "passed", (tid, res[tid])
        for tid in ("imm.write", "req.segmentation", "access.flush"):
            assert res[tid]["status"] == "skipped"
        assert os.path.exists(tmp_path / "rep" / "junit.xml")
        # the DUT's endpoints really were used: the shared one received the tester's WRITEs
        shown = json.loads(cli("qp", "list", "--dev", "eth0", "--netns", ns2, "--json",
                               check=0).stdout)
        states = {e["qpn"]: e["state"] for e in shown["endpoints"]}
        assert sum(1 for s in states.values() if s == "ERR") >= 3
    core.down(lab_name)


def test_cli_exit_codes(tmp_path):
    p = cli("conformance", "run", "--dut", "manual", "--json")
    assert p.returncode == 2 and "description" in json.loads(p.stdout)["error"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tester": {"ip": "10.9.9.9", "qpn": 5, "psn": 1},
                               "endpoints": [{"qpn": 1}]}))
    p = cli("conformance", "run", "--dut", "manual", "--description", str(bad), "--json")
    assert p.returncode == 2 and "missing" in json.loads(p.stdout)["error"]
    p = cli("conformance", "run", "--dut", "reference", "--only", "no.such.test", "--json")
    assert p.returncode == 2 and "no test matches" in json.loads(p.stdout)["error"]
    p = cli("conformance", "run", "--dut", "reference", "--mode", "roce", "--profile", "base",
            "--json")
    assert p.returncode != 0 and "not both" in json.loads(p.stdout)["error"]
    listed = json.loads(cli("conformance", "list", "--json", check=0).stdout)["tests"]
    assert any(t["id"] == "hdr.icrc" and "ICRC-1" in t["clauses"] for t in listed)
    assert any(t["id"] == "psn.gap_sack" and t["profiles"] == {"metaroce": "base"}
               for t in listed)
