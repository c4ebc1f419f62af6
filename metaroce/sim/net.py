"""A deterministic discrete-event network simulator that runs the real transport engine (C).

Virtual clock in integer nanoseconds, one heap of ``(time, seq, fn, args)`` events, one
``random.Random(seed)``: a run is a pure function of its seed and parameters.

Model
-----
* :class:`Port` — the egress of a node onto a link: a FIFO served at ``rate_bps``, then
  ``delay_ns`` of propagation. Finite capacity (tail drop), ECN CE-marking when the queue holds
  more than ``ecn_bytes`` at enqueue (step marking, as DCTCP/DCQCN configure switches), random
  loss, duplication and reordering (extra delay on a fraction of frames), and up/down state
  (``fail()``: the queue and every frame on the wire are lost). A frame's serialisation end is
  computed when it is enqueued, so a hop costs one event (its arrival at the next node).
* :class:`Switch` — routes by destination host; several equal-cost ports are chosen by a
  seeded hash of (source host, destination host, UDP source port), as ECMP does. Routing does
  not converge around a failed link (a black hole the transport has to route around).
* :class:`Host` — a NIC: one uplink port and the engine QPs (``metaroce.cengine.QueuePair``,
  the C engine) behind it; it delivers frames to QPs, moves their output onto the wire and runs
  their timers.
* Topologies: :func:`pair`, :func:`incast` (N senders, one switch, one receiver) and
  :func:`leaf_spine` (2 leaves, K spines: K equal-cost paths).
"""

import heapq
import random
import zlib
from collections import deque
from dataclasses import replace

# Header bytes on the wire, per frame: preamble+IFG 20, Ethernet 14 + FCS 4, IPv4 20, UDP 8,
# BTH 12, ICRC 4; plus the extension headers the packet carries.
BASE_OVERHEAD = 82


def wire_size(pkt) -> int:
    n = BASE_OVERHEAD + len(pkt.payload)
    if pkt.place is not None:
        n += 20
    if pkt.reth is not None:
        n += 16
    if pkt.aeth is not None:
        n += 4
    if pkt.sack is not None:
        n += 32
    if pkt.immdt is not None:
        n += 4
    if pkt.atomic is not None:
        n += 28
    if pkt.atomic_ack is not None:
        n += 8
    if pkt.grant is not None:
        n += 8
    if pkt.opcode == 0x81:
        n += 16
    return n


class Sim:
    def __init__(self, seed: int = 0):
        self.now = 0
        self.rng = random.Random(seed)
        self.seed = seed
        self._heap: list = []
        self._seq = 0
        self.events = 0

    def at(self, t, fn, *args) -> None:
        t = int(t)
        if t < self.now:
            t = self.now
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn, args))

    def run(self, until: int | None = None, stop=None, max_events: int = 50_000_000) -> None:
        heap, pop = self._heap, heapq.heappop
        check = 0
        while heap and self.events < max_events:
            t = heap[0][0]
            if until is not None and t > until:
                self.now = until
                return
            _, _, fn, args = pop(heap)
            self.now = t
            self.events += 1
            fn(*args)
            if stop is not None:
                check += 1
                if check >= 64:
                    check = 0
                    if stop():
                        return


class Frame:
    __slots__ = ("pkt", "src", "dst", "size", "ce")

    def __init__(self, pkt, src: int, dst: int, size: int):
        self.pkt, self.src, self.dst, self.size, self.ce = pkt, src, dst, size, False


