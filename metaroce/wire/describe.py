"""One-line summaries of captured frames, RoCE or not, for `metaroce pcap decode`."""

from . import consts as C
from .errors import ParseError
from .headers import AETH, PETH, RETH, SACKETH
from .packet import RocePacket, parse_frame


def _ip_version(data: bytes) -> int | None:
    if len(data) < 14:
        return None
    ethertype = int.from_bytes(data[12:14], "big")
    if ethertype == C.ETH_P_8021Q and len(data) >= 18:
        ethertype = int.from_bytes(data[16:18], "big")
    return {C.ETH_P_IPV4: 4, C.ETH_P_IPV6: 6}.get(ethertype)


def describe(data: bytes, frame: int) -> dict:
    """A JSON-ready dict: frame, ip_version, opcode, opcode_name, dest_qp, psn, ack_req,
    icrc_ok, error, and the main extension fields when present."""
    doc = {"frame": frame, "length": len(data), "ip_version": _ip_version(data), "opcode": None,
           "opcode_name": None, "dest_qp": None, "psn": None, "ack_req": None, "icrc_ok": None,
           "error": None}
    pkt: RocePacket | None = None
    try:
        pkt = parse_frame(data)
        doc["icrc_ok"] = True
    except ParseError as exc:
        doc["error"] = exc.reason.value
        doc["detail"] = str(exc)
        doc["icrc_ok"] = exc.icrc_ok
        pkt = exc.packet
        if exc.bth is not None:
            _bth_fields(doc, exc.bth)
    if pkt is not None:
        _bth_fields(doc, pkt.bth)
        doc["udp_sport"] = pkt.udp.sport
        doc["ecn"] = pkt.ip.ecn
        doc["payload_len"] = len(pkt.payload)
        for h in pkt.headers:
            if isinstance(h, (RETH, AETH, PETH, SACKETH)):
                doc[type(h).NAME.lower()] = h.to_dict()
    return doc


def _bth_fields(doc: dict, bth) -> None:
    doc["opcode"] = bth.opcode
    doc["opcode_name"] = C.OPCODE_NAMES.get(bth.opcode, f"UNKNOWN_0x{bth.opcode:02X}")
    doc["dest_qp"] = bth.dest_qp
    doc["psn"] = bth.psn
    doc["ack_req"] = bool(bth.ack_req)


def text_line(doc: dict) -> str:
    """Human-readable rendering of :func:`describe`'s dict."""
    head = f"{doc['frame']:>5}  "
    if doc["opcode"] is None:
        return head + f"not RoCE ({doc['error']})" if doc["error"] else head + "?"
    ipv = f"IPv{doc['ip_version']}" if doc["ip_version"] else "?"
    parts = [ipv, f"{doc['opcode_name']}(0x{doc['opcode']:02x})", f"qp=0x{doc['dest_qp']:06x}",
             f"psn={doc['psn']}"]
    if doc["ack_req"]:
        parts.append("A")
    for key in ("reth", "aeth", "peth"):
        if key in doc:
            parts.append(key + "{" + ",".join(f"{k}={v:#x}" for k, v in doc[key].items()) + "}")
    icrc = {True: "icrc=ok", False: "icrc=BAD", None: "icrc=?"}[doc["icrc_ok"]]
    parts.append(icrc)
    if doc["error"]:
        parts.append(f"error={doc['error']}")
    return head + " ".join(parts)
