"""Build the transport engine's cffi (API mode) extension: `python -m metaroce.cengine.build`
(the setup step runs it when a source changed; the result sits next to this file).
MRE_CFLAGS adds compiler flags (e.g. -fsanitize=address -g for a debugging build)."""

import os
import shutil
import tempfile
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
HEADERS = ("mre.h", "mre_cc.h", "mre_paths.h", "mre_credit.h")   # the cffi interface
SOURCES = ("engine.c", "requester.c", "responder.c", "readresp.c", "cc.c", "paths.c", "credit.c")
MODULE = "metaroce.cengine._mre"


def ffibuilder() -> FFI:
    ffi = FFI()
    for name in HEADERS:
        text = (HERE / name).read_text()
        ffi.cdef("\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#")))
    flags = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-std=gnu11"]
    flags += os.environ.get("MRE_CFLAGS", "").split()
    ffi.set_source(MODULE, "".join(f'#include "{h}"\n' for h in HEADERS),
                   sources=[str(HERE / s) for s in SOURCES], include_dirs=[str(HERE)],
                   libraries=["m"], extra_compile_args=flags,
                   extra_link_args=[f for f in flags if f.startswith("-fsanitize")])
    return ffi


def main() -> None:
    # build away from the project root (setuptools would read its pyproject.toml)
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            built = Path(ffibuilder().compile(tmpdir=tmp, verbose=False))
        finally:
            os.chdir(cwd)
        shutil.copy2(built, HERE / built.name)


if __name__ == "__main__":
    main()
