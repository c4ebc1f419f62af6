"""Build the cffi (API mode) extension of the user-space fast path: `python -m
metaroce.fastpath.build` (the setup step runs it; the result sits next to this file)."""

import re
from pathlib import Path

from cffi import FFI

from ..cffi_build import cdef_headers, compile_into

HERE = Path(__file__).resolve().parent
# the verbs queues' layout is shared with the NIC: bpf/nic in a checkout, or the wheel's copy
NIC = next((p for p in (HERE.parent.parent / "bpf" / "nic", HERE.parent / "_bpf" / "nic")
            if p.is_dir()), HERE.parent.parent / "bpf" / "nic")
# the transport engine's packet descriptor (struct mre_pkt) is what mr_build_pkt takes: its
# header's types only (the engine is not compiled in: its functions are left out of the cdef)
CENGINE = HERE.parent / "cengine"
HEADERS = ("xsk.h", "roce_tx.h", "events.h", "poll.h", "vq.h")
CDEF_ONLY = (NIC / "nic_vq.h",)
SOURCES = ("xsk.c", "roce_tx.c", "events.c", "poll.c", "vq.c")
# the data path thread (metaroce/datapath, dp.h its interface) runs the engine on the wire: both
# are compiled into this module, so its views of the rings and flows are this module's types
DATAPATH = HERE.parent / "datapath"
DP_SOURCES = ("dp.c", "dp_res.c", "dp_wqe.c", "dp_events.c", "dp_tx.c", "dp_cq.c", "dp_timer.c")
ENGINE_SOURCES = ("engine.c", "requester.c", "responder.c", "readresp.c", "cc.c", "paths.c",
                  "credit.c")


def types_only(text: str) -> str:
    """A C header without comments, preprocessor lines and function declarations (top-level
    statements with a parameter list and no body): its enums and structs, for a cdef that does
    not make cffi link the header's functions."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)
    text = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#"))
    keep, stmt, depth = [], [], 0
    for ch in text:
        stmt.append(ch)
        depth += (ch == "{") - (ch == "}")
        if ch == ";" and depth == 0:
            s = "".join(stmt).strip()
            if "{" in s or "(" not in s:
                keep.append(s)
            stmt = []
    return "\n".join(keep) + "\n"


def ffibuilder() -> FFI:
    ffi = FFI()
    cdef_headers(ffi, CDEF_ONLY)
    ffi.cdef(types_only((CENGINE / "mre.h").read_text()))   # before roce_tx.h, which uses it
    cdef_headers(ffi, (*(HERE / name for name in HEADERS), DATAPATH / "dp.h"))
    ffi.set_source("metaroce.fastpath._xsk",
                   "".join(f'#include "{h}"\n' for h in (*HEADERS, "dp.h")),
                   sources=[*(str(HERE / s) for s in SOURCES),
                            *(str(DATAPATH / s) for s in DP_SOURCES),
                            *(str(CENGINE / s) for s in ENGINE_SOURCES)],
                   include_dirs=[str(HERE), str(NIC), str(CENGINE), str(DATAPATH)],
                   libraries=["isal", "bpf", "m", "pthread"],
                   extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                       "-std=gnu11", "-D_GNU_SOURCE"])
    return ffi


def main() -> None:
    compile_into(ffibuilder(), HERE)


if __name__ == "__main__":
    main()
