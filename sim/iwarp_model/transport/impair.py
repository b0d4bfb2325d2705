"""Link impairment for frame-level tests: loss, duplication, reordering, corruption, delay and
resegmentation.

Implements the fault model of the project's verification plan (DESIGN.md section 5): frames on
a wire may be lost, duplicated, reordered or corrupted, and every run must still deliver every
byte intact. A corrupted frame has one random bit flipped, which the receiver's Ethernet FCS
(absent here), IPv4 or TCP checksum (RFC 791, RFC 9293 section 3.1) must catch; a flip in a MAC
address or the EtherType makes the frame "not for us" instead. Resegmentation is what a
middlebox may do to a TCP stream (RFC 9293 section 3.8.6.2 leaves segment boundaries to each
sender; RFC 5044 section 4.1 has MPA survive them): a TCP segment is cut in two at an offset
that steps through every value from one cut to the next, or into segments of at most a given
number of octets, so FPDUs arrive split at any offset.

:class:`Link` carries frames one way between two frame sinks under a clock; :class:`Pipe`
joins two :class:`~iwarp_model.transport.rawtcp.RawStack` hosts with a pair of links and a
:class:`VirtualClock`, and runs them event by event, so simulated seconds cost only the CPU
time of the frames exchanged. Everything is deterministic for a given seed.
"""

import heapq
import random
from collections import Counter
from dataclasses import replace

from ..wire.errors import WireError
from ..wire.net import (
    ETH_MIN_FRAME,
    ETHERTYPE_IPV4,
    FIN,
    PROTO_TCP,
    PSH,
    EthernetFrame,
    IPv4Packet,
    TcpSegment,
)
from .rawtcp import RawStack, TcpConfig

__all__ = ["VirtualClock", "Link", "Pipe", "resegment", "cut"]

_SWEEP_END = 2047           # the last split offset before the sweep starts again (above any MSS)


class VirtualClock:
    """A clock that only moves when told: call it for the time, set ``now`` to advance."""

    def __init__(self, start: float = 0.0):
        self.now = start

    def __call__(self) -> float:
        return self.now


def _probability(value: float, what: str) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{what} probability {value} outside [0, 1]")
    return value


