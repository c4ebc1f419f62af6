"""Golden vectors checked against decoders we did not write: scapy.contrib.roce and tshark."""

import json
import subprocess

import pytest
from _deps import require, require_tool

from metaroce.wire import AETH, RETH, AtomicAckETH, AtomicETH, ImmDt, parse_frame
from metaroce.wire import consts as C
from metaroce.wire.layout import LAYOUTS
from metaroce.wire.pcap import write_pcap
from metaroce.wire.samples import sample_packets

scapy_all = require("scapy.all", "the independent RoCEv2 decoder (the test extra)")
roce = require("scapy.contrib.roce", "the independent RoCEv2 decoder (the test extra)")

PACKETS = sample_packets()


@pytest.fixture(scope="module")
def tshark() -> str:
    return require_tool("tshark", "the independent RoCEv2 decoder (Debian package tshark; "
                                  "make setup installs it)")


def test_samples_cover_every_opcode_in_both_ip_versions():
    seen = {(p.ip.version, p.bth.opcode) for p in PACKETS}
    assert seen == {(v, op) for v in (4, 6) for op in LAYOUTS}
    assert {p.bth.pad_count for p in PACKETS} == {0, 1, 2, 3}


@pytest.mark.parametrize("pkt", PACKETS, ids=lambda p: f"v{p.ip.version}-{p.opcode_name}")
def test_scapy_agrees_on_bth_and_icrc(pkt):
    raw = pkt.to_bytes()
    s = scapy_all.Ether(raw)
    bth = s[roce.BTH]
    assert (bth.opcode, bth.dqpn, bth.psn, bth.ackreq) == (
        pkt.bth.opcode, pkt.bth.dest_qp, pkt.bth.psn, pkt.bth.ack_req)
    assert (bth.solicited, bth.padcount, bth.pkey, bth.becn) == (
        pkt.bth.se, pkt.bth.pad_count, pkt.bth.pkey, pkt.bth.becn)
    # Let scapy recompute the ICRC from scratch: it must produce our bytes exactly.
    bth.icrc = None
    assert bytes(s) == raw
    assert parse_frame(raw) == pkt


def test_scapy_built_packets_parse_with_valid_icrc():
    for ip in (scapy_all.IP(src="10.1.1.1", dst="10.1.1.2", tos=0x68),
               scapy_all.IPv6(src="fd00::1", dst="fd00::2", tc=0x6a, fl=0xABCDE)):
        s = (scapy_all.Ether() / ip / scapy_all.UDP(sport=0xD00D, dport=4791)
             / roce.BTH(opcode=C.Opcode.RC_ACKNOWLEDGE, dqpn=0x123456, psn=0xFFFFFF, ackreq=0)
             / roce.AETH(syndrome=0x60 | 2, msn=0xABCDEF))
        pkt = parse_frame(bytes(s))
        assert pkt.get(AETH) == AETH(syndrome=0x62, msn=0xABCDEF)
        assert (pkt.bth.dest_qp, pkt.bth.psn, pkt.udp.sport) == (0x123456, 0xFFFFFF, 0xD00D)
        cnp = bytes(scapy_all.Ether() / ip / scapy_all.UDP(sport=0xC001, dport=4791) / roce.cnp(0xD2))
        assert parse_frame(cnp).bth.pack() == bytes.fromhex("8100ffff400000d200000000")


def _tshark_fields(tshark, path, fields):
    out = subprocess.run([tshark, "-r", str(path), "-T", "fields", "-E", "separator=|",
                          "-E", "occurrence=f", *sum((["-e", f] for f in fields), [])],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return [line.split("|") for line in out.splitlines()]


def _num(text):
    return None if text == "" else int(text, 0)


def test_tshark_agrees_on_every_opcode(tshark, tmp_path):
    path = tmp_path / "all.pcap"
    write_pcap(path, (p.to_bytes() for p in PACKETS))
    fields = ["frame.number", "infiniband.bth.opcode", "infiniband.bth.destqp",
              "infiniband.bth.psn", "infiniband.bth.a", "infiniband.bth.padcnt",
              "infiniband.reth.va", "infiniband.reth.r_key", "infiniband.reth.dmalen",
              "infiniband.aeth.syndrome", "infiniband.aeth.msn", "udp.dstport", "_ws.malformed",
              "infiniband.atomiceth.swapdt", "infiniband.atomiceth.cmpdt",
              "infiniband.atomicacketh.origremdt", "infiniband.immdt"]
    rows = _tshark_fields(tshark, path, fields)
    assert len(rows) == len(PACKETS)
    for row, pkt in zip(rows, PACKETS):
        got = dict(zip(fields, row))
        assert got["_ws.malformed"] == "", f"tshark flags frame {got['frame.number']} malformed"
        assert _num(got["udp.dstport"]) == 4791
        assert _num(got["infiniband.bth.opcode"]) == pkt.bth.opcode
        assert _num(got["infiniband.bth.destqp"]) == pkt.bth.dest_qp
        assert _num(got["infiniband.bth.psn"]) == pkt.bth.psn
        assert _num(got["infiniband.bth.a"]) == pkt.bth.ack_req
        assert _num(got["infiniband.bth.padcnt"]) == pkt.bth.pad_count
        if pkt.bth.opcode >= C.METAROCE_OPCODE_MIN:
            continue  # manufacturer-specific: tshark decodes the BTH only
        reth, aeth, atomic = pkt.get(RETH), pkt.get(AETH), pkt.get(AtomicETH)
        if reth:
            assert (_num(got["infiniband.reth.va"]), _num(got["infiniband.reth.r_key"]),
                    _num(got["infiniband.reth.dmalen"])) == (reth.va, reth.rkey, reth.dma_len)
        elif atomic:  # tshark shows AtomicETH's VA and R_Key under the reth fields
            assert (_num(got["infiniband.reth.va"]), _num(got["infiniband.reth.r_key"])) == (
                atomic.va, atomic.rkey)
            assert (_num(got["infiniband.atomiceth.swapdt"]),
                    _num(got["infiniband.atomiceth.cmpdt"])) == (atomic.swap_add, atomic.compare)
        else:
            assert got["infiniband.reth.va"] == ""
        if aeth:
            assert (_num(got["infiniband.aeth.syndrome"]), _num(got["infiniband.aeth.msn"])) == (
                aeth.syndrome, aeth.msn)
        else:
            assert got["infiniband.aeth.syndrome"] == ""
        ack = pkt.get(AtomicAckETH)
        assert _num(got["infiniband.atomicacketh.origremdt"]) == (ack.orig if ack else None)
        imm = pkt.get(ImmDt)
        assert got["infiniband.immdt"].replace(":", "") == (f"{imm.value:08x}" if imm else "")


def test_tshark_sees_no_malformed_or_expert_warnings(tshark, tmp_path):
    path = tmp_path / "all.pcap"
    write_pcap(path, (p.to_bytes() for p in PACKETS))
    out = subprocess.run([tshark, "-r", str(path), "-T", "json", "-Y",
                          "_ws.malformed || _ws.expert.severity >= warning"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    assert json.loads(out or "[]") == []
