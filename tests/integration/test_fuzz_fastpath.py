"""The fast-path fuzzer: random and mutated packets through the real XDP program with
BPF_PROG_TEST_RUN. A modest run must keep every invariant and reach every deep check; runs with a
deliberate fault (a guard byte written, a byte of a read-only region written, a count lost or
doubled, a reply or a passed frame damaged) must be reported, so the checks are known to fire;
the CLI keeps its contract."""

import json
import os
import subprocess
import sys

import pytest

PACKETS = 150_000


@pytest.fixture(scope="module")
def fuzzer():
    from metaroce.fuzz.harness import load_fuzzer
    fz = load_fuzzer(seed=11)
    yield fz
    fz.close()


def test_fuzz_keeps_every_invariant_and_reaches_every_deep_check(fuzzer):
    from metaroce.fuzz.harness import DEEP_REASONS
    rep = fuzzer.run(PACKETS)
    assert rep["failures"] == [] and rep["ok"], rep["failures"]
    assert rep["packets"] == PACKETS
    assert rep["accepted"] + rep["passed"] + rep["tx"] + rep["dropped"] == PACKETS
    assert rep["unaccounted"] == rep["out_of_region_writes"] == rep["guard_bytes_changed"] == 0
    assert rep["crashes"] == rep["bad_retval"] == rep["bad_replies"] == rep["pass_modified"] == 0
    assert sum(rep["drops_by_reason"].values()) == rep["dropped"]
    assert sum(rep["tx_by_reason"].values()) == rep["tx"]
    assert rep["final_write_ok"]
    # every deep check reached many times, not once by luck
    assert rep["deep_reasons_missing"] == []
    assert set(rep["deep_reasons"]) == set(DEEP_REASONS)
    few = {r: n for r, n in rep["deep_reasons"].items() if n < 20}
    assert not few, f"deep checks hardly reached: {few}"
    # every kind of accepted work happened: placement, atomics, READ requests, ACKs consumed
    for r in ("placed", "atomic", "read_request", "ack"):
        assert rep["accepted_by_reason"].get(r, 0) > 20, rep["accepted_by_reason"]
    assert rep["replies"].get("ack", 0) > 0 and rep["replies"].get("nak_seq", 0) > 0
    # the MetaRoCE-mode QP took MR_* requests of every kind (placement by PETH and RETH in
    # every packet, receive WQEs by RSN, atomics and READs at the cumulative PSN)
    mr = rep["metaroce_accepted_by_work"]
    assert all(mr.get(k, 0) >= 20 for k in ("write", "send", "atomic", "read_request")), mr


@pytest.mark.parametrize("fault, field", [("guard", "guard_bytes_changed"),
                                          ("region", "out_of_region_writes"),
                                          ("lose_count", "unaccounted"),
                                          ("extra_count", "double_counted"),
                                          ("bad_reply", "bad_replies"),
                                          ("pass_modified", "pass_modified")])
def test_the_checks_fire_on_a_deliberate_fault(fuzzer, fault, field):
    rep = fuzzer.run(3000, faults={1234: fault})
    assert not rep["ok"] and rep["violations"] >= 1, rep
    assert rep[field] >= 1, (fault, rep["failures"])
    assert rep["failures"]
    # and the fuzzer is whole again afterwards: a clean run passes
    clean = fuzzer.run(1000)
    assert clean["ok"], clean["failures"]


def test_the_final_write_check_fires_when_placement_stops(fuzzer):
    """Without the region's rkey in the program's MR map nothing is placed: the closing valid
    WRITE must be reported as not placed."""
    from metaroce.kern import libbpf
    import struct
    g = fuzzer.regions[0]
    key = struct.pack("=I", g.rkey)
    mrs_fd = fuzzer.rx.bpf[b"mrs"].map_fd
    saved = fuzzer.rx.mrs[g.rkey].fd
    libbpf.map_delete_raw(mrs_fd, key)
    try:
        rep = fuzzer.run(500)
    finally:
        libbpf.map_update_raw(mrs_fd, key, struct.pack("=I", saved))
    assert not rep["final_write_ok"] and not rep["ok"]
    assert fuzzer.run(500)["ok"]


METAROCE = [sys.executable, "-m", "metaroce.cli"]
ENV = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(__file__)))}


def cli(*args, user=None):
    cmd = METAROCE + list(args)
    if user:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] + cmd
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)


def test_cli_json_is_one_document_with_the_contract_fields():
    p = cli("fuzz", "--packets", "4000", "--seed", "2", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)                       # exactly one JSON document
    assert p.stdout.count("\n") == 1
    for k in ("packets", "accepted", "passed", "tx", "dropped", "drops_by_reason", "unaccounted",
              "out_of_region_writes", "crashes"):
        assert k in doc, k
    assert doc["packets"] == 4000 and doc["ok"] is True
    assert doc["packets"] == (doc["accepted"] + doc["passed"] + doc["tx"] + doc["dropped"] +
                              doc["unaccounted"])


