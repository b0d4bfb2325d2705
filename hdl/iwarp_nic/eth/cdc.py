"""The clock-domain crossings between a MAC (:mod:`.mac`) and the core, one per direction.

A MAC runs in its PHY's clock (renamed ``mac`` where it sits in a design) and cannot wait: the
line delivers a received frame at its own pace, and :class:`~.fcs.TxFramer` must be fed one beat
per cycle from a frame's first beat to its last. Each crossing is an
``amaranth.lib.fifo.AsyncFIFO`` of beats (Gray-coded pointers, block RAM storage) with the logic
that keeps these rules on the MAC side:

* :class:`MacRxCrossing`: MAC to core, never stalls the MAC; a frame that does not fit is cut
  short and ended with ``err``.
* :class:`MacTxCrossing`: core to MAC, store and forward: a frame starts only once it is whole
  in the FIFO, so the framer never underruns.

The MAC's event counters cross too, each through a :class:`CountCrossing`: a few bits of the
count in Gray code, so that the core reads a value the counter really had, never one torn
between two.
"""

import math

from amaranth import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.fifo import AsyncFIFO
from amaranth.lib.wiring import In, Out

from ..counters import counted
from ..exact import add, same
from ..stream import BeatLayout, BeatStream, check_data_bytes
from .fcs import MAX_FRAME

__all__ = ["MacRxCrossing", "MacTxCrossing", "CountCrossing", "count_bits", "TX_FRAMES"]

#: Frames whose end :class:`MacTxCrossing` can have announced to the MAC side at once.
TX_FRAMES = 4


