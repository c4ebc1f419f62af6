"""Prometheus metrics of running MetaRoCE daemons (`metaroce exporter`): each scrape asks every
device's daemon for its status; a prometheus_client custom collector turns the answers into metric
families, and prometheus_client renders them (text format 0.0.4) and serves them over HTTP.

Only what the daemon reports is exported: the XDP program's receive verdicts (drops by reason),
the replies it sends, the transmit ring, the requester's per-QP counters and window. Names follow
Prometheus conventions: `metaroce_` prefix, `_total` on counters, base units (bytes, seconds)."""

from __future__ import annotations

import re
import socket
import threading
import time
from dataclasses import dataclass
from wsgiref.simple_server import WSGIRequestHandler, make_server as _wsgi_server

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer, generate_latest, make_wsgi_app
from prometheus_client.registry import Collector as _PromCollector
from prometheus_client.registry import CollectorRegistry

from ..errors import MetaroceError, UsageError

# daemon status "counters" (kernel verdicts) that are not receive verdicts: tx_* are replies
# hw counter -> (metric name without prefix/suffix, help)
HW_HELP = {
    "rx_packets": "RoCE packets the device received (every QP, dropped ones included)",
    "rx_bytes": "RoCE bytes the device received (every QP, dropped ones included)",
    "tx_packets": "RoCE packets the device sent (requests, READ responses, replies)",
    "tx_bytes": "RoCE bytes the device sent",
    "rx_read_requests": "RDMA READ requests received",
    "rx_atomic_requests": "atomic requests received",
    "out_of_sequence": "packets received with a PSN beyond the expected one",
    "duplicate_request": "duplicate requests received (already executed PSNs)",
    "out_of_buffer": "SENDs that found no posted receive (RNR)",
    "packet_seq_err": "PSN sequence error NAKs received by the requester",
    "rnr_nak_retry_err": "RNR NAKs received by the requester",
    "local_ack_timeout_err": "requester retransmission timeouts",
    "resp_remote_access_errors": "remote access error NAKs sent",
    "resp_invalid_request_errors": "invalid request NAKs sent",
    "np_cnp_sent": "congestion notification packets sent (notification point)",
    "rp_cnp_handled": "congestion notification packets received (reaction point)",
    "np_ecn_marked_roce_packets": "ECN CE-marked RoCE packets received",
    "retransmitted_packets": "packets the requester retransmitted",
}
# per-QP counters (daemon qp_stats keys) -> help; exported as metaroce_qp_<key>_total
QP_COUNTER_HELP = {
    "rx_packets": "packets received on the QP",
    "rx_bytes": "payload bytes received on the QP",
    "sent_packets": "packets the QP sent",
    "sent_bytes": "payload bytes the QP sent",
    "out_of_sequence": "packets received with a PSN beyond the expected one",
    "duplicate_request": "duplicate requests received",
    "packet_seq_err": "PSN sequence error NAKs received",
    "rnr_nak_received": "RNR NAKs received",
    "local_ack_timeout_err": "retransmission timeouts",
    "retransmitted_packets": "packets retransmitted",
    "selective_retransmits": "single packets retransmitted to repair a SACKed hole",
    "read_response_packets": "READ response packets sent",
    "np_cnp_sent": "CNPs sent",
    "rp_cnp_handled": "CNPs received by the kernel",
    "cnp_received": "CNPs handled by the requester",
    "np_ecn_marked_roce_packets": "CE-marked packets received",
    "acks_received": "ACKs received",
    "sacks_sent": "MetaRoCE SACKs sent",
    "sacks_received": "MetaRoCE SACKs received",
    "sacks_handled": "MetaRoCE SACKs the requester processed",
    "rnr_nak_retry": "RNR NAK retries",
    "packet_seq_err_handled": "PSN sequence error NAKs the requester acted on",
}
# per-QP gauges: status key -> (metric name, help, scale to base unit), each exported when the
# daemon reports it: srtt_us once the QP has an RTT sample, cwnd_pkts always; no daemon reports
# a per-QP "credits" yet (its credit state is credit_limit_psn, a PSN, not a gauge).
QP_GAUGES = {
    "sq_outstanding": ("qp_send_queue_outstanding", "work requests posted and not completed", 1),
    "window_pkts": ("qp_inflight_packets", "packets sent and not yet acknowledged", 1),
    "srtt_us": ("qp_rtt_seconds", "smoothed round-trip time", 1e-6),
    "cwnd_pkts": ("qp_cwnd_packets", "congestion window", 1),
    "credits": ("qp_credits_packets", "receiver credits granted for incast", 1),
}
PATH_COUNTER_HELP = {
    "sent_packets": "packets sent on the path",
    "lost": "packets declared lost on the path",
    "rtos": "retransmission timeouts the path caused",
    "ecn_echoes": "SACKs echoing a CE mark on the path",
    "evictions": "times the path moved to a new source port",
}
XSK_HELP = {
    "tx_queued": "frames queued on the AF_XDP transmit ring",
    "tx_completed": "frames the kernel completed sending (every descriptor of each)",
    "tx_multi": "frames queued as several descriptors (multi-buffer, XDP_USE_SG)",
    "tx_refused": "frames refused: empty or longer than the socket's largest frame",
    "kicks": "sendto() wakeups of the AF_XDP socket",
    "kick_busy": "wakeups that found the driver busy",
    "kick_deferred": "wakeups held back while a busy driver's back-off ran",
    "tx_ring_full": "times the transmit ring was full",
}


