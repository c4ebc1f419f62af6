"""What verbs says must happen to a list of work requests posted on a connected RC QP pair, for
the control-socket fuzz (test_control_fuzz.py): which post the device refuses, the status of each
work request, the receives it consumes at the responder, which QPs end in ERR, and every byte of
every registered region afterwards.

The rig: a requester `a` (regions src: all access, ro: no local write, alien: another PD) and a
responder `b` (mr: all access, ro: remote read only, rx: the receive buffers, alien: another
PD), and a guard region on each side that no work request names. The rules are rdma-core's and
the spec's (docs/spec/03-rc-transport.md RESP-5, ERR-1):
- the device checks a post before it queues any of it (local key, PD, access, bounds, opcode,
  atomic alignment) and refuses the whole post; a receive post stops at the first bad one
  (those before it are posted, as with ibv_post_recv's bad_wr);
- at the responder, an RDMA WRITE/READ/atomic whose rkey is not a region of the QP's PD with the
  access it needs, or whose range leaves the region, is NAKed remote access error; a SEND longer
  than the receive buffer is NAKed invalid request (the receive completes with a local length
  error); a zero-length RDMA WRITE or READ names no memory and is not checked;
- a NAKed request completes with its remote error, every later one with a flush, and both QPs
  go to ERR (their outstanding receives flushed); earlier requests have been executed;
- successful requests complete only when signaled; errors always complete."""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass, field

from metaroce.verbs import (IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_ATOMIC,
                            IBV_ACCESS_REMOTE_READ, IBV_ACCESS_REMOTE_WRITE, IBV_SEND_SIGNALED,
                            IBV_WC_LOC_LEN_ERR, IBV_WC_REM_ACCESS_ERR, IBV_WC_REM_INV_REQ_ERR,
                            IBV_WC_SUCCESS, IBV_WC_WR_FLUSH_ERR)

WRITES = {"RDMA_WRITE": False, "RDMA_WRITE_WITH_IMM": True}
SENDS = {"SEND": False, "SEND_WITH_IMM": True}
ATOMICS = ("ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD")
OPCODES = (*WRITES, *SENDS, "RDMA_READ", *ATOMICS)
MAX_INLINE = 256
RECV_BYTES = 1024          # each receive the responder posts
U64 = 2**64 - 1


class Refused(Exception):
    """The device must refuse this post."""


@dataclass
class Memory:
    """Expected contents of named regions: bytes, and positions whose contents are unknown."""
    data: dict[str, bytearray]
    unknown: dict[str, set[int]] = field(default_factory=dict)

    def write(self, name: str, off: int, data: bytes) -> None:
        self.data[name][off:off + len(data)] = data

    def forget(self, name: str, off: int, n: int) -> None:
        self.unknown.setdefault(name, set()).update(range(off, off + n))

    def known(self, name: str, off: int, n: int) -> bool:
        return not self.unknown.get(name, set()).intersection(range(off, off + n))


@dataclass
class Outcome:
    send_wcs: list[tuple[int, int]]            # (wr_id, status) on the requester's send CQ
    recv_wcs: list[tuple[int, int, int]]       # (wr_id, status, byte_len) at the responder
    a_err: bool
    b_err: bool


