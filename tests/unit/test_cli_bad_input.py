"""Bad input that used to get through (issue 18, section 5), caught where no root is needed:
NaN durations and rates, QP numbers in hex, `lab impair` without an impairment, and a daemon's
{"error": ...} reply turning into one clear error instead of KeyErrors further down."""

import contextlib
import io
import json
import math
import socket
import threading

import click
import pytest

from metaroce.cli import cli, main
from metaroce.numbers import parse_qpn, parse_uint
from metaroce.errors import MetaroceError, UsageError
from metaroce.lab.plan import parse_rate
from metaroce.nic import credit
from metaroce.nic import daemon as d
from metaroce.nic import devid
from metaroce.perf.run import Options

NO_SUCH = "mrfz0"


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_perf_duration_nan_is_a_usage_error(value):
    """`perf … -D nan` ran zero iterations and exited 0."""
    code, out, err = run(["perf", "write-bw", "10.0.0.2", "--dev", NO_SUCH, "-D", value])
    assert code == 2 and "-D" in err and "finite" in err, err
    assert err.count("\n") == 1
    code, out, _ = run(["perf", "write-bw", "10.0.0.2", "--dev", NO_SUCH, "-D", value, "--json"])
    assert code == 2 and "finite" in json.loads(out)["error"]


def test_perf_options_refuse_nan_in_the_library():
    with pytest.raises(MetaroceError, match="duration"):
        Options(test="write-bw", dev="eth0", duration=math.nan)
    with pytest.raises(MetaroceError, match="duration"):
        Options(test="write-bw", dev="eth0", duration=math.inf)
    with pytest.raises(MetaroceError, match="size"):
        Options(test="write-bw", dev="eth0", size=0)
    assert Options(test="write-bw", dev="eth0", duration=0.5).duration == 0.5


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
def test_up_credit_rtt_nan_is_refused_by_the_parser(value):
    cmd = cli.get_command(None, "up")
    with pytest.raises(click.BadParameter, match="finite"):
        cmd.make_context("up", ["--dev", "eth0", "--credit-rtt-us", value])


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e400"])
def test_up_cc_target_out_of_range_is_refused_by_the_parser(value):
    cmd = cli.get_command(None, "up")
    with pytest.raises(click.BadParameter):
        cmd.make_context("up", ["--dev", "eth0", "--cc-target-us", value])


def test_credit_config_refuses_nan():
    with pytest.raises(UsageError, match="base_rtt_s"):
        credit.CreditConfig(base_rtt_s=math.nan)
    with pytest.raises(UsageError, match="link_rate_bps"):
        credit.CreditConfig(link_rate_bps=math.inf)
    cfg = credit.CreditConfig()
    cfg.base_rtt_s = math.nan           # changed after it was made: validate() still sees it
    with pytest.raises(UsageError, match="base_rtt_s"):
        cfg.validate()


@pytest.mark.parametrize("text", ["1e400gbit", "1e400", "11tbit", "nan", "inf"])
def test_rates_are_finite_and_bounded(text):
    """1e400gbit overflowed to an OverflowError (a traceback-shaped "bug" line)."""
    with pytest.raises(UsageError):
        parse_rate(text)
    with pytest.raises(ValueError):
        credit.parse_rate(text)


def test_qpns_in_decimal_and_hex():
    assert parse_qpn("0xa88e78") == parse_qpn("11046520") == parse_qpn(11046520) == 0xA88E78
    assert parse_qpn("0XFF") == parse_qpn(" 255 ") == 255
    for bad in ("nan", "1e3", "0x", "-1", "0x1000000", 1 << 24, True, 5.0, "٣", None):
        with pytest.raises(ValueError):
            parse_qpn(bad)
    assert parse_uint("0x10", 16, "mtu") == 16
    with pytest.raises(ValueError, match="mtu must fit in 16 bits"):
        parse_uint(1 << 16, 16, "mtu")


