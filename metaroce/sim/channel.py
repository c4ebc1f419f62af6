"""A seeded, virtual-clock event loop and impaired links connecting engine QPs.

Everything is driven from one heap of (time, seq) events and one ``random.Random(seed)``, so
a run is a pure function of its seed and inputs. ``Link`` models delay, jitter (which reorders),
loss and duplication; a later slice can replace it with rate-limited queues, ECN marking and
topologies (a ``Link`` is just something with ``send(pkt)``).
"""

import heapq
import random
from dataclasses import dataclass
from typing import Callable


class EventLoop:
    def __init__(self, seed: int = 0):
        self.now = 0
        self.rng = random.Random(seed)
        self._heap: list = []
        self._seq = 0
        self.after_event: list[Callable[[], None]] = []
        self.events = 0

    def at(self, t: int, fn: Callable, *args) -> None:
        heapq.heappush(self._heap, (max(t, self.now), self._seq, fn, args))
        self._seq += 1

    def run(self, until: int | None = None, max_events: int = 2_000_000,
            stop: Callable[[], bool] | None = None) -> None:
        while self._heap and self.events < max_events:
            if stop is not None and stop():
                return
            t, _, fn, args = self._heap[0]
            if until is not None and t > until:
                self.now = until
                return
            heapq.heappop(self._heap)
            self.now = t
            self.events += 1
            fn(*args)
            for hook in self.after_event:
                hook()


@dataclass
class Impairment:
    delay_ns: int = 2_000
    jitter_ns: int = 0  # uniform extra delay in [0, jitter]: reorders when > packet spacing
    loss: float = 0.0
    dup: float = 0.0
    drop: Callable | None = None  # deterministic drop predicate (pkt, index) -> bool
    spacing_ns: int = 100  # serialisation gap between packets sent in one burst


class Link:
    """One direction: packets from one QP to another, impaired."""

    def __init__(self, loop: EventLoop, dst, imp: Impairment, deliver: Callable):
        self.loop, self.dst, self.imp, self._deliver = loop, dst, imp, deliver
        self.sent = self.lost = self.duplicated = 0
        self._busy_until = 0
        self.log: list = []  # (send time, packet)

    def send(self, pkt) -> None:
        idx = self.sent
        self.sent += 1
        rng, imp = self.loop.rng, self.imp
        self._busy_until = max(self._busy_until, self.loop.now) + imp.spacing_ns
        self.log.append((self.loop.now, pkt))
        if (imp.drop and imp.drop(pkt, idx)) or rng.random() < imp.loss:
            self.lost += 1
            return
        copies = 2 if rng.random() < imp.dup else 1
        self.duplicated += copies - 1
        for _ in range(copies):
            t = self._busy_until + imp.delay_ns + (rng.randint(0, imp.jitter_ns) if imp.jitter_ns else 0)
            self.loop.at(t, self._deliver, self.dst, pkt)


class Pair:
    """Two QueuePairs joined by two impaired links; runs their timers and output."""

    def __init__(self, loop: EventLoop, a, b, ab: Impairment | None = None,
                 ba: Impairment | None = None):
        self.loop, self.a, self.b = loop, a, b
        self.links = {id(a): Link(loop, b, ab or Impairment(), self._deliver),
                      id(b): Link(loop, a, ba or Impairment(), self._deliver)}
        self._timer_at = {id(a): None, id(b): None}

    def _deliver(self, qp, pkt) -> None:
        qp.receive(pkt, self.loop.now)
        self.service(qp)

    def _timer(self, qp, t) -> None:
        if self._timer_at[id(qp)] != t:
            return  # superseded
        self._timer_at[id(qp)] = None
        qp.on_timer(self.loop.now)
        self.service(qp)

    def service(self, qp) -> None:
        """Move qp's output onto its link and (re)arm its timer."""
        for pkt in qp.take_packets():
            self.links[id(qp)].send(pkt)
        d = qp.next_deadline()
        if d is not None and d != self._timer_at[id(qp)]:
            self._timer_at[id(qp)] = d
            self.loop.at(d, self._timer, qp, d)
        elif d is None:
            self._timer_at[id(qp)] = None

    def post_send(self, qp, wr) -> None:
        qp.post_send(wr, self.loop.now)
        self.service(qp)

    def post_recv(self, qp, wr) -> None:
        qp.post_recv(wr)
        self.service(qp)
