"""Packets between the simulator (metaroce.engine.packets.Packet objects) and the C engine's
packet descriptors (struct mre_pkt, mre.h): the simulator's half of what the transmit path
and the XDP parser do on the wire."""

from metaroce.engine.packets import Aeth, AtomicEth, Packet, Placement, Reth

# struct mre_pkt.flags / .has (mre.h)
ACK_REQ, RETX, CE, ECN_ECHO, PROBE_REPLY, CREDIT, GRANT_ACTIVE = 1, 2, 4, 8, 16, 32, 64
H_RETH, H_AETH, H_IMM, H_ATOMIC, H_ATOMIC_ACK, H_SACK, H_PETH, H_GRANT = (1, 2, 4, 8, 16, 32,
                                                                           64, 128)
MASK64 = (1 << 64) - 1


def to_packet(ffi, d) -> Packet:
    """A descriptor the engine wants sent, as a simulator Packet (payload copied)."""
    has, fl = d.has, d.flags
    return Packet(
        d.opcode, d.psn, d.dest_qp, ack_req=bool(fl & ACK_REQ),
        reth=Reth(d.reth_va, d.reth_rkey, d.reth_len) if has & H_RETH else None,
        aeth=Aeth(d.syndrome, d.msn) if has & H_AETH else None,
        immdt=d.imm if has & H_IMM else None,
        atomic=AtomicEth(d.atomic_va, d.atomic_rkey, d.swap_add, d.compare)
        if has & H_ATOMIC else None,
        atomic_ack=d.atomic_ack if has & H_ATOMIC_ACK else None,
        sack=(d.sack[1] << 64 | d.sack[0]) if has & H_SACK else None,
        place=Placement(d.ssn, d.rsn, d.offset) if has & H_PETH else None,
        retx=bool(fl & RETX), ts=d.ts,
        payload=ffi.buffer(d.data, d.len)[:] if d.len and d.data != ffi.NULL else b"",
        path=d.path, sport=d.sport, ecn_echo=bool(fl & ECN_ECHO), ce_count=d.ce_count,
        ts_echo=d.ts_echo, credit_limit=d.credit_limit if fl & CREDIT else None,
        probe_reply=bool(fl & PROBE_REPLY),
        grant=(bool(fl & GRANT_ACTIVE), d.grant_limit, d.grant_rate) if has & H_GRANT else None)


def fill(ffi, d, pkt: Packet):
    """Write a received Packet into descriptor d; returns what keeps its payload alive."""
    fl = (ACK_REQ if pkt.ack_req else 0) | (RETX if pkt.retx else 0) | (CE if pkt.ce else 0) \
        | (ECN_ECHO if pkt.ecn_echo else 0) | (PROBE_REPLY if pkt.probe_reply else 0)
    has = 0
    d.opcode, d.psn, d.dest_qp = pkt.opcode, pkt.psn, pkt.dest_qp
    d.path, d.sport, d.ts = pkt.path, pkt.sport, pkt.ts & 0xFFFFFFFF
    d.ts_echo, d.ce_count = pkt.ts_echo & 0xFFFFFFFF, pkt.ce_count & 0xFFFFFFFF
    if pkt.credit_limit is not None:
        fl |= CREDIT
        d.credit_limit = pkt.credit_limit
    r = pkt.reth
    if r is not None:
        has |= H_RETH
        d.reth_va, d.reth_rkey, d.reth_len = r.va, r.rkey, r.length
    a = pkt.aeth
    if a is not None:
        has |= H_AETH
        d.syndrome, d.msn = a.syndrome, a.msn
    if pkt.immdt is not None:
        has |= H_IMM
        d.imm = pkt.immdt
    at = pkt.atomic
    if at is not None:
        has |= H_ATOMIC
        d.atomic_va, d.atomic_rkey, d.swap_add, d.compare = at.va, at.rkey, at.swap_add, at.compare
    if pkt.atomic_ack is not None:
        has |= H_ATOMIC_ACK
        d.atomic_ack = pkt.atomic_ack
    if pkt.sack is not None:
        has |= H_SACK
        d.sack[0], d.sack[1] = pkt.sack & MASK64, pkt.sack >> 64 & MASK64
    else:
        d.sack[0] = d.sack[1] = 0
    pl = pkt.place
    if pl is not None:
        has |= H_PETH
        d.ssn, d.rsn, d.offset = pl.ssn, pl.rsn, pl.offset
    g = pkt.grant
    if g is not None:
        has |= H_GRANT
        if g[0]:
            fl |= GRANT_ACTIVE
        d.grant_limit, d.grant_rate = g[1], g[2]
    d.flags, d.has = fl, has
    keep = None
    if pkt.payload:
        keep = ffi.from_buffer(pkt.payload)
        d.data, d.len = keep, len(pkt.payload)
    else:
        d.data, d.len = ffi.NULL, 0
    return keep
