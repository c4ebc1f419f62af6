"""What the project's cffi (API mode) builds share: declarations read from C headers, and a
compile that leaves the extension next to its package (metaroce.fastpath.build,
metaroce.cengine.build; the setup step runs both)."""

import os
import shutil
import tempfile
from pathlib import Path

from cffi import FFI


def cdef_headers(ffi: FFI, paths) -> None:
    """Declare everything in these headers to cffi (preprocessor lines left out)."""
    for path in paths:
        text = Path(path).read_text()
        ffi.cdef("\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#")))


def compile_into(ffi: FFI, dest: Path) -> Path:
    """Compile away from the project root (setuptools would read its pyproject.toml) and copy
    the extension into dest."""
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            built = Path(ffi.compile(tmpdir=tmp, verbose=False))
        finally:
            os.chdir(cwd)
        return Path(shutil.copy2(built, dest / built.name))