class Port:
    """Egress queue + link to ``peer``."""

    __slots__ = ("sim", "name", "rate", "delay", "peer", "cap", "ecn", "loss", "dup",
                 "reorder", "reorder_ns", "up", "epoch", "busy", "q", "qbytes", "max_q",
                 "tail_drops", "lost", "down_drops", "marks", "tx_frames", "tx_bytes",
                 "switch_port")

    def __init__(self, sim: Sim, name: str, rate_bps: float, delay_ns: int, cap_bytes=None,
                 ecn_bytes=None, loss=0.0, dup=0.0, reorder=0.0, reorder_ns=0,
                 switch_port=False):
        self.sim, self.name = sim, name
        self.rate = float(rate_bps)
        self.delay = int(delay_ns)
        self.peer = None
        self.cap, self.ecn = cap_bytes, ecn_bytes
        self.loss, self.dup, self.reorder, self.reorder_ns = loss, dup, reorder, reorder_ns
        self.up = True
        self.epoch = 0
        self.busy = 0.0
        self.q: deque = deque()
        self.qbytes = self.max_q = 0
        self.tail_drops = self.lost = self.down_drops = self.marks = 0
        self.tx_frames = self.tx_bytes = 0
        self.switch_port = switch_port

    def send(self, f: Frame) -> None:
        if not self.up:
            self.down_drops += 1
            return
        sim = self.sim
        now = sim.now
        q = self.q
        while q and q[0][0] <= now:
            self.qbytes -= q.popleft()[1]
        size = f.size
        if self.cap is not None and self.qbytes + size > self.cap:
            self.tail_drops += 1
            return
        if self.ecn is not None and self.qbytes > self.ecn:
            f.ce = True
            self.marks += 1
        start = self.busy if self.busy > now else now
        end = start + size * 8e9 / self.rate
        self.busy = end
        q.append((end, size))
        self.qbytes += size
        if self.qbytes > self.max_q:
            self.max_q = self.qbytes
        self.tx_frames += 1
        self.tx_bytes += size
        rng = sim.rng
        if self.loss and rng.random() < self.loss:
            self.lost += 1
            return
        arrive = end + self.delay
        if self.reorder and rng.random() < self.reorder:
            arrive += rng.randint(1, self.reorder_ns)
        sim.at(arrive, self.peer.receive, f, self, self.epoch)
        if self.dup and rng.random() < self.dup:
            g = Frame(f.pkt, f.src, f.dst, f.size)
            g.ce = f.ce
            sim.at(arrive + 1, self.peer.receive, g, self, self.epoch)

    def fail(self) -> None:
        self.up = False
        self.epoch += 1
        self.down_drops += len(self.q)
        self.q.clear()
        self.qbytes = 0
        self.busy = 0.0

    def restore(self) -> None:
        self.up = True

    @property
    def drops(self) -> int:
        return self.tail_drops + self.lost + self.down_drops


class Switch:
    def __init__(self, sim: Sim, name: str, salt: int):
        self.sim, self.name = sim, name
        self.salt = salt
        self.routes: dict[int, list[Port]] = {}
        self.ports: list[Port] = []
        self.no_route = 0

    def receive(self, f: Frame, via: Port, epoch: int) -> None:
        if epoch != via.epoch:
            via.down_drops += 1
            return
        ports = self.routes.get(f.dst)
        if not ports:
            self.no_route += 1
            return
        if len(ports) == 1:
            ports[0].send(f)
            return
        h = ecmp_hash(f.src, f.dst, f.pkt.sport, self.salt)
        ports[h % len(ports)].send(f)


def ecmp_hash(src: int, dst: int, sport: int, salt: int) -> int:
    """CRC32 of the flow's (source, destination, UDP source port), like a switch's ECMP hash."""
    return zlib.crc32(((src & 0xFFFF) << 48 | (dst & 0xFFFF) << 32 | (sport & 0xFFFF) << 16
                       | (salt & 0xFFFF)).to_bytes(8, "big"))


class Host:
    """A NIC with one uplink and the QPs behind it."""

    def __init__(self, sim: Sim, hid: int, name: str):
        self.sim, self.id, self.name = sim, hid, name
        self.port: Port | None = None
        self.qps: dict[int, tuple] = {}  # qpn -> (qp, peer host id)
        self._timer: dict[int, int | None] = {}
        self.on_deliver = None  # hook(qp, accepted_bytes) for measurements
        self.after_service = None  # hook(qp): the application polls its CQ and posts more

    def attach(self, qp, peer: int) -> None:
        self.qps[qp.attr.qpn] = (qp, peer)
        self._timer[qp.attr.qpn] = None

    def receive(self, f: Frame, via: Port, epoch: int) -> None:
        if epoch != via.epoch:
            via.down_drops += 1
            return
        pkt = f.pkt
        ent = self.qps.get(pkt.dest_qp)
        if ent is None:
            return
        qp = ent[0]
        if f.ce:
            pkt = replace(pkt, ce=True)
        if self.on_deliver is not None and pkt.payload:
            before = qp.resp.rx_bytes
            qp.receive(pkt, self.sim.now)
            got = qp.resp.rx_bytes - before
            if got:
                self.on_deliver(qp, got)
        else:
            qp.receive(pkt, self.sim.now)
        self.service(qp)

    def _timer_fire(self, qp, t: int) -> None:
        qpn = qp.attr.qpn
        if self._timer.get(qpn) != t:
            return  # superseded
        self._timer[qpn] = None
        qp.on_timer(self.sim.now)
        self.service(qp)

    def service(self, qp) -> None:
        """Move qp's output onto the wire and (re)arm its timer."""
        qpn = qp.attr.qpn
        out = qp.take_packets()
        if out:
            peer = self.qps[qpn][1]
            port, hid = self.port, self.id
            for pkt in out:
                port.send(Frame(pkt, hid, peer, wire_size(pkt)))
        d = qp.next_deadline()
        cur = self._timer[qpn]
        if d is not None and d != cur:
            self._timer[qpn] = d
            self.sim.at(d, self._timer_fire, qp, d)
        elif d is None and cur is not None:
            self._timer[qpn] = None
        if self.after_service is not None and qp.cq:
            self.after_service(qp)


