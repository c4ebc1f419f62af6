"""`metaroce stats`: the kernel's verdicts and the requester's counters in rdma-core's names."""

from metaroce.nic.rx import PORT_COUNTERS, QP_COUNTERS, RX_REASONS, TX_COUNTERS
from metaroce.nic.stats import DROP_REASONS, HW_COUNTERS, device_stats, format_stats


def _status():
    counters = {r: i + 1 for i, r in enumerate(RX_REASONS)}
    counters.update({f"tx_{t}": 100 + i for i, t in enumerate(TX_COUNTERS)})
    qp = {k: 7 for k in QP_COUNTERS}
    qp.update({"qpn": 0x12, "state": "RTS", "mode": "roce", "remote": {"qpn": 0x34, "ip": "10.0.0.2"},
               "retransmitted_packets": 3, "sent_packets": 10, "sent_bytes": 9000,
               "local_ack_timeout_err": 2, "sq_outstanding": 1, "window_pkts": 4})
    qp2 = dict(qp, qpn=0x13, retransmitted_packets=5)
    return {"counters": counters, "qps": [qp, qp2],
            "port": {"rcv_packets": 5000, "rcv_bytes": 4_000_000, "xmit_packets": 300,
                     "xmit_bytes": 24_000, "rcv_icrc_checked": 4000, "rcv_csum_checked": 900},
            "tx": {"tx_queued": 2001, "tx_completed": 2000, "tx_bytes": 2_000_000},
            "destroyed_qp_counters": {"retransmitted_packets": 100, "sent_packets": 9,
                                      "local_ack_timeout_err": 1}}


def test_names_and_sources():
    st = device_stats(_status())
    hw = st["hw_counters"]
    rx = _status()["counters"]
    assert hw["out_of_sequence"] == rx["psn_out_of_order"]
    assert hw["duplicate_request"] == rx["duplicate"] and hw["out_of_buffer"] == rx["rnr"]
    assert hw["np_cnp_sent"] == rx["tx_cnp"] and hw["rp_cnp_handled"] == rx["cnp"]
    assert hw["resp_remote_access_errors"] == rx["tx_nak_rem_access"]
    # QP counters: the live QPs' and those of QPs destroyed since
    assert hw["retransmitted_packets"] == 108 and hw["local_ack_timeout_err"] == 5
    # traffic: the device's, whatever the QP (the kernel's port counters + the AF_XDP socket)
    assert hw["rx_packets"] == 5000 and hw["rx_bytes"] == 4_000_000
    assert hw["tx_packets"] == 2300 and hw["tx_bytes"] == 2_024_000
    port = st["port_counters"]
    assert port["port_rcv_packets"] == 5000 and port["port_rcv_data"] == 1_000_000
    assert port["port_xmit_packets"] == 2300 and port["port_xmit_data"] == 506_000
    assert port["port_rcv_errors"] == rx["malformed"] + rx["bad_icrc"] + rx["bad_csum"]
    # spec 5.7, INT-5: what each end-to-end check verified and refused
    assert st["integrity"] == {"icrc_checked": 4000, "csum_checked": 900,
                               "bad_icrc": rx["bad_icrc"], "bad_csum": rx["bad_csum"]}
    assert st["qps"][0]["integrity"] == "icrc"
    assert set(st["drops"]) == set(DROP_REASONS) and st["drops_total"] == sum(st["drops"].values())
    assert "placed" not in st["drops"] and "not_roce" not in st["drops"]
    assert set(st["replies"]) == set(TX_COUNTERS)
    assert [q["lqpn"] for q in st["qps"]] == ["0x000012", "0x000013"]
    assert st["qps"][0]["rqpn"] == 0x34 and st["qps"][0]["peer"] == "10.0.0.2"


def test_every_source_key_exists():
    """A renamed kernel counter must not silently read as zero."""
    qp_keys = set(QP_COUNTERS) | {"sent_packets", "sent_bytes", "local_ack_timeout_err",
                                  "retransmitted_packets"}
    for name, (src, key) in HW_COUNTERS.items():
        if src == "rx":
            assert key in RX_REASONS, name
        elif src == "tx":
            assert key in TX_COUNTERS, name
        elif src == "port":
            assert key in device_stats({})["port_counters"] or key in ("rcv_bytes", "xmit_bytes"), name
        else:
            assert key in qp_keys, name
    assert set(DROP_REASONS) <= set(RX_REASONS)
    assert PORT_COUNTERS == ("rcv_packets", "rcv_bytes", "xmit_packets", "xmit_bytes",
                             "rcv_icrc_checked", "rcv_csum_checked", "rcv_multi_buf", "rcv_steered")


def test_rdma_style_lines():
    st = device_stats(_status())
    lines = format_stats("eth0", st)
    assert lines[0].startswith("link eth0/1 rx_packets 5000 ")
    assert lines[1].startswith("link eth0/1 port_xmit_data 506000 port_rcv_data 1000000 ")
    assert lines[2].startswith("link eth0/1 integrity icrc_checked 4000 csum_checked 900 ")
    assert lines[3].startswith(f"link eth0/1 drops {st['drops_total']} malformed ")
    # QP numbers in hex, as rdma-core prints them
    assert lines[4].startswith("link eth0/1 lqpn 0x000012 type RC state RTS mode roce "
                               "integrity icrc rqpn 0x000034 peer 10.0.0.2")
    quiet = format_stats("eth0", device_stats({"counters": {}, "qps": []}), show_zero=False)
    assert quiet == ["link eth0/1", "link eth0/1", "link eth0/1 integrity", "link eth0/1 drops 0"]
