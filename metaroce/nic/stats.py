"""Device and QP statistics in the ecosystem's names: the kernel's receive verdicts and reply
counters and the requester's per-QP counters, summed into rdma-core's hw_counters names where
one exists (mlx5's `rdma statistic` set) and kept by drop reason otherwise. Pure: it reads a
daemon status document and returns dictionaries."""

from __future__ import annotations

# hw counter name -> (where it comes from, key)
#   "rx": a receive verdict of the XDP program; "tx": a reply the XDP program sent;
#   "qp": summed over the device's QPs
HW_COUNTERS = {
    "rx_packets": ("qp", "rx_packets"),
    "rx_bytes": ("qp", "rx_bytes"),
    "tx_packets": ("qp", "sent_packets"),
    "tx_bytes": ("qp", "sent_bytes"),
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
                "wrong_mode", "beyond_window", "bad_pkey")
QP_FIELDS = ("rx_packets", "rx_bytes", "sent_packets", "sent_bytes", "out_of_sequence",
             "duplicate_request", "packet_seq_err", "rnr_nak_received", "local_ack_timeout_err",
             "retransmitted_packets", "read_response_packets", "np_cnp_sent", "rp_cnp_handled",
             "cnp_received", "np_ecn_marked_roce_packets", "acks_received", "sq_outstanding",
             "window_pkts", "path_evictions")
# per path of a multipath MetaRoCE QP (MP-4)
PATH_FIELDS = ("sport", "sent_packets", "lost", "rtos", "ecn_echoes", "evictions")


def device_stats(status: dict) -> dict:
    """{"hw_counters", "drops", "replies", "qps"} from a daemon status document."""
    rx = status.get("counters", {})
    qps = status.get("qps", [])
    hw = {}
    for name, (src, key) in HW_COUNTERS.items():
        if src == "qp":
            hw[name] = sum(int(q.get(key, 0)) for q in qps)
        elif src == "tx":
            hw[name] = int(rx.get("tx_" + key, 0))
        else:
            hw[name] = int(rx.get(key, 0))
    drops = {r: int(rx.get(r, 0)) for r in DROP_REASONS}
    replies = {k.removeprefix("tx_"): int(v) for k, v in rx.items() if k.startswith("tx_")}
    out_qps = []
    for q in qps:
        doc = {"qpn": q["qpn"], "lqpn": f"0x{q['qpn']:06x}", "state": q.get("state"),
               "mode": q.get("mode"), "type": "RC",
               "rqpn": (q.get("remote") or {}).get("qpn"),
               "peer": (q.get("remote") or {}).get("ip")}
        doc.update({k: int(q.get(k, 0)) for k in QP_FIELDS})
        if q.get("path_stats"):
            doc["paths"] = [{"path": int(p["path"]), **{k: int(p.get(k, 0)) for k in PATH_FIELDS}}
                            for p in q["path_stats"]]
        out_qps.append(doc)
    return {"hw_counters": hw, "drops": drops, "drops_total": sum(drops.values()),
            "replies": replies, "qps": out_qps}


def format_stats(dev: str, st: dict, show_zero: bool = True) -> list[str]:
    """`rdma statistic show`-style lines: one per link, one per QP."""
    def pairs(d: dict) -> str:
        return " ".join(f"{k} {v}" for k, v in d.items() if show_zero or v)
    lines = [f"link {dev}/1 {pairs(st['hw_counters'])}".rstrip(),
             f"link {dev}/1 drops {st['drops_total']} {pairs(st['drops'])}".rstrip()]
    for q in st["qps"]:
        head = (f"link {dev}/1 lqpn {q['qpn']} type RC state {q['state']} mode {q['mode']} "
                f"rqpn {q['rqpn']} peer {q['peer']}")
        body = {k: q[k] for k in QP_FIELDS}
        lines.append(f"{head} {pairs(body)}".rstrip())
        for p in q.get("paths", []):
            lines.append(f"link {dev}/1 lqpn {q['qpn']} path {p['path']} "
                         f"{pairs({k: p[k] for k in PATH_FIELDS})}".rstrip())
    return lines
