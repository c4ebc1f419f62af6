"""The path MTU a device offers (Device.max_pmtu): the largest RoCE MTU that fits both the
link's IP MTU and the AF_XDP socket's largest frame (one 4 KiB UMEM chunk, or two with
multi-buffer transmit, XDP_USE_SG)."""

import pytest

from metaroce.nic.device import MAX_EXT, largest_pmtu

HDRS = 40 + 8 + 12 + MAX_EXT + 3 + 4      # IPv6, UDP, BTH, longest extensions, pad, ICRC


@pytest.mark.parametrize("mtu,cap,want", [
    (1500, 4096, 1024), (1500, 8192, 1024),        # a standard link: the link decides
    (9000, 4096, 2048),                            # one chunk: 4096 + headers do not fit
    (9000, 8192, 4096),                            # two chunks (SG): RoCE's largest MTU
    (4096 + HDRS, 8192, 4096), (4096 + HDRS - 1, 8192, 2048),   # the link's exact edge
    (9000, 4096 + 14 + HDRS, 4096), (9000, 4096 + 14 + HDRS - 1, 2048),  # the frame's edge
    (1280, 8192, 1024), (600, 8192, 256), (300, 8192, 256)])
def test_largest_pmtu(mtu, cap, want):
    assert largest_pmtu(mtu, cap) == want


def test_every_offered_mtu_fits_link_and_frame():
    for mtu in range(576, 9001, 7):
        for cap in (2048, 4096, 8192):
            p = largest_pmtu(mtu, cap)
            if p > 256:
                assert p + HDRS <= mtu and p + HDRS + 14 <= cap, (mtu, cap, p)
