"""BTF of BCC-created maps, for the build cache: which BTF object and type ids a map was
created with (bpf_map_info), the raw BTF bytes of that object, and loading them again. A map
whose value holds a bpf_spin_lock cannot be created without them."""

from __future__ import annotations

import ctypes
import os

from . import libbpf


class MapInfo(ctypes.Structure):          # struct bpf_map_info (linux/bpf.h)
    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("key_size", ctypes.c_uint32),
                ("value_size", ctypes.c_uint32), ("max_entries", ctypes.c_uint32),
                ("map_flags", ctypes.c_uint32), ("name", ctypes.c_char * 16),
                ("ifindex", ctypes.c_uint32), ("btf_vmlinux_value_type_id", ctypes.c_uint32),
                ("netns_dev", ctypes.c_uint64), ("netns_ino", ctypes.c_uint64),
                ("btf_id", ctypes.c_uint32), ("btf_key_type_id", ctypes.c_uint32),
                ("btf_value_type_id", ctypes.c_uint32), ("_pad", ctypes.c_uint32),
                ("map_extra", ctypes.c_uint64)]


class BtfInfo(ctypes.Structure):          # struct bpf_btf_info
    _fields_ = [("btf", ctypes.c_uint64), ("btf_size", ctypes.c_uint32), ("id", ctypes.c_uint32),
                ("name", ctypes.c_uint64), ("name_len", ctypes.c_uint32),
                ("kernel_btf", ctypes.c_uint32)]


def _info(fd: int, info) -> None:
    lib = libbpf.lib()
    lib.bpf_obj_get_info_by_fd.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    n = ctypes.c_uint32(ctypes.sizeof(info))
    libbpf._check(lib.bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(n)),
                  "bpf_obj_get_info_by_fd")


def map_info(fd: int) -> MapInfo:
    info = MapInfo()
    _info(fd, info)
    return info


def btf_bytes(btf_id: int) -> bytes:
    """The raw BTF of a loaded BTF object, by id."""
    lib = libbpf.lib()
    lib.bpf_btf_get_fd_by_id.argtypes = [ctypes.c_uint32]
    fd = libbpf._check(lib.bpf_btf_get_fd_by_id(btf_id), f"bpf_btf_get_fd_by_id {btf_id}")
    try:
        info = BtfInfo()
        _info(fd, info)
        buf = ctypes.create_string_buffer(info.btf_size)
        size = info.btf_size
        info = BtfInfo(btf=ctypes.addressof(buf), btf_size=size)
        _info(fd, info)
        return buf.raw[:size]
    finally:
        os.close(fd)


def btf_load(raw: bytes) -> int:
    lib = libbpf.lib()
    lib.bpf_btf_load.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    buf = ctypes.create_string_buffer(raw, len(raw))
    return libbpf._check(lib.bpf_btf_load(buf, len(raw), None), "bpf_btf_load")
