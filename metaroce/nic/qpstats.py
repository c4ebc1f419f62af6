"""One QP's statistics as the daemon reports them (`metaroce qp show`, `metaroce stats`, the
exporter, the tests): the kernel's counters (its XDP program's per-QP state) and the data path's
(the engine's requester and READ responder, the adapter's transmit counts), under the names the
daemon has always used. Reads both, changes nothing."""

from __future__ import annotations

from .rx import CREDIT_VALID, QP_COUNTERS, QP_RX_ERROR

PSN_MASK = 0xFFFFFF


def qp_stats(dev, qp) -> dict:
    try:
        st = dev.rx.qp_state(qp.qpn) if qp.state != "INIT" else {}
    except KeyError:                         # never connected: nothing in the kernel
        st = {}
    info = dev.dp.qp_info(qp.qpn)
    out = {"qpn": qp.qpn, "state": qp.state, "mode": dev.qp_mode(qp), "integrity": qp.integrity,
           "remote": qp.remote, "rx_cpu": dev.rx.qp_cpu(qp.qpn)}
    out.update({k: st.get(k, 0) for k in QP_COUNTERS})
    if info is None:
        return out
    e = info.e
    # ERR as soon as either half knows: the engine (an error completion, a fatal NAK it got),
    # or the kernel, whose responder moved the QP to ERR when it sent a fatal NAK (its event
    # reaches the engine thread a moment later: a query right after the requester's error
    # completion must not still say RTS)
    if (info.err or st.get("state") == QP_RX_ERROR) and qp.state != "ERR":
        qp.state = out["state"] = "ERR"
    connected = bool(info.connected)
    out["sq_outstanding"] = int(info.sq_taken) + int(info.unfetched)
    out["window_pkts"] = (e.nxt - e.una) & PSN_MASK if connected else 0
    out.update({
        "sent_packets": int(info.sent_packets), "sent_bytes": int(info.sent_bytes),
        "retransmitted_packets": int(e.retx), "local_ack_timeout_err": int(e.ack_timeouts),
        "rto_expired": int(e.timeouts), "rnr_nak_retry": int(e.rnr),
        "packet_seq_err_handled": int(e.seq_errs), "sacks_handled": int(e.sacks),
        "selective_retransmits": int(e.retx) if qp.metaroce else 0,
        "partial_rereads": int(e.rereads), "read_response_packets": int(e.read_responses),
        "read_go_backs": int(e.read_go_backs), "read_requests_pending": int(e.read_pending),
        "cnp_received": int(e.cnp), "credit_grants": int(e.credit_grants),
        "credit_blocked": int(e.credit_blocked), "credit_probes": int(e.probes),
        "cwnd_ecn_cuts": int(e.cc_md), "cwnd_loss_cuts": int(e.cc_loss_cuts),
        "lost_packets": int(e.lost),
        "rtt_samples": int(e.rtt_samples), "bad_wqes": int(info.bad_wqes),
        "wqes_taken": int(info.wqes), "recv_completions": int(info.recv_completions),
        "blocked": ("none", "window", "cwnd", "credit", "pace", "txq", "order")[e.blocked]
        if e.blocked < 7 else str(e.blocked)})
    if e.srtt >= 0:
        out["srtt_us"] = round(e.srtt / 1e3, 1)
        out["rttvar_us"] = round(e.rttvar / 1e3, 1)
        out["min_rtt_us"] = round(e.min_rtt / 1e3, 1) if e.min_rtt >= 0 else None
    out["rto_us"] = round(e.timeout_ns / 1e3, 1) if connected and e.timeout_ns >= 0 else None
    out["rto_min_us"] = round(e.rto_min / 1e3, 1) if connected else None
    out["cwnd_pkts"] = (round(e.cwnd / qp.pmtu, 1) if e.cwnd >= 0 else
                        (127 if qp.metaroce else 1024))
    out["dcqcn_rate_bps"] = float(e.dcqcn_rc) if e.dcqcn_on else None   # COMPAT-4: Rc
    out["credit_limit_psn"] = int(e.credit_limit) if e.credit_on and e.credit_active else None
    kc = int(st.get("credit", 0))            # what the kernel took from the last SACK
    out["kernel_credit_limit_psn"] = kc & PSN_MASK if kc & CREDIT_VALID else None
    out["credit_share_pkts"] = dev.credits.share_of(qp.qpn) if dev.credits else 0
    if st:                                   # the kernel's PSNs (as `rdma res show qp`)
        out["kernel"] = {k: int(st[k]) for k in ("epsn", "una", "rd_head", "rd_state", "rd_psn",
                                                 "sack_cum") if k in st}
    out["engine_psns"] = {"una": int(e.una), "nxt": int(e.nxt)} if connected else None
    out["paths"] = int(e.paths) if connected else 1
    out["path_evictions"] = int(e.path_evictions)
    if qp.metaroce and connected and e.paths > 1:          # MP-4: per-path statistics
        out["path_stats"] = [p for p in (dev.dp.path_info(qp.qpn, k) for k in range(e.paths))
                             if p is not None]
    return out
