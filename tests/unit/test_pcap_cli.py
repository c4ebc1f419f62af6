"""`metaroce pcap sample|decode`: golden file, one JSON document with --json, clear errors."""

import json
import struct

import pytest

from metaroce.cli import main
from metaroce.wire import consts as C
from metaroce.wire.layout import LAYOUTS
from metaroce.wire.pcap import PcapError, read_pcap, write_pcap
from metaroce.wire.samples import sample_packet

KEYS = {"frame", "ip_version", "opcode", "opcode_name", "dest_qp", "psn", "ack_req", "icrc_ok",
        "error"}


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_sample_then_decode_json(tmp_path, capsys):
    path = tmp_path / "s.pcap"
    rc, _, err = run(capsys, "pcap", "sample", str(path))
    assert rc == 0 and "wrote" in err
    rc, out, _ = run(capsys, "pcap", "decode", str(path), "--json")
    assert rc == 0
    doc = json.loads(out)                    # one document, whatever the number of frames
    assert doc["file"] == str(path)
    docs = doc["frames"]
    assert len(docs) == 2 * len(LAYOUTS)
    assert [d["frame"] for d in docs] == list(range(1, len(docs) + 1))
    assert {(d["ip_version"], d["opcode"]) for d in docs} == {(v, o) for v in (4, 6) for o in LAYOUTS}
    for d in docs:
        assert KEYS <= d.keys()
        assert d["icrc_ok"] is True and d["error"] is None
        assert d["opcode_name"] == C.Opcode(d["opcode"]).name
        assert isinstance(d["ack_req"], bool)


def test_decode_reports_non_roce_and_broken_frames(tmp_path, capsys):
    good = sample_packet(C.Opcode.RC_RDMA_WRITE_ONLY, 4).to_bytes()
    bad_icrc = good[:-1] + bytes([good[-1] ^ 1])
    arp = bytes(12) + b"\x08\x06" + bytes(28)
    other_udp = bytearray(good)
    other_udp[36:38] = struct.pack("!H", 53)
    path = tmp_path / "mix.pcap"
    write_pcap(path, [good, bad_icrc, arp, bytes(other_udp), good[:40]])
    rc, out, _ = run(capsys, "pcap", "decode", "--json", str(path))
    assert rc == 0
    docs = json.loads(out)["frames"]
    assert [(d["error"], d["icrc_ok"]) for d in docs] == [
        (None, True), ("bad_icrc", False), ("not_ip", None), ("not_roce", None),
        ("truncated", None)]
    assert docs[1]["opcode"] == C.Opcode.RC_RDMA_WRITE_ONLY and docs[1]["reth"]["dma_len"] == 4096
    assert docs[2]["ip_version"] is None and docs[2]["opcode"] is None
    rc, text, _ = run(capsys, "pcap", "decode", str(path))
    lines = text.splitlines()
    assert len(lines) == 5 and "icrc=BAD" in lines[1] and "not RoCE (not_ip)" in lines[2]


@pytest.mark.parametrize("content,needle", [
    (None, "no such file"), (b"hello world, not a capture", "bad magic"),
    (struct.pack("<I", 0x0A0D0D0A) + bytes(28), "pcapng"),
    (struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 101), "not Ethernet"),
    (struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1) + struct.pack("<IIII", 0, 0, 1 << 30, 1 << 30),
     "exceeds"),
])
def test_decode_errors_are_one_line(tmp_path, capsys, content, needle):
    path = tmp_path / "x.pcap"
    if content is not None:
        path.write_bytes(content)
    rc, out, err = run(capsys, "pcap", "decode", str(path))
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1
    rc, out, _ = run(capsys, "pcap", "decode", "--json", str(path))
    assert rc == 2 and needle in json.loads(out)["error"]


def test_pcap_reader_handles_big_endian_and_nanoseconds(tmp_path):
    frame = sample_packet(C.Opcode.RC_ACKNOWLEDGE, 6).to_bytes()
    path = tmp_path / "be.pcap"
    path.write_bytes(struct.pack(">IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1)
                     + struct.pack(">IIII", 5, 999_999_999, len(frame), len(frame)) + frame)
    (rec,) = list(read_pcap(path))
    assert rec.data == frame and rec.ts_frac == 999_999_999
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(PcapError):
        list(read_pcap(path))


def test_sample_ipv_option_and_unwritable_target(tmp_path, capsys):
    path = tmp_path / "v6.pcap"
    rc, out, _ = run(capsys, "pcap", "sample", str(path), "--ipv", "6", "--json")
    assert rc == 0 and json.loads(out)["packets"] == len(LAYOUTS)
    rc, _, err = run(capsys, "pcap", "sample", str(tmp_path / "missing" / "x.pcap"))
    assert rc != 0 and "cannot write" in err


def test_decode_json_is_one_document_even_when_the_file_breaks_off(tmp_path, capsys):
    """Frames before a cut-off record and the error are not separate documents: --json prints
    exactly one document, here {"error": ...}."""
    good = sample_packet(C.Opcode.RC_RDMA_WRITE_ONLY, 4).to_bytes()
    path = tmp_path / "cut.pcap"
    write_pcap(path, [good, good])
    path.write_bytes(path.read_bytes()[:-10])
    rc, out, _ = run(capsys, "pcap", "decode", "--json", str(path))
    docs = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert rc == 2 and len(docs) == 1 and set(docs[0]) == {"error"}
