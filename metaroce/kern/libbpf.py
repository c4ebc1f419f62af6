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
        _lib.bpf_map_create.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32,
                                        ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p]
        _lib.bpf_map_delete_elem.argtypes = [ctypes.c_int, ctypes.c_void_p]
        _lib.bpf_prog_test_run_opts.argtypes = [ctypes.c_int, ctypes.c_void_p]
        _lib.bpf_obj_get_info_by_fd.argtypes = [ctypes.c_int, ctypes.c_void_p,
                                                ctypes.POINTER(ctypes.c_uint32)]
    return _lib


def _check(rv: int, what: str) -> int:
    if rv < 0:
        err = ctypes.get_errno() or -rv
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rv


PROG_INFO_SIZE = 232                 # struct bpf_prog_info (uapi, Linux 6.1 and later)
_VERIFIED_INSNS_OFF = 216            # its verified_insns (Linux 5.16)
VERIFIER_BUDGET = 1_000_000          # BPF_COMPLEXITY_LIMIT_INSNS: instructions the verifier walks


def prog_verified_insns(fd: int) -> int | None:
    """How many instructions the verifier processed to load the program (its walk of every
    path, which BPF_COMPLEXITY_LIMIT_INSNS bounds), or None on a kernel that does not say."""
    info = ctypes.create_string_buffer(PROG_INFO_SIZE)
    n = ctypes.c_uint32(PROG_INFO_SIZE)
    if lib().bpf_obj_get_info_by_fd(fd, info, ctypes.byref(n)) or \
            n.value < _VERIFIED_INSNS_OFF + 4:
        return None
    return int.from_bytes(info.raw[_VERIFIED_INSNS_OFF:_VERIFIED_INSNS_OFF + 4], "little") or None


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


BPF_MAP_TYPE_ARRAY = 2
BPF_F_MMAPABLE = 1 << 10
BPF_F_INNER_MAP = 1 << 12


class _MapCreateOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("btf_fd", ctypes.c_uint32),
                ("btf_key_type_id", ctypes.c_uint32), ("btf_value_type_id", ctypes.c_uint32),
                ("btf_vmlinux_value_type_id", ctypes.c_uint32), ("inner_map_fd", ctypes.c_uint32),
                ("map_flags", ctypes.c_uint32), ("map_extra", ctypes.c_uint64),
                ("numa_node", ctypes.c_uint32), ("map_ifindex", ctypes.c_uint32)]


def map_create(map_type: int, name: str, key_size: int, value_size: int, entries: int,
               flags: int = 0) -> int:
    opts = _MapCreateOpts(sz=ctypes.sizeof(_MapCreateOpts), map_flags=flags)
    return _check(lib().bpf_map_create(map_type, name.encode()[:15], key_size, value_size, entries,
                                       ctypes.byref(opts)), f"bpf_map_create {name}")


def map_update_raw(fd: int, key: bytes, value: bytes) -> None:
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(value, len(value))
    _check(lib().bpf_map_update_elem(fd, k, v, 0), "bpf_map_update_elem")


def map_delete_raw(fd: int, key: bytes, missing_ok: bool = False) -> None:
    k = ctypes.create_string_buffer(key, len(key))
    rc = lib().bpf_map_delete_elem(fd, k)
    if rc == -errno.ENOENT and missing_ok:
        return
    _check(rc, "bpf_map_delete_elem")


class _TestRunOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("data_in", ctypes.c_void_p), ("data_out", ctypes.c_void_p),
                ("data_size_in", ctypes.c_uint32), ("data_size_out", ctypes.c_uint32),
                ("ctx_in", ctypes.c_void_p), ("ctx_out", ctypes.c_void_p),
                ("ctx_size_in", ctypes.c_uint32), ("ctx_size_out", ctypes.c_uint32),
                ("retval", ctypes.c_uint32), ("repeat", ctypes.c_int), ("duration", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("cpu", ctypes.c_uint32), ("batch_size", ctypes.c_uint32)]


