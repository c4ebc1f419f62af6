"""The rxe peer's pieces that need no guest: the stock tools' exchange formats as rdma-core and
perftest write and parse them, the initramfs writer, the image key, the host's apt source, the
kernel modules the image takes, the capture's checks, and the guest's agent (run here, on a
UNIX socket instead of the virtio port) with the host's client."""

import contextlib
import gzip
import importlib.util
import io
import json
import socket
import threading

import pytest

from metaroce.cli import main
from metaroce.rxe import capture, guest, image, interop


def test_pingpong_address_is_what_ibv_rc_pingpong_sends():
    msg = interop._pp_msg(0x11, 0x150DC6, "10.0.0.200")
    # "%04x:%06x:%06x:%s" + NUL, the GID as 32 hex digits of its 16 bytes
    assert msg == b"0000:000011:150dc6:00000000000000000000ffff0a0000c8\0"
    assert len(msg) == interop.PP_MSG
    assert interop._pp_parse(msg) == (0x11, 0x150DC6, "10.0.0.200")
    with pytest.raises(interop.InteropError):
        interop._pp_parse(b"garbage\0")


def test_perftest_keys_are_key_msg_size_gid_and_parse_back():
    msg = interop._key_msg(0xA83551, 0x38D059, 0xAB0E877, 0x8D1860CC000, "10.0.0.1", 16)
    assert len(msg) == interop.KEY_MSG == 108
    text = msg.rstrip(b"\0").decode()
    # KEY_PRINT_FMT_GID: lid:out_reads:qpn:psn:rkey:vaddr:16 gid bytes:srqn:
    assert text.startswith("0000:0010:a83551:38d059:0ab0e877:000008d1860cc000:00:00:")
    assert text.endswith(":ff:ff:0a:00:00:01:00000000:")
    assert interop._key_parse(msg) == {"out_reads": 16, "qpn": 0xA83551, "psn": 0x38D059,
                                       "rkey": 0xAB0E877, "vaddr": 0x8D1860CC000,
                                       "ip": "10.0.0.1"}


def test_pingpong_buffers():
    a, b = interop.pp_pattern(8192, 1), interop.pp_pattern(8192, 2)
    assert a != b and a[0] == a[4096] == 0 and len(a) == 8192
    rx = interop.pp_rxe_buffer(8192)
    assert rx[0] == rx[4096] == 0 and set(rx[1:4096]) == {0x7B}


def _cpio_names(data: bytes) -> list[tuple[str, int, bytes]]:
    out, off = [], 0
    while True:
        hdr = data[off:off + 110]
        assert hdr[:6] == b"070701"
        f = [int(hdr[6 + 8 * i:14 + 8 * i], 16) for i in range(13)]
        mode, size, nlen = f[1], f[6], f[11]
        name = data[off + 110:off + 110 + nlen - 1].decode()
        off += 110 + nlen
        off += -off % 4
        body = data[off:off + size]
        off += size + (-size % 4)
        if name == "TRAILER!!!":
            return out
        out.append((name, mode, body))


def test_overlay_is_a_newc_archive_with_init_and_the_guest_scripts():
    entries = {n: (m, b) for n, m, b in _cpio_names(image.overlay())}
    assert entries["init"][0] == 0o100755 and entries["init"][1].startswith(b"#!/bin/sh")
    for f in ("agent.py", "rxe_verbs.py", "init.sh"):
        assert f"opt/metaroce/{f}" in entries
    assert len(image.overlay()) % 4 == 0


def test_cpio_writer_keeps_symlinks_and_directories(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"12345")
    (tmp_path / "l").symlink_to("d/f")
    buf = io.BytesIO()
    w = image.CpioWriter(buf)
    for rel in ("d", "d/f", "l"):
        w.add_path(tmp_path / rel, rel)
    w.close()
    got = {n: (m >> 12, b) for n, m, b in _cpio_names(buf.getvalue())}
    assert got == {"d": (0o4, b""), "d/f": (0o10, b"12345"), "l": (0o12, b"d/f")}


