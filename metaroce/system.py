"""Checks of the host: privileges and the kernel/BCC prerequisites, with actionable errors."""

import os
import platform

from .errors import MissingDependency, NeedRoot


def require_root(what: str = "this command") -> None:
    if os.geteuid() != 0:
        raise NeedRoot(f"{what} needs root (network namespaces and BPF): run it with sudo")


def kernel_build_dir() -> str:
    return f"/lib/modules/{platform.release()}/build"


def import_bcc():
    """Import Debian's BCC, or say exactly which package or link is missing."""
    try:
        import bcc  # noqa: PLC0415
    except ImportError as exc:
        raise MissingDependency(
            "BCC is not importable: install the Debian package python3-bpfcc "
            "(sudo make setup does it and exposes it to the venv)"
        ) from exc
    if not os.path.exists(os.path.join(kernel_build_dir(), "include")):
        raise MissingDependency(
            f"kernel headers not found at {kernel_build_dir()}: install linux-headers-amd64 "
            "and link it there (sudo make setup does both)"
        )
    return bcc