@pytest.mark.parametrize("args", [("--packets", "0"), ("--packets", "many"), ("--bogus",),
                                  ("--wire", "--time-limit", "5"), ("--mtu", "9001"),
                                  ("--mtu", "jumbo"), ("--wire", "--mtu", "100")])
def test_cli_bad_arguments_are_one_line_and_non_zero(args):
    p = cli("fuzz", *args)
    assert p.returncode != 0 and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and "error" in p.stderr
    pj = cli("fuzz", *args, "--json")
    assert pj.returncode != 0 and "error" in json.loads(pj.stdout)


def test_cli_without_root_says_sudo():
    p = cli("fuzz", "--packets", "10", user="65534")
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "sudo" in lines[0], p.stderr


# -- jumbo frames (issue 21): MTU 9000, PMTU 4096, multi-buffer xdp_buffs ----------------------

JUMBO_PACKETS = 25_000


@pytest.fixture(scope="module")
def jumbo():
    from metaroce.fuzz.harness import load_fuzzer
    fz = load_fuzzer(seed=13, mtu=9000)
    yield fz
    fz.close()


def test_jumbo_fuzz_runs_the_fragments_path_and_keeps_every_invariant(jumbo):
    """Frames up to 9014 bytes (and a few past them) at PMTU 4096: most reach the program as
    multi-buffer xdp_buffs, many with a linear part cut at a header edge; the program counts
    every one of them (its rcv_multi_buf port counter, checked per batch against what the test
    runs handed over) and sees all their bytes; nothing is unaccounted or written out of place."""
    from metaroce.fuzz.harness import DEEP_REASONS
    rep = jumbo.run(JUMBO_PACKETS)
    assert rep["failures"] == [] and rep["ok"], rep["failures"]
    assert rep["mtu"] == 9000 and rep["pmtu"] == 4096 and rep["max_frame"] == 9014
    assert rep["unaccounted"] == rep["out_of_region_writes"] == rep["short_views"] == 0
    assert rep["accepted"] + rep["passed"] + rep["tx"] + rep["dropped"] == JUMBO_PACKETS
    # the fragments path ran, and not by luck: a third of the frames at least, hundreds of
    # them accepted (placed, executed), the program's own count of the RoCE ones
    assert rep["multi_buffer_frames"] >= JUMBO_PACKETS // 3, rep["multi_buffer_frames"]
    assert rep["multi_buffer_accepted"] >= 300 and rep["multi_buffer_passed"] >= 300, rep
    assert rep["multi_buffer_seen"] == rep["multi_buffer_frames"] - rep["multi_buffer_passed"]
    work = rep["multi_buffer_accepted_by_work"]             # 4 KiB WRITE, SEND, READ response
    assert all(work.get(k, 0) >= 20 for k in ("write", "send", "read_response")), work
    assert rep["linear_splits"] >= JUMBO_PACKETS // 5
    assert rep["largest_frame"] > 9014
    assert rep["deep_reasons_missing"] == [] and set(rep["deep_reasons"]) == set(DEEP_REASONS)
    assert rep["accepted_by_reason"].get("placed", 0) > 500 and rep["final_write_ok"]
    # the MetaRoCE-mode QP at the fitted path MTU (CM-14): payloads past the IB enum's 4096
    # bytes, placed across fragments and checked like the rest
    assert rep["pmtu_metaroce"] == 8064
    mr = rep["metaroce_accepted_by_work"]
    assert mr.get("write", 0) >= 20 and mr.get("send", 0) >= 10, mr
    assert rep["metaroce_accepted_past_4096"] >= 20, rep["metaroce_accepted_past_4096"]


@pytest.mark.parametrize("fault, field", [("lose_count", "unaccounted"),
                                          ("short_view", "short_views"),
                                          ("guard", "guard_bytes_changed")])
def test_jumbo_checks_fire_on_a_deliberate_fault(jumbo, fault, field):
    rep = jumbo.run(3000, faults={1500: fault})
    assert not rep["ok"] and rep[field] >= 1, (fault, rep["failures"])
    assert jumbo.run(1000)["ok"]


def test_jumbo_run_without_fragments_fails(jumbo, monkeypatch):
    """If no frame reached the program in fragments (frames cut to fit the linear part, no
    chosen splits), the jumbo run must not pass."""
    from metaroce.fuzz import harness
    real = harness.Generator

    class Small(real):
        def __iter__(self):
            for f in super().__iter__():
                yield f[:harness.LINEAR_MAX]
    monkeypatch.setattr(harness, "Generator", Small)
    monkeypatch.setattr(jumbo, "can_split", False)
    rep = jumbo.run(2000)
    assert rep["multi_buffer_frames"] == 0 and not rep["ok"]
    assert any("fragments path did not run" in f for f in rep["failures"]), rep["failures"]


def test_cli_jumbo_json_reports_the_multi_buffer_frames():
    p = cli("fuzz", "--packets", "3000", "--seed", "4", "--mtu", "9000", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["ok"] and doc["mtu"] == 9000 and doc["pmtu"] == 4096
    assert doc["multi_buffer_frames"] > 500 and doc["multi_buffer_seen"] > 0
    assert doc["unaccounted"] == doc["out_of_region_writes"] == 0
