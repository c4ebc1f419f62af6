"""Device and QP statistics in the ecosystem's names: the kernel's receive verdicts and reply
counters and the requester's per-QP counters, summed into rdma-core's hw_counters names where
one exists (mlx5's `rdma statistic` set) and kept by drop reason otherwise; the port counters
(rdma-core's ports/1/counters) count every frame of the device. Device and port counters are
device totals: traffic of every QP (verbs applications', the daemon's endpoints, raw ones),
including QPs destroyed since, so they never go backwards while the daemon lives. Pure: it
reads a daemon status document and returns dictionaries."""

from __future__ import annotations

# hw counter name -> (where it comes from, key)
#   "rx": a receive verdict of the XDP program; "tx": a reply the XDP program sent;
#   "qp": summed over the device's QPs, those destroyed included; "port": PORT_COUNTERS below
HW_COUNTERS = {
    "rx_packets": ("port", "port_rcv_packets"),
    "rx_bytes": ("port", "rcv_bytes"),
    "tx_packets": ("port", "port_xmit_packets"),
    "tx_bytes": ("port", "xmit_bytes"),
    "rx_read_requests": ("rx", "read_request"),
    "rx_atomic_requests": ("rx", "atomic"),
    "out_of_sequence": ("rx", "psn_out_of_order"),
    "duplicate_request": ("rx", "duplicate"),
    "out_of_buffer": ("rx", "rnr"),
    "packet_seq_err": ("qp", "packet_seq_err"),
    "rnr_nak_retry_err": ("qp", "rnr_nak_received"),
    "local_ack_timeout_err": ("qp", "local_ack_timeout_err"),
    "resp_remote_access_errors": ("tx", "nak_rem_access"),
    "resp_invalid_request_errors": ("tx", "nak_inv_req"),
    "np_cnp_sent": ("tx", "cnp"),
    "rp_cnp_handled": ("rx", "cnp"),
    "np_ecn_marked_roce_packets": ("qp", "np_ecn_marked_roce_packets"),
    "retransmitted_packets": ("qp", "retransmitted_packets"),
}
# receive verdicts that are drops (counted per reason, per CPU, in the kernel)
DROP_REASONS = ("malformed", "unknown_qp", "psn_out_of_order", "bad_opcode_seq", "bad_rkey",
                "mr_bounds", "mr_access", "unsupported_opcode", "bad_icrc", "duplicate", "rnr",
                "qp_error", "wrong_source", "unexpected_response", "invalid_request",
                "wrong_mode", "beyond_window", "bad_pkey", "bad_csum")
QP_FIELDS = ("rx_packets", "rx_bytes", "sent_packets", "sent_bytes", "out_of_sequence",
             "duplicate_request", "packet_seq_err", "rnr_nak_received", "local_ack_timeout_err",
             "retransmitted_packets", "read_response_packets", "np_cnp_sent", "rp_cnp_handled",
             "cnp_received", "np_ecn_marked_roce_packets", "acks_received", "sq_outstanding",
             "window_pkts", "path_evictions")
# per path of a multipath MetaRoCE QP (MP-4)
PATH_FIELDS = ("sport", "sent_packets", "lost", "rtos", "ecn_echoes", "evictions")


# rdma-core's port counters (IB PortCounters; /sys/class/infiniband/DEV/ports/1/counters):
# port_*_data are in 4-octet words, as there. Received: every RoCE frame the XDP program saw
# (dropped ones too); transmitted: the program's replies (XDP_TX) and the frames the daemon
# sent (its AF_XDP socket); port_rcv_errors: malformed frames and failed integrity checks.
PORT_COUNTERS = ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets",
                 "unicast_xmit_packets", "unicast_rcv_packets", "port_rcv_errors")


def _port(status: dict) -> dict:
    """Port counters, plus the byte counts they are made of (rcv_bytes, xmit_bytes)."""
    k, xsk, rx = status.get("port", {}), status.get("tx", {}), status.get("counters", {})
    rcv_pkts, rcv_bytes = int(k.get("rcv_packets", 0)), int(k.get("rcv_bytes", 0))
    xmit_pkts = int(k.get("xmit_packets", 0)) + int(xsk.get("tx_completed", 0))
    xmit_bytes = int(k.get("xmit_bytes", 0)) + int(xsk.get("tx_bytes", 0))
    return {"port_xmit_data": xmit_bytes // 4, "port_rcv_data": rcv_bytes // 4,
            "port_xmit_packets": xmit_pkts, "port_rcv_packets": rcv_pkts,
            "unicast_xmit_packets": xmit_pkts, "unicast_rcv_packets": rcv_pkts,
            "port_rcv_errors": int(rx.get("malformed", 0)) + int(rx.get("bad_icrc", 0)) +
            int(rx.get("bad_csum", 0)),
            "rcv_bytes": rcv_bytes, "xmit_bytes": xmit_bytes}