def _int(v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise Refused
    return v


class Model:
    """regions: name -> (addr, length, lkey, rkey, pd, access) of every region of the rig;
    side: name -> "a" or "b"."""

    def __init__(self, regions: dict[str, tuple], side: dict[str, str], pd_a: int, pd_b: int):
        self.regions, self.side, self.pd = regions, side, {"a": pd_a, "b": pd_b}

    def _by_key(self, key: int, which: int, side: str) -> str | None:
        for name, r in self.regions.items():
            if self.side[name] == side and r[which] == key:
                return name
        return None

    def local(self, sge, need_write: bool) -> tuple[str, int, int]:
        """(region, offset, length) of a requester SGE; Refused if the device must refuse it."""
        if not isinstance(sge, list) or len(sge) != 3:
            raise Refused
        addr, n, lkey = (_int(v) for v in sge)
        name = self._by_key(lkey, 2, "a")
        if name is None:
            raise Refused
        base, length, _, _, pd, access = self.regions[name]
        if pd != self.pd["a"] or (need_write and not access & IBV_ACCESS_LOCAL_WRITE):
            raise Refused
        if n < 0 or addr < base or addr + n > base + length:
            raise Refused
        return name, addr - base, n

    def remote(self, rkey: int, va: int, n: int, need: int) -> tuple[str, int] | None:
        """(region, offset) the responder executes on, or None: remote access error."""
        name = self._by_key(rkey, 3, "b")
        if name is None:
            return None
        base, length, _, _, pd, access = self.regions[name]
        if pd != self.pd["b"] or not access & need or va < base or va + n > base + length:
            return None
        return name, va - base

    def check_post_send(self, wrs) -> list[dict]:
        """Each WR's parsed form; Refused if the device must refuse the post."""
        if not isinstance(wrs, list):
            raise Refused
        return [self._parse(wr) for wr in wrs]

    def _parse(self, wr) -> dict:
        if not isinstance(wr, dict) or wr.get("opcode") not in OPCODES:
            raise Refused
        op = wr["opcode"]
        out = {"op": op, "wr_id": _int(wr.get("wr_id", 0)),
               "signaled": bool(_int(wr.get("send_flags", IBV_SEND_SIGNALED)) & IBV_SEND_SIGNALED)}
        sg = wr.get("sg_list", [])
        if not isinstance(sg, list):
            raise Refused
        if op in WRITES or op in SENDS:
            if "inline" in wr:
                raw = base64.b64decode(wr["inline"], validate=True)
                if len(raw) > MAX_INLINE:
                    raise Refused
                out["src"] = ("inline", raw)
            else:
                out["src"] = ("sges", [self.local(s, False) for s in sg])
        else:
            if len(sg) != 1:
                raise Refused
            out["dst"] = self.local(sg[0], True)
            if op in ATOMICS and out["dst"][2] != 8:
                raise Refused
        if op not in SENDS:
            if "remote_addr" not in wr or "rkey" not in wr:
                raise Refused
            va, rkey = _int(wr["remote_addr"]), _int(wr["rkey"])
            if not (0 <= va <= U64 and 0 <= rkey < 2**32):
                raise Refused
            if op in ATOMICS and va & 7:
                raise Refused
            out["va"], out["rkey"] = va, rkey
        if op in ATOMICS:
            out["compare_add"] = _int(wr.get("compare_add", 0)) & U64
            out["swap"] = _int(wr.get("swap", 0)) & U64
        return out

    def check_post_recv(self, wrs) -> tuple[list[int], bool]:
        """(wr_ids the device posts, whether it refuses the rest)."""
        posted = []
        for wr in wrs if isinstance(wrs, list) else [None]:
            try:
                if not isinstance(wr, dict):
                    raise Refused
                wr_id = _int(wr.get("wr_id", 0))
                sg = wr.get("sg_list", [])
                if not isinstance(sg, list) or len(sg) != 1:
                    raise Refused
                self.local(sg[0], True)
            except Refused:
                return posted, True
            posted.append(wr_id)
        return posted, False

    def run(self, parsed: list[dict], mem: Memory, recvs: list[tuple[int, int]]) -> Outcome:
        """Execute parsed WRs in order on the expected memory. recvs: the responder's
        outstanding receives (wr_id, offset in rx), consumed in order."""
        wcs, rwcs, failed, b_err = [], [], False, False
        recvs = list(recvs)
        landing = [w["dst"] for w in parsed if "dst" in w]
        for w in parsed:
            if failed:
                wcs.append((w["wr_id"], IBV_WC_WR_FLUSH_ERR))
                continue
            status = self._execute(w, mem, recvs, rwcs, landing)
            if status != IBV_WC_SUCCESS:
                failed = b_err = True
                wcs.append((w["wr_id"], status))
            elif w["signaled"]:
                wcs.append((w["wr_id"], status))
        if b_err:
            rwcs += [(wr_id, IBV_WC_WR_FLUSH_ERR, 0) for wr_id, _ in recvs]
        return Outcome(wcs, rwcs, failed, b_err)

    @staticmethod
    def _source(w: dict, mem: Memory, landing: list) -> tuple[bytes, bool]:
        """The bytes a WRITE or SEND carries, and whether they are certain: a source that a READ
        or atomic of the same post lands on may be read before or after it lands (no fence)."""
        kind, val = w["src"]
        if kind == "inline":
            return val, True
        certain = not any(r == lr and off < loff + ln and loff < off + n
                          for r, off, n in val for lr, loff, ln in landing)
        certain = certain and all(mem.known(r, off, n) for r, off, n in val)
        return b"".join(bytes(mem.data[r][off:off + n]) for r, off, n in val), certain

    def _execute(self, w: dict, mem: Memory, recvs: list, rwcs: list, landing: list) -> int:
        op = w["op"]
        if op in SENDS or op in WRITES:
            data, certain = self._source(w, mem, landing)
        if op in SENDS:
            wr_id, slot = recvs.pop(0)
            if len(data) > RECV_BYTES:
                rwcs.append((wr_id, IBV_WC_LOC_LEN_ERR, len(data)))
                mem.forget("b.rx", slot, RECV_BYTES)   # placed up to where it did not fit
                return IBV_WC_REM_INV_REQ_ERR
            mem.write("b.rx", slot, data)
            if not certain:
                mem.forget("b.rx", slot, len(data))
            rwcs.append((wr_id, IBV_WC_SUCCESS, len(data)))
            return IBV_WC_SUCCESS
        if op in WRITES:
            if data:
                at = self.remote(w["rkey"], w["va"], len(data), IBV_ACCESS_REMOTE_WRITE)
                if at is None:
                    return IBV_WC_REM_ACCESS_ERR
                mem.write(at[0], at[1], data)
                if not certain:
                    mem.forget(at[0], at[1], len(data))
            if WRITES[op]:
                wr_id, _ = recvs.pop(0)
                rwcs.append((wr_id, IBV_WC_SUCCESS, len(data)))
            return IBV_WC_SUCCESS
        region, off, n = w["dst"]
        if op == "RDMA_READ":
            if n:
                at = self.remote(w["rkey"], w["va"], n, IBV_ACCESS_REMOTE_READ)
                if at is None:
                    return IBV_WC_REM_ACCESS_ERR
                mem.write(region, off, bytes(mem.data[at[0]][at[1]:at[1] + n]))
                if not mem.known(at[0], at[1], n):
                    mem.forget(region, off, n)
            return IBV_WC_SUCCESS
        at = self.remote(w["rkey"], w["va"], 8, IBV_ACCESS_REMOTE_ATOMIC)
        if at is None:
            return IBV_WC_REM_ACCESS_ERR
        old = struct.unpack_from("<Q", mem.data[at[0]], at[1])[0]
        if op == "ATOMIC_FETCH_AND_ADD":
            new = (old + w["compare_add"]) & U64
        else:
            new = w["swap"] if old == w["compare_add"] else old
        mem.write(region, off, struct.pack("<Q", old))
        mem.write(at[0], at[1], struct.pack("<Q", new))
        if not mem.known(at[0], at[1], 8):
            mem.forget(region, off, 8)
        return IBV_WC_SUCCESS
