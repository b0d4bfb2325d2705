"""Width converters for beat streams (:func:`~iwarp_nic.stream.BeatStream`): the same bytes, the
same packets, more or fewer bytes per beat.

Where they serve: a MAC whose PHY interface is narrower than the core's datapath (GMII's one
byte at 125 MHz against a two-byte core at 62.5 MHz) runs in its own clock domain, and the
converters sit on its side of the clock-domain crossing, where the line's pace is kept
(:class:`~iwarp_nic.node.MacIp`).

* :class:`BeatUpsizer`: ``ratio`` narrow beats into one wide beat.
* :class:`BeatDownsizer`: a wide beat out as up to ``ratio`` narrow beats.
* :func:`resized`: whichever of the two a stream needs, or none.

Both keep every stream rule of :mod:`iwarp_nic.stream`: lane 0 first, ``keep`` contiguous from
lane 0 and partial only on ``last``, no empty beats; ``err`` (when present) only matters on a
packet's last beat and stays there.
"""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .exact import add, eq, gt, select
from .stream import BeatLayout, BeatStream, check_data_bytes

__all__ = ["BeatUpsizer", "BeatDownsizer", "resized"]


def resized(m, source, from_bytes, to_bytes, name, *, err=False):
    """The byte stream ``source`` (an interface that sends ``from_bytes`` per beat, with
    ``err`` or not) as an interface that sends ``to_bytes`` per beat: through a
    :class:`BeatUpsizer` or :class:`BeatDownsizer` added to ``m`` as ``name``, or ``source``
    itself when the widths are equal."""
    if from_bytes == to_bytes:
        return source
    if from_bytes < to_bytes:
        block = BeatUpsizer(from_bytes, to_bytes, err=err)
    else:
        block = BeatDownsizer(from_bytes, to_bytes, err=err)
    m.submodules[name] = block
    wiring.connect(m, source, block.i)
    return block.o


def _check_ratio(narrow_bytes, wide_bytes):
    check_data_bytes(narrow_bytes)
    check_data_bytes(wide_bytes)
    if wide_bytes <= narrow_bytes:
        raise ValueError(f"wide_bytes ({wide_bytes}) must be more than narrow_bytes "
                         f"({narrow_bytes})")
    return wide_bytes // narrow_bytes   # both powers of two: an exact ratio


class BeatUpsizer(wiring.Component):
    """Gather ``narrow_bytes`` beats into ``wide_bytes`` beats.

    Ports
    -----
    i : In(BeatStream(narrow_bytes, err=err, conns=conns))
    o : Out(BeatStream(wide_bytes, err=err, conns=conns))
        Narrow beat ``k`` of a wide beat fills its lanes ``k * narrow_bytes`` up; a wide beat is
        complete after ``ratio`` narrow beats or at a packet's last, and leaves with that beat's
        ``last``, ``err`` and ``conn`` (a packet's beats all name one connection).

    Throughput: one narrow beat per cycle, sustained, while ``o`` takes what it is offered.
    Latency: a wide beat is offered (from a register) the cycle after its last narrow beat is
    taken. Back-pressure: ``i.ready`` is low while a complete wide beat waits on ``o``.
    """

    def __init__(self, narrow_bytes, wide_bytes, *, err=False, conns=None):
        self.ratio = _check_ratio(narrow_bytes, wide_bytes)
        self.narrow_bytes, self.wide_bytes = narrow_bytes, wide_bytes
        self.err, self.conns = err, conns
        super().__init__({"i": In(BeatStream(narrow_bytes, err=err, conns=conns)),
                          "o": Out(BeatStream(wide_bytes, err=err, conns=conns))})

    def elaborate(self, platform):
        m = Module()
        n, ratio = self.narrow_bytes, self.ratio
        beat, out = self.i.payload, self.o.payload
        slot = Signal(range(ratio))             # where the next narrow beat goes
        data = [Signal(8 * n, name=f"data{k}") for k in range(ratio)]
        keep = [Signal(n, name=f"keep{k}") for k in range(ratio)]

        m.d.comb += self.i.ready.eq(~self.o.valid | self.o.ready)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.i.valid & self.i.ready):
            complete = beat.last | eq(slot, ratio - 1)
            for k in range(ratio):
                with m.If(eq(slot, k)):
                    m.d.sync += [data[k].eq(beat.data), keep[k].eq(beat.keep)]
            with m.If(complete):
                # The wide beat: the slots gathered so far, this one, nothing past it.
                m.d.sync += [
                    self.o.valid.eq(1), slot.eq(0), out.last.eq(beat.last),
                    out.data.eq(Cat(Mux(eq(slot, k), beat.data, data[k]) for k in range(ratio))),
                    out.keep.eq(Cat(Mux(eq(slot, k), beat.keep,
                                        Mux(gt(slot, k), keep[k], Const(0, n))
                                        if k < ratio - 1 else Const(0, n))
                                    for k in range(ratio))),
                ]
                if self.err:
                    m.d.sync += out.err.eq(beat.err)
                if self.conns is not None:
                    m.d.sync += out.conn.eq(beat.conn)
            with m.Else():
                m.d.sync += slot.eq(add(slot, 1))
        return m


