"""The numbers in the spec text equal the codec's constants, and the ICRC worked example
(read from the spec) is confirmed by scapy.contrib.roce."""

import re
import zlib

import pytest
from _deps import require

from metaroce import spec
from metaroce.wire import consts as C
from metaroce.wire import icrc, parse_frame
from metaroce.wire.layout import LAYOUTS

HEADER_NAMES = {"—": (), "16 reserved bytes": ("CNP",)}


def _doc(name):
    return (spec.spec_dir() / name).read_text()


def _header_names(cell):
    cell = cell.strip()
    if cell in HEADER_NAMES:
        return HEADER_NAMES[cell]
    return tuple(h.strip() for h in cell.split(","))


def _table_rows(text, clause_id):
    clause = next(c for c in spec.clauses() if c.id == clause_id)
    return re.findall(r"^\| (0x[0-9A-F]{2})(?:–(0x[0-9A-F]{2}))? \| ([\w /]+?) \| ([^|]+) \| (yes|no) \|$",
                      clause.text, re.M)


def _expand(first, last, names):
    parts = [p.strip() for p in names.split("/")]
    base = parts[0].rsplit("_", 1)[0]
    full = [parts[0]] + [f"{base}_{p}" for p in parts[1:]]
    codes = list(range(int(first, 16), int(last or first, 16) + 1))
    assert len(codes) == len(full), (first, last, names)
    return zip(codes, full)


@pytest.mark.parametrize("clause_id", ["HDR-3", "EXT-2"])
def test_opcode_tables_match_the_codec(clause_id):
    rows = _table_rows(None, clause_id)
    assert rows
    seen = {}
    for first, last, names, headers, payload in rows:
        for code, name in _expand(first, last, names):
            seen[code] = (name, _header_names(headers), payload == "yes")
    for code, (name, headers, payload) in seen.items():
        lay = LAYOUTS[code]
        assert C.OPCODE_NAMES[code] == name, hex(code)
        assert tuple(h.NAME for h in lay.headers) == headers, hex(code)
        assert lay.payload == payload, hex(code)
    ours = {op for op in LAYOUTS if (op >= 0xC0) == (clause_id == "EXT-2")}
    assert set(seen) == ours


def test_aeth_tables_match_the_codec():
    text = _doc("02-headers.md")
    credits = re.search(r"ACK credit codes 0–30 stand for ([\d, \n]+) available", text)[1]
    assert tuple(int(x) for x in re.findall(r"\d+", credits)) == C.AETH_CREDIT_TABLE
    timers = re.search(r"RNR timer codes \(minimum time before retry, ms\): (.+?)\n\n", text, re.S)[1]
    pairs = re.findall(r"(\d+) = (\d+(?:\.\d+)?)", timers)
    assert [int(k) for k, _ in pairs] == list(range(32))
    assert tuple(round(float(v) * 1000) for _, v in pairs) == C.RNR_TIMER_USEC
    naks = dict((int(code, 16), int(val)) for code, val in
                re.findall(r"^\| (0x6[0-4]) \| 11 NAK \| (\d):", text, re.M))
    assert naks == {0x60 | c: c for c in C.NakCode}


def test_cmeth_capability_bits_match_the_codec():
    clause = next(c for c in spec.clauses() if c.id == "EXT-7")
    bits = dict(re.findall(r"([A-Z_]+) (0x[0-9a-f]{2})", clause.text))
    assert {name: int(v, 16) for name, v in bits.items()} == {c.name: int(c) for c in C.Cap}


def _hex_block(label):
    m = re.search(r"```hex " + re.escape(label) + r"\n(.*?)```", _doc("02-headers.md"), re.S)
    assert m, label
    return bytes.fromhex(m[1])


@pytest.mark.parametrize("version,stated", [(4, 0x84F8D2EE), (6, 0xF20B1158)])
def test_icrc_worked_example_is_confirmed_by_scapy(version, stated):
    scapy_all = require("scapy.all", "the independent RoCEv2 decoder (the test extra)")
    roce = require("scapy.contrib.roce", "the independent RoCEv2 decoder (the test extra)")
    l3 = _hex_block(f"icrc-example-ipv{version}")
    text = _doc("02-headers.md")
    assert f"0x{stated:08X}" in text and stated.to_bytes(4, "little").hex(" ") in text
    assert l3[-4:] == stated.to_bytes(4, "little")
    ip = scapy_all.IP(l3) if version == 4 else scapy_all.IPv6(l3)
    assert ip[roce.BTH].opcode == C.Opcode.RC_SEND_ONLY and ip[roce.BTH].psn == 0xABCD
    ip[roce.BTH].icrc = None
    assert bytes(ip) == l3  # scapy computes the same ICRC from the spec's bytes
    assert icrc.compute(l3[:-4]) == stated
    ethertype = b"\x08\x00" if version == 4 else b"\x86\xdd"
    assert parse_frame(bytes(12) + ethertype + l3).payload == b"MetaRoCE"
    if version == 4:
        masked = _hex_block("icrc-example-ipv4-masked")
        assert masked == b"\xff" * 8 + icrc.masked_header(l3[:-4]) + b"MetaRoCE"
        assert zlib.crc32(masked) == stated


def test_icrc_seed_shortcut_of_icrc3():
    # The CRC register after eight 0xFF bytes, un-complemented, is rxe's seed 0xDEBB20E3.
    assert zlib.crc32(b"\xff" * 8) ^ 0xFFFFFFFF == 0xDEBB20E3
    assert "0xDEBB20E3" in _doc("02-headers.md")


def test_cnp_example_bytes():
    from metaroce.wire.samples import sample_packet
    assert "81 00 ff ff 40 00 00 d2 00 00 00 00" in _doc("02-headers.md")
    pkt = sample_packet(C.Opcode.CNP)
    assert pkt.bth.pack()[:5] == bytes.fromhex("8100ffff40")


def test_sack_example_bytes():
    from metaroce.wire import SACKETH
    text = _doc("05-metaroce-mode.md")
    example = re.search(r"the 16 bitmap bytes are\n`([0-9a-f ]+)`", text)[1]
    bitmap = SACKETH.bitmap_for(0x000100, [0x000102, 0x000103, 0x000110])
    assert SACKETH(bitmap=bitmap).pack()[16:] == bytes.fromhex(example)
