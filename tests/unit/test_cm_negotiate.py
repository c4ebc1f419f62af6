"""Connection-management rules without a network: capability negotiation (CM-5, CM-6),
request validation (CM-10, VER-2), GIDs (WIRE-12), path MTU (CM-1), the CMETH block's magic and
version-independent prefix (VER-2, VER-4)."""

import pytest

from metaroce.cm import negotiate as N
from metaroce.wire import consts as C
from metaroce.wire.headers import CMETH

Cap = C.Cap


def req(**kw):
    base = dict(cm_type=C.CmType.CONNECT_REQ, txn_id=7, qpn=0x12, start_psn=5, mtu=3,
                window_pkts=128)
    return CMETH(**{**base, **kw})


@pytest.mark.parametrize("credits", [False, True])
@pytest.mark.parametrize("offered", range(0, 64))
def test_answer_is_the_and_of_offer_and_support(offered, credits):
    """CM-5: offered AND supported; MetaRoCE iff both SACK and PLACEMENT survive; CREDIT is
    supported only by a device that grants credits (CC-8)."""
    got = N.accept(req(caps=offered, max_paths=1), "metaroce", credits=credits)
    supported = N.SUPPORTED_CAPS & ~(0 if credits else Cap.CREDIT)
    assert got == offered & supported if offered & 3 == 3 else got == 0
    assert N.mode_of(got) == ("metaroce" if offered & 3 == 3 else "roce")
    assert N.credit_of(got) == bool(credits and offered & Cap.CREDIT and offered & 3 == 3)


def test_credit_is_offered_by_a_device_that_grants():
    assert N.offer("metaroce", credits=True) & Cap.CREDIT
    assert not N.offer("metaroce") & Cap.CREDIT
    assert N.offer("roce", credits=True) == 0
    assert not N.credit_of(Cap.CREDIT)                  # without the pair it means nothing


def test_unknown_bits_are_cleared_not_echoed():
    got = N.accept(req(caps=0xFFFF0000 | Cap.SACK | Cap.PLACEMENT), "metaroce")
    assert got == Cap.SACK | Cap.PLACEMENT


def test_compat_target_answers_compat_unless_mandatory():
    """CM-6: caps = 0 rather than REJECT; REJECT 3 only when MetaRoCE was required."""
    assert N.accept(req(caps=Cap.SACK | Cap.PLACEMENT), "roce") == 0
    assert N.accept(req(caps=Cap.SACK | Cap.PLACEMENT), "metaroce", policy_allows=False) == 0
    with pytest.raises(N.Rejected) as e:
        N.accept(req(caps=Cap.SACK | Cap.PLACEMENT), "roce", mandatory=True)
    assert e.value.reason == C.CmReject.UNSUPPORTED_CAPS


@pytest.mark.parametrize("fields,reason", [
    ({"mtu": 0}, C.CmReject.INVALID_PARAMS), ({"mtu": 6}, C.CmReject.INVALID_PARAMS),
    ({"caps": Cap.MULTIPATH, "max_paths": 0}, C.CmReject.INVALID_PARAMS),
    ({"caps": Cap.MULTIPATH, "max_paths": 65}, C.CmReject.INVALID_PARAMS),
    ({"caps": 3, "window_pkts": 0}, C.CmReject.INVALID_PARAMS),
    ({"version": 1}, C.CmReject.BAD_VERSION), ({"version": 4}, C.CmReject.BAD_VERSION),
    ({"mtu64": 3}, C.CmReject.INVALID_PARAMS), ({"mtu64": 129}, C.CmReject.INVALID_PARAMS)])
def test_invalid_requests(fields, reason):
    """CM-10 and VER-2 (version)."""
    with pytest.raises(N.Rejected) as e:
        N.accept(req(**fields), "metaroce")
    assert e.value.reason == reason
    N.accept(req(caps=Cap.MULTIPATH, max_paths=64), "metaroce")     # the edge is valid


def test_gids_and_mtu():
    assert N.gid_of("10.0.0.1") == bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1])
    assert N.ip_of(N.gid_of("10.0.0.1")) == "10.0.0.1"
    assert N.ip_of(N.gid_of("fd00::2")) == "fd00::2"
    assert N.path_mtu(4096, 3) == 1024 and N.path_mtu(1024, 5) == 1024      # CM-1


def test_fitted_mtu():
    """CM-14: on a MetaRoCE connection whose two CMETHs (version 3) both offered a fitted MTU,
    the smaller of the two; otherwise the IB enum's rule (CM-1), in compat mode always."""
    assert N.path_mtu(1024, 5, 1344, 21, caps=3) == 1344
    assert N.path_mtu(1024, 5, 1344, 64, caps=3) == 1344
    assert N.path_mtu(4096, 5, 4096, 21, caps=3) == 1344
    assert N.path_mtu(1024, 5, 1344, 0, caps=3) == 1024          # the peer offered none
    assert N.path_mtu(1024, 5, 0, 21, caps=3) == 1024            # this end offered none
    assert N.path_mtu(1024, 5, 1344, 21, caps=0) == 1024         # compat: the enum
    assert N.mtu64_of(1344, 3) == 21 and N.mtu64_of(1344, 0) == 0
    assert N.mtu64_of(1344, 3, peer_offered=False) == 0 and N.mtu64_of(0, 3) == 0
    assert C.path_mtu_ok(1344, True) and not C.path_mtu_ok(1344, False)
    assert not C.path_mtu_ok(1000, True) and not C.path_mtu_ok(8256, True)
    assert C.path_mtu_ok(8000, True) and not C.path_mtu_ok(8000, False)
    assert all(C.path_mtu_ok(m, False) for m in (256, 512, 1024, 2048, 4096))
    assert N.offer("metaroce", 0) == 3 and N.offer("roce") == 0
    assert N.offer("metaroce") == 3 | Cap.MULTIPATH                       # MP-1 by default


