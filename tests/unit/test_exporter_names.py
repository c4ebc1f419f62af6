"""The exporter's contract with dashboards and alerts: every metric name, type and label set it
exposes, for a status document in which the daemon reports everything it can. The names were
read off the hand-written exporter this one (prometheus_client) replaced; none may change."""

from prometheus_client.parser import text_string_to_metric_families

from metaroce.deploy import exporter as ex
from metaroce.nic.rx import RX_REASONS, TX_COUNTERS

DEV = ("dev", "netns")
QP = ("dev", "netns", "qpn")
PATH = ("dev", "netns", "path", "qpn", "sport")
EXPOSED = {
    "metaroce_device_info": ("gauge", ("dev", "mode", "netns", "xdp_mode")),
    "metaroce_device_start_time_seconds": ("gauge", DEV),
    "metaroce_device_up": ("gauge", DEV),
    "metaroce_scrape_duration_seconds": ("gauge", DEV),
    "metaroce_memory_regions": ("gauge", DEV),
    "metaroce_qps": ("gauge", DEV),
    **{f"metaroce_{n}_total": ("counter", DEV) for n in (
        "rx_packets", "rx_bytes", "tx_packets", "tx_bytes", "rx_read_requests",
        "rx_atomic_requests", "out_of_sequence", "duplicate_request", "out_of_buffer",
        "packet_seq_err", "rnr_nak_retry_err", "local_ack_timeout_err",
        "resp_remote_access_errors", "resp_invalid_request_errors", "np_cnp_sent",
        "rp_cnp_handled", "np_ecn_marked_roce_packets", "retransmitted_packets",
        "events", "events_lost",
        "xsk_tx_queued", "xsk_tx_completed", "xsk_tx_multi", "xsk_tx_refused", "xsk_kicks",
        "xsk_kick_busy", "xsk_tx_ring_full")},
    "metaroce_rx_drops_total": ("counter", ("dev", "netns", "reason")),
    "metaroce_rx_verdicts_total": ("counter", ("dev", "netns", "verdict")),
    "metaroce_tx_replies_total": ("counter", ("dev", "kind", "netns")),
    "metaroce_qp_info": ("gauge", ("dev", "mode", "netns", "peer", "qpn", "rqpn", "state")),
    **{f"metaroce_qp_{n}_total": ("counter", QP) for n in (
        "rx_packets", "rx_bytes", "sent_packets", "sent_bytes", "out_of_sequence",
        "duplicate_request", "packet_seq_err", "rnr_nak_received", "local_ack_timeout_err",
        "retransmitted_packets", "selective_retransmits", "read_response_packets",
        "np_cnp_sent", "rp_cnp_handled", "cnp_received", "np_ecn_marked_roce_packets",
        "acks_received", "sacks_sent", "sacks_received", "sacks_handled", "rnr_nak_retry",
        "packet_seq_err_handled")},
    "metaroce_qp_send_queue_outstanding": ("gauge", QP),
    "metaroce_qp_inflight_packets": ("gauge", QP),
    "metaroce_qp_rtt_seconds": ("gauge", QP),
    "metaroce_qp_cwnd_packets": ("gauge", QP),
    "metaroce_qp_credits_packets": ("gauge", QP),
    **{f"metaroce_qp_path_{n}_total": ("counter", PATH) for n in (
        "sent_packets", "lost", "rtos", "ecn_echoes", "evictions")},
}
QP_KEYS = ("rx_packets", "rx_bytes", "sent_packets", "sent_bytes", "out_of_sequence",
           "duplicate_request", "packet_seq_err", "rnr_nak_received", "local_ack_timeout_err",
           "retransmitted_packets", "selective_retransmits", "read_response_packets",
           "np_cnp_sent", "rp_cnp_handled", "cnp_received", "np_ecn_marked_roce_packets",
           "acks_received", "sacks_sent", "sacks_received", "sacks_handled", "rnr_nak_retry",
           "packet_seq_err_handled", "sq_outstanding", "window_pkts", "srtt_us", "cwnd_pkts",
           "credits")
# everything a daemon can report: every verdict and reply counter, events, the AF_XDP ring, a
# multipath QP with every per-QP counter and gauge
FULL = {
    "dev": "eth1", "netns": "ns1", "pid": 42, "mode": "metaroce", "xdp_mode": "native",
    "uptime_s": 100.0, "mrs": 2,
    "counters": {**{r: i + 1 for i, r in enumerate(RX_REASONS)},
                 **{f"tx_{t}": i + 1 for i, t in enumerate(TX_COUNTERS)}},
    "events": {"events": 500, "events_lost": 1},
    "tx": {"tx_queued": 10, "tx_completed": 9, "tx_multi": 4, "tx_refused": 0, "kicks": 3,
           "kick_busy": 1, "tx_ring_full": 1, "sg": True, "frame_cap": 8192},
    "qps": [{"qpn": 17, "state": "RTS", "mode": "metaroce",
             "remote": {"qpn": 34, "ip": "10.0.0.2"}, **{k: 2 for k in QP_KEYS},
             "path_stats": [{"path": p, "sport": 49153 + p, "sent_packets": 5, "lost": 1,
                             "rtos": 0, "ecn_echoes": 0, "evictions": 0} for p in range(2)]}],
}


def exposed(text: str) -> dict:
    """{sample name: (type, label names)}, every sample of a family having the same."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            got = (fam.type, tuple(sorted(s.labels)))
            assert out.setdefault(s.name, got) == got, s
    return out


def test_every_name_type_and_label_set_is_kept():
    text = ex.families([ex.Scrape("eth1", "ns1", FULL, 0.001)], now=1000.0).render()
    assert exposed(text) == EXPOSED
    # one HELP and TYPE per family, and a counter's TYPE line names its _total samples
    for name, (kind, _) in EXPOSED.items():
        assert text.count(f"# TYPE {name} {kind}\n") == 1, name
        assert text.count(f"# HELP {name} ") == 1, name


def test_a_daemon_that_does_not_answer_keeps_its_two_families():
    text = ex.families([ex.Scrape("eth2", None, None, 0.5)]).render()
    assert exposed(text) == {k: EXPOSED[k] for k in ("metaroce_device_up",
                                                     "metaroce_scrape_duration_seconds")}
