"""`metaroce.cm`: connect RC QPs between hosts by address, as RDMA-CM does for verbs
applications. The initiator sends CONNECT_REQ over a TCP side channel (CM-2), the target
allocates a QP (CM-4), negotiates the mode (CM-5, CM-6) and answers CONNECT_REP (or REJECT), the
initiator brings its QP to RTS and confirms with READY; DISCONNECT tears both sides down (CM-9).
Private data (up to 192 bytes) rides along, e.g. an MR's rkey and address for a benchmark."""

from __future__ import annotations

import errno
import ipaddress
import secrets
import socket

from ..verbs import CQ, PD, QP, Context, QPCap, QPInitAttr
from ..wire import consts as C
from ..wire.headers import CMETH
from . import negotiate as N
from .channel import Channel, CmError, ConnectionRefused, Unreadable, tcp_socket

DEFAULT_PORT = C.CM_TCP_PORT     # VER-5: 4791, RoCEv2's UDP port number, over TCP
READY_TIMEOUT_S = 1.0            # CM-4


def _family(ip: str) -> int:
    return socket.AF_INET6 if ipaddress.ip_address(ip).version == 6 else socket.AF_INET


def _local_ip(qp: QP, family: int) -> str:
    want = 6 if family == socket.AF_INET6 else 4
    for a in qp.attrs.get("addrs") or []:
        if ipaddress.ip_address(a).version == want:
            return a
    raise CmError(f"the device has no IPv{want} address")


class Connection:
    """A connected RC QP and its side channel. `mode` is "metaroce" or "roce"; `integrity` the
    end-to-end check its packets pass ("icrc", or "csum" when both devices accepted CSUM);
    `remote` holds the peer's qpn, psn, ip and mtu; `private_data` is what the peer sent."""

    def __init__(self, ctx: Context, qp: QP, channel: Channel, mode: str, caps: int,
                 remote: dict, private_data: bytes, txn_id: int, version: int = C.CM_VERSION):
        self.ctx, self.qp, self.channel = ctx, qp, channel
        self.version = version                     # its CONNECT_REQ's CMETH version (VER-2)
        self.mode, self.caps, self.remote = mode, caps, remote
        self.integrity = N.integrity_of(caps)      # INT-1: "csum" or "icrc"
        self.private_data, self.txn_id = private_data, txn_id
        self.closed = False

    def _disconnect_msg(self) -> CMETH:
        return CMETH(cm_type=C.CmType.DISCONNECT, txn_id=self.txn_id, qpn=self.qp.qp_num,
                     start_psn=0, version=self.version)

    def wait_disconnect(self, timeout_s: float | None = None) -> bool:
        """Wait for the peer's DISCONNECT; answer it and tear down (the QP's outstanding work
        requests complete with flush errors). False on timeout."""
        if self.closed:
            return True
        while True:
            try:
                got = self.channel.recv(timeout_s)
            except CmError:
                got = (self._disconnect_msg(), b"")     # the peer went away: same effect
            if got is None:
                return False
            if got[0].cm_type == C.CmType.DISCONNECT:
                try:
                    self.channel.send(self._disconnect_msg())
                except CmError:
                    pass
                self._teardown()
                return True

    def close(self, timeout_s: float = 1.0) -> None:
        """Send DISCONNECT, wait briefly for the answer, destroy the QP."""
        if self.closed:
            return
        try:
            self.channel.send(self._disconnect_msg())
            self.channel.recv(timeout_s)
        except CmError:
            pass
        self._teardown()

    def _teardown(self) -> None:
        if not self.closed:
            self.closed = True
            self.channel.close()
            self.qp.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _request(qp: QP, txn: int, caps: int, mtu: int, gid: bytes, attr: dict,
             paths: int, fitted: int = 0, version: int = C.CM_VERSION) -> CMETH:
    return CMETH(cm_type=C.CmType.CONNECT_REQ, txn_id=txn, qpn=qp.qp_num, start_psn=qp.psn,
                 caps=caps, mtu=N.MTU_CODE[mtu], max_paths=paths if caps & C.Cap.MULTIPATH else 1,
                 timeout=attr.get("timeout", 14), retry_cnt=attr.get("retry_cnt", 7),
                 rnr_retry=attr.get("rnr_retry", 7), max_rd_atomic=16, max_dest_rd_atomic=16,
                 min_rnr_timer=attr.get("min_rnr_timer", 12),
                 window_pkts=N.MR_WINDOW if caps else 0, gid=gid, version=version,
                 mtu64=N.mtu64_of(fitted, caps) if version >= 3 else 0)