class BeatDownsizer(wiring.Component):
    """Send each ``wide_bytes`` beat as ``narrow_bytes`` beats, its empty lanes left out.

    Ports
    -----
    i : In(BeatStream(wide_bytes, err=err, conns=conns))
    o : Out(BeatStream(narrow_bytes, err=err, conns=conns))
        Lanes ``k * narrow_bytes`` up of a wide beat make narrow beat ``k``; the wide beat's
        ``last`` and ``err`` go on the narrow beat holding its last byte, its ``conn`` on each.

    Throughput: one narrow beat per cycle, sustained: the next wide beat is taken in the cycle
    the current one's last narrow beat is. Latency: the first narrow beat is offered (from the
    wide beat's register) the cycle after the wide beat is taken. Back-pressure on ``o`` holds
    the wide beat, then ``i``.
    """

    def __init__(self, wide_bytes, narrow_bytes, *, err=False, conns=None):
        self.ratio = _check_ratio(narrow_bytes, wide_bytes)
        self.narrow_bytes, self.wide_bytes = narrow_bytes, wide_bytes
        self.err, self.conns = err, conns
        super().__init__({"i": In(BeatStream(wide_bytes, err=err, conns=conns)),
                          "o": Out(BeatStream(narrow_bytes, err=err, conns=conns))})

    def elaborate(self, platform):
        m = Module()
        n, ratio = self.narrow_bytes, self.ratio
        held = Signal(BeatLayout(self.wide_bytes, err=self.err, conns=self.conns))
        held_valid = Signal()
        slot = Signal(range(ratio))             # the narrow beat on offer
        out = self.o.payload
        # The narrow beat on offer is the wide beat's last when the next slot is empty.
        final = Signal()
        m.d.comb += final.eq(eq(slot, ratio - 1) | ~Cat(
            held.keep[(k + 1) * n] & eq(slot, k) for k in range(ratio - 1)).any())
        m.d.comb += [
            self.o.valid.eq(held_valid),
            out.data.eq(select(m, slot, [held.data.word_select(k, 8 * n) for k in range(ratio)],
                               8 * n, "slot_data")),
            out.keep.eq(select(m, slot, [held.keep.word_select(k, n) for k in range(ratio)], n,
                               "slot_keep")),
            out.last.eq(held.last & final),
            self.i.ready.eq(~held_valid | (self.o.ready & final)),
        ]
        if self.err:
            m.d.comb += out.err.eq(held.err & final)
        if self.conns is not None:
            m.d.comb += out.conn.eq(held.conn)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += slot.eq(Mux(final, 0, add(slot, 1)))
            with m.If(final):
                m.d.sync += held_valid.eq(0)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [held.eq(self.i.payload), held_valid.eq(1), slot.eq(0)]
        return m
