"""Compile BPF C from bpf/ with BCC, with the project's include path and -D tunables, and turn
BCC/clang failures into one clear error."""

import os
from pathlib import Path

from ..errors import MetaroceError
from ..system import import_bcc


def bpf_dir() -> Path:
    """bpf/ in a source checkout, or the copy shipped inside the wheel."""
    here = Path(__file__).resolve().parent.parent
    for cand in (here.parent / "bpf", here / "_bpf"):
        if cand.is_dir():
            return cand
    raise MetaroceError("BPF sources not found (expected bpf/ next to the metaroce package)")


def _cflags(relpath: str, defines: dict | None) -> list[str]:
    src = bpf_dir() / relpath
    cflags = [f"-I{src.parent}", f"-I{bpf_dir()}", "-Wno-unused-function"]
    for k, v in (defines or {}).items():
        cflags.append(f"-D{k}={v}")
    return cflags


def compile_program(relpath: str, defines: dict | None = None):
    """Compile bpf/<relpath> with BCC; returns the bcc.BPF object (maps created, nothing attached)."""
    bcc = import_bcc()
    src = bpf_dir() / relpath
    cflags = _cflags(relpath, defines)
    try:
        return bcc.BPF(src_file=str(src).encode(), cflags=cflags)
    except Exception as exc:  # BCC raises bare Exception on compile failures
        raise MetaroceError(f"compiling {relpath} with BCC failed: {exc}") from exc


def build_program(relpath: str, defines: dict | None, funcs: dict[str, str]):
    """compile_program + load of `funcs` ({name: 'xdp'|'sched_cls'}) through the build cache
    (kern/progcache.py): a BCC object when compiled, a CachedProgram when loaded from cache;
    both give bpf[b"map"], load(bpf, name, kind), cleanup(), and .build_info."""
    from . import progcache  # noqa: PLC0415
    return progcache.build(relpath, bpf_dir(), _cflags(relpath, defines), funcs,
                           lambda: compile_program(relpath, defines))


def load(bpf, name: str, prog_type: str):
    """Load one function; prog_type is 'xdp', 'xdp.frags' (an XDP program that takes
    multi-buffer frames: BPF_F_XDP_HAS_FRAGS, which BCC's load_func cannot pass, so BCC's
    instructions go through libbpf), 'xdp.cpumap' (the same, run by a cpumap entry) or
    'sched_cls'. Verifier failures become one line."""
    bcc = import_bcc()
    if prog_type in ("xdp.frags", "xdp.cpumap") and isinstance(bpf, bcc.BPF) and \
            name.encode() not in bpf.funcs:
        from .progcache import load_kind  # noqa: PLC0415
        fd = load_kind(name, prog_type, bytes(bpf.dump_func(name.encode())))
        bpf.funcs[name.encode()] = bcc.BPF.Function(bpf, name.encode(), fd)   # closed by cleanup
    kind = {"xdp": bcc.BPF.XDP, "xdp.frags": bcc.BPF.XDP, "xdp.cpumap": bcc.BPF.XDP,
            "sched_cls": bcc.BPF.SCHED_CLS}[prog_type]
    try:
        return bpf.load_func(name.encode(), kind)
    except Exception as exc:
        raise MetaroceError(f"loading BPF program {name} failed (verifier or kernel): {exc}") from exc


__all__ = ["bpf_dir", "build_program", "compile_program", "load", "os"]
