"""The BPF build cache (metaroce/kern/progcache.py) on the NIC program: a second build with
the same configuration loads from the cache, its maps equal BCC's (names, types, sizes, Key and
Leaf layouts; a value written through one is read the same through the other), the loaded
program gives the same verdicts, output bytes and counters for the same packets, and a damaged
entry falls back to compiling."""

import ctypes
import itertools
import os
import struct

import pytest
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from metaroce.kern import libbpf, progcache
from metaroce.kern.bpftables import CachedTable
from metaroce.nic import rx as rxmod
from metaroce.nic.rx import ACCESS_LOCAL_WRITE, ACCESS_REMOTE_READ, ACCESS_REMOTE_WRITE, RxPath

QPN, PD, PEER = 0x000123, 7, 0x000456
WRITE_ONLY, READ_REQ, SEND_ONLY = 0x0A, 0x0C, 0x04


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    d = tmp_path_factory.mktemp("pcbpf")
    os.chmod(d, 0o700)
    old = os.environ.get("METAROCE_BPF_CACHE")
    os.environ["METAROCE_BPF_CACHE"] = str(d)
    yield d
    if old is None:
        os.environ.pop("METAROCE_BPF_CACHE", None)
    else:
        os.environ["METAROCE_BPF_CACHE"] = old


@pytest.fixture(scope="module")
def pair(cache):
    """(compiled, cached) RxPaths of one configuration."""
    a = RxPath(max_qps=64, max_mrs=64)
    b = RxPath(max_qps=64, max_mrs=64)
    yield a, b
    a.close()
    b.close()


def test_second_build_is_from_cache_and_fast(pair, cache):
    a, b = pair
    assert a.build_info["source"] == "compiled" and b.build_info["source"] == "cache"
    assert a.build_info["key"] == b.build_info["key"]
    # the kernel verifier (~0.9 s for nic_rx on the test machine) is the floor of a cached load
    assert b.build_info["seconds"] < a.build_info["seconds"] / 2
    entry = cache / next(p for p in os.listdir(cache) if not p.startswith("."))
    assert os.stat(entry).st_mode & 0o777 == 0o700
    assert all(os.stat(entry / f).st_mode & 0o777 == 0o600 for f in os.listdir(entry))


class MapInfo(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("key_size", ctypes.c_uint32),
                ("value_size", ctypes.c_uint32), ("max_entries", ctypes.c_uint32),
                ("map_flags", ctypes.c_uint32), ("name", ctypes.c_char * 16),
                ("rest", ctypes.c_uint8 * 128)]


def map_info(fd):
    info, n = MapInfo(), ctypes.c_uint32(ctypes.sizeof(MapInfo))
    lib = libbpf.lib()
    lib.bpf_obj_get_info_by_fd.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    assert lib.bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(n)) == 0
    return (info.type, info.key_size, info.value_size, info.max_entries, info.map_flags, info.name)


def layout(t):
    """A ctypes type as nested (size, [(field, offset, layout)]) / element layouts."""
    if t is None:
        return None
    if hasattr(t, "_length_"):
        return ("array", t._length_, layout(t._type_))
    if hasattr(t, "_fields_"):
        return (ctypes.sizeof(t), [(f[0], getattr(t, f[0]).offset, layout(f[1])) for f in t._fields_])
    return (ctypes.sizeof(t), t._type_)


def test_maps_equal_bcc_tables(pair):
    a, b = pair
    names = sorted(b.bpf.meta["maps"])
    assert "mrs" in names and "mr_tmpl" in names and "qps" in names
    for name in names:
        bt, ct_ = a.bpf[name.encode()], b.bpf[name.encode()]
        assert map_info(bt.map_fd) == map_info(ct_.map_fd), name
        if name != "events":                    # BCC gives a ring buffer no Key/Leaf to compare
            assert layout(bt.Key) == layout(ct_.Key), name
            assert layout(bt.Leaf) == layout(ct_.Leaf), name


def test_values_cross_between_bcc_and_cached_tables(pair):
    a, b = pair
    meta = b.bpf.meta["maps"]
    bq = a.bpf[b"qps"]
    cq = CachedTable("qps", meta["qps"], bq.map_fd)          # the facade on BCC's map
    leaf = bq.Leaf()
    leaf.epsn, leaf.pd, leaf.pmtu = 77, 3, 1024
    bq[bq.Key(99)] = leaf
    got = cq[cq.Key(99)]
    assert bytes(got) == bytes(leaf)
    got.epsn = 78
    cq[cq.Key(98)] = got
    assert bq[bq.Key(98)].epsn == 78 and bytes(bq[bq.Key(98)])[4:] == bytes(got)[4:]
    del cq[cq.Key(98)]
    with pytest.raises(KeyError):
        bq[bq.Key(98)]
    with pytest.raises(KeyError):
        cq[cq.Key(98)]
    del bq[bq.Key(99)]
    bc = a.bpf[b"rx_counters"]
    cc = CachedTable("rx_counters", meta["rx_counters"], bc.map_fd)
    v = bc.Leaf()
    for i in range(len(v)):
        v[i] = i + 5
    bc[bc.Key(3)] = v
    assert list(cc[cc.Key(3)]) == list(v) and sum(cc[cc.Key(3)]) == sum(bc[bc.Key(3)])
    cc[cc.Key(3)] = cc.Leaf()
    assert sum(bc[bc.Key(3)]) == 0


