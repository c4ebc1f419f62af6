"""Map access for programs loaded from the build cache (metaroce/kern/progcache.py): the same
uses as BCC's table objects (map_fd, Key, Leaf, item get/set/delete, per-CPU values as one
Leaf per possible CPU), through libbpf by fd, without a BCC module."""

from __future__ import annotations

import ctypes
import json

from . import libbpf

PERCPU_TYPES = {5, 6, 10}            # PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH
ARRAY_TYPES = {2, 6}                 # ARRAY, PERCPU_ARRAY (int keys allowed, like BCC)


def decode_type(desc: str):
    """A ctypes type from BCC's JSON type description (None if BCC recorded none)."""
    if not desc:
        return None
    from ..system import import_bcc  # noqa: PLC0415
    return import_bcc().BPF._decode_table_type(json.loads(desc))


class CachedTable:
    """One map created from a cache entry; `meta` is its recorded description."""

    def __init__(self, name: str, meta: dict, fd: int):
        self.name = name
        self.map_fd = fd
        self.ttype = meta["type"]
        self.flags = meta["flags"]
        self.max_entries = meta["max_entries"]
        self.Key = decode_type(meta["key_desc"])
        self.Leaf = decode_type(meta["leaf_desc"])
        if self.ttype in PERCPU_TYPES and self.Leaf is not None:
            self.sLeaf, ncpu = self.Leaf, libbpf.possible_cpus()
            if ctypes.sizeof(self.sLeaf) % 8 == 0:
                self.Leaf = self.sLeaf * ncpu
            elif self.sLeaf in (ctypes.c_uint, ctypes.c_int):     # what BCC widens, likewise
                self.Leaf = (ctypes.c_uint64 if self.sLeaf is ctypes.c_uint else ctypes.c_int64) * ncpu
            else:
                raise IndexError("Leaf must be aligned to 8 bytes")

    def get_fd(self) -> int:
        return self.map_fd

    def _key(self, key):
        if isinstance(key, int) and self.ttype in ARRAY_TYPES:
            if not 0 <= key < self.max_entries:
                raise IndexError("Array index out of range")
            return self.Key(key)
        return key

    def __getitem__(self, key):
        leaf = self.Leaf()
        if libbpf.lib().bpf_map_lookup_elem(self.map_fd, ctypes.byref(self._key(key)),
                                            ctypes.byref(leaf)) < 0:
            raise KeyError(key)
        return leaf

    def __setitem__(self, key, leaf) -> None:
        libbpf._check(libbpf.lib().bpf_map_update_elem(self.map_fd, ctypes.byref(self._key(key)),
                                                       ctypes.byref(leaf), 0),
                      f"update {self.name}")

    def __delitem__(self, key) -> None:
        k = self._key(key)
        if self.ttype in ARRAY_TYPES:              # arrays cannot delete: zero, as BCC does
            self[k] = self.Leaf()
            return
        if libbpf.lib().bpf_map_delete_elem(self.map_fd, ctypes.byref(k)) < 0:
            raise KeyError(key)