@pytest.mark.parametrize("argv", [
    ["qp", "connect", "0xa88e78", "--dev", "eth0", "--remote", "x.json"],
    ["qp", "show", "0xa88e78", "--dev", "eth0"],
    ["qp", "destroy", "0xa88e78", "--dev", "eth0"],
    ["stats", "--dev", "eth0", "--qp", "0xa88e78"],
])
def test_every_qpn_argument_takes_hex(argv):
    """`qp connect 0xa88e78` refused what `qp list` printed."""
    group = cli.get_command(None, argv[0])
    cmd = group.get_command(None, argv[1]) if isinstance(group, click.Group) else group
    args = argv[2:] if isinstance(group, click.Group) else argv[1:]
    dec = [str(0xA88E78) if a == "0xa88e78" else a for a in args]
    ctx = cmd.make_context(argv[1], list(args))         # click consumes the list it is given
    assert ctx.params["qpn"] == 0xA88E78
    assert cmd.make_context(argv[1], dec).params["qpn"] == 0xA88E78


def test_lab_impair_without_an_impairment_is_a_usage_error():
    """It silently cleared the link's impairment."""
    code, out, err = run(["lab", "impair", "--name", NO_SUCH, "h1"])
    assert code == 2 and "no impairment given" in err and "--clear" in err
    code, out, err = run(["lab", "impair", "--name", NO_SUCH, "h1", "--json"])
    assert code == 2 and "no impairment given" in json.loads(out)["error"]
    code, out, err = run(["lab", "impair", "--name", NO_SUCH, "h1", "--clear", "--loss", "0.1"])
    assert code == 2 and "--clear takes no impairment options" in err and "--loss" in err
    code, out, err = run(["lab", "impair", "--name", NO_SUCH, "h1", "--loss", "nan"])
    assert code == 2 and "finite" in err


class OneReplyDaemon:
    """A control socket at a device's path that answers one request with a fixed reply (the
    part of a daemon that request() talks to)."""

    def __init__(self, path: str, reply: bytes | None):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(1)
        self.reply = reply
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        conn, _ = self.sock.accept()
        with conn:
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
            if self.reply is not None:
                conn.sendall(self.reply)

    def close(self):
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(devid, "RUN_DIR", str(tmp_path))
    return tmp_path


def test_an_error_reply_is_one_metaroce_error(run_dir):
    """`status` printed KeyError: 'dev' and `status --json` exited 0 with the daemon's error:
    request() turns an {"error": ...} reply into a MetaroceError, in one place."""
    dev = d.DeviceId(NO_SUCH, None)
    srv = OneReplyDaemon(dev.sock_path, b'{"error": "cannot convert float NaN to integer"}\n')
    try:
        with pytest.raises(MetaroceError, match="status on mrfz0: cannot convert float NaN"):
            d.request(dev, {"op": "status"})
    finally:
        srv.close()


@pytest.mark.parametrize("reply,needle", [
    (None, "closed the connection without answering status"),
    (b"not json\n", "talking to the MetaRoCE daemon"),
    (b"[1, 2]\n", "answered status with"),
])
def test_broken_replies_are_one_metaroce_error(run_dir, reply, needle):
    dev = d.DeviceId(NO_SUCH, None)
    srv = OneReplyDaemon(dev.sock_path, reply)
    try:
        with pytest.raises(MetaroceError, match=needle):
            d.request(dev, {"op": "status"})
    finally:
        srv.close()


def test_a_request_cannot_carry_nan(run_dir):
    with pytest.raises(MetaroceError, match="create_cq: a request cannot carry NaN"):
        d.request(d.DeviceId(NO_SUCH, None), {"op": "create_cq", "depth": math.nan})


def test_the_daemon_finds_json_constants_in_a_request():
    assert d.parse_request(b'{"op": "create_cq", "depth": NaN, "id": 3}') == (
        {"op": "create_cq", "depth": pytest.approx(math.nan, nan_ok=True), "id": 3}, "NaN")
    assert d.parse_request(b'{"wrs": [{"wr_id": -Infinity}]}')[1] == "-Infinity"
    assert d.parse_request(b'{"op": "status", "id": 1}') == ({"op": "status", "id": 1}, None)
    with pytest.raises(ValueError, match="a request is a JSON object"):
        d.parse_request(b"[1]")