def test_image_key_follows_every_version():
    v = {"format": 2, "suite": "bookworm", "mirror": "http://m/debian",
         "kernel_package": "linux-image-6.1.0-57-amd64", "packages": {"perftest": "4.5+0.17-1"}}
    k = image.key_of(v)
    assert k == image.key_of(json.loads(json.dumps(v))) and len(k) == 16
    assert image.key_of({**v, "packages": {"perftest": "4.5+0.18-1"}}) != k
    assert image.key_of({**v, "format": 3}) != k


def test_host_mirror_reads_deb822_and_one_line_sources(tmp_path, monkeypatch):
    monkeypatch.delenv("METAROCE_RXE_MIRROR", raising=False)
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "sources.list.d" / "x.sources").write_text(
        "Types: deb\nURIs: http://sec/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\nTypes: deb\nURIs: http://mirror/debian\nSuites: bookworm "
        "bookworm-updates\nComponents: main\n")
    assert image.host_mirror("bookworm", etc) == "http://mirror/debian"
    (etc / "sources.list.d" / "x.sources").unlink()
    (etc / "sources.list").write_text("deb-src http://src/debian bookworm main\n"
                                      "deb http://contrib/debian bookworm contrib\n"
                                      "deb [arch=amd64] http://old/debian bookworm main\n")
    assert image.host_mirror("bookworm", etc) == "http://old/debian"
    with pytest.raises(image.ImageError, match="METAROCE_RXE_MIRROR"):
        image.host_mirror("trixie", etc)
    monkeypatch.setenv("METAROCE_RXE_MIRROR", "http://given/debian")
    assert image.host_mirror("trixie", etc) == "http://given/debian"


def test_perftest_version_strings():
    assert interop._version(b"6.06\0\0\0\0\0\0\0\0\0\0\0\0") == 6.06
    with pytest.raises(interop.InteropError):
        interop._version(b"\xff\xfe")


# ---- the kernel modules the image takes -----------------------------------------------------

def _ko(d, name, depends):
    """A module file as far as the image builder reads it: its .modinfo strings."""
    p = d / f"{name}.ko"
    p.write_bytes(b"\x7fELF\0" + b"license=GPL\0" + f"depends={depends}\0".encode() +
                  b"name=" + name.replace("-", "_").encode() + b"\0vermagic=6.1.0\0")
    return p


def test_module_closure_follows_depends_and_leaves_out_built_in_modules(tmp_path):
    ib = tmp_path / "kernel" / "drivers" / "infiniband"
    ib.mkdir(parents=True)
    _ko(ib, "rdma_rxe", "ib_core,ib_uverbs,ip6_udp_tunnel,udp_tunnel")
    _ko(ib, "ib_uverbs", "ib_core")
    _ko(ib, "ib_core", "")
    _ko(tmp_path, "ip6_udp_tunnel", "")
    _ko(tmp_path, "udp_tunnel", "")
    _ko(tmp_path, "crc32-generic", "")        # a file name with '-', asked for with '_'
    _ko(tmp_path, "unrelated", "ib_core")
    by_name = image.module_files(tmp_path)
    assert set(by_name) == {"rdma_rxe", "ib_uverbs", "ib_core", "ip6_udp_tunnel", "udp_tunnel",
                            "crc32_generic", "unrelated"}
    got = image.module_closure(by_name, ("rdma_rxe", "crc32_generic", "virtio_net"))
    # virtio_net has no file: built into the kernel, nothing to copy
    assert sorted(got) == ["crc32_generic", "ib_core", "ib_uverbs", "ip6_udp_tunnel",
                           "rdma_rxe", "udp_tunnel"]
    assert len(got) == len(set(got))


def test_module_closure_survives_a_dependency_cycle(tmp_path):
    _ko(tmp_path, "a", "b")
    _ko(tmp_path, "b", "a")
    assert sorted(image.module_closure(image.module_files(tmp_path), ["a"])) == ["a", "b"]


def test_modinfo_depends_reads_the_list_and_an_empty_one(tmp_path):
    assert image._modinfo_depends(_ko(tmp_path, "x", "ib_core,udp_tunnel")) == \
        ["ib_core", "udp_tunnel"]
    assert image._modinfo_depends(_ko(tmp_path, "y", "")) == []
    # "softdepends=" or a string ending in "depends=" is not the depends field
    p = tmp_path / "z.ko"
    p.write_bytes(b"\0softdepends=pre: foo\0xdepends=bar\0")
    assert image._modinfo_depends(p) == []