class Families:
    """The metric families of one scrape in first-use order, each with all its samples (one HELP
    and TYPE per family however many devices and QPs). A prometheus_client collector: `name` is
    given without the `metaroce_` prefix and, for counters, without `_total`, which
    prometheus_client appends to a counter's exposed name."""

    def __init__(self):
        self._fams: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        self._keys: dict[str, tuple[str, ...]] = {}

    def add(self, name: str, kind: str, help_: str, labels: dict, value) -> None:
        if value is None:
            return
        fam = self._fams.get(name)
        if fam is None:
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            fam = self._fams[name] = cls(f"metaroce_{name}", help_, labels=list(labels))
            self._keys[name] = tuple(labels)
        elif tuple(labels) != self._keys[name]:
            raise ValueError(f"metaroce_{name}: labels {tuple(labels)} after {self._keys[name]}")
        fam.add_metric([str(v) for v in labels.values()], float(value))

    def collect(self) -> list:
        return list(self._fams.values())

    def render(self) -> str:
        """The text exposition format (prometheus_client.generate_latest)."""
        return generate_latest(self).decode()


def add_device(reg: Families, dev: str, netns: str | None, status: dict | None,
               scrape_s: float, now: float | None = None) -> None:
    """The families of one device from its daemon status (None: the daemon did not answer)."""
    from ..nic.rx import RX_REASONS  # noqa: PLC0415
    from ..nic.stats import DROP_REASONS, device_stats  # noqa: PLC0415
    base = {"dev": dev, "netns": netns or ""}
    reg.add("device_up", "gauge", "1 if the device's daemon answered this scrape", base,
            1 if status else 0)
    reg.add("scrape_duration_seconds", "gauge", "time to read the device's daemon status", base,
            round(scrape_s, 6))
    if not status:
        return
    now = time.time() if now is None else now
    reg.add("device_info", "gauge", "the device's transport mode and XDP attachment",
            {**base, "mode": status.get("mode", ""), "xdp_mode": status.get("xdp_mode", "")}, 1)
    if "uptime_s" in status:
        reg.add("device_start_time_seconds", "gauge", "when the daemon started (Unix time)",
                base, round(now - float(status["uptime_s"]), 3))
    reg.add("memory_regions", "gauge", "registered memory regions", base, status.get("mrs"))
    st = device_stats(status)
    for name, value in st["hw_counters"].items():
        reg.add(name, "counter", HW_HELP.get(name, name.replace("_", " ")), base, value)
    for reason in DROP_REASONS:
        reg.add("rx_drops", "counter", "received packets the XDP program dropped, by reason",
                {**base, "reason": reason}, st["drops"][reason])
    counters = status.get("counters", {})
    for verdict in RX_REASONS:
        if verdict in counters:
            reg.add("rx_verdicts", "counter", "every XDP receive verdict, by verdict",
                    {**base, "verdict": verdict}, counters[verdict])
    for kind, value in st["replies"].items():
        reg.add("tx_replies", "counter",
                "replies the XDP program sent (XDP_TX): ACK, NAKs, SACK, CNP, atomic ACK",
                {**base, "kind": kind}, value)
    for key, metric in (("events", "events"), ("events_lost", "events_lost")):
        if key in status.get("events", {}):
            reg.add(metric, "counter",
                    "kernel-to-daemon events" + (" lost (ring full)" if key == "events_lost" else ""),
                    base, status["events"][key])
    for key, value in status.get("tx", {}).items():
        if key in XSK_HELP:
            reg.add(f"xsk_{key}", "counter", XSK_HELP[key], base, value)
    qps = {q["qpn"]: q for q in status.get("qps", [])}
    reg.add("qps", "gauge", "queue pairs on the device", base, len(qps))
    for q in st["qps"]:
        raw = qps.get(q["qpn"], {})
        ql = {**base, "qpn": str(q["qpn"])}
        reg.add("qp_info", "gauge", "a queue pair's state, mode and peer",
                {**ql, "state": q.get("state") or "", "mode": q.get("mode") or "",
                 "rqpn": "" if q.get("rqpn") is None else str(q["rqpn"]),
                 "peer": q.get("peer") or ""}, 1)
        for key, help_ in QP_COUNTER_HELP.items():
            if key in raw:
                reg.add(f"qp_{key}", "counter", help_, ql, int(raw[key]))
        for key, (metric, help_, scale) in QP_GAUGES.items():
            if raw.get(key) is not None:
                reg.add(metric, "gauge", help_, ql, float(raw[key]) * scale)
        for p in raw.get("path_stats") or []:            # multipath QPs (MP-4)
            pl = {**ql, "path": str(p["path"]), "sport": str(p["sport"])}
            for key, help_ in PATH_COUNTER_HELP.items():
                reg.add(f"qp_path_{key}", "counter", help_, pl, int(p.get(key, 0)))


