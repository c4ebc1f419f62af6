"""Prometheus metrics of running MetaRoCE daemons (`metaroce exporter`): each scrape asks every
device's daemon for its status and renders the text exposition format (version 0.0.4).

Only what the daemon reports is exported: the XDP program's receive verdicts (drops by reason),
the replies it sends, the transmit ring, the requester's per-QP counters and window. Names follow
Prometheus conventions: `metaroce_` prefix, `_total` on counters, base units (bytes, seconds)."""

from __future__ import annotations

import glob
import os
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..errors import MetaroceError, UsageError

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# daemon status "counters" (kernel verdicts) that are not receive verdicts: tx_* are replies
# hw counter -> (metric name without prefix/suffix, help)
HW_HELP = {
    "rx_packets": "RoCE packets received on the device's QPs",
    "rx_bytes": "RoCE payload bytes received on the device's QPs",
    "tx_packets": "RoCE request and READ response packets sent",
    "tx_bytes": "RoCE payload bytes sent",
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
# per-QP gauges: status key -> (metric name, help, scale to base unit). The RTT, congestion
# window and credit keys are exported when a daemon reports them (the engine computes them; the
# daemon's QP status does not carry them yet).
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
    "tx_completed": "frames the kernel completed sending",
    "kicks": "sendto() wakeups of the AF_XDP socket",
    "kick_busy": "wakeups that found the driver busy",
    "tx_ring_full": "times the transmit ring was full",
}


@dataclass
class Family:
    name: str
    kind: str                   # counter | gauge
    help: str
    samples: list[tuple[dict, float]] = field(default_factory=list)


class Registry:
    """Families in first-use order; every sample of a family is rendered together."""

    def __init__(self):
        self.families: dict[str, Family] = {}

    def add(self, name: str, kind: str, help_: str, labels: dict, value) -> None:
        if value is None:
            return
        full = f"metaroce_{name}" + ("_total" if kind == "counter" else "")
        fam = self.families.get(full)
        if fam is None:
            fam = self.families[full] = Family(full, kind, help_)
        fam.samples.append((labels, float(value)))

    def render(self) -> str:
        out = []
        for fam in self.families.values():
            out.append(f"# HELP {fam.name} {_escape_help(fam.help)}")
            out.append(f"# TYPE {fam.name} {fam.kind}")
            for labels, value in fam.samples:
                lab = ",".join(f'{k}="{_escape_label(str(v))}"' for k, v in labels.items())
                out.append(f"{fam.name}{{{lab}}} {_number(value)}" if lab else
                           f"{fam.name} {_number(value)}")
        return "\n".join(out) + "\n"


def _escape_help(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(v: float) -> str:
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "+Inf" if v > 0 else "-Inf"
    return str(int(v)) if v.is_integer() and abs(v) < 2**63 else repr(v)


def add_device(reg: Registry, dev: str, netns: str | None, status: dict | None,
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
    network namespace it runs."""
    from ..nic.devid import devices_in_run_dir  # noqa: PLC0415
    return devices_in_run_dir(run_dir)


class Collector:
    """What one scrape renders: the given devices, or every running daemon when none given."""

    def __init__(self, devices: list[tuple[str, str | None]] | None = None, timeout: float = 2.0):
        self.devices, self.timeout = devices, timeout

    def collect(self) -> str:
        from ..nic import daemon as d  # noqa: PLC0415
        reg = Registry()
        devices = ([d.DeviceId(dev, ns) for dev, ns in self.devices] if self.devices
                   else discover())
        for did in devices:
            t0 = time.monotonic()
            dev, ns = did.dev, did.netns_name()
            try:
                status = d.request(did, {"op": "status"}, timeout=self.timeout)[0]
                if "error" in status:
                    status = None
            except (MetaroceError, OSError, ValueError):
                status = None
            add_device(reg, dev, ns, status, time.monotonic() - t0)
        return reg.render()


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


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr, collector: Collector):
        import socket  # noqa: PLC0415
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        self.collector = collector
        self.lock = threading.Lock()
        super().__init__(addr, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server_version = "metaroce-exporter"

    def do_GET(self):  # noqa: N802 (http.server's name)
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            with self.server.lock:          # one daemon round trip per device at a time
                body = self.server.collector.collect().encode()
            self._reply(200, CONTENT_TYPE, body)
        elif path == "/":
            self._reply(200, "text/html; charset=utf-8",
                        b"<html><head><title>MetaRoCE exporter</title></head><body>"
                        b"<h1>MetaRoCE exporter</h1><p><a href=\"/metrics\">Metrics</a></p>"
                        b"</body></html>\n")
        else:
            self._reply(404, "text/plain; charset=utf-8", b"not found: try /metrics\n")

    def _reply(self, code: int, ctype: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_HEAD = do_GET  # noqa: N815

    def log_message(self, fmt, *args):      # scrapes are not worth a line each
        pass


def make_server(listen: str, collector: Collector) -> _Server:
    host, port = parse_listen(listen)
    try:
        return _Server((host or "", port), collector)
    except OSError as exc:
        raise MetaroceError(f"cannot listen on {listen}: {exc.strerror}") from None