class Link:
    """One direction of a wire: frames given to :meth:`send` reach ``deliver`` later.

    Each frame is lost with probability ``loss``; otherwise it is sent twice with probability
    ``duplicate``; each copy gets one bit flipped with probability ``corrupt`` and is held back
    with probability ``reorder`` until ``reorder_frames`` later frames have passed it or
    ``reorder_delay`` seconds have elapsed, whichever is first. Every copy arrives ``delay``
    seconds after it was sent (frames are never reordered otherwise). Before all that, a TCP
    segment carrying two octets or more is cut in two with probability ``split``, after
    1, 2, 3, ... 2047 of its octets in turn and then from 1 again (a segment too short for
    the next offset ``k`` is cut after ``1 + (k - 1) mod (length - 1)`` octets, and the next
    one gets ``k`` again; :attr:`split_offsets` keeps the offsets used, so that after n
    segments longer than n, every offset up to n has been cut at); with ``resegment`` (an
    octet count), each
    TCP segment carrying more is cut by :func:`resegment` instead. Each piece is then
    impaired on its own. Probabilities and the delays are attributes and may be changed
    between frames. ``on_frame(time, frame)``, if given, sees each frame as sent, before any
    impairment. ``counters`` counts what happened: ``sent``, ``delivered``, ``lost`` (and
    ``lost_sequenced``, those of them that took TCP sequence numbers, which their sender had
    to retransmit), ``duplicated``, ``corrupted``, ``reordered``, ``split``,
    ``resegmented``.
    """

    def __init__(self, deliver, *, clock, rng: random.Random, delay: float = 0.0,
                 loss: float = 0.0, duplicate: float = 0.0, corrupt: float = 0.0,
                 reorder: float = 0.0, reorder_frames: int = 3, reorder_delay: float = 0.005,
                 split: float = 0.0, resegment: int | None = None, on_frame=None):
        if delay < 0 or reorder_delay < 0 or reorder_frames < 1:
            raise ValueError("delays must be >= 0 and reorder_frames >= 1")
        if resegment is not None and resegment < 1:
            raise ValueError(f"resegment must be 1 octet or more, not {resegment}")
        self.resegment = resegment
        self.split = _probability(split, "split")
        self.split_offsets: set[int] = set()
        self._sweep = 1
        self.deliver, self.clock, self.rng = deliver, clock, rng
        self.delay = delay
        self.loss = _probability(loss, "loss")
        self.duplicate = _probability(duplicate, "duplicate")
        self.corrupt = _probability(corrupt, "corrupt")
        self.reorder = _probability(reorder, "reorder")
        self.reorder_frames, self.reorder_delay = reorder_frames, reorder_delay
        self.on_frame = on_frame
        self.counters: Counter[str] = Counter()
        self._queue: list[tuple[float, int, bytes]] = []
        self._held: list[list] = []  # [frames still to pass, release time, frame]
        self._order = 0

    def send(self, frame: bytes) -> None:
        """Accept one frame for the far end (the frame-sink interface)."""
        now = self.clock()
        self.counters["sent"] += 1
        if self.on_frame is not None:
            self.on_frame(now, frame)
        if self.resegment is not None:
            pieces = resegment(frame, self.resegment)
            self.counters["resegmented"] += len(pieces) > 1
        elif self.split and self.rng.random() < self.split:
            pieces = cut(frame, self._split_offset)
            self.counters["split"] += len(pieces) > 1
        else:
            pieces = [frame]
        for piece in pieces:
            self._impair(piece, now)

    def _split_offset(self, length: int) -> list[int]:
        offset = self._sweep
        if offset < length:
            self._sweep = offset % _SWEEP_END + 1
        else:
            offset = 1 + (offset - 1) % (length - 1)
        self.split_offsets.add(offset)
        return [offset]

    def _impair(self, frame: bytes, now: float) -> None:
        if self.rng.random() < self.loss:
            self.counters["lost"] += 1
            self.counters["lost_sequenced"] += _takes_sequence_numbers(frame)
            return
        copies = 1
        if self.rng.random() < self.duplicate:
            self.counters["duplicated"] += 1
            copies = 2
        for _ in range(copies):
            data = frame
            if self.rng.random() < self.corrupt:
                self.counters["corrupted"] += 1
                bit = self.rng.randrange(len(frame) * 8)
                flipped = bytearray(frame)
                flipped[bit // 8] ^= 1 << (bit % 8)
                data = bytes(flipped)
            if self.rng.random() < self.reorder:
                self.counters["reordered"] += 1
                self._held.append([self.reorder_frames, now + self.reorder_delay, data])
                continue
            self._schedule(now, data)
            for held in self._held:
                held[0] -= 1
            self._release(lambda held: held[0] <= 0, now)

    def _schedule(self, when: float, frame: bytes) -> None:
        self._order += 1
        heapq.heappush(self._queue, (when + self.delay, self._order, frame))

    def _release(self, due, now: float) -> None:
        keep = []
        for held in self._held:
            if due(held):
                self._schedule(now, held[2])
            else:
                keep.append(held)
        self._held = keep

    def next_due(self) -> float | None:
        """When :meth:`poll` next has a frame to deliver, or None if the link is empty."""
        times = [self._queue[0][0]] if self._queue else []
        times += [held[1] for held in self._held]
        return min(times, default=None)

    def poll(self) -> None:
        """Deliver every frame due at ``clock()``, in order of arrival time."""
        now = self.clock()
        self._release(lambda held: held[1] <= now, now - self.delay)
        while self._queue and self._queue[0][0] <= now:
            _, _, frame = heapq.heappop(self._queue)
            self.counters["delivered"] += 1
            self.deliver(frame)


def _tcp_layers(frame: bytes):
    """``frame``'s Ethernet frame, IPv4 packet and TCP segment, or None for any other frame
    and for one that does not decode (a corrupted one)."""
    try:
        eth = EthernetFrame.decode(frame)
        if eth.ethertype != ETHERTYPE_IPV4:
            return None
        ip = IPv4Packet.decode(eth.payload)
        if ip.proto != PROTO_TCP or ip.is_fragment:
            return None
        return eth, ip, TcpSegment.decode(ip.payload, ip.src, ip.dst)
    except WireError:
        return None


def _takes_sequence_numbers(frame: bytes) -> bool:
    """Whether ``frame`` is a TCP segment that takes sequence numbers (payload, SYN or FIN:
    RFC 9293 section 3.4), which its sender must retransmit if it is lost; a bare
    acknowledgement is not."""
    layers = _tcp_layers(frame)
    return layers is not None and layers[2].seg_len > 0


def resegment(frame: bytes, most: int) -> list[bytes]:
    """``frame`` as frames whose TCP segments carry at most ``most`` octets each (see
    :func:`cut`)."""
    return cut(frame, lambda length: range(most, length, most))


def cut(frame: bytes, offsets) -> list[bytes]:
    """``frame``'s IPv4 TCP segment cut after each of ``offsets(length)`` octets of its
    payload (``length`` of them, two or more; the offsets ascending, each between 1 and
    ``length - 1``) into consecutive segments: the sequence numbers advanced, the checksums
    made anew, FIN and PSH on the last piece only. Any other frame, a segment with fewer than
    two octets, and one that does not decode (a corrupted one), is returned alone and
    unchanged."""
    layers = _tcp_layers(frame)
    if layers is None:
        return [frame]
    eth, ip, seg = layers
    inner = list(offsets(len(seg.payload))) if len(seg.payload) > 1 else []
    if not inner:
        return [frame]
    bounds = [0, *inner, len(seg.payload)]
    pieces = []
    for start, end in zip(bounds, bounds[1:]):
        last = end == len(seg.payload)
        piece = replace(seg, seq=(seg.seq + start) & 0xFFFF_FFFF,
                        flags=seg.flags if last else seg.flags & ~(FIN | PSH),
                        payload=seg.payload[start:end])
        packet = replace(ip, payload=piece.encode(ip.src, ip.dst))
        pieces.append(replace(eth, payload=packet.encode()).encode(min_size=ETH_MIN_FRAME))
    return pieces


class Pipe:
    """Two RawStacks, ``a`` (10.0.0.1) and ``b`` (10.0.0.2), joined by links ``ab`` and
    ``ba`` under one :class:`VirtualClock`.

    Keyword arguments other than those named are :class:`Link` impairments applied to both
    directions. ``config`` (or ``config_a``/``config_b``) is the stacks' :class:`TcpConfig`;
    ``stack_options`` are further :class:`RawStack` keyword arguments for both. With
    ``record=True``, ``log`` collects ``(time, "ab" | "ba", frame)`` for every frame sent.
    """

    MAC_A, IP_A = "02:00:00:00:00:0a", "10.0.0.1"
    MAC_B, IP_B = "02:00:00:00:00:0b", "10.0.0.2"

    def __init__(self, *, seed: int = 0, delay: float = 0.0005, config: TcpConfig = None,
                 config_a: TcpConfig = None, config_b: TcpConfig = None, record: bool = False,
                 stack_options: dict | None = None, **impairments):
        self.clock = VirtualClock()
        seeds = random.Random(seed)
        self.log: list[tuple[float, str, bytes]] = []
        self.ab = Link(lambda f: self.b.receive_frame(f), clock=self.clock,
                       rng=random.Random(seeds.getrandbits(64)), delay=delay,
                       on_frame=(lambda t, f: self.log.append((t, "ab", f))) if record else None,
                       **impairments)
        self.ba = Link(lambda f: self.a.receive_frame(f), clock=self.clock,
                       rng=random.Random(seeds.getrandbits(64)), delay=delay,
                       on_frame=(lambda t, f: self.log.append((t, "ba", f))) if record else None,
                       **impairments)
        options = stack_options or {}
        self.a = RawStack(self.MAC_A, self.IP_A, send_frame=self.ab.send, clock=self.clock,
                          rng=random.Random(seeds.getrandbits(64)), config=config_a or config,
                          **options)
        self.b = RawStack(self.MAC_B, self.IP_B, send_frame=self.ba.send, clock=self.clock,
                          rng=random.Random(seeds.getrandbits(64)), config=config_b or config,
                          **options)

    def step(self) -> bool:
        """Do everything due now, then move the clock to the next event; False when nothing
        is left to happen (no frame in flight and no timer running)."""
        self.ab.poll()
        self.ba.poll()
        self.a.poll()
        self.b.poll()
        times = [t for t in (self.ab.next_due(), self.ba.next_due(), self.a.next_deadline(),
                             self.b.next_deadline()) if t is not None]
        if not times:
            return False
        self.clock.now = max(self.clock.now, min(times))
        return True

    def run(self, until=None, timeout: float = 60.0) -> bool:
        """Step until ``until()`` is true (returns True), nothing is left to happen, or
        ``timeout`` simulated seconds pass (both return ``until()``, or True without one)."""
        end = self.clock.now + timeout
        while until is None or not until():
            if self.clock.now > end or not self.step():
                return until is None or until()
        return True