def discover(run_dir: str | None = None) -> list:
    """The DeviceId of every daemon with a control socket in the run directory, in whichever
    network namespace it runs (nic.devid reads the run directory: the only place that looks)."""
    from ..nic.devid import devices_in_run_dir  # noqa: PLC0415
    return devices_in_run_dir(run_dir)


@dataclass
class Scrape:
    """One daemon's answer to a scrape: its device, its status (None: it did not answer) and
    how long the answer took."""
    dev: str
    netns: str | None
    status: dict | None
    seconds: float


def scrape(devices: list[tuple[str, str | None]] | None = None,
           timeout: float = 2.0) -> list[Scrape]:
    """Ask each device's daemon (every running daemon when none given) for its status."""
    from ..nic import daemon as d  # noqa: PLC0415
    targets = ([d.DeviceId(dev, ns) for dev, ns in devices] if devices else discover())
    out = []
    for target in targets:
        t0 = time.monotonic()
        try:
            status = d.request(target, {"op": "status"}, timeout=timeout)[0]
            if "error" in status:
                status = None
        except (MetaroceError, OSError, ValueError):
            status = None
        if status:                                   # the daemon names its own device
            dev, ns = status.get("dev") or target.dev, status.get("netns")
        else:                                        # what its socket's name says
            dev, ns = target.dev, target.netns_name()
        out.append(Scrape(dev, ns or None, status, time.monotonic() - t0))
    return out


def families(scrapes: list[Scrape], now: float | None = None) -> Families:
    """The metric families of a scrape."""
    fams = Families()
    for s in scrapes:
        add_device(fams, s.dev, s.netns, s.status, s.seconds, now)
    return fams


class Collector(_PromCollector):
    """A prometheus_client custom collector: each collect() scrapes the given devices (every
    running daemon when none given), one scrape at a time."""

    def __init__(self, devices: list[tuple[str, str | None]] | None = None, timeout: float = 2.0):
        self.devices, self.timeout = devices, timeout
        self._lock = threading.Lock()

    def scrape(self) -> list[Scrape]:
        with self._lock:                  # one daemon round trip per device at a time
            return scrape(self.devices, self.timeout)

    def collect(self) -> list:
        return families(self.scrape()).collect()

    def render(self) -> str:
        """One scrape in the text exposition format (what /metrics serves)."""
        return generate_latest(self).decode()


def parse_listen(text: str) -> tuple[str, int]:
    """ADDR:PORT, [V6ADDR]:PORT or :PORT (every address)."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\[\]]*):(\d+)", text)
    if not m:
        raise UsageError(f"--listen {text!r}: expected ADDR:PORT, [IPV6]:PORT or :PORT")
    host = m.group(1) if m.group(1) is not None else m.group(3)
    port = int(m.group(2) or m.group(4))
    if not 0 <= port <= 65535:
        raise UsageError(f"--listen {text!r}: port out of range")
    return host, port


INDEX = (b"<html><head><title>MetaRoCE exporter</title></head><body>"
         b"<h1>MetaRoCE exporter</h1><p><a href=\"/metrics\">Metrics</a></p></body></html>\n")


def app(collector: Collector):
    """The WSGI application: prometheus_client's metrics app at /metrics, an index at /, 404
    elsewhere."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    metrics = make_wsgi_app(reg)

    def route(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics(environ, start_response)
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [INDEX]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found: try /metrics\n"]
    return route


class _Server(ThreadingWSGIServer):
    """prometheus_client's threading WSGI server, on IPv6 when the address is one."""

    def __init__(self, addr, handler):
        self.address_family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
        super().__init__(addr, handler)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, fmt, *args):      # scrapes are not worth a line each
        pass


def make_server(listen: str, collector: Collector) -> _Server:
    """The HTTP server for `--listen` (not serving yet: serve_forever, shutdown, server_close)."""
    host, port = parse_listen(listen)
    try:
        return _wsgi_server(host or "", port, app(collector), _Server, _QuietHandler)
    except OSError as exc:
        raise MetaroceError(f"cannot listen on {listen}: {exc.strerror}") from None
