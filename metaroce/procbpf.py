"""What a process holds in the kernel, read from /proc (no bpftool needed): its BPF maps,
programs and links (from /proc/PID/fdinfo), how many entries its hash maps hold, its resident
memory; and whether a BPF object of a given id still exists anywhere. The fault tests and the
soak use this to show that nothing stays behind (no stale program, no map, no growth)."""

from __future__ import annotations

import ctypes
import os

from .kern import libbpf

# map types whose entries come and go (arrays always hold max_entries)
HASH_TYPES = {1: "hash", 5: "percpu_hash", 9: "lru_hash", 10: "lru_percpu_hash",
              13: "hash_of_maps"}
BPF_F_MMAPABLE, BPF_F_INNER_MAP = 0x400, 0x1000


def _fdinfo(pid: int, fd: str) -> dict:
    out = {}
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            for line in f:
                k, _, v = line.partition(":")
                out[k.strip()] = v.strip()
    except OSError:
        return {}
    return out


def bpf_objects(pid: int) -> dict:
    """{"maps": [{id, type, key_size, value_size, max_entries, flags}], "progs": [ids],
    "links": [ids]} for every BPF fd the process holds (each object once)."""
    maps: dict[int, dict] = {}
    progs, links = set(), set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        info = _fdinfo(pid, fd)
        if "map_id" in info:
            mid = int(info["map_id"])
            maps[mid] = {"id": mid, "type": int(info.get("map_type", -1)),
                         "key_size": int(info.get("key_size", 0)),
                         "value_size": int(info.get("value_size", 0)),
                         "max_entries": int(info.get("max_entries", 0)),
                         "flags": int(info.get("map_flags", "0"), 16)}
        elif "prog_id" in info and "link_id" not in info:
            progs.add(int(info["prog_id"]))
        if "link_id" in info:
            links.add(int(info["link_id"]))
    return {"maps": sorted(maps.values(), key=lambda m: m["id"]), "progs": sorted(progs),
            "links": sorted(links)}


def _inner_arrays(pid: int, value_size: int) -> list[int]:
    want = BPF_F_MMAPABLE | BPF_F_INNER_MAP
    return [m["id"] for m in bpf_objects(pid)["maps"]
            if m["flags"] & want == want and m["value_size"] == value_size]


def mr_maps(pid: int) -> list[int]:
    """Ids of the memory-region maps (mmap-able inner arrays of 64 KiB chunks) it holds."""
    from .nic.rx import MR_CHUNK  # noqa: PLC0415
    return _inner_arrays(pid, MR_CHUNK)


def rq_maps(pid: int) -> list[int]:
    """Ids of the receive queue rings (mmap-able inner arrays of 32-byte slots) it holds."""
    from .fastpath.vqlayout import C  # noqa: PLC0415
    return _inner_arrays(pid, C["MR_RQ_STRIDE"])


def _lib():
    lib = libbpf.lib()
    lib.bpf_map_get_fd_by_id.argtypes = [ctypes.c_uint32]
    lib.bpf_prog_get_fd_by_id.argtypes = [ctypes.c_uint32]
    lib.bpf_map_get_next_key.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    return lib


def map_exists(map_id: int) -> bool:
    fd = _lib().bpf_map_get_fd_by_id(map_id)
    if fd < 0:
        return False
    os.close(fd)
    return True


def prog_exists(prog_id: int) -> bool:
    fd = _lib().bpf_prog_get_fd_by_id(prog_id)
    if fd < 0:
        return False
    os.close(fd)
    return True


def count_entries(map_id: int, key_size: int, limit: int = 1 << 22) -> int:
    """Keys in a (hash-type) map, by walking it with get_next_key."""
    lib = _lib()
    fd = lib.bpf_map_get_fd_by_id(map_id)
    if fd < 0:
        return -1
    try:
        cur = ctypes.create_string_buffer(key_size)
        nxt = ctypes.create_string_buffer(key_size)
        n, prev = 0, None
        while n < limit and lib.bpf_map_get_next_key(fd, prev, nxt) == 0:
            n += 1
            ctypes.memmove(cur, nxt, key_size)
            prev = cur
        return n
    finally:
        os.close(fd)


def hash_entries(pid: int) -> dict[str, int]:
    """Entries of every hash-type map the process holds, by "type:id", and their "total"."""
    out = {}
    for m in bpf_objects(pid)["maps"]:
        if m["type"] in HASH_TYPES:
            out[f"{HASH_TYPES[m['type']]}:{m['id']}"] = count_entries(m["id"], m["key_size"])
    out["total"] = sum(out.values())
    return out


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """Resident memory of the process in KiB: VmRSS (all of it), RssAnon (its private heap:
    what a leak grows) or RssShmem (shared memory it has touched, e.g. verbs rings)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"no {field} for pid {pid}")
