"""Build the cffi (API mode) extension of the user-space fast path: `python -m
metaroce.fastpath.build` (the setup step runs it; the result sits next to this file)."""

from pathlib import Path

from cffi import FFI

from ..cffi_build import cdef_headers, compile_into

HERE = Path(__file__).resolve().parent
# the verbs queues' layout is shared with the NIC: bpf/nic in a checkout, or the wheel's copy
NIC = next((p for p in (HERE.parent.parent / "bpf" / "nic", HERE.parent / "_bpf" / "nic")
            if p.is_dir()), HERE.parent.parent / "bpf" / "nic")
HEADERS = ("xsk.h", "roce_tx.h", "events.h", "poll.h", "vq.h")
CDEF_ONLY = (NIC / "nic_vq.h",)
SOURCES = ("xsk.c", "roce_tx.c", "events.c", "poll.c", "vq.c")


def ffibuilder() -> FFI:
    ffi = FFI()
    cdef_headers(ffi, (*CDEF_ONLY, *(HERE / name for name in HEADERS)))
    ffi.set_source("metaroce.fastpath._xsk", "".join(f'#include "{h}"\n' for h in HEADERS),
                   sources=[str(HERE / s) for s in SOURCES], include_dirs=[str(HERE), str(NIC)],
                   libraries=["isal", "bpf"],
                   extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"])
    return ffi


def main() -> None:
    compile_into(ffibuilder(), HERE)


if __name__ == "__main__":
    main()