def test_paths_negotiation():
    """MP-1: N = min of both ends' max_paths, only with MULTIPATH accepted and MetaRoCE mode."""
    got = N.accept(req(caps=3 | Cap.MULTIPATH, max_paths=6), "metaroce")
    assert got & Cap.MULTIPATH
    assert N.paths_of(got, 6, 4) == 4 and N.paths_of(got, 2, 8) == 2
    assert N.paths_of(got & ~Cap.MULTIPATH, 6, 4) == 0
    assert N.paths_of(got, 64, 64) == N.LOCAL_MAX_PATHS      # what the data path can spray
    # MULTIPATH without the MetaRoCE pair is cleared: paths ride on the PETH's PathID
    assert N.accept(req(caps=Cap.SACK | Cap.MULTIPATH, max_paths=4), "metaroce") == 0
    assert N.accept(req(caps=3 | Cap.MULTIPATH, max_paths=4), "roce") == 0
    assert N.local_paths(None) == N.DEFAULT_PATHS and N.local_paths(0) == 0
    with pytest.raises(ValueError):
        N.local_paths(9)


def test_options_without_the_pair_mean_compat():
    """CM-5 (C7): an answer is 0 or holds SACK + PLACEMENT; CNP_EXT or MULTIPATH alone is 0."""
    for offered in (Cap.CNP_EXT, Cap.MULTIPATH | Cap.SACK, Cap.CREDIT | Cap.PLACEMENT,
                    Cap.DELAY_TS | Cap.CNP_EXT | Cap.MULTIPATH):
        assert N.accept(req(caps=offered, max_paths=4), "metaroce") == 0
        assert N.effective(offered) == 0
    assert N.effective(3 | Cap.CNP_EXT) == 3 | Cap.CNP_EXT


def test_cmeth_magic_and_prefix():
    """VER-4: 52 bytes starting with "MRCM"; VER-2: the first 12 bytes read in any version."""
    b = req(caps=3).pack()
    assert len(b) == C.CMETH_LEN == 52 and b[:4] == b"MRCM"
    assert CMETH.parse(b) == req(caps=3)
    assert CMETH.prefix(b) == {"cm_type": 1, "version": 3, "reject_reason": 0, "txn_id": 7}
    other = b[:5] + bytes([4]) + b[6:]                  # a version-4 block
    assert CMETH.prefix(other)["version"] == 4
    v2 = CMETH.parse(b[:5] + bytes([2]) + b[6:])        # version 2: the same but byte 31
    assert v2.version == 2 and v2.mtu64 == 0
    fitted = req(caps=3, mtu64=21).pack()               # CM-14: byte 31 in version 3
    assert fitted[31] == 21 and CMETH.parse(fitted).mtu64 == 21
    from metaroce.wire import ParseError
    for bad in (other, b"XRCM" + b[4:], bytes(52),
                fitted[:5] + bytes([2]) + fitted[6:]):  # byte 31 is reserved in version 2
        with pytest.raises(ParseError) as e:
            CMETH.parse(bad)
        assert e.value.reason.value == "bad_field"
    assert CMETH.prefix(b"XRCM" + b[4:]) is None and CMETH.prefix(b[:11]) is None


def test_the_fitted_offer_is_fitted_to_the_connections_ip_version():
    """CM-14: the largest multiple of 64 bytes whose payload packet fits the link and the
    largest frame, with the connection's own IP header (IPv4 20 bytes, IPv6 40) and the longest
    extension headers a packet with payload carries (PETH + RETH + ImmDt, 40 bytes)."""
    from metaroce.nic.device import largest_fitted_pmtu
    assert largest_fitted_pmtu(1500, 4096, ipv6=False) == 1408      # 1500 - 92 = 1408
    assert largest_fitted_pmtu(1500, 4096) == 1344                  # 1500 - 112 = 1388
    assert largest_fitted_pmtu(9000, 8192, ipv6=False) == 8064      # the frame binds: 8178 - 92
    assert largest_fitted_pmtu(9000, 8192) == 8064                  # over IPv6 too
    assert largest_fitted_pmtu(9000, 4096) == 3968                  # one UMEM chunk a frame
    assert largest_fitted_pmtu(300, 4096) == 256                    # never below the least
    for link in range(300, 9001, 7):
        for v6 in (False, True):
            m = largest_fitted_pmtu(link, 8192, ipv6=v6)
            packet = (40 if v6 else 20) + 8 + 12 + 40 + m + 4       # IP .. ICRC, no pad
            assert m % 64 == 0 and (m == 256 or (packet <= link and packet + 14 <= 8192 and
                                                 packet + 64 > min(link, 8178))), (link, v6)
