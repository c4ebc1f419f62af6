"""`metaroce fuzz --wire` (issue 9): generator frames sent over a real veth from h1 to the real
daemon on h2 with live QPs and regions. Every frame that reached the device got exactly one
counted verdict, no byte outside a region changed, the daemon lives and still serves, and the
deep checks behind the ICRC were reached."""

import json
import subprocess
import sys

from metaroce.fuzz.harness import DEEP_REASONS


def test_wire_fuzz_accounts_for_every_frame():
    p = subprocess.run([sys.executable, "-m", "metaroce.cli", "fuzz", "--wire", "--packets", "3000",
                        "--seed", "7", "--json"], capture_output=True, text=True, timeout=600)
    assert p.stdout, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["unaccounted"] == 0 and r["delivered"] == r["seen_by_xdp"], r
    assert r["out_of_region_writes"] == 0 and r["crashes"] == 0, r
    assert r["daemon_serves_after"], p.stderr[-2000:]
    assert p.returncode == 0 and r["ok"], r
    assert r["delivered"] == r["accepted"] + r["passed"] + r["dropped"]
    assert r["sent"] + r["refused_by_socket"] == r["packets"]
    assert r["delivered"] >= 0.7 * r["packets"]            # most frames reach the device
    assert r["out_of_region_writes"] == 0 and r["crashes"] == 0 and r["daemon_serves_after"]
    hit = {k for k, v in r["deep_reasons_hit"].items() if v > 0}
    assert {"bad_rkey", "mr_bounds", "psn_out_of_order", "bad_icrc", "malformed",
            "bad_opcode_seq", "duplicate"} <= hit, r["deep_reasons_hit"]
    assert set(r["deep_reasons_hit"]) == set(DEEP_REASONS)


def test_wire_fuzz_at_mtu_9000_reaches_the_fragments_path():
    """`--mtu 9000`: a jumbo pair lab, compat QPs at PMTU 4096 and the MetaRoCE QP at its fitted
    8064 (so 8064-byte payloads are placed), frames up to 9014 bytes. The NIC's
    program itself counts the RoCE frames that reached it as multi-buffer xdp_buffs; the run
    must have some, every frame accounted for, nothing written out of place, and a fresh QP
    pair must still move verified data at PMTU 8064 afterwards."""
    p = subprocess.run([sys.executable, "-m", "metaroce.cli", "fuzz", "--wire", "--mtu", "9000",
                        "--packets", "2000", "--seed", "3", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert p.stdout, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["mtu"] == 9000 and r["pmtu"] == 4096 and r["max_frame"] == 9014, r
    assert r["pmtu_metaroce"] == 8064, r              # the MetaRoCE QP's fitted MTU (CM-14)
    assert r["unaccounted"] == 0 and r["delivered"] == r["seen_by_xdp"], r
    assert r["delivered"] == r["accepted"] + r["passed"] + r["dropped"]
    assert r["out_of_region_writes"] == 0 and r["crashes"] == 0, r
    assert r["daemon_serves_after"], p.stderr[-2000:]
    # the fragments path ran: a good share of the frames were longer than a page, and the
    # program counted most of those as multi-buffer RoCE frames
    assert r["sent_longer_than_a_page"] >= 0.25 * r["packets"], r
    assert r["multi_buffer_frames"] >= 0.5 * r["sent_longer_than_a_page"], r
    assert r["rcv_bytes"] > 3520 * r["multi_buffer_frames"]
    assert p.returncode == 0 and r["ok"], r


def test_wire_fuzz_with_two_queues_goes_through_the_steering():
    """`--queues 2` (issue 21 item 3): the lab's veths have two queues, so the daemon steers by
    QP (nic_steer hands every RoCE frame to a CPU's nic_rx_cpu through a cpumap). Every frame is
    still accounted for, once, by the program on the far side of the hand-over; mutated frames
    that name no QP or no parseable one reach the default CPU and are counted there."""
    p = subprocess.run([sys.executable, "-m", "metaroce.cli", "fuzz", "--wire", "--queues", "2",
                        "--packets", "3000", "--seed", "11", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert p.stdout, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["queues"] == 2 and r["rx_steering"], r
    assert r["unaccounted"] == 0 and r["delivered"] == r["seen_by_xdp"], r
    assert r["delivered"] == r["accepted"] + r["passed"] + r["dropped"]
    assert r["out_of_region_writes"] == 0 and r["crashes"] == 0, r
    assert r["daemon_serves_after"], p.stderr[-2000:]
    assert r["steered_frames"] >= r["delivered"] - r["passed"] > 0, r
    hit = {k for k, v in r["deep_reasons_hit"].items() if v > 0}
    assert {"malformed", "bad_icrc", "mr_bounds"} <= hit, r["deep_reasons_hit"]
    assert r["drops_by_reason"].get("unknown_qp", 0) > 0, r["drops_by_reason"]
    assert p.returncode == 0 and r["ok"], r