class _OlderVersion(CmError):
    """The target answered REJECT BAD_VERSION in an older version this end implements."""

    def __init__(self, version: int):
        super().__init__(f"the target speaks CMETH version {version}")
        self.version = version


def connect(ctx: Context, ip: str, port: int = DEFAULT_PORT, **kw) -> Connection:
    """Connect to a listener at ip:port (_connect's arguments). The request goes in the highest
    CMETH version this end implements; a target that answers REJECT BAD_VERSION in an older one
    this end implements gets one retry in that version, with a new transaction (VER-2)."""
    try:
        return _connect(ctx, ip, port, **kw)
    except _OlderVersion as exc:
        return _connect(ctx, ip, port, version=exc.version, **kw)


def _connect(ctx: Context, ip: str, port: int = DEFAULT_PORT, *, pd: PD, send_cq: CQ,
             recv_cq: CQ | None = None, cap: QPCap | None = None, mode: str | None = None,
             mandatory: bool = False, private_data: bytes = b"", timeout_s: float = 5.0,
             paths: int | None = None, integrity: str | None = None,
             version: int = C.CM_VERSION, mtu: int | None = None, **attr) -> Connection:
    """Connect to a listener at ip:port. mode: what to ask for (default: what the device
    offers); mandatory: fail instead of falling back to RoCEv2 (CM-6); paths: how many paths
    (UDP source ports) a MetaRoCE connection may spray over (MP-1; default 4, 0: one fixed
    port, no MULTIPATH); integrity: "icrc" keeps the ICRC even where both devices accept the
    checksums, "csum" (or None, the default) offers CSUM when this device accepts it (INT-1:
    the connection takes it only when the peer's does too); mtu: the largest path MTU this end
    offers, in bytes (an IB MTU, and on a MetaRoCE connection a fitted one, CM-14; default:
    what the device takes)."""
    try:
        paths = N.local_paths(paths)
    except ValueError as exc:
        raise CmError(str(exc)) from None
    try:
        family = _family(ip)
    except ValueError:
        raise CmError(f"{ip!r} is not an IP address") from None
    dev = ctx.query_device()
    device_mode = dev["mode"]
    offer_int = _integrity_offer(dev, integrity)
    want = mode or device_mode
    if want not in ("roce", "metaroce"):
        raise CmError(f"mode must be roce or metaroce, not {want!r}")
    if want == "metaroce" and device_mode != "metaroce":
        if mandatory:
            raise CmError("MetaRoCE mode is required but this device offers only roce "
                          "(metaroce up --mode metaroce)")
        want = "roce"
    s = tcp_socket(ctx.dev.netns, family)
    s.settimeout(timeout_s)
    try:
        s.connect((ip, port))
    except ConnectionRefusedError:
        s.close()
        raise ConnectionRefused(f"connection refused: nothing listens on {ip} port {port}") \
            from None
    except (socket.timeout, TimeoutError):
        s.close()
        raise CmError(f"unreachable: no answer from {ip} port {port} within {timeout_s} s") \
            from None
    except OSError as exc:
        s.close()
        if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            raise CmError(f"unreachable: {ip} ({exc.strerror})") from None
        raise CmError(f"cannot reach {ip} port {port}: {exc.strerror}") from None
    s.settimeout(None)
    ch = Channel(s, f"{ip} port {port}")
    qp = QP(pd, QPInitAttr(send_cq, recv_cq or send_cq, cap or QPCap()))
    try:
        local_mtu, fitted = _mtu_offers(dev, mtu, family)
        txn = secrets.randbits(32)
        req = _request(qp, txn, N.offer(want, paths, offer_int, bool(dev.get("credits"))),
                       local_mtu,
                       N.gid_of(_local_ip(qp, family)), attr, paths, fitted, version)
        ch.send(req, private_data)
        try:
            got = ch.recv(timeout_s)
        except Unreadable as exc:
            p = exc.prefix
            if p and p["cm_type"] == C.CmType.REJECT and p["reject_reason"] == \
                    C.CmReject.BAD_VERSION:            # VER-2: the target speaks another version
                raise CmError(f"{ip} port {port} speaks CMETH version {p['version']}; this end "
                              f"implements versions "
                              f"{' and '.join(map(str, C.CM_VERSIONS))}") from None
            raise
        if got is None:
            raise CmError(f"{ip} port {port} did not answer the connection request within "
                          f"{timeout_s} s")
        rep, private = got
        if rep.txn_id != txn:
            raise CmError(f"{ip} port {port} answered another transaction")
        if rep.cm_type == C.CmType.REJECT and rep.reject_reason == C.CmReject.BAD_VERSION \
                and rep.version < version:             # VER-2: retry in the target's version
            raise _OlderVersion(rep.version)
        if rep.cm_type == C.CmType.REJECT:
            raise CmError(f"{ip} port {port} rejected the connection: "
                          f"{N.REJECT_TEXT.get(rep.reject_reason, rep.reject_reason)}")
        if rep.cm_type != C.CmType.CONNECT_REP:
            raise CmError(f"{ip} port {port} answered with CM type {rep.cm_type}")
        if rep.caps & ~req.caps:
            _reject(ch, rep, C.CmReject.INVALID_PARAMS)
            raise CmError(f"{ip} port {port} accepted capabilities that were not offered")
        caps = N.effective(rep.caps)                  # options without the pair: compat (CM-5)
        got_mode = N.mode_of(caps)
        if got_mode == "metaroce" and not 1 <= rep.window_pkts < C.PSN_HALF:
            _reject(ch, rep, C.CmReject.INVALID_PARAMS)
            raise CmError(f"{ip} port {port} answered MetaRoCE mode with window "
                          f"{rep.window_pkts} (SACK-1: 1 .. 2^23 - 1)")
        if not N.mtu64_ok(rep.mtu64):
            _reject(ch, rep, C.CmReject.INVALID_PARAMS)
            raise CmError(f"{ip} port {port} answered a fitted MTU of {rep.mtu64} x 64 bytes "
                          f"(CM-14: {C.FITTED_MTU_MIN} .. {C.FITTED_MTU_MAX})")
        if mandatory and want == "metaroce" and got_mode != "metaroce":
            _reject(ch, rep, C.CmReject.UNSUPPORTED_CAPS)
            raise CmError(f"incompatible: {ip} does not offer MetaRoCE mode, which was required")
        remote = {"qpn": rep.qpn, "psn": rep.start_psn, "ip": N.ip_of(rep.gid),
                  "mtu": N.path_mtu(local_mtu, rep.mtu, req.mtu64 * C.FITTED_MTU_UNIT,
                                    rep.mtu64, caps), "mode": got_mode}
        qp.connect(remote, timeout=attr.get("timeout", 14), retry_cnt=attr.get("retry_cnt", 7),
                   rnr_retry=attr.get("rnr_retry", 7), integrity=N.integrity_of(caps),
                   paths=N.paths_of(caps, req.max_paths, rep.max_paths),
                   credit=N.credit_of(caps))
        ch.send(CMETH(cm_type=C.CmType.READY, txn_id=txn, qpn=qp.qp_num, start_psn=qp.psn,
                      version=version))
        return Connection(ctx, qp, ch, got_mode, caps, remote, private, txn, version)
    except BaseException:
        ch.close()
        qp.close()
        raise