class Network:
    """Hosts, switches and ports of one topology."""

    def __init__(self, sim: Sim):
        self.sim = sim
        self.hosts: list[Host] = []
        self.switches: list[Switch] = []
        self.ports: list[Port] = []
        self.host_rate: dict[int, float] = {}

    def host(self, name: str) -> Host:
        h = Host(self.sim, len(self.hosts), name)
        self.hosts.append(h)
        return h

    def switch(self, name: str) -> Switch:
        s = Switch(self.sim, name, salt=zlib.crc32(f"{self.sim.seed}/{name}".encode()) & 0xFFFF)
        self.switches.append(s)
        return s

    def link(self, a, b, rate_bps, delay_ns, **sw) -> tuple[Port, Port]:
        """A full-duplex link; switch egress ports get the queue parameters ``sw`` (cap,
        ECN, impairments); host NIC ports are unbounded and unimpaired unless given
        ``host_*`` keys."""
        pa = self._port(a, b, rate_bps, delay_ns, sw)
        pb = self._port(b, a, rate_bps, delay_ns, sw)
        for node, p in ((a, pa), (b, pb)):
            if isinstance(node, Host):
                node.port = p
                self.host_rate[node.id] = rate_bps
            else:
                node.ports.append(p)
        return pa, pb

    def _port(self, src, dst, rate, delay, sw) -> Port:
        kw = {}
        if isinstance(src, Switch):
            kw = {k: v for k, v in sw.items() if not k.startswith("host_")}
            kw["switch_port"] = True
        else:
            kw = {k[5:]: v for k, v in sw.items() if k.startswith("host_")}
        p = Port(self.sim, f"{getattr(src, 'name')}->{getattr(dst, 'name')}", rate, delay, **kw)
        p.peer = dst
        self.ports.append(p)
        return p

    @staticmethod
    def route(sw: Switch, dst: Host, *ports: Port) -> None:
        sw.routes.setdefault(dst.id, []).extend(ports)

    # --- measurements -------------------------------------------------------------------------
    def drops(self) -> int:
        return sum(p.drops for p in self.ports)

    def max_switch_queue(self) -> int:
        return max((p.max_q for p in self.ports if p.switch_port), default=0)


# --- topologies -----------------------------------------------------------------------------

def pair(sim: Sim, rate_bps=100e9, delay_ns=1_000, **sw) -> tuple[Network, Host, Host]:
    """h0 — s0 — h1."""
    net = Network(sim)
    a, b, s = net.host("h0"), net.host("h1"), net.switch("s0")
    _, s_a = net.link(a, s, rate_bps, delay_ns, **sw)
    _, s_b = net.link(b, s, rate_bps, delay_ns, **sw)
    net.route(s, a, s_a)
    net.route(s, b, s_b)
    return net, a, b


def incast(sim: Sim, senders: int, rate_bps=100e9, delay_ns=1_000, **sw):
    """N senders and one receiver on one switch: the receiver's downlink is the bottleneck."""
    net = Network(sim)
    s = net.switch("s0")
    rx = net.host("rx")
    _, s_rx = net.link(rx, s, rate_bps, delay_ns, **sw)
    net.route(s, rx, s_rx)
    txs = []
    for i in range(senders):
        h = net.host(f"tx{i}")
        _, s_h = net.link(h, s, rate_bps, delay_ns, **sw)
        net.route(s, h, s_h)
        txs.append(h)
    return net, txs, rx


def leaf_spine(sim: Sim, spines: int, hosts_per_leaf: int = 1, host_rate_bps=400e9,
               fabric_rate_bps=100e9, delay_ns=1_000, **sw):
    """Two leaves, ``spines`` spines, every leaf linked to every spine: between hosts on
    different leaves there are exactly ``spines`` equal-cost paths, chosen at the source leaf by
    the ECMP hash. Returns (net, left hosts, right hosts, {(leaf, spine): (up, down) ports})."""
    net = Network(sim)
    leaves = [net.switch("leaf0"), net.switch("leaf1")]
    sp = [net.switch(f"spine{j}") for j in range(spines)]
    sides: list[list[Host]] = [[], []]
    for li, leaf in enumerate(leaves):
        for i in range(hosts_per_leaf):
            h = net.host(f"h{li}.{i}")
            _, down = net.link(h, leaf, host_rate_bps, delay_ns, **sw)
            net.route(leaf, h, down)
            sides[li].append(h)
    fabric = {}
    for li, leaf in enumerate(leaves):
        for j, s in enumerate(sp):
            up, down = net.link(leaf, s, fabric_rate_bps, delay_ns, **sw)
            fabric[(li, j)] = (up, down)
            for h in sides[li]:
                net.route(s, h, down)
    for li, leaf in enumerate(leaves):
        for h in sides[1 - li]:
            net.route(leaf, h, *(fabric[(li, j)][0] for j in range(spines)))
    return net, sides[0], sides[1], fabric