class XdpMd(ctypes.Structure):
    """struct xdp_md, a test run's context in: data_end < the packet's length sets its linear
    part (the rest goes into page fragments; kernels from 6.18)."""
    _fields_ = [(n, ctypes.c_uint32) for n in ("data", "data_end", "data_meta", "ingress_ifindex",
                                               "rx_queue_index", "egress_ifindex")]


def prog_test_run(prog_fd: int, packet: bytes, repeat: int = 1,
                  linear: int | None = None) -> tuple[int, bytes, int]:
    """Run a loaded program on one packet (BPF_PROG_TEST_RUN): (return value, output packet,
    mean duration in ns). Without `linear` the kernel puts what does not fit its linear part
    (PAGE_SIZE - 256 - 320 bytes) into fragments, for a frags-aware XDP program; with it, the
    linear part is `linear` bytes."""
    inp = ctypes.create_string_buffer(packet, len(packet))
    out = ctypes.create_string_buffer(len(packet) + 512)
    o = _TestRunOpts(sz=ctypes.sizeof(_TestRunOpts), data_in=ctypes.addressof(inp),
                     data_out=ctypes.addressof(out), data_size_in=len(packet),
                     data_size_out=len(out), repeat=repeat)
    if linear is not None:
        ctx = XdpMd(data_end=linear)
        o.ctx_in, o.ctx_size_in = ctypes.addressof(ctx), ctypes.sizeof(ctx)
    _check(lib().bpf_prog_test_run_opts(prog_fd, ctypes.byref(o)), "bpf_prog_test_run_opts")
    return o.retval, out.raw[:o.data_size_out], o.duration


BPF_XDP_CPUMAP = 35              # expected attach type of a cpumap entry's program
BPF_XDP = 37
BPF_F_XDP_HAS_FRAGS = 1 << 5     # prog_flags: the program takes multi-buffer frames
XDP_FLAGS_SKB_MODE, XDP_FLAGS_DRV_MODE = 1 << 1, 1 << 2
# veth refuses native XDP for programs that are not frags-aware once a frame exceeds a page
VETH_NATIVE_XDP_MAX_MTU = 3498


def xdp_mode_for_mtu(mtu: int, frags: bool = False) -> tuple[str, int, str]:
    """(mode, attach flags, reason) for a program, frags-aware or not."""
    if frags:
        return "native", XDP_FLAGS_DRV_MODE, f"frags-aware program (MTU {mtu})"
    if mtu <= VETH_NATIVE_XDP_MAX_MTU:
        return "native", XDP_FLAGS_DRV_MODE, "the frame fits one page"
    return "generic", XDP_FLAGS_SKB_MODE, f"MTU {mtu} needs a frags-aware program"


class _LinkCreateOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("flags", ctypes.c_uint32), ("_pad", ctypes.c_uint32),
                ("_union", ctypes.c_uint64 * 8)]


def xdp_link_create(prog_fd: int, ifindex: int, flags: int = 0) -> int:
    """Attach an XDP program through a BPF link (in the calling thread's namespace). The
    program stays attached exactly as long as the returned fd is open: it goes away with the
    process that holds it, crash included."""
    lib().bpf_link_create.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    opts = _LinkCreateOpts(sz=ctypes.sizeof(_LinkCreateOpts), flags=flags)
    return _check(lib().bpf_link_create(prog_fd, ifindex, BPF_XDP, ctypes.byref(opts)),
                  f"bpf_link_create XDP ifindex {ifindex}")


def prog_get_fd_by_id(prog_id: int) -> int:
    """A new fd for a loaded program, by its kernel id (e.g. one netlink reports attached)."""
    lib().bpf_prog_get_fd_by_id.argtypes = [ctypes.c_uint32]
    return _check(lib().bpf_prog_get_fd_by_id(prog_id), f"bpf_prog_get_fd_by_id {prog_id}")


def is_bpffs(path: str = "/sys/fs/bpf") -> bool:
    try:
        with open("/proc/mounts") as f:
            return any(line.split()[1] == path and line.split()[2] == "bpf" for line in f)
    except OSError:
        return False


__all__ = ["PinnedMap", "obj_pin", "obj_get", "possible_cpus", "is_bpffs", "errno"]
