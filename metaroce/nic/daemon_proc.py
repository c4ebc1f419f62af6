"""The daemon's own process: `start_background` runs `python -m metaroce.nic.daemon_proc` in a
fresh interpreter, never a bare fork of its caller.

Why not fork: a forked child inherits every Python object of its caller, garbage included. When
such an object (a socket, an mmap, a file of a test runner or an application) is finalised in
the child, it closes its fd *number* in the child, where that number now belongs to one of the
daemon's own BPF maps or sockets. The daemon then fails at random: maps answer EBADF, requests
are refused, the XDP event ring or an MR map goes away. A forked child of a threaded caller can
also inherit a lock some other thread held. An exec'd interpreter owns exactly what it opens.

Protocol: the parent passes one pipe end (--ready-fd); the child writes "ok" once the device
serves, or "error: <why>" and exits. Its stderr is the device's log."""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="metaroce-daemon")
    ap.add_argument("--dev", required=True)
    ap.add_argument("--netns", default=None)
    ap.add_argument("--netns-inode", type=int, required=True)
    ap.add_argument("--mode", default="roce")
    ap.add_argument("--credits", default=None, help="CreditConfig fields as JSON")
    ap.add_argument("--integrity", default="icrc")
    ap.add_argument("--cc", default=None, help="CCConfig fields as JSON")
    ap.add_argument("--rx-cpus", default="auto")
    ap.add_argument("--ready-fd", type=int, required=True)
    a = ap.parse_args(argv)
    wfd = a.ready_fd
    try:
        from .ccconfig import CCConfig  # noqa: PLC0415
        from .credit import CreditConfig  # noqa: PLC0415
        from .daemon import Daemon  # noqa: PLC0415
        from .devid import DeviceId  # noqa: PLC0415
        dev = DeviceId(a.dev, a.netns, a.netns_inode)
        credits = CreditConfig(**json.loads(a.credits)) if a.credits else None
        cc = CCConfig(**json.loads(a.cc)) if a.cc else None
        dm = Daemon(dev, a.mode, credits, a.integrity, cc, a.rx_cpus)
    except BaseException as exc:  # noqa: BLE001 (reported to the parent, then exit)
        traceback.print_exc()
        os.write(wfd, f"error: {exc}".encode())
        return 1
    os.write(wfd, b"ok")
    os.close(wfd)
    try:
        dm.serve_forever()
    except BaseException:  # noqa: BLE001 (the log keeps the traceback)
        traceback.print_exc()
        return 1
    finally:
        sys.stderr.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
