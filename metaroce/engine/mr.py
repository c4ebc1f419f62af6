"""Registered memory: rkey -> (base VA, bytearray, access flags), with bounds/access checks."""

from dataclasses import dataclass
from enum import IntFlag


class Access(IntFlag):
    """Like enum ibv_access_flags."""

    LOCAL_WRITE = 1
    REMOTE_WRITE = 2
    REMOTE_READ = 4
    REMOTE_ATOMIC = 8
    ALL_REMOTE = REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC


@dataclass
class MemoryRegion:
    rkey: int
    addr: int
    buf: bytearray
    access: Access

    @property
    def length(self) -> int:
        return len(self.buf)

    def covers(self, va: int, length: int) -> bool:
        return self.addr <= va and va + length <= self.addr + self.length


class MRTable:
    def __init__(self):
        self._mrs: dict[int, MemoryRegion] = {}
        self.version = 0  # bumped by every registration (the C engine's adapter re-syncs)

    def register(self, rkey: int, addr: int, buf: bytearray, access: Access) -> MemoryRegion:
        mr = MemoryRegion(rkey, addr, buf, Access(access))
        self._mrs[rkey] = mr
        self.version += 1
        return mr

    def regions(self) -> list[MemoryRegion]:
        return list(self._mrs.values())

    def get(self, rkey: int) -> MemoryRegion | None:
        return self._mrs.get(rkey)

    def bounds(self) -> dict[int, tuple[int, int, int]]:
        """rkey -> (addr, length, access): what a data path would hold in a BPF map."""
        return {k: (m.addr, m.length, int(m.access)) for k, m in self._mrs.items()}

    def check(self, rkey: int, va: int, length: int, need: Access) -> bool:
        mr = self._mrs.get(rkey)
        return mr is not None and bool(mr.access & need) and mr.covers(va, length)

    def write(self, rkey: int, va: int, data: bytes) -> None:
        mr = self._mrs[rkey]
        off = va - mr.addr
        mr.buf[off:off + len(data)] = data

    def read(self, rkey: int, va: int, length: int) -> bytes:
        mr = self._mrs[rkey]
        off = va - mr.addr
        return bytes(mr.buf[off:off + length])