# ---- the guest's start files ----------------------------------------------------------------

def test_initrd_puts_this_checkouts_files_in_front_of_the_cached_image(tmp_path):
    base = gzip.compress(b"the cached rootfs cpio")
    (tmp_path / "rootfs.cpio.gz").write_bytes(base)
    ov = image.overlay()
    p = guest._initrd(tmp_path)
    data = p.read_bytes()
    # the kernel needs the uncompressed archive first, the gzip one after it
    assert data == ov + base
    assert guest._initrd(tmp_path) == p                  # the same files: the same initrd
    assert [x.name for x in tmp_path.glob("initrd-*.img")] == [p.name]
    assert not list(tmp_path.glob("*.tmp*"))


def test_guest_mac_and_gid_text():
    m = guest._mac_for("rx1")
    assert m == guest._mac_for("rx1") and m != guest._mac_for("rx2")
    assert m.startswith("52:54:00:") and len(m.split(":")) == 6
    # /sys/class/infiniband/rxe0/ports/1/gids/1 for 10.0.0.200
    assert guest._gid_text("0000:0000:0000:0000:0000:ffff:0a00:00c8") == "::ffff:10.0.0.200"
    assert guest._gid_text("fe80:0000:0000:0000:5054:00ff:fe12:3456") == "fe80::5054:ff:fe12:3456"


# ---- the capture's checks ---------------------------------------------------------------------

RXE_MAC, OUR_MAC = "52:54:00:aa:bb:cc", "02:00:00:00:00:01"


def _frame(src_mac, opcode, psn, *layers, sport=49152, dport=4791):
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    p = Ether(src=src_mac, dst=OUR_MAC if src_mac == RXE_MAC else RXE_MAC) / \
        IP(src="10.0.0.1", dst="10.0.0.200") / UDP(sport=sport, dport=dport) / \
        BTH(opcode=opcode, psn=psn, dqpn=0x11)
    for layer in layers:
        p = p / layer
    return bytes(p)


def test_capture_check_counts_frames_icrc_failures_and_naks():
    from scapy.contrib.roce import AETH
    from scapy.packet import Raw
    send = _frame(OUR_MAC, 0x04, 7, Raw(b"\x11" * 1024))             # SEND_ONLY
    ack = _frame(RXE_MAC, 0x11, 7, AETH(syndrome=0x1F, msn=1))       # ACK
    nak = _frame(RXE_MAC, 0x11, 8, AETH(syndrome=0x60, msn=1))       # PSN sequence error
    rnr = _frame(RXE_MAC, 0x11, 9, AETH(syndrome=0x2E, msn=1))       # RNR NAK
    bad = bytearray(_frame(OUR_MAC, 0x04, 8, Raw(b"x" * 64)))        # SEND_ONLY, ICRC broken
    bad[-1] ^= 0xFF
    not_roce = _frame(OUR_MAC, 0x04, 1, Raw(b"y" * 16), dport=4792)
    cap = object.__new__(capture.Capture)                             # no socket: frames given
    cap.frames = [(0, f) for f in (send, ack, nak, rnr, bytes(bad))]
    assert all(capture._is_roce(f) for _, f in cap.frames) and not capture._is_roce(not_roce)
    out = capture.Capture.check(cap, RXE_MAC.upper())
    assert (out["frames"], out["from_rxe"], out["to_rxe"]) == (5, 3, 2)
    assert out["bad_icrc"] == ["ours opcode 0x04 psn 8"]
    assert out["naks"] == {"rxe:0x60": 1, "rxe:0x2e": 1}              # an ACK is not a NAK
    assert out["opcodes"] == {"ours:0x04": 2, "rxe:0x11": 3}


def test_is_roce_needs_udp_port_4791_over_ipv4_or_ipv6():
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import IP, TCP, UDP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import Ether
    v6 = bytes(Ether() / IPv6() / UDP(dport=4791) / BTH(opcode=4) / (b"\0" * 8))
    tcp = bytes(Ether() / IP() / TCP(dport=4791) / (b"\0" * 32))
    assert capture._is_roce(v6) and not capture._is_roce(tcp) and not capture._is_roce(b"\0" * 20)


# ---- the guest's agent and the host's client --------------------------------------------------

