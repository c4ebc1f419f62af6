"""Classic libpcap files (no scapy at runtime): write Ethernet captures, read them back.

The reader accepts both byte orders and microsecond/nanosecond timestamps, refuses pcapng
and non-Ethernet link types, and never allocates more than MAX_RECORD bytes per record.
"""

import struct
from dataclasses import dataclass

MAGIC_US = 0xA1B2C3D4
MAGIC_NS = 0xA1B23C4D
PCAPNG_MAGIC = 0x0A0D0D0A
LINKTYPE_ETHERNET = 1
MAX_RECORD = 262144  # the largest snap length tcpdump uses


class PcapError(ValueError):
    """The file is not a readable classic Ethernet pcap."""


@dataclass(frozen=True)
class Record:
    index: int  # 1-based frame number, as Wireshark counts
    ts_sec: int
    ts_frac: int  # microseconds or nanoseconds, see PcapReader.nanoseconds
    data: bytes
    orig_len: int


def write_pcap(path, frames, ts_start: int = 1_700_000_000) -> int:
    """Write ``frames`` (bytes) to ``path``, 1 ms apart; returns the number written."""
    n = 0
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", MAGIC_US, 2, 4, 0, 0, MAX_RECORD, LINKTYPE_ETHERNET))
        for n, frame in enumerate(frames, 1):
            frame = bytes(frame)
            if len(frame) > MAX_RECORD:
                raise ValueError("frame longer than the snap length")
            usec = n * 1000
            f.write(struct.pack("<IIII", ts_start + usec // 1_000_000, usec % 1_000_000,
                                len(frame), len(frame)))
            f.write(frame)
    return n


class PcapReader:
    """Iterate over the records of an open binary file."""

    def __init__(self, f):
        self._f = f
        head = f.read(24)
        if len(head) < 4:
            raise PcapError("file too short for a pcap header")
        magic_le = struct.unpack("<I", head[:4])[0]
        if magic_le == PCAPNG_MAGIC:
            raise PcapError("pcapng is not supported; convert with 'editcap -F pcap IN OUT'")
        for order in "<>":
            magic = struct.unpack(order + "I", head[:4])[0]
            if magic in (MAGIC_US, MAGIC_NS):
                self._order = order
                self.nanoseconds = magic == MAGIC_NS
                break
        else:
            raise PcapError("not a pcap file (bad magic number)")
        if len(head) < 24:
            raise PcapError("truncated pcap header")
        self.linktype = struct.unpack(order + "I", head[20:24])[0] & 0x0FFFFFFF
        if self.linktype != LINKTYPE_ETHERNET:
            raise PcapError(f"link type {self.linktype} is not Ethernet (1)")

    def __iter__(self):
        index = 0
        while True:
            rec = self._f.read(16)
            if not rec:
                return
            if len(rec) < 16:
                raise PcapError(f"truncated record header after frame {index}")
            sec, frac, incl, orig = struct.unpack(self._order + "IIII", rec)
            if incl > MAX_RECORD:
                raise PcapError(f"frame {index + 1}: record length {incl} exceeds {MAX_RECORD}")
            data = self._f.read(incl)
            if len(data) < incl:
                raise PcapError(f"frame {index + 1}: truncated record data")
            index += 1
            yield Record(index, sec, frac, data, orig)


def read_pcap(path):
    """Yield the records of the pcap file at ``path``."""
    with open(path, "rb") as f:
        yield from PcapReader(f)