def device_stats(status: dict) -> dict:
    """{"hw_counters", "port_counters", "integrity", "drops", "replies", "qps"} from a
    daemon status document. integrity: the frames of known QPs each check verified (spec 5.7:
    the ICRC, or the negotiated UDP checksum) and those each refused."""
    rx = status.get("counters", {})
    qps = status.get("qps", [])
    gone = status.get("destroyed_qp_counters", {})
    port = _port(status)
    hw = {}
    for name, (src, key) in HW_COUNTERS.items():
        if src == "qp":
            hw[name] = sum(int(q.get(key, 0)) for q in qps) + int(gone.get(key, 0))
        elif src == "port":
            hw[name] = port[key]
        elif src == "tx":
            hw[name] = int(rx.get("tx_" + key, 0))
        else:
            hw[name] = int(rx.get(key, 0))
    drops = {r: int(rx.get(r, 0)) for r in DROP_REASONS}
    k = status.get("port", {})
    integrity = {"icrc_checked": int(k.get("rcv_icrc_checked", 0)),
                 "csum_checked": int(k.get("rcv_csum_checked", 0)),
                 "bad_icrc": drops["bad_icrc"], "bad_csum": drops["bad_csum"]}
    replies = {k.removeprefix("tx_"): int(v) for k, v in rx.items() if k.startswith("tx_")}
    out_qps = []
    for q in qps:
        doc = {"qpn": q["qpn"], "lqpn": f"0x{q['qpn']:06x}", "state": q.get("state"),
               "mode": q.get("mode"), "integrity": q.get("integrity", "icrc"), "type": "RC",
               "rqpn": (q.get("remote") or {}).get("qpn"),
               "peer": (q.get("remote") or {}).get("ip")}
        doc.update({k: int(q.get(k, 0)) for k in QP_FIELDS})
        if q.get("path_stats"):
            doc["paths"] = [{"path": int(p["path"]), **{k: int(p.get(k, 0)) for k in PATH_FIELDS}}
                            for p in q["path_stats"]]
        out_qps.append(doc)
    return {"hw_counters": hw, "port_counters": {k: port[k] for k in PORT_COUNTERS},
            "integrity": integrity, "drops": drops, "drops_total": sum(drops.values()), "replies": replies,
            "qps": out_qps}


def format_stats(dev: str, st: dict, show_zero: bool = True) -> list[str]:
    """`rdma statistic show`-style lines: the link's hw counters, its port counters, its drops,
    then one line per QP (QP numbers in hex, as rdma-core prints them)."""
    def pairs(d: dict) -> str:
        return " ".join(f"{k} {v}" for k, v in d.items() if show_zero or v)
    lines = [f"link {dev}/1 {pairs(st['hw_counters'])}".rstrip(),
             f"link {dev}/1 {pairs(st.get('port_counters', {}))}".rstrip(),
             f"link {dev}/1 integrity {pairs(st.get('integrity', {}))}".rstrip(),
             f"link {dev}/1 drops {st['drops_total']} {pairs(st['drops'])}".rstrip()]
    for q in st["qps"]:
        rqpn = "-" if q["rqpn"] is None else f"0x{q['rqpn']:06x}"
        head = (f"link {dev}/1 lqpn {q['lqpn']} type RC state {q['state']} mode {q['mode']} "
                f"integrity {q.get('integrity', 'icrc')} rqpn {rqpn} peer {q['peer'] or '-'}")
        body = {k: q[k] for k in QP_FIELDS}
        lines.append(f"{head} {pairs(body)}".rstrip())
        for p in q.get("paths", []):
            lines.append(f"link {dev}/1 lqpn {q['lqpn']} path {p['path']} "
                         f"{pairs({k: p[k] for k in PATH_FIELDS})}".rstrip())
    return lines
