"""The host side of a TCP engine in a :class:`~iwarp_tb.harness.Harness`: the application a test
plays through the engine's command, event and byte-stream ports.

:class:`TcpHost` keeps, per connection slot, the bytes queued to send and the bytes received,
and turns calls into transfers on the module's streams (names of :mod:`iwarp_nic.axis`):
``s_axis_cmd`` / ``m_axis_event`` and ``s_axis_tx_header`` + ``s_axis_tx`` /
``m_axis_rx_header`` + ``m_axis_rx`` (with a ``prefix`` after ``s_axis_``/``m_axis_`` for a
module holding more than one engine, :class:`~iwarp_tb.tcppair.TcpPair`). :meth:`TcpHost.service`
moves data both ways; call it between runs of the clock.
"""

from collections import deque
from dataclasses import dataclass, field

from iwarp_nic.tcp.layouts import ChunkHeader, Command, CommandOp, Event, EventKind

from .harness import pack, unpack

__all__ = ["TcpHost", "Slot", "ENDED"]

#: The events after which a slot is free.
ENDED = (EventKind.CLOSED, EventKind.RESET, EventKind.TIMEOUT, EventKind.ABORTED)


@dataclass
class Slot:
    """What the host knows of one connection slot."""

    to_send: deque = field(default_factory=deque)   # chunks not yet handed to the engine
    queued: int = 0                                 # bytes ever queued by send()
    sent: int = 0                                   # bytes handed to the engine
    received: bytearray = field(default_factory=bytearray)
    events: list = field(default_factory=list)      # EventKind, in order
    peer: tuple = None          # (remote ip, remote port) from ESTABLISHED until the slot ends

    @property
    def last_event(self):
        return self.events[-1] if self.events else None


class TcpHost:
    """Plays the application of a TCP engine with ``conns`` slots.

    ``chunk`` is the largest chunk handed to the engine (at most its ``ring_bytes``);
    ``in_flight`` bounds the chunks queued in the harness at once, so a chunk waiting for a
    full ring holds few others behind it. ``prefix`` goes in front of the stream names
    (``prefix="a_"``: ``s_axis_a_cmd``, ``m_axis_a_rx``, ...).
    """

    def __init__(self, harness, conns, *, chunk=2048, in_flight=2, prefix=""):
        self.h = harness
        self.conns = conns
        self.chunk = chunk
        self.in_flight = in_flight
        self.slots = [Slot() for _ in range(conns)]
        self.events = []          # (EventKind, conn, event dict), in order
        self._rx_headers = deque()
        self._turn = 0
        self._cmd = Command(conns)
        self._event = Event(conns)
        self._header = ChunkHeader(conns)
        self._cmd_port, self._event_port = f"s_axis_{prefix}cmd", f"m_axis_{prefix}event"
        self._tx_header_port, self._tx_port = f"s_axis_{prefix}tx_header", f"s_axis_{prefix}tx"
        self._rx_header_port, self._rx_port = f"m_axis_{prefix}rx_header", f"m_axis_{prefix}rx"

    # Commands.

    def command(self, op, conn, *, local_port=0, remote_ip=0, remote_port=0):
        self.h.push(self._cmd_port, [pack(self._cmd, op=op, conn=conn, local_port=local_port,
                                          remote_ip=remote_ip, remote_port=remote_port)])

    def listen(self, conn, port):
        self.command(CommandOp.LISTEN, conn, local_port=port)

    def connect(self, conn, local_port, remote_ip, remote_port):
        self.command(CommandOp.CONNECT, conn, local_port=local_port, remote_ip=remote_ip,
                     remote_port=remote_port)

    def close(self, conn):
        self.command(CommandOp.CLOSE, conn)

    def abort(self, conn):
        self.command(CommandOp.ABORT, conn)

    # Data.

    def send(self, conn, data, sizes=None):
        """Queue ``data`` for connection ``conn`` (handed over by :meth:`service`), in chunks
        of ``chunk`` bytes, or of the lengths ``sizes`` (in order; they add up to
        ``len(data)``)."""
        slot = self.slots[conn]
        if sizes is None:
            sizes = [min(self.chunk, len(data) - at) for at in range(0, len(data), self.chunk)]
        if sum(sizes) != len(data) or not all(0 < n <= self.chunk for n in sizes):
            raise ValueError(f"chunk sizes must be 1 to {self.chunk} and add up to {len(data)}")
        at = 0
        for n in sizes:
            slot.to_send.append(bytes(data[at:at + n]))
            at += n
        slot.queued += len(data)

    def unsent(self, conn=None):
        """Bytes still queued on the host side (of one slot, or all). Counted, not summed over
        the queue: a test asks every round, with megabytes queued."""
        slots = self.slots if conn is None else [self.slots[conn]]
        return sum(s.queued - s.sent for s in slots)

    def service(self):
        """Hand queued chunks to the engine (round-robin over slots) and collect what came
        out: events and received bytes."""
        while self.h.pending(self._tx_header_port) < self.in_flight:
            for k in range(self.conns):
                conn = (self._turn + k) % self.conns
                if self.slots[conn].to_send:
                    break
            else:
                break
            self._turn = (conn + 1) % self.conns
            data = self.slots[conn].to_send.popleft()
            self.h.push(self._tx_header_port, [pack(self._header, conn=conn, length=len(data))])
            self.h.push(self._tx_port, [data])
            self.slots[conn].sent += len(data)
        for value in self.h.pull(self._event_port):
            ev = unpack(self._event, value)
            slot = self.slots[ev["conn"]]
            slot.events.append(ev["kind"])
            if ev["kind"] == EventKind.ESTABLISHED:
                slot.peer = (ev["remote_ip"], ev["remote_port"])
            elif ev["kind"] in ENDED:
                slot.peer = None
            self.events.append((ev["kind"], ev["conn"], ev))
        self._rx_headers.extend(unpack(self._header, v) for v in self.h.pull(self._rx_header_port))
        for packet in self.h.pull(self._rx_port):
            header = self._rx_headers.popleft()
            if len(packet) != header["length"] or packet.err:
                raise AssertionError(f"rx chunk of {len(packet)} bytes (err={packet.err}) "
                                     f"under a header of {header}")
            self.slots[header["conn"]].received += packet
