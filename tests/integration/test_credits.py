"""Receiver credits in the real data path (spec CC-8, CC-9): a star lab whose switch ports are
shaped to 100 Mbit/s, four senders WRITE to one receiver at once in MetaRoCE mode. With the
receiver's daemon granting credits, its XDP program stamps flag C and a Limit PSN in the SACKs,
the senders' daemons hold new PSNs at the limit, and the transfer completes with every byte
verified, fairly and at the same goodput as the same incast without credits."""

import hashlib
import os
import time
from contextlib import contextmanager

import pytest
from verbs_util import End, connect, ip_of

from metaroce.lab import core
from metaroce.nic import daemon as d
from metaroce.nic.credit import CreditConfig
from metaroce.verbs import IBV_WC_SUCCESS, IBV_WR_RDMA_WRITE, Context, SendWR

MiB = 1 << 20
SENDERS = 4
MSGS, MSG = 8, 256 << 10          # each sender writes 2 MiB as 8 x 256 KiB


@pytest.fixture(scope="module")
def star(module_lab_name):
    """The lab and the senders' daemons (each run starts its own receiver daemon)."""
    core.up(module_lab_name, "star", hosts=SENDERS + 1, rate="100mbit", ecn_threshold=60_000)
    view = core.LabView(module_lab_name)
    devs = [d.DeviceId("eth0", view.plan.node(f"h{i + 1}").netns) for i in range(SENDERS)]
    try:
        for dev in devs:
            d.start_background(dev, "metaroce", CreditConfig())
        yield view
    finally:
        for dev in devs:
            d.stop(dev)
        core.down(module_lab_name)


@contextmanager
def senders_into_receiver(view, credits: CreditConfig | None, mode: str, size: int, **attr):
    """A receiver daemon on the last host (credits as given) and one QP pair per sender host
    into it, each sender's buffer of `size` random bytes: yields (receiver device, pairs);
    closed and stopped afterwards."""
    hosts = [f"h{i + 1}" for i in range(SENDERS + 1)]
    rx_host = hosts[-1]
    rdev = d.DeviceId("eth0", view.plan.node(rx_host).netns)
    ctxs = []
    d.start_background(rdev, "metaroce", credits)
    try:
        rctx = Context("eth0", view.plan.node(rx_host).netns)
        ctxs.append(rctx)
        pairs = []
        for h in hosts[:-1]:
            c = Context("eth0", view.plan.node(h).netns)
            ctxs.append(c)
            a, b = End(c, size), End(rctx, size)
            connect(a, b, ip_of(view, h), ip_of(view, rx_host), mode, timeout=16, retry_cnt=7,
                    **attr)
            a.mr.write(os.urandom(size))
            pairs.append((a, b))
        yield rdev, pairs
    finally:
        for c in ctxs:
            c.close()
        d.stop(rdev)


def incast(view, credits: CreditConfig | None) -> dict:
    # both ends speak CREDIT: start in credit mode
    with senders_into_receiver(view, credits, "metaroce", MSGS * MSG, credit=True) as (rdev, pairs):
        before = _bottleneck(view)
        t0 = time.monotonic()
        for a, b in pairs:
            a.qp.post_send([SendWR(IBV_WR_RDMA_WRITE, wr_id=k, sg_list=[a.mr.sge(k * MSG, MSG)],
                                   remote_addr=b.mr.addr + k * MSG, rkey=b.mr.rkey)
                            for k in range(MSGS)])
        for a, _ in pairs:
            wcs = a.cq.wait(MSGS, timeout_s=60)
            assert [w.status for w in wcs] == [IBV_WC_SUCCESS] * MSGS
        seconds = time.monotonic() - t0
        after = _bottleneck(view)
        for a, b in pairs:
            assert hashlib.sha256(a.mr.read(MSGS * MSG)).digest() == \
                hashlib.sha256(b.mr.read(MSGS * MSG)).digest()
        senders = [a.qp.query() for a, _ in pairs]
        receiver = d.request(rdev, {"op": "status"})[0]
        return {"drops": after["queue_drops"] - before["queue_drops"],
                "ce": after["ecn_marked"] - before["ecn_marked"],
                "goodput_bps": SENDERS * MSGS * MSG * 8 / seconds,
                "senders": senders, "receiver": receiver}