def _mtu_offers(dev: dict, cap: int | None, family: int) -> tuple[int, int]:
    """This end's two offers (CM-1, CM-14): the largest IB MTU and the largest fitted MTU its
    device takes for a connection of this address family (IPv4's headers are 20 bytes
    shorter), neither above cap bytes (None: no cap)."""
    enum, fitted = dev["max_pmtu"], dev.get("max_fitted_pmtu", 0)
    if family == socket.AF_INET:
        fitted = dev.get("max_fitted_pmtu_ipv4", fitted)
    if cap is None:
        return enum, fitted
    if not C.FITTED_MTU_MIN <= cap <= C.FITTED_MTU_MAX:
        raise CmError(f"mtu must be {C.FITTED_MTU_MIN} .. {C.FITTED_MTU_MAX} bytes, not {cap!r}")
    enum = max([m for m in C.MTU_CODES.values() if m <= min(enum, cap)] or [C.FITTED_MTU_MIN])
    fitted = min(fitted, cap // C.FITTED_MTU_UNIT * C.FITTED_MTU_UNIT) if fitted else 0
    return enum, fitted


def path_mtu(mode: str, *contexts, family: int = socket.AF_INET) -> int:
    """The path MTU the CM would pick for a connection of this address family between these
    contexts' devices, for QPs connected by hand: in MetaRoCE mode the smallest fitted offer
    (CM-14; 1408 over IPv4 at a 1500-byte link), else, and when a device offers none, the
    smallest IB MTU (CM-1)."""
    offers = [_mtu_offers(c.query_device(), None, family) for c in contexts]
    if mode == "metaroce" and all(fitted for _, fitted in offers):
        return min(fitted for _, fitted in offers)
    return min(enum for enum, _ in offers)


def _integrity_offer(dev: dict, asked: str | None) -> str:
    """What this end offers or accepts (INT-1): the checksums only when its device accepts
    them and the application did not ask for the ICRC."""
    if asked not in (None, "icrc", "csum"):
        raise CmError(f"integrity must be icrc or csum, not {asked!r}")
    device = dev.get("integrity", "icrc")
    return "csum" if device == "csum" and asked != "icrc" else "icrc"


def _reject(ch: Channel, req: CMETH | dict, reason: int, version: int | None = None) -> None:
    """REJECT the request (a CMETH, or the prefix of an unreadable one) in its own version when
    this end implements it, else (BAD_VERSION) in `version`, this end's highest (VER-2)."""
    txn = req["txn_id"] if isinstance(req, dict) else req.txn_id
    theirs = req["version"] if isinstance(req, dict) else req.version
    if version is None:
        version = theirs if theirs in C.CM_VERSIONS else C.CM_VERSION
    try:
        ch.send(CMETH(cm_type=C.CmType.REJECT, txn_id=txn, qpn=0, start_psn=0,
                      reject_reason=int(reason), version=version))
    except CmError:
        pass


class Listener:
    """A bound side channel in the device's namespace; `accept` makes one Connection."""

    def __init__(self, ctx: Context, port: int = DEFAULT_PORT, host: str | None = None,
                 family: int = socket.AF_INET6, version: int = C.CM_VERSION):
        """version: the highest CMETH version it answers in (a lower one than this end's
        highest makes it behave as a target that implements no later one, VER-2)."""
        if version not in C.CM_VERSIONS:
            raise CmError(f"CMETH version must be one of {C.CM_VERSIONS}, not {version}")
        self.ctx, self.version = ctx, version
        if host:
            family = _family(host)
        self.sock = tcp_socket(ctx.dev.netns, family)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # v4 and v6
        try:
            self.sock.bind((host or ("::" if family == socket.AF_INET6 else "0.0.0.0"), port))
        except OSError as exc:
            self.sock.close()
            raise CmError(f"cannot listen on port {port}: {exc.strerror}") from None
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]

    def accept(self, *, pd: PD, send_cq: CQ, recv_cq: CQ | None = None,
               cap: QPCap | None = None, private_data: bytes = b"", timeout_s: float | None = None,
               allow_metaroce: bool = True, paths: int | None = None,
               integrity: str | None = None, mtu: int | None = None, **attr) -> Connection:
        """One connection; paths: the most paths this end sprays over (MP-1; default 4, 0
        refuses MULTIPATH); integrity: "icrc" refuses CSUM even where this device accepts it
        (None: the device's choice, INT-1)."""
        try:
            paths = N.local_paths(paths)
        except ValueError as exc:
            raise CmError(str(exc)) from None
        self.sock.settimeout(timeout_s)
        try:
            s, addr = self.sock.accept()
        except (socket.timeout, TimeoutError):
            raise CmError(f"no connection request within {timeout_s} s") from None
        s.settimeout(None)
        peer = addr[0].removeprefix("::ffff:")
        ch = Channel(s, peer)
        qp = None
        try:
            try:
                got = ch.recv(timeout_s if timeout_s else 10.0)
            except Unreadable as exc:
                if exc.prefix is not None:             # VER-2 / CM-10: answer what was readable
                    known = exc.prefix["version"] in C.CM_VERSIONS
                    _reject(ch, exc.prefix, C.CmReject.INVALID_PARAMS if known
                            else C.CmReject.BAD_VERSION, None if known else self.version)
                raise                                 # VER-4: no magic, no answer
            if got is None:
                raise CmError(f"{peer} sent no connection request")
            req, private = got
            if req.cm_type != C.CmType.CONNECT_REQ:
                raise CmError(f"{peer} sent CM type {req.cm_type} instead of CONNECT_REQ")
            if req.version > self.version:            # VER-2: a version it does not implement
                _reject(ch, req, C.CmReject.BAD_VERSION, self.version)
                raise CmError(f"rejected {peer}: CMETH version {req.version} (this listener "
                              f"answers up to {self.version})")
            dev = self.ctx.query_device()
            try:
                caps = N.accept(req, dev["mode"], allow_metaroce,
                                integrity=_integrity_offer(dev, integrity),
                                credits=bool(dev.get("credits")))
                if not paths:
                    caps &= ~C.Cap.MULTIPATH
            except N.Rejected as exc:
                _reject(ch, req, exc.reason)
                raise CmError(f"rejected {peer}: {exc}") from None
            try:
                qp = QP(pd, QPInitAttr(send_cq, recv_cq or send_cq, cap or QPCap()))
            except Exception as exc:
                _reject(ch, req, C.CmReject.NO_RESOURCES)
                raise CmError(f"rejected {peer}: no QP ({exc})") from None
            mode = N.mode_of(caps)
            family = _family(N.ip_of(req.gid))
            local_mtu, fitted = _mtu_offers(dev, mtu, family)
            my_mtu64 = N.mtu64_of(fitted, caps, peer_offered=bool(req.mtu64))
            remote = {"qpn": req.qpn, "psn": req.start_psn, "ip": N.ip_of(req.gid),
                      "mtu": N.path_mtu(local_mtu, req.mtu, my_mtu64 * C.FITTED_MTU_UNIT,
                                        req.mtu64, caps), "mode": mode}
            my_paths = min(paths, req.max_paths) if caps & C.Cap.MULTIPATH else 1
            qp.connect(remote, timeout=attr.get("timeout", 14),
                       retry_cnt=attr.get("retry_cnt", 7), rnr_retry=attr.get("rnr_retry", 7),
                       integrity=N.integrity_of(caps),
                       paths=N.paths_of(caps, req.max_paths, my_paths),
                       credit=N.credit_of(caps))
            rep = CMETH(cm_type=C.CmType.CONNECT_REP, txn_id=req.txn_id, qpn=qp.qp_num,
                        start_psn=qp.psn, caps=caps, mtu=N.MTU_CODE[local_mtu], max_paths=my_paths,
                        max_rd_atomic=16, max_dest_rd_atomic=16,
                        window_pkts=N.MR_WINDOW if caps else 0,
                        gid=N.gid_of(_local_ip(qp, family)), mtu64=my_mtu64,
                        version=req.version)
            ch.send(rep, private_data)
            ready = ch.recv(READY_TIMEOUT_S)
            if ready is None or ready[0].cm_type != C.CmType.READY or \
                    ready[0].txn_id != req.txn_id:
                raise CmError(f"{peer} did not confirm the connection (no READY)")
            return Connection(self.ctx, qp, ch, mode, caps, remote, private, req.txn_id,
                              req.version)
        except BaseException:
            ch.close()
            if qp is not None:
                qp.close()
            raise

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def listen(ctx: Context, port: int = DEFAULT_PORT, host: str | None = None,
           version: int = C.CM_VERSION) -> Listener:
    return Listener(ctx, port, host, version=version)