def _depth(data_bytes, depth_beats):
    """The FIFO depth: ``depth_beats`` (default two frames of :data:`~.fcs.MAX_FRAME` bytes)
    rounded up to a power of two, as ``AsyncFIFO`` needs."""
    check_data_bytes(data_bytes)
    if depth_beats is None:
        depth_beats = -(-2 * MAX_FRAME // data_bytes)
    if not isinstance(depth_beats, int) or depth_beats < 2:
        raise ValueError(f"depth_beats must be an integer of 2 or more, not {depth_beats!r}")
    return 1 << (depth_beats - 1).bit_length()


def _check_domains(mac_domain, core_domain):
    if mac_domain == core_domain:
        raise ValueError(f"mac_domain and core_domain must differ, both are {mac_domain!r}")


class MacRxCrossing(wiring.Component):
    """Received frames from the MAC's clock domain into the core's, without ever stalling.

    Ports
    -----
    i : In(BeatStream(data_bytes, err=True)), MAC domain
        Frames from :class:`~.fcs.RxChecker`. ``i.ready`` is always 1.
    o : Out(BeatStream(data_bytes, err=True)), core domain
        The same beats, in order, as soon as they have crossed (no store and forward): a frame
        may arrive with idle cycles between its beats. Frames that did not fit are changed as
        below; the rest are exact.
    overflows : Out(32), MAC domain
        Frames hit by a full FIFO (wraps). When a beat finds the FIFO full, it and the rest of
        its frame are thrown away; if part of the frame had already been written, a one-byte
        beat with ``last`` and ``err`` (data 0) ends it as soon as there is room, so the core
        drops the frame whole. Beats arriving before that end beat is written (the start of the
        next frame included) find the FIFO full too. A frame that lost its first beat leaves
        nothing at all.

    Latency: a beat is offered on ``o`` at the second core clock edge after the MAC edge that
    wrote it (the FIFO's pointer synchroniser). Throughput: one beat per cycle on each side;
    the core must drain at least at the MAC's beat rate, on average, for no frame to overflow.

    Parameters
    ----------
    data_bytes : int
        The width, one of :data:`~iwarp_nic.stream.DATA_BYTES`.
    depth_beats : int or None
        FIFO depth in beats, rounded up to a power of two (default: two frames of
        :data:`~.fcs.MAX_FRAME` bytes). The rounded depth is :attr:`depth_beats`.
    mac_domain, core_domain : str
        The clock domains of ``i`` and of ``o``.
    """

    def __init__(self, data_bytes, depth_beats=None, *, mac_domain="mac", core_domain="sync"):
        self.depth_beats = _depth(data_bytes, depth_beats)
        _check_domains(mac_domain, core_domain)
        self.data_bytes = data_bytes
        self._mac, self._core = mac_domain, core_domain
        super().__init__({
            "i": In(BeatStream(data_bytes, err=True)),
            "o": Out(BeatStream(data_bytes, err=True)),
            "overflows": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        layout = BeatLayout(self.data_bytes, err=True)
        m.submodules.fifo = fifo = AsyncFIFO(width=layout.size, depth=self.depth_beats,
                                             w_domain=self._mac, r_domain=self._core)
        mac = m.d[self._mac]
        beat = self.i.payload

        in_frame = Signal()                     # some of the current frame has been written
        dropping = Signal()                     # throwing away the rest of an overflowed frame
        owe_end = Signal()                      # an overflowed frame still needs its err end
        end = Signal(layout)
        m.d.comb += [end.keep.eq(1), end.last.eq(1), end.err.eq(1), self.i.ready.eq(1)]

        with m.If(owe_end):
            m.d.comb += [fifo.w_en.eq(1), fifo.w_data.eq(end)]
            with m.If(fifo.w_rdy):
                mac += owe_end.eq(0)
        with m.If(self.i.valid):
            with m.If(dropping):
                mac += dropping.eq(~beat.last)
            with m.Elif(~owe_end & fifo.w_rdy):
                m.d.comb += [fifo.w_en.eq(1), fifo.w_data.eq(beat)]
                mac += in_frame.eq(~beat.last)
            with m.Else():
                mac += [self.overflows.eq(add(self.overflows, 1)), dropping.eq(~beat.last),
                        in_frame.eq(0)]
                with m.If(in_frame):
                    mac += owe_end.eq(1)

        m.d.comb += [self.o.valid.eq(fifo.r_rdy), self.o.payload.eq(fifo.r_data),
                     fifo.r_en.eq(self.o.ready)]
        return m


class MacTxCrossing(wiring.Component):
    """Frames to send from the core's clock domain into the MAC's, each released whole.

    Ports
    -----
    i : In(BeatStream(data_bytes, err=True)), core domain
        Frames for :class:`~.fcs.TxFramer`, each at most :attr:`depth_beats` beats: a longer
        frame can never be whole in the FIFO, so it stalls ``i`` forever (forbidden).
        ``i.ready`` is low while the FIFO is full or :data:`TX_FRAMES` frames wait for the MAC.
    o : Out(BeatStream(data_bytes, err=True)), MAC domain
        The same frames, exactly. A frame's first beat is offered only once its last beat is
        in the FIFO; from then on a beat is offered on every cycle until its last, so the framer
        never underruns. Between frames ``o.valid`` is low for at least one cycle (the framer's
        preamble and gap are longer).

    The core side counts each frame's beats and, with its last beat, writes that count into a
    second small ``AsyncFIFO``; the MAC side starts a frame when its count has crossed and the
    beat FIFO shows at least that many beats readable.

    Latency: when the MAC side is idle, a frame's first beat is offered at the fifth MAC clock
    edge after the core edge that took its last beat (two synchroniser stages, the registered
    level, the registered check, then the start register). Throughput: one beat per cycle on
    each side, with at least three idle MAC cycles between frames.

    Parameters
    ----------
    data_bytes : int
        The width, one of :data:`~iwarp_nic.stream.DATA_BYTES`.
    depth_beats : int or None
        FIFO depth in beats, rounded up to a power of two (default: two frames of
        :data:`~.fcs.MAX_FRAME` bytes, so one frame fills while the one before it leaves). The
        rounded depth is :attr:`depth_beats`.
    mac_domain, core_domain : str
        The clock domains of ``o`` and of ``i``.
    """

    def __init__(self, data_bytes, depth_beats=None, *, mac_domain="mac", core_domain="sync"):
        self.depth_beats = _depth(data_bytes, depth_beats)
        _check_domains(mac_domain, core_domain)
        self.data_bytes = data_bytes
        self._mac, self._core = mac_domain, core_domain
        super().__init__({
            "i": In(BeatStream(data_bytes, err=True)),
            "o": Out(BeatStream(data_bytes, err=True)),
        })

    def elaborate(self, platform):
        m = Module()
        layout = BeatLayout(self.data_bytes, err=True)
        m.submodules.fifo = fifo = AsyncFIFO(width=layout.size, depth=self.depth_beats,
                                             w_domain=self._core, r_domain=self._mac)
        m.submodules.lengths = lengths = AsyncFIFO(width=len(fifo.r_level), depth=TX_FRAMES,
                                                   w_domain=self._core, r_domain=self._mac)
        core, mac = m.d[self._core], m.d[self._mac]

        # Core side: beats into the FIFO, and each frame's beat count once its last is in.
        beats = Signal.like(fifo.r_level)       # beats of the frame being written, so far
        counted = add(beats, 1)
        m.d.comb += [self.i.ready.eq(fifo.w_rdy & lengths.w_rdy),
                     fifo.w_data.eq(self.i.payload), lengths.w_data.eq(counted)]
        with m.If(self.i.valid & self.i.ready):
            m.d.comb += fifo.w_en.eq(1)
            core += beats.eq(counted)
            with m.If(self.i.payload.last):
                m.d.comb += lengths.w_en.eq(1)
                core += beats.eq(0)

        # MAC side: start a frame once its count and all its beats have crossed. The count and
        # the beats cross through separate synchronisers that may resolve a cycle apart in
        # hardware (never in simulation), hence the check of the beat FIFO's level.
        # The check is registered (`whole`), made only while no frame is being sent and none
        # starts: the FIFO's level and the count are then both about the frame at the head.
        sending = Signal()
        whole = Signal()
        # The level is registered first (its Gray decode and subtraction are a long chain)
        # and trusted only if no beat was read in the cycle it was taken: it is then at most
        # the level now, as only the core side adds beats.
        level = Signal.like(fifo.r_level)
        settled = Signal()
        mac += [level.eq(fifo.r_level), settled.eq(~fifo.r_en)]
        view = Signal(layout)
        m.d.comb += view.eq(fifo.r_data)
        mac += whole.eq(0)
        with m.If(sending):
            m.d.comb += [self.o.valid.eq(fifo.r_rdy), self.o.payload.eq(view),
                         fifo.r_en.eq(self.o.ready)]
            with m.If(self.o.valid & self.o.ready & view.last):
                mac += sending.eq(0)
        with m.Elif(whole):
            m.d.comb += lengths.r_en.eq(1)
            mac += sending.eq(1)
        with m.Else():
            mac += whole.eq(lengths.r_rdy & settled & (level >= lengths.r_data))
        return m


def count_bits(ratio):
    """The Gray-coded bits a :class:`CountCrossing` needs when its source clock is up to
    ``ratio`` times as fast as its destination's: between two destination cycles the count
    steps at most ``ceil(ratio)`` times, once more when a bit changing at the first sample was
    read as its old value, and that advance must stay below ``2**bits``; one bit is spare."""
    if not ratio > 0:
        raise ValueError(f"ratio must be above 0, not {ratio!r}")
    return (math.ceil(ratio) + 1).bit_length() + 1


class CountCrossing(wiring.Component):
    """An event counter carried from one clock domain into another, read whole.

    Ports
    -----
    i : In(bits), ``from_domain``
        A counter of events in its own domain, wrapping at ``2**bits`` (the low bits of a wider
        one); it may step by more than one in a cycle.
    o : Out(width), ``to_domain``
        The same events counted again in ``to_domain``, ``width`` bits wrapping, 0 at reset.

    How: a ``bits``-bit register in ``from_domain`` follows ``i`` one step a cycle, and a
    register of its Gray code (one bit changes per step) crosses through two flip-flops
    (``FFSynchronizer``). In ``to_domain`` the decoded value's advance since the cycle before
    (modulo ``2**bits``) is added to ``o`` (:func:`~iwarp_nic.counters.counted`). Whatever
    a changing bit resolves to, the value read is one the follower held, so ``o`` never jumps
    (a binary count caught mid-carry can read anything).

    Contract: ``i`` runs at most ``2**bits - 1`` steps ahead of the follower (its events come
    no faster than one a ``from_domain`` cycle on average), and ``from_domain`` is at most
    ``ratio`` times as fast as ``to_domain`` where ``bits`` is :func:`count_bits` of
    ``ratio`` or more. Latency: a step of the follower shows on ``o`` two or three
    ``to_domain`` cycles later (the synchroniser, then the addition).
    """

    def __init__(self, bits, *, width=32, from_domain="mac", to_domain="sync"):
        if not isinstance(bits, int) or not 2 <= bits <= width:
            raise ValueError(f"bits must be an integer from 2 to width ({width}), not {bits!r}")
        if from_domain == to_domain:
            raise ValueError(f"from_domain and to_domain must differ, both are {from_domain!r}")
        self.bits, self.width = bits, width
        self._from, self._to = from_domain, to_domain
        super().__init__({"i": In(bits), "o": Out(width)})

    def elaborate(self, platform):
        m = Module()
        k = self.bits
        follower, gray = Signal(k), Signal(k)
        step = add(follower, 1)
        with m.If(~same(follower, self.i)):
            m.d[self._from] += [follower.eq(step), gray.eq(step ^ step[1:])]
        crossed = Signal(k)
        m.submodules.sync = FFSynchronizer(gray, crossed, o_domain=self._to, stages=2)
        # Gray to binary: each bit the parity of the code's bits from it up.
        value = Signal(k)
        m.d.comb += value.eq(Cat(crossed[j:].xor() for j in range(k)))
        seen = Signal(k)
        m.d[self._to] += [seen.eq(value), self.o.eq(counted(m, self.o, value, seen, "counted"))]
        return m
