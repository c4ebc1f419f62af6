"""Prometheus exposition of a daemon status: names, types, labels, parsed by prometheus_client."""

import pytest
from prometheus_client import parser

from metaroce.deploy import exporter as ex
from metaroce.errors import UsageError
from metaroce.nic.stats import DROP_REASONS


STATUS = {
    "dev": "eth1", "netns": None, "pid": 42, "mode": "metaroce", "xdp_mode": "native",
    "xdp_mode_reason": "mtu fits a page", "uptime_s": 100.0, "mrs": 2,
    "counters": {"placed": 1000, "not_roce": 7, "bad_icrc": 3, "unknown_qp": 1, "wrong_mode": 2,
                 "duplicate": 4, "read_request": 5, "tx_ack": 90, "tx_sack": 11, "tx_cnp": 0},
    "events": {"events": 500, "events_lost": 0},
    "port": {"rcv_packets": 600, "rcv_bytes": 600 * 4096, "xmit_packets": 101, "xmit_bytes": 6464},
    "tx": {"tx_queued": 10, "tx_completed": 9, "kicks": 3, "kick_busy": 0, "tx_ring_full": 1},
    "qps": [{"qpn": 0x11, "state": "RTS", "mode": "metaroce",
             "remote": {"qpn": 0x22, "ip": "10.0.0.2"}, "sq_outstanding": 3, "window_pkts": 17,
             "rx_packets": 600, "rx_bytes": 600 * 4096, "sent_packets": 400, "sent_bytes": 1 << 20,
             "retransmitted_packets": 5, "selective_retransmits": 4, "srtt_us": 250},
            {"qpn": 0x12, "state": "INIT", "mode": "roce", "remote": {}}],
}


def families(text):
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def render(status=STATUS, dev="eth1", netns=None):
    reg = ex.Families()
    ex.add_device(reg, dev, netns, status, 0.002, now=1000.0)
    return reg.render()


def test_parses_and_follows_conventions():
    text = render()
    fams = families(text)
    for f in fams.values():
        assert f.name.startswith("metaroce_")
        assert f.documentation
        for s in f.samples:
            if f.type == "counter":
                assert s.name == f.name + "_total"
    assert fams["metaroce_device_up"].samples[0].value == 1
    assert fams["metaroce_device_start_time_seconds"].samples[0].value == 900.0
    info = fams["metaroce_device_info"].samples[0].labels
    assert info == {"dev": "eth1", "netns": "", "mode": "metaroce", "xdp_mode": "native"}
    # a counter family's TYPE line names the _total metric, once per family
    assert text.count("# TYPE metaroce_rx_drops_total counter") == 1


def test_drop_reasons_are_a_label():
    f = families(render())["metaroce_rx_drops"]
    assert f.type == "counter"
    by = {s.labels["reason"]: s.value for s in f.samples}
    assert set(by) == set(DROP_REASONS)
    assert by["bad_icrc"] == 3 and by["unknown_qp"] == 1 and by["malformed"] == 0
    verdicts = {s.labels["verdict"]: s.value for s in families(render())["metaroce_rx_verdicts"].samples}
    assert verdicts["placed"] == 1000 and verdicts["wrong_mode"] == 2


def test_hw_counters_and_replies():
    fams = families(render())
    assert fams["metaroce_rx_packets"].samples[0].value == 600
    assert fams["metaroce_rx_bytes"].samples[0].value == 600 * 4096
    assert fams["metaroce_retransmitted_packets"].samples[0].value == 5
    assert fams["metaroce_duplicate_request"].samples[0].value == 4
    replies = {s.labels["kind"]: s.value for s in fams["metaroce_tx_replies"].samples}
    assert replies == {"ack": 90, "sack": 11, "cnp": 0}
    assert fams["metaroce_xsk_tx_ring_full"].samples[0].value == 1
    assert fams["metaroce_events_lost"].samples[0].value == 0


def test_per_qp_metrics_have_a_qpn_label():
    fams = families(render())
    assert fams["metaroce_qps"].samples[0].value == 2
    rx = {s.labels["qpn"]: s.value for s in fams["metaroce_qp_rx_packets"].samples}
    assert rx == {"17": 600}                      # QP 0x12 reported no counters
    info = {s.labels["qpn"]: s.labels for s in fams["metaroce_qp_info"].samples}
    assert info["17"]["peer"] == "10.0.0.2" and info["17"]["rqpn"] == "34"
    assert info["18"]["state"] == "INIT" and info["18"]["peer"] == ""
    assert fams["metaroce_qp_inflight_packets"].samples[0].value == 17
    assert fams["metaroce_qp_send_queue_outstanding"].samples[0].value == 3
    assert fams["metaroce_qp_selective_retransmits"].samples[0].value == 4
    # the RTT is exported in seconds because (and only where) the daemon reported it
    (rtt,) = fams["metaroce_qp_rtt_seconds"].samples
    assert rtt.labels["qpn"] == "17" and rtt.value == pytest.approx(250e-6)
    assert "metaroce_qp_cwnd_packets" not in fams and "metaroce_qp_credits_packets" not in fams


def test_a_daemon_that_does_not_answer():
    fams = families(render(status=None, dev="eth2", netns="ns1"))
    assert fams["metaroce_device_up"].samples[0].value == 0
    assert fams["metaroce_device_up"].samples[0].labels == {"dev": "eth2", "netns": "ns1"}
    assert set(fams) == {"metaroce_device_up", "metaroce_scrape_duration_seconds"}


def test_two_devices_share_families():
    reg = ex.Families()
    ex.add_device(reg, "eth1", None, STATUS, 0.001, now=1000.0)
    ex.add_device(reg, "eth2", "ns\"q\\", STATUS, 0.001, now=1000.0)
    text = reg.render()
    assert text.count("# HELP metaroce_rx_packets_total ") == 1
    devs = {s.labels["netns"] for s in families(text)["metaroce_rx_packets"].samples}
    assert devs == {"", "ns\"q\\"}                  # escaped, parsed back


@pytest.mark.parametrize("text,want", [("127.0.0.1:9470", ("127.0.0.1", 9470)),
                                       (":0", ("", 0)), ("[::1]:80", ("::1", 80)),
                                       ("localhost:1", ("localhost", 1))])
def test_parse_listen(text, want):
    assert ex.parse_listen(text) == want


@pytest.mark.parametrize("text", ["9470", "::1:80", "host:port", "h:70000"])
def test_parse_listen_rejects(text):
    with pytest.raises(UsageError):
        ex.parse_listen(text)


def test_discover(tmp_path):
    from metaroce.nic.devid import DeviceId, own_netns_inode
    me = own_netns_inode()
    for name in (f"net{me}--eth1.sock", f"net{me}--eth1.pid", "host--eth0.sock", "junk.sock"):
        (tmp_path / name).write_text("")
    assert ex.discover(str(tmp_path)) == [DeviceId("eth1")]


def test_a_family_keeps_its_label_names():
    reg = ex.Families()
    reg.add("qps", "gauge", "h", {"dev": "eth0", "netns": ""}, 1)
    with pytest.raises(ValueError, match="metaroce_qps"):
        reg.add("qps", "gauge", "h", {"netns": "", "dev": "eth0"}, 1)
