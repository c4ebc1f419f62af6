"""A capture of the RoCEv2 frames on the guest's tap (both directions: what rxe sent, and what
reached it after the lab's impairment), checked with a decoder we did not write
(``scapy.contrib.roce``): every ICRC valid, and the NAKs by syndrome."""

from __future__ import annotations

import socket
import struct
import threading
from collections import Counter

ETH_P_ALL = 0x0003
ROCE_PORT = 4791


class Capture:
    def __init__(self, netns: str, iface: str):
        from ..lab import netdev  # noqa: PLC0415
        with netdev.in_netns(netns):
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            self.sock.bind((iface, 0))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
        self.sock.settimeout(0.2)
        self.frames: list[tuple[int, bytes]] = []     # (pkttype, frame)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Capture":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
        self.sock.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                raw, addr = self.sock.recvfrom(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if _is_roce(raw):
                self.frames.append((addr[2], raw))

    def check(self, guest_mac: str) -> dict:
        """Frames from and to the guest, ICRC failures, and NAKs by sender and syndrome."""
        from scapy.contrib import roce  # noqa: PLC0415
        from scapy.layers.l2 import Ether  # noqa: PLC0415
        out = {"frames": 0, "from_rxe": 0, "to_rxe": 0, "bad_icrc": [], "naks": Counter(),
               "opcodes": Counter()}
        mac = guest_mac.lower()
        for _, raw in self.frames:
            s = Ether(raw)
            if roce.BTH not in s:
                continue
            bth = s[roce.BTH]
            src = "rxe" if s.src.lower() == mac else "ours"
            out["frames"] += 1
            out["from_rxe" if src == "rxe" else "to_rxe"] += 1
            out["opcodes"][f"{src}:{bth.opcode:#04x}"] += 1
            if _recomputed(s) != raw:          # scapy's ICRC over the frame differs
                out["bad_icrc"].append(f"{src} opcode {bth.opcode:#04x} psn {bth.psn}")
            if bth.opcode in (0x11,) and roce.AETH in s:      # RC ACKNOWLEDGE
                syn = s[roce.AETH].syndrome
                if syn & 0x60 == 0x60 or syn & 0x60 == 0x20:
                    out["naks"][f"{src}:{syn:#04x}"] += 1
        out["naks"] = dict(out["naks"])
        out["opcodes"] = dict(out["opcodes"])
        return out


def _recomputed(s) -> bytes:
    from scapy.contrib import roce  # noqa: PLC0415
    c = s.copy()
    c[roce.BTH].icrc = None
    return bytes(c)


def _is_roce(raw: bytes) -> bool:
    if len(raw) < 14 + 20 + 8 + 12:
        return False
    et = struct.unpack_from("!H", raw, 12)[0]
    if et == 0x0800:
        if raw[23] != 17:
            return False
        off = 14 + (raw[14] & 0xF) * 4
    elif et == 0x86DD:
        if raw[20] != 17:
            return False
        off = 14 + 40
    else:
        return False
    return struct.unpack_from("!H", raw, off + 2)[0] == ROCE_PORT