def _agent_module():
    spec = importlib.util.spec_from_file_location("rxe_guest_agent", image.GUESTFS / "agent.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def served(tmp_path, monkeypatch):
    """The guest's agent (guestfs/agent.py, unchanged) serving a UNIX socket where the guest's
    virtio port would be; a Guest record whose agent path is that socket."""
    monkeypatch.setattr(guest, "RUN_DIR", tmp_path)
    agent = _agent_module()
    g = guest.Guest(lab="t", netns="", bridge="", tap="", ip="10.0.0.200", prefix=24,
                    mac=RXE_MAC, gid="", gid_index=1, pid=0, accel="tcg", image="", hosts={})
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ls.bind(str(g.agent_path))
    ls.listen(4)

    def loop():
        while True:
            try:
                conn, _ = ls.accept()
            except OSError:
                return
            with conn:
                agent.serve(conn.fileno(), reconnect=False)
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    yield g, agent
    ls.close()
    for p in list(agent.PROCS.values()):
        p.p.kill()
        p.p.wait()


def test_agent_exec_put_and_errors_through_the_hosts_client(served, tmp_path):
    g, _ = served
    with guest.Agent(g, connect_timeout=2) as a:
        assert a.request({"op": "ping"})["ok"] is True
        r = a.exec(["sh", "-c", "cat; echo err >&2; exit 3"], input="in\n")
        assert (r["rc"], r["out"], r["err"]) == (3, "in\n", "err\n")
        assert a.exec(["/nonexistent/tool"])["rc"] == 127
        assert a.exec(["sleep", "5"], timeout=0.2)["rc"] is None        # timed out, reported
        a.put(str(tmp_path / "sub" / "f.sh"), b"#!/bin/sh\n", 0o750)
        assert (tmp_path / "sub" / "f.sh").read_bytes() == b"#!/bin/sh\n"
        assert (tmp_path / "sub" / "f.sh").stat().st_mode & 0o777 == 0o750
        assert "unknown op" in a.request({"op": "reboot"})["error"]
        with pytest.raises(guest.GuestError, match="no process"):
            a.call("nothing", "x", timeout=1)
        # a request it cannot read is answered, and the next one still is
        a.sock.sendall(b"{not json\n")
        assert a.request({"op": "ping"})["ok"] is True


def test_agent_spawned_process_lines_and_exit(served):
    g, _ = served
    echo = "import sys\nfor l in sys.stdin:\n    print(l.strip().upper(), flush=True)\n" \
           "    if l.strip() == 'bye': sys.exit(4)\n"
    with guest.Agent(g, connect_timeout=2) as a:
        a.spawn("p", ["python3", "-c", echo])
        assert a.call("p", "hello") == "HELLO\n"
        assert a.call("p", None, timeout=0.2) is None                   # nothing more to read
        assert a.wait("p")["rc"] is None                                 # still running
        assert a.call("p", "bye") == "BYE\n"
        with pytest.raises(guest.GuestError, match="exited"):
            a.call("p", None, timeout=5)
        a.spawn("q", ["sleep", "30"])
        assert a.kill("q")["rc"] == -9


def test_agent_client_is_one_at_a_time(served):
    g, _ = served
    with guest.Agent(g, connect_timeout=2) as a:
        with pytest.raises(guest.GuestError, match="busy"):
            guest.Agent(g, connect_timeout=0.2).open()
        assert a.request({"op": "ping"})["ok"]
    with guest.Agent(g, connect_timeout=2) as b:                     # free again
        assert b.request({"op": "ping"})["ok"]


# ---- the CLI without a guest -----------------------------------------------------------------

def _cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_rxe_status_without_a_guest_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(guest, "RUN_DIR", tmp_path)
    code, out, err = _cli(["rxe", "status"])
    assert code != 0 and out == "" and "no rxe guest is running" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    code, out, _ = _cli(["rxe", "status", "--lab", "nolab", "--json"])
    assert code != 0 and "no rxe guest on lab 'nolab'" in json.loads(out)["error"]
    for lab in ("a", "b"):
        (tmp_path / f"{lab}.json").write_text("{}")
    code, out, err = _cli(["rxe", "status"])
    assert code != 0 and "several rxe guests run (a, b): give --lab" in err