def pkt(opcode, psn, body, v6=False, ackreq=1):
    ip = IPv6(src="fd00::1", dst="fd00::2") if v6 else IP(src="10.0.0.1", dst="10.0.0.2")
    return bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / ip /
                 UDP(sport=49152, dport=4791) /
                 BTH(opcode=opcode, dqpn=QPN, psn=psn, ackreq=ackreq) / Raw(body))


def setup(rx, monkeypatch):
    seq = itertools.count(0x1234567)
    monkeypatch.setattr(rxmod.secrets, "randbits", lambda n: next(seq) & ((1 << n) - 1))
    mr = rx.reg_mr(1 << 18, PD, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ,
                   addr=0x7000000)
    rx.set_qp(QPN, epsn=100, pd=PD, dqpn=PEER, sq_psn=500)
    rx.post_recv(QPN, 0, wr_id=1, addr=mr.addr + 8192, lkey=mr.rkey, length=4096)
    return mr


def packets(mr):
    data = bytes(range(256)) * 4
    reth = lambda off, n, rkey=mr.rkey: struct.pack("!QII", mr.addr + off, rkey, n)  # noqa: E731
    return [pkt(WRITE_ONLY, 100, reth(0, len(data)) + data),
            pkt(WRITE_ONLY, 100, reth(0, len(data)) + data),                 # duplicate
            pkt(WRITE_ONLY, 105, reth(0, 16) + bytes(16)),                   # out of order
            pkt(WRITE_ONLY, 101, reth(0, 16, rkey=mr.rkey ^ 1) + bytes(16)),  # bad rkey
            pkt(WRITE_ONLY, 101, reth(1 << 18, 16) + bytes(16)),             # out of bounds
            pkt(READ_REQ, 101, reth(64, 128)),
            pkt(SEND_ONLY, 102, b"hello, cache" * 10, v6=True),
            pkt(0x1F, 103, b""),                                             # bad opcode
            b"\xff" * 60]                                                    # not RoCE


def test_same_packets_same_results(pair, monkeypatch):
    results = []
    for rx in pair:
        mr = setup(rx, monkeypatch)
        out = [rx.run(p)[:2] for p in packets(mr)]
        results.append((out, rx.counters(), rx.event_counters(), rx.qp_state(QPN),
                        bytes(mr.buf[:16384])))
        rx.dereg_mr(mr)
        rx.del_qp(QPN)
    assert results[0][0] == results[1][0]
    assert results[0][1:] == results[1][1:]
    assert results[0][1]["placed"] >= 1 and results[0][1]["bad_rkey"] == 1


def test_a_damaged_entry_is_compiled_again(pair, cache):
    entry = cache / next(p for p in os.listdir(cache) if not p.startswith("."))
    insns = entry / "nic_rx.insns"
    raw = insns.read_bytes()
    insns.write_bytes(raw[: len(raw) // 2])
    rx = RxPath(max_qps=64, max_mrs=64)
    try:
        assert rx.build_info["source"] == "compiled" and "damaged" in rx.build_info["note"]
        assert rx.run(b"\xff" * 60)[0] == 2
    finally:
        rx.close()
    assert len((entry / "nic_rx.insns").read_bytes()) == len(raw)   # rewritten whole
    assert progcache._read_entry(entry) is not None


def test_fabric_with_a_spin_lock_map_loads_from_cache(cache):
    """The lab fabric's vqueue map holds a bpf_spin_lock: the cached build recreates it with
    the recorded BTF, and its programs (XDP and TC) load."""
    from metaroce.kern import btf
    from metaroce.kern.bcc_loader import build_program, load
    from metaroce.lab import fabric
    builds = [build_program("lab/fabric.bpf.c", {"MAX_PORTS": fabric.MAX_PORTS},
                            dict(fabric.PROGRAMS.values())) for _ in range(2)]
    try:
        assert [b.build_info["source"] for b in builds] == ["compiled", "cache"]
        for b in builds:
            fabric._check_layouts(b)
            assert all(load(b, f, k).fd >= 0 for f, k in fabric.PROGRAMS.values())
        infos = [btf.map_info(b[b"vqueue"].map_fd) for b in builds]
        assert infos[1].btf_id and infos[0].btf_value_type_id == infos[1].btf_value_type_id
        for name in builds[1].meta["maps"]:
            assert map_info(builds[0][name.encode()].map_fd) == map_info(builds[1][name.encode()].map_fd)
    finally:
        for b in builds:
            b.cleanup()