def _bottleneck(view) -> dict:
    links = {lk["name"]: lk for lk in view.status()["links"]}
    return links[f"h{SENDERS + 1}-sw1"]["counters"]["b-a"]


def jain(xs):
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if any(xs) else 0.0


def test_credits_bound_an_incast(star):
    cfg = CreditConfig(link_rate_bps=100e6, base_rtt_s=2e-3)       # BDP 24 packets: 6 each
    with_credits = incast(star, cfg)
    without = incast(star, None)
    rcv = with_credits["receiver"]["credits"]
    assert rcv["enabled"] and rcv["incast_active_max"] >= 2 and rcv["credit_updates"] > 0, rcv
    grants = [s["credit_grants"] for s in with_credits["senders"]]
    blocked = [s["credit_blocked"] for s in with_credits["senders"]]
    assert all(g > 0 for g in grants), grants           # flag C reached every sender ...
    assert sum(blocked) > 0, blocked                    # ... and held it back
    # CC-9: a sender probes only after 4 x RTO blocked without a grant. On the wire (no credit
    # manager) it probed at once, each probe let one more packet go, and credits bounded
    # nothing: a 16:1 incast overflowed the switch queue (600 drops) with credits on
    probes = [s["credit_probes"] for s in with_credits["senders"]]
    assert sum(probes) <= sum(blocked) // 20 + 8, (probes, blocked)
    assert with_credits["drops"] == 0, with_credits["drops"]
    # CC-3 on the wire: where the switch marked CE, the senders' windows were cut for it
    cuts = [s["cwnd_ecn_cuts"] for s in without["senders"]]
    assert not without["ce"] or sum(cuts) > 0, (without["ce"], cuts)
    assert without["receiver"]["credits"] == {"enabled": False}
    assert all(s["credit_grants"] == 0 for s in without["senders"])
    sent = [s["sent_packets"] for s in with_credits["senders"]]
    print(f"incast {SENDERS}:1 with / without credits: drops {with_credits['drops']} / "
          f"{without['drops']}, CE marks {with_credits['ce']} / {without['ce']}, goodput "
          f"{with_credits['goodput_bps'] / 1e6:.1f} / {without['goodput_bps'] / 1e6:.1f} Mbit/s; "
          f"sent per sender {sent}; grants {grants}; blocked {blocked}")
    # no drop more and no goodput lost for it (the CE marks at the 60 KB threshold are printed:
    # on this 2-vCPU machine the senders' daemons barely overload the link, so the queue the
    # credits save is small and noisy -- measured in tools/bench, not asserted)
    assert with_credits["drops"] <= without["drops"], (with_credits["drops"], without["drops"])
    assert with_credits["goodput_bps"] >= 0.8 * without["goodput_bps"]
    assert jain(sent) >= 0.9, sent


def test_dcqcn_on_the_wire_cuts_a_compat_senders_rate_on_cnps(star):
    """COMPAT-4 on the wire (metaroce up --cc, the default): RoCEv2-mode senders into the
    shaped port are CE-marked, the receiver's XDP answers with CNPs (COMPAT-7), and each
    sender's DCQCN reaction point cuts its rate below the line rate; every byte arrives."""
    size = 256 << 10                                   # 256 packets each: fits the queue
    with senders_into_receiver(star, None, "roce", size) as (_, pairs):
        for a, b in pairs:
            a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[a.mr.sge(0, size)],
                                  remote_addr=b.mr.addr, rkey=b.mr.rkey))
        for a, b in pairs:
            assert [w.status for w in a.cq.wait(1, timeout_s=60)] == [IBV_WC_SUCCESS]
            assert a.mr.read(size) == b.mr.read(size)
        senders = [a.qp.query() for a, _ in pairs]
    cnps = [s["cnp_received"] for s in senders]
    rates = [s["dcqcn_rate_bps"] for s in senders]
    assert all(r is not None for r in rates), rates            # the reaction point is on
    assert sum(cnps) > 0, cnps
    print(f"CNPs {cnps}, DCQCN rates {[round(r / 1e6, 1) for r in rates]} Mbit/s")
    assert any(r < 10e9 for r, n in zip(rates, cnps) if n), (rates, cnps)
