"""Rate limiting of switch egress with htb (pyroute2), and the drop counters of that queue."""

from __future__ import annotations

from .netdev import ifindex, ipr_in

ROOT, CLASS = 0x10000, 0x10010       # 1: and 1:10


def shape(netns_name: str, iface: str, rate_bps: int, mtu: int) -> None:
    """One htb class at rate_bps (ceil = rate) as the interface's root qdisc; the queue in front
    of it (pfifo, 1000 frames) is where overload waits and, when full, drops."""
    burst = max(2 * (mtu + 14), rate_bps // 8 // 1000)   # 1 ms at rate, at least two frames
    with ipr_in(netns_name) as ipr:
        idx = ifindex(ipr, iface)
        ipr.tc("add", "htb", index=idx, handle=ROOT, default=0x10)
        ipr.tc("add-class", "htb", index=idx, handle=CLASS, parent=ROOT,
               rate=f"{rate_bps}bit", ceil=f"{rate_bps}bit", burst=burst, cburst=burst,
               quantum=max(mtu + 14, 1514))


def queue_stats(netns_name: str, iface: str) -> dict:
    """Drops and backlog of the interface's root qdisc (zeros when it has none)."""
    out = {"qdisc": None, "drops": 0, "overlimits": 0, "backlog_bytes": 0}
    with ipr_in(netns_name) as ipr:
        idx = ifindex(ipr, iface)
        for q in ipr.get_qdiscs(index=idx):
            if q["parent"] != 0xFFFFFFFF:
                continue
            out["qdisc"] = q.get_attr("TCA_KIND")
            st = q.get_attr("TCA_STATS2")
            queue = st.get_attr("TCA_STATS_QUEUE") if st else None
            if queue:
                out["drops"] = queue["drops"]
                out["overlimits"] = queue["overlimits"]
                out["backlog_bytes"] = queue["backlog"]
    return out
