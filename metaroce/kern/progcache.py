"""BPF build cache: a program is compiled with BCC once per configuration (bpf/ sources,
-D defines, BCC version, kernel release); later builds recreate its maps and load its recorded
instructions through libbpf, skipping clang. See docs/architecture.md, "BPF build cache".

An entry, /var/cache/metaroce/bpf/<key>/ (METAROCE_BPF_CACHE=<dir> moves it, =off disables):
meta.json (maps, functions, map references, file digests) and <function>.insns (raw insns)."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shutil
import stat
import struct
import tempfile
import time
from pathlib import Path

from ..errors import MetaroceError
from . import btf, libbpf
from .bpftables import CachedTable

FORMAT = 1
DEFAULT_ROOT = "/var/cache/metaroce/bpf"
PROG_TYPES = {"xdp": 6, "xdp.frags": 6, "xdp.cpumap": 6, "sched_cls": 3}
# kinds loaded with flags: (prog_flags, expected_attach_type); xdp.cpumap: a program run by a
# cpumap entry on the CPU a frame was handed to (frags-aware as well)
LOAD_OPTS = {"xdp.frags": (libbpf.BPF_F_XDP_HAS_FRAGS, libbpf.BPF_XDP),
             "xdp.cpumap": (libbpf.BPF_F_XDP_HAS_FRAGS, libbpf.BPF_XDP_CPUMAP)}
MAP_IN_MAP = {12: "ARRAY", 13: "HASH"}         # ARRAY_OF_MAPS, HASH_OF_MAPS
LD_IMM64 = 0x18
PSEUDO_MAP_FD, PSEUDO_MAP_VALUE = 1, 2
BTF_FILE = "maps.btf"
_INSN = struct.Struct("<BBhi")
last_build: dict = {}


def cache_root() -> Path | None:
    v = os.environ.get("METAROCE_BPF_CACHE", DEFAULT_ROOT)
    return None if v.strip().lower() in ("off", "0", "") else Path(v)


def cache_key(src_dir: Path, relpath: str, cflags: list[str], bcc_version: str, kernel: str,
              funcs: dict[str, str] | None = None) -> str:
    h = hashlib.sha256(f"metaroce-bpf-cache {FORMAT}\0{relpath}\0{bcc_version}\0{kernel}\0".encode())
    h.update(json.dumps(cflags).encode())
    if funcs:                       # how each function loads (e.g. xdp.frags) is part of the build
        h.update(json.dumps(sorted(funcs.items())).encode())
    for p in sorted(q for q in src_dir.rglob("*") if q.is_file()):
        data = p.read_bytes()
        h.update(f"\0{p.relative_to(src_dir)}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def find_relocs(insns: bytes, fd_names: dict[int, str]) -> list[list]:
    """[insn index, map name, pseudo kind] of every ld_imm64 that loads a map by fd."""
    out, i, n = [], 0, len(insns) // 8
    while i < n:
        code, regs, _off, imm = _INSN.unpack_from(insns, i * 8)
        if code == LD_IMM64:
            src = regs >> 4
            if src in (PSEUDO_MAP_FD, PSEUDO_MAP_VALUE):
                if imm not in fd_names:
                    raise MetaroceError(f"insn {i} refers to fd {imm}, which is no map of the program")
                out.append([i, fd_names[imm], src])
            i += 2
            continue
        i += 1
    return out


def patch_relocs(insns: bytes, relocs: list[list], fds: dict[str, int]) -> bytes:
    """The instructions with each recorded map reference's imm set to the map's new fd."""
    buf = bytearray(insns)
    for idx, name, src in relocs:
        code, regs, off, _imm = _INSN.unpack_from(buf, idx * 8)
        if code != LD_IMM64 or regs >> 4 != src:
            raise MetaroceError(f"insn {idx} is not the recorded map reference")
        _INSN.pack_into(buf, idx * 8, code, regs, off, fds[name])
    return bytes(buf)


# --- the entry directory: trusted only if root-owned and not writable by others ---

def _trusted(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return st.st_uid == 0 and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not stat.S_ISLNK(st.st_mode)


def _usable_root(root: Path) -> bool:
    if os.geteuid() != 0:
        return False
    try:
        if not root.exists():
            old = os.umask(0o077)
            try:
                os.makedirs(root, mode=0o700, exist_ok=True)
            finally:
                os.umask(old)
    except OSError:
        return False
    return _trusted(root)


def _read_entry(d: Path) -> dict | None:
    """The entry's meta with its insns, or None if it is missing, untrusted or damaged."""
    if not _trusted(d) or not _trusted(d / "meta.json"):
        return None
    try:
        meta = json.loads((d / "meta.json").read_text())
        if meta.get("format") != FORMAT:
            return None
        for f in meta["funcs"].values():
            p = d / f["file"]
            if not _trusted(p):
                return None
            f["insns"] = p.read_bytes()
            if hashlib.sha256(f["insns"]).hexdigest() != f["sha256"] or len(f["insns"]) % 8:
                return None
        if "btf" in meta:
            p = d / meta["btf"]["file"]
            if not _trusted(p):
                return None
            meta["btf"]["raw"] = p.read_bytes()
            if hashlib.sha256(meta["btf"]["raw"]).hexdigest() != meta["btf"]["sha256"]:
                return None
        return meta
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_entry(root: Path, key: str, meta: dict, insns: dict[str, bytes]) -> None:
    """Write into a temp dir, then rename: readers see a whole entry or none."""
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))     # mode 0700
    try:
        for name, raw in insns.items():
            fname = meta["funcs"][name]["file"] if name in meta["funcs"] else name
            fd = os.open(tmp / fname, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(raw)
        fd = os.open(tmp / "meta.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(meta, f, indent=1)
        dest = root / key
        if dest.exists():                      # a damaged entry: move it aside first
            shutil.rmtree(dest, ignore_errors=True)
        os.rename(tmp, dest)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # lost a race with another writer: theirs stays


# --- recording a BCC build ---

def _bcc_lib():
    from ..system import import_bcc  # noqa: PLC0415
    lib = import_bcc().libbcc.lib
    vp, u64 = ctypes.c_void_p, ctypes.c_ulonglong
    for fn, res, args in (("bpf_num_tables", ctypes.c_size_t, [vp]),
                          ("bpf_table_name", ctypes.c_char_p, [vp, u64]),
                          ("bpf_table_fd_id", ctypes.c_int, [vp, u64]),
                          ("bpf_table_key_size_id", ctypes.c_size_t, [vp, u64]),
                          ("bpf_table_leaf_size_id", ctypes.c_size_t, [vp, u64])):
        getattr(lib, fn).restype, getattr(lib, fn).argtypes = res, args
    return lib


def inner_templates(src_dir: Path) -> dict[str, str]:
    """Map-in-map name -> its inner template's name, from the BPF_*_OF_MAPS declarations."""
    text = "\n".join(p.read_text(errors="replace") for p in sorted(src_dir.rglob("*.[ch]")))
    out = {m[0]: m[1] for m in re.findall(r'BPF_HASH_OF_MAPS\(\s*(\w+)\s*,\s*[^,]+,\s*"(\w+)"', text)}
    out.update({m[0]: m[1] for m in re.findall(r'BPF_ARRAY_OF_MAPS\(\s*(\w+)\s*,\s*"(\w+)"', text)})
    return out


def record(bpf, funcs: dict[str, str], inner: dict[str, str]) -> tuple[dict, dict[str, bytes]]:
    """meta.json content and raw insns of a BCC build whose `funcs` are loaded."""
    lib, mod = _bcc_lib(), bpf.module
    maps, fd_names, btf_ids = {}, {}, set()
    for i in range(lib.bpf_num_tables(mod)):
        name = lib.bpf_table_name(mod, i).decode()
        fd = lib.bpf_table_fd_id(mod, i)
        if fd < 0:
            continue
        bname = name.encode()
        maps[name] = {"type": lib.bpf_table_type_id(mod, i),
                      "key_size": lib.bpf_table_key_size_id(mod, i),
                      "value_size": lib.bpf_table_leaf_size_id(mod, i),
                      "max_entries": int(lib.bpf_table_max_entries_id(mod, i)),
                      "flags": lib.bpf_table_flags_id(mod, i),
                      "key_desc": (lib.bpf_table_key_desc(mod, bname) or b"").decode(),
                      "leaf_desc": (lib.bpf_table_leaf_desc(mod, bname) or b"").decode()}
        if maps[name]["type"] in MAP_IN_MAP:
            maps[name]["inner"] = inner.get(name)
        info = btf.map_info(fd)
        if info.btf_id:
            btf_ids.add(info.btf_id)
            maps[name]["btf_key_type_id"] = info.btf_key_type_id
            maps[name]["btf_value_type_id"] = info.btf_value_type_id
        fd_names[fd] = name
    for name, m in maps.items():
        if ("bpf_spin_lock" in m["leaf_desc"] or "bpf_timer" in m["leaf_desc"]) and \
                "btf_value_type_id" not in m:
            raise MetaroceError(f"map {name} needs BTF (spin lock/timer) and has none")
        if m["type"] in MAP_IN_MAP and m.get("inner") not in maps:
            raise MetaroceError(f"map-in-map {name}: inner template not found")
    if len(btf_ids) > 1:
        raise MetaroceError("maps with BTF from more than one BTF object: not cacheable")
    meta = {"format": FORMAT, "license": "GPL", "maps": maps, "funcs": {}}
    raw = {}
    if btf_ids:
        raw[BTF_FILE] = btf.btf_bytes(btf_ids.pop())
        meta["btf"] = {"file": BTF_FILE, "sha256": hashlib.sha256(raw[BTF_FILE]).hexdigest()}
    for fname, kind in funcs.items():
        insns = bytes(bpf.dump_func(fname.encode()))
        raw[fname] = insns
        meta["funcs"][fname] = {"prog_type": kind, "file": f"{fname}.insns",
                                "sha256": hashlib.sha256(insns).hexdigest(),
                                "relocs": find_relocs(insns, fd_names)}
    return meta, raw


# --- loading an entry ---

class _ProgLoadOpts(ctypes.Structure):          # libbpf 1.1 struct bpf_prog_load_opts
    _fields_ = [("sz", ctypes.c_size_t), ("attempts", ctypes.c_int),
                ("expected_attach_type", ctypes.c_int), ("prog_btf_fd", ctypes.c_uint32),
                ("prog_flags", ctypes.c_uint32), ("prog_ifindex", ctypes.c_uint32),
                ("kern_version", ctypes.c_uint32), ("attach_btf_id", ctypes.c_uint32),
                ("attach_prog_fd", ctypes.c_uint32), ("attach_btf_obj_fd", ctypes.c_uint32),
                ("fd_array", ctypes.c_void_p), ("func_info", ctypes.c_void_p),
                ("func_info_cnt", ctypes.c_uint32), ("func_info_rec_size", ctypes.c_uint32),
                ("line_info", ctypes.c_void_p), ("line_info_cnt", ctypes.c_uint32),
                ("line_info_rec_size", ctypes.c_uint32), ("log_level", ctypes.c_uint32),
                ("log_size", ctypes.c_uint32), ("log_buf", ctypes.c_char_p)]


def prog_load(name: str, prog_type: int, insns: bytes, license: str = "GPL",
              prog_flags: int = 0, expected_attach_type: int = 0) -> int:
    """bpf_prog_load; on failure load again with a verifier log and raise it."""
    lib = libbpf.lib()
    lib.bpf_prog_load.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p,
                                  ctypes.c_size_t, ctypes.c_void_p]
    buf = ctypes.create_string_buffer(insns, len(insns))
    how = {"prog_flags": prog_flags, "expected_attach_type": expected_attach_type}
    opts = _ProgLoadOpts(sz=ctypes.sizeof(_ProgLoadOpts), **how)
    fd = lib.bpf_prog_load(prog_type, name.encode()[:15], license.encode(), buf, len(insns) // 8,
                           ctypes.byref(opts))
    if fd >= 0:
        return fd
    err = ctypes.get_errno()
    log = ctypes.create_string_buffer(1 << 24)
    opts = _ProgLoadOpts(sz=ctypes.sizeof(_ProgLoadOpts), log_level=1, log_size=len(log),
                         log_buf=ctypes.cast(log, ctypes.c_char_p), **how)
    fd = lib.bpf_prog_load(prog_type, name.encode()[:15], license.encode(), buf, len(insns) // 8,
                           ctypes.byref(opts))
    if fd >= 0:
        return fd
    tail = log.value.decode(errors="replace")[-4000:]
    raise MetaroceError(f"loading BPF program {name} through libbpf failed: {os.strerror(err)}\n{tail}")


def load_kind(name: str, kind: str, insns: bytes, license: str = "GPL") -> int:
    """prog_load for a kind of funcs ('xdp', 'xdp.frags', 'sched_cls'), with its load flags."""
    flags, attach = LOAD_OPTS.get(kind, (0, 0))
    return prog_load(name, PROG_TYPES[kind], insns, license, flags, attach)


class CachedFunction:
    def __init__(self, name: str, fd: int):
        self.name, self.fd = name.encode(), fd


class CachedProgram:
    """What BPF.__getitem__/load_func/cleanup give callers, for a program loaded from cache."""

    def __init__(self, meta: dict):
        self.meta, self.fds, self.funcs, self.tables = meta, {}, {}, {}
        try:
            self._create_maps()
            for fname, f in meta["funcs"].items():
                insns = patch_relocs(f["insns"], f["relocs"], self.fds)
                self.funcs[fname.encode()] = CachedFunction(
                    fname, load_kind(fname, f["prog_type"], insns, meta["license"]))
        except BaseException:
            self.cleanup()
            raise

    def _create_maps(self) -> None:
        maps = self.meta["maps"]
        btf_fd = btf.btf_load(self.meta["btf"]["raw"]) if "btf" in self.meta else -1
        try:
            for name in sorted(maps, key=lambda n: maps[n]["type"] in MAP_IN_MAP):  # templates first
                m = maps[name]
                opts = libbpf._MapCreateOpts(sz=ctypes.sizeof(libbpf._MapCreateOpts),
                                             map_flags=m["flags"])
                if m["type"] in MAP_IN_MAP:
                    opts.inner_map_fd = self.fds[m["inner"]]
                if "btf_value_type_id" in m:
                    opts.btf_fd, opts.btf_key_type_id = btf_fd, m["btf_key_type_id"]
                    opts.btf_value_type_id = m["btf_value_type_id"]
                self.fds[name] = libbpf._check(
                    libbpf.lib().bpf_map_create(m["type"], name.encode()[:15], m["key_size"],
                                                m["value_size"], m["max_entries"], ctypes.byref(opts)),
                    f"bpf_map_create {name}")
        finally:
            if btf_fd >= 0:
                os.close(btf_fd)                  # the maps keep their reference

    def __getitem__(self, name):
        key = name.decode() if isinstance(name, bytes) else name
        if key not in self.tables:
            if key not in self.fds:
                raise KeyError(name)
            self.tables[key] = CachedTable(key, self.meta["maps"][key], self.fds[key])
        return self.tables[key]

    def load_func(self, name, prog_type=None):
        name = name if isinstance(name, bytes) else name.encode()
        if name not in self.funcs:
            raise MetaroceError(f"{name.decode()} is not in the cached build")
        return self.funcs[name]

    def cleanup(self) -> None:
        for fd in [f.fd for f in self.funcs.values()] + list(self.fds.values()):
            try:
                os.close(fd)
            except OSError:
                pass
        self.funcs, self.fds, self.tables = {}, {}, {}


def build(relpath: str, src_dir: Path, cflags: list[str], funcs: dict[str, str], compile_fn):
    """The program with `funcs` ({name: 'xdp'|'sched_cls'}) loaded: from the cache when an
    intact entry exists, else compiled by compile_fn() (a BCC object) and recorded."""
    from ..system import import_bcc  # noqa: PLC0415
    t0 = time.monotonic()
    root = cache_root()
    key = cache_key(src_dir, relpath, cflags, import_bcc().__version__, os.uname().release,
                    funcs)
    use = root is not None and _usable_root(root)
    note = ("cache off" if root is None else
            None if use else f"cache {root} not usable (must be root's, 0700, and we root)")
    if use:
        meta = _read_entry(root / key)
        if meta is not None:
            try:
                prog = CachedProgram(meta)
                return _done(prog, "cache", key, t0)
            except (MetaroceError, OSError) as exc:     # the kernel refuses the entry: compile
                note = f"cached entry failed to load: {str(exc)[:300]}"
        elif (root / key).exists():
            note = "cached entry damaged or untrusted: compiled again"
    bpf = compile_fn()
    for fname, kind in funcs.items():
        from .bcc_loader import load  # noqa: PLC0415
        load(bpf, fname, kind)
    if use:
        try:
            meta, raw = record(bpf, funcs, inner_templates(src_dir))
            _write_entry(root, key, meta, raw)
        except (MetaroceError, OSError):
            pass                          # not cacheable: still a working build
    return _done(bpf, "compiled", key, t0, note)


def _done(prog, source: str, key: str, t0: float, note: str | None = None):
    info = {"source": source, "seconds": round(time.monotonic() - t0, 3), "key": key[:12]}
    if note:
        info["note"] = note
    last_build.clear()
    last_build.update(info)
    try:
        prog.build_info = info
    except AttributeError:
        pass
    return prog
