"""The BPF C headers restate wire numbers and counter layouts; check they agree with the Python
side (metaroce.wire.consts is the single source of truth) so they cannot drift apart."""

import re
from pathlib import Path

from metaroce.lab import fabric
from metaroce.nic.rx import PORT_COUNTERS, RX_REASONS, TX_COUNTERS
from metaroce.wire import consts

BPF = Path(__file__).resolve().parents[2] / "bpf"


def defines(path: Path) -> dict[str, int]:
    out = {}
    for m in re.finditer(r"^#define\s+(\w+)\s+\(?(0x[0-9A-Fa-f]+|\d+)U?(?:\s*<<\s*(\d+))?\)?",
                         path.read_text(), re.M):
        value = int(m.group(2), 0) << int(m.group(3) or 0)
        out[m.group(1)] = value
    return out


def test_nic_wire_numbers_match_the_codec():
    d = defines(BPF / "nic" / "nic_consts.h")
    opcodes = {k: v for k, v in d.items() if k.startswith("RC_")}
    assert len(opcodes) >= 6
    for name, value in opcodes.items():
        assert consts.Opcode[name] == value, name
    assert d["ROCE_UDP_PORT"] == consts.ROCEV2_UDP_PORT
    assert d["BTH_LEN"] == consts.BTH_LEN and d["RETH_LEN"] == consts.RETH_LEN
    assert d["ICRC_LEN"] == consts.ICRC_LEN and d["PSN_MASK"] == consts.PSN_MASK


def test_nic_drop_reasons_match_their_names():
    d = defines(BPF / "nic" / "nic_consts.h")
    reasons = sorted(((v, k) for k, v in d.items() if k.startswith("RX_") and k != "RX_NREASONS"))
    assert [k[3:].lower() for _, k in reasons] == list(RX_REASONS)
    assert d["RX_NREASONS"] == len(RX_REASONS)
    replies = sorted(((v, k) for k, v in d.items() if k.startswith("TX_") and k != "TX_NCOUNTERS"))
    assert [k[3:].lower() for _, k in replies] == list(TX_COUNTERS)
    port = sorted(((v, k) for k, v in d.items() if k.startswith("PORT_") and k != "PORT_NCOUNTERS"))
    assert [k[5:].lower() for _, k in port] == list(PORT_COUNTERS)
    assert d["PORT_NCOUNTERS"] == len(PORT_COUNTERS)
    assert d["RC_ACKNOWLEDGE"] == consts.Opcode.RC_ACKNOWLEDGE
    assert d["AETH_ACK_UNLIMITED"] == consts.AETH_ACK_UNLIMITED
    assert d["AETH_NAK_PSN_SEQ"] == consts.AethType.NAK | consts.NakCode.PSN_SEQ_ERROR


def test_fabric_flags_match():
    d = defines(BPF / "lab" / "fabric_consts.h")
    assert d["IMPAIR_ENABLED"] == fabric.IMPAIR_ENABLED
    assert d["IMPAIR_ALL_TRAFFIC"] == fabric.IMPAIR_ALL_TRAFFIC
    assert d["MAX_PORTS"] == fabric.MAX_PORTS
    assert d["ROCE_UDP_PORT"] == consts.ROCEV2_UDP_PORT


def test_nic_event_and_state_numbers_match():
    from metaroce.nic import rx
    d = defines(BPF / "nic" / "nic_consts.h")
    for name in ("EV_RECV", "EV_READ_REQUEST", "EV_ACK", "EV_NAK", "EV_RD_DONE", "EV_RD_GAP",
                 "EV_CNP", "EV_RECV_ERR", "EV_QP_ERROR", "EV_SACK", "EV_EPSN", "QP_RX_ERROR",
                 "RD_READ", "RD_ATOMIC", "RQ_DEPTH", "RD_DEPTH"):
        assert d[name] == getattr(rx, name), name
