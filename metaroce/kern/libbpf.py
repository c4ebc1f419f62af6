"""ctypes bindings to Debian's libbpf.so.1 for what BCC lacks: pinning, opening pinned objects,
raw map access by fd (from processes that did not load the program), per-CPU sizing."""

import ctypes
import ctypes.util
import errno
import os

from ..errors import MissingDependency

_lib = None


def lib():
    global _lib
    if _lib is None:
        try:
            _lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
        except OSError as exc:
            raise MissingDependency("libbpf.so.1 not found: install the Debian package libbpf1") from exc
        _lib.bpf_obj_pin.argtypes = [ctypes.c_int, ctypes.c_char_p]
        _lib.bpf_obj_get.argtypes = [ctypes.c_char_p]
        _lib.bpf_map_lookup_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        _lib.bpf_map_update_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                             ctypes.c_uint64]
        _lib.libbpf_num_possible_cpus.argtypes = []
    return _lib


def _check(rv: int, what: str) -> int:
    if rv < 0:
        err = ctypes.get_errno() or -rv
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rv


def obj_pin(fd: int, path: str) -> None:
    _check(lib().bpf_obj_pin(fd, path.encode()), f"bpf_obj_pin {path}")


def obj_get(path: str) -> int:
    return _check(lib().bpf_obj_get(path.encode()), f"bpf_obj_get {path}")


def possible_cpus() -> int:
    return _check(lib().libbpf_num_possible_cpus(), "libbpf_num_possible_cpus")


class PinnedMap:
    """A pinned array map opened by path; values are raw bytes (per-CPU maps: one per CPU)."""

    def __init__(self, path: str, value_size: int, percpu: bool = False):
        self.path = path
        self.fd = obj_get(path)
        self.value_size = value_size
        self.percpu = percpu
        self._stride = (value_size + 7) & ~7
        self._ncpu = possible_cpus() if percpu else 1

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def lookup(self, key: int) -> list[bytes]:
        """The value at key: a list with one bytes object per CPU (one item if not per-CPU)."""
        k = ctypes.c_uint32(key)
        buf = ctypes.create_string_buffer(self._stride * self._ncpu)
        _check(lib().bpf_map_lookup_elem(self.fd, ctypes.byref(k), buf), f"lookup {self.path}[{key}]")
        raw = buf.raw
        return [raw[i * self._stride: i * self._stride + self.value_size] for i in range(self._ncpu)]

    def update(self, key: int, value: bytes) -> None:
        if self.percpu:
            value = b"".join(value.ljust(self._stride, b"\0") for _ in range(self._ncpu))
        k = ctypes.c_uint32(key)
        buf = ctypes.create_string_buffer(value, len(value))
        _check(lib().bpf_map_update_elem(self.fd, ctypes.byref(k), buf, 0), f"update {self.path}[{key}]")


def is_bpffs(path: str = "/sys/fs/bpf") -> bool:
    try:
        with open("/proc/mounts") as f:
            return any(line.split()[1] == path and line.split()[2] == "bpf" for line in f)
    except OSError:
        return False


__all__ = ["PinnedMap", "obj_pin", "obj_get", "possible_cpus", "is_bpffs", "errno"]
