"""The interface's XDP slot around a daemon's life: what was attached by netlink before the
daemon (a lab's host-port program, another tool's) is taken off so the daemon's BPF link can
attach, recorded, and put back when the daemon stops, cleanly or not (`metaroce down` of a
dead daemon puts it back too)."""

from __future__ import annotations

import errno
import json
import os

from pyroute2 import IPRoute

from ..errors import MetaroceError
from ..kern import libbpf

# IFLA_XDP_ATTACHED values -> the netlink flags that attach in the same mode
_MODE_FLAGS = {1: libbpf.XDP_FLAGS_DRV_MODE, 2: libbpf.XDP_FLAGS_SKB_MODE}
_MODE_NAMES = {1: "native", 2: "generic", 3: "offload", 4: "several"}
_ATTACHED_BY_NAME = {"none": 0, "xdp": 1, "drv": 1, "skb": 2, "generic": 2, "hw": 3, "multi": 4}


def attached(ipr: IPRoute, ifindex: int) -> dict | None:
    """{'prog_id', 'attached', 'mode'} of the program on the interface, or None."""
    link = ipr.link("get", index=ifindex)[0]
    xdp = link.get_attr("IFLA_XDP")
    if not xdp:
        return None
    how = xdp.get_attr("IFLA_XDP_ATTACHED") or 0
    how = _ATTACHED_BY_NAME.get(how, how)      # pyroute2 may decode the value into a name
    if not how:
        return None
    return {"prog_id": xdp.get_attr("IFLA_XDP_PROG_ID"), "attached": how,
            "mode": _MODE_NAMES.get(how, str(how))}


def take_over(ifindex: int, record_path: str) -> dict | None:
    """Detach what netlink attached (recording it in record_path first); None if nothing was.
    A program held by someone's BPF link cannot be taken over: that is another owner."""
    with IPRoute() as ipr:
        prev = attached(ipr, ifindex)
        if prev is None:
            return None
        if prev["attached"] not in _MODE_FLAGS:
            raise MetaroceError(f"interface {ifindex} has an XDP program attached in "
                                f"{prev['mode']} mode: detach it first")
        os.makedirs(os.path.dirname(record_path), exist_ok=True)
        tmp = record_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"ifindex": ifindex, **prev}, f)
        os.replace(tmp, record_path)
        try:
            ipr.link("set", index=ifindex, xdp={"attrs": [("IFLA_XDP_FD", -1),
                                                          ("IFLA_XDP_FLAGS", _MODE_FLAGS[prev["attached"]])]})
        except Exception as exc:  # noqa: BLE001 (pyroute2 raises NetlinkError)
            os.unlink(record_path)
            if getattr(exc, "code", None) == errno.EBUSY:
                raise MetaroceError(f"the XDP program on interface {ifindex} is held by a BPF "
                                    f"link (another MetaRoCE daemon or tool owns it)") from None
            raise
        return prev


def put_back(record_path: str) -> dict | None:
    """Attach again what take_over recorded, in the same mode, if the interface's slot is free
    and the program still exists; the record is removed either way. Runs in the calling
    thread's namespace (the device's)."""
    try:
        with open(record_path) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    try:
        fd = libbpf.prog_get_fd_by_id(int(rec["prog_id"]))
    except (OSError, KeyError, ValueError, TypeError):
        fd = None                             # the program is gone (its lab went down)
    try:
        os.unlink(record_path)
    except FileNotFoundError:
        pass
    if fd is None:
        return None
    try:
        with IPRoute() as ipr:
            if attached(ipr, int(rec["ifindex"])) is not None:
                return None                   # someone attached since: theirs now
            ipr.link("set", index=int(rec["ifindex"]),
                     xdp={"attrs": [("IFLA_XDP_FD", fd),
                                    ("IFLA_XDP_FLAGS", _MODE_FLAGS[int(rec["attached"])])]})
    except Exception:  # noqa: BLE001 (the interface went away with its namespace)
        return None
    finally:
        os.close(fd)
    return rec
