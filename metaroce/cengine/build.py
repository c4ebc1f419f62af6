"""Build the transport engine's cffi (API mode) extension: `python -m metaroce.cengine.build`
(the setup step runs it when a source changed; the result sits next to this file).
MRE_CFLAGS adds compiler flags (e.g. -fsanitize=address -g for a debugging build)."""

import os
from pathlib import Path

from cffi import FFI

from ..cffi_build import cdef_headers, compile_into

HERE = Path(__file__).resolve().parent
HEADERS = ("mre.h", "mre_cc.h", "mre_paths.h", "mre_credit.h")   # the cffi interface
SOURCES = ("engine.c", "requester.c", "responder.c", "readresp.c", "cc.c", "paths.c", "credit.c")
MODULE = "metaroce.cengine._mre"


def ffibuilder() -> FFI:
    ffi = FFI()
    cdef_headers(ffi, (HERE / name for name in HEADERS))
    flags = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-std=gnu11"]
    flags += os.environ.get("MRE_CFLAGS", "").split()
    ffi.set_source(MODULE, "".join(f'#include "{h}"\n' for h in HEADERS),
                   sources=[str(HERE / s) for s in SOURCES], include_dirs=[str(HERE)],
                   libraries=["m"], extra_compile_args=flags,
                   extra_link_args=[f for f in flags if f.startswith("-fsanitize")])
    return ffi


def main() -> None:
    compile_into(ffibuilder(), HERE)


if __name__ == "__main__":
    main()
