"""An in-memory transport for tests: two :class:`~iwarp_model.engine.Connection` objects joined
by a lossless, in-order byte pipe, standing in for a TCP connection (RFC 5044 section 2
assumes only a reliable, ordered byte stream underneath MPA).

:meth:`MemoryPair.pump` moves bytes both ways until neither end has anything to send. With an
``rng`` each burst is cut at random boundaries into several :meth:`Connection.receive` calls,
as TCP may deliver a stream in any pieces. An end that :attr:`~Connection.wants_close` and has
sent everything closes its direction: the other end is told :meth:`~Connection.connection_lost`.
"""

import random

from ..engine import Connection

__all__ = ["MemoryPair"]


class MemoryPair:
    """Carry the bytes between ``a`` and ``b`` (``a`` usually the initiator).

    ``burst`` bounds the bytes taken from one end per turn (whole FPDUs, so a turn may take a
    little more), so large transfers interleave with the other direction as on a real link.
    ``wire`` collects everything sent, per direction (``"ab"``, ``"ba"``), when ``record``.
    ``capture`` (a :class:`~iwarp_model.capture.StreamCapture` whose local side is ``a``)
    records the exchange as a pcap, each burst one or more segments.
    """

    def __init__(self, a: Connection, b: Connection, *, rng: random.Random | None = None,
                 burst: int = 1 << 16, record: bool = False, capture=None):
        if burst <= 0:
            raise ValueError(f"burst {burst} must be positive")
        self.a, self.b, self.rng, self.burst = a, b, rng, burst
        self.record = record
        self.wire = {"ab": bytearray(), "ba": bytearray()}
        self.capture = capture
        self.closed = {"ab": False, "ba": False}
        self.deliveries = 0

    def start(self) -> None:
        """Start both ends (responder first, as it listens) and run the handshake."""
        self.b.start()
        self.a.start()
        self.pump()

    def pump(self, max_turns: int | None = None) -> int:
        """Move bytes until both ends are quiet, or for at most ``max_turns`` turns (one turn:
        one burst each way); the number of bytes moved. Without ``max_turns``, RuntimeError
        if the ends are still talking after a million turns."""
        moved = 0
        limit = 1 << 20 if max_turns is None else max_turns
        for _ in range(limit):
            progress = False
            for src, dst, key in ((self.a, self.b, "ab"), (self.b, self.a, "ba")):
                if self.closed[key]:
                    continue
                data = src.transmit(self.burst)
                if data:
                    progress = True
                    moved += len(data)
                    if self.record:
                        self.wire[key] += data
                    if self.capture is not None:
                        (self.capture.sent if key == "ab" else self.capture.received)(data)
                    self._deliver(dst, data)
                elif src.wants_close:
                    self.closed[key] = True
                    dst.connection_lost()
                    progress = True
            if not progress:
                return moved
        if max_turns is None:
            raise RuntimeError(f"the pair was still busy after {limit} turns")
        return moved

    def _deliver(self, dst: Connection, data: bytes) -> None:
        if self.rng is None:
            dst.receive(data)
            self.deliveries += 1
            return
        offset = 0
        while offset < len(data):
            limit = self.rng.choice((3, 40, 3000))
            step = self.rng.randint(1, min(len(data) - offset, limit))
            dst.receive(data[offset:offset + step])
            self.deliveries += 1
            offset += step
