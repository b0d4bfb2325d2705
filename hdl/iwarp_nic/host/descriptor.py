"""Descriptors between host memory's octets and the gateware's records: the little-endian
packing of :mod:`.formats` (bit ``k`` of a layout's value is bit ``k % 8`` of octet ``k // 8``),
done on byte streams as the DMA engine moves them.

* :class:`DescriptorUnpacker`: the octets of one descriptor, read from host memory, to its
  record (a work queue entry fetched).
* :class:`DescriptorPacker`: a record to its octets, for host memory (a completion written).
"""

from amaranth import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.wiring import In, Out

from ..exact import add, eq, mask
from ..stream import BeatStream, check_data_bytes

__all__ = ["Unpacked", "DescriptorUnpacker", "DescriptorPacker"]


def Unpacked(layout):
    """A descriptor read: its record, and ``err``, set when the read failed (the DMA
    engine's ``err`` on the packet's last beat) or the packet was not the descriptor's
    length."""
    return StructLayout({"value": layout, "err": 1})


def _octets(layout):
    if layout.size % 8:
        raise ValueError(f"a descriptor is whole octets, not {layout.size} bits")
    return layout.size // 8


class DescriptorUnpacker(wiring.Component):
    """One packet of octets in, the descriptor they hold out.

    Ports
    -----
    i : In(BeatStream(data_bytes, err=True))
        One packet per descriptor, its octets in memory order: exactly ``layout.size // 8``
        of them.
    o : Out(stream.Signature(Unpacked(layout)))
        The descriptor, offered the cycle after the packet's last beat is taken.

    Throughput: one beat per cycle, descriptors back to back (a descriptor of one beat per
    cycle). Back-pressure: ``i`` waits while a descriptor is offered and not taken. Bad
    input: a shorter packet leaves the octets it did not fill zero, a longer one has its extra
    octets dropped; either way ``err`` is set, as it is for a packet with ``err`` on its last
    beat.
    """

    def __init__(self, layout, data_bytes):
        self.layout, self.data_bytes = layout, check_data_bytes(data_bytes)
        self.octets = _octets(layout)
        super().__init__({"i": In(BeatStream(data_bytes, err=True)),
                          "o": Out(stream.Signature(Unpacked(layout)))})

    def elaborate(self, platform):
        m = Module()
        n, octets = self.data_bytes, self.octets
        beats = -(-octets // n)
        value = Signal(8 * beats * n)
        index = Signal(range(beats + 1))        # beats + 1: the packet ran past the descriptor
        err = Signal()
        full = mask(octets % n or n)            # the keep of the descriptor's last beat
        beat = self.i.payload
        lanes = Cat(lane.replicate(8) for lane in beat.keep)    # the octets the beat has
        m.d.comb += [self.o.payload.value.eq(value[:self.layout.size]),
                     self.o.payload.err.eq(err),
                     self.i.ready.eq(~self.o.valid | self.o.ready)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.i.valid & self.i.ready):
            with m.If(eq(index, 0)):        # a new descriptor: the octets after it are zero
                m.d.sync += value.eq(beat.data & lanes)
            for k in range(1, beats):
                with m.If(eq(index, k)):
                    m.d.sync += value[8 * n * k:8 * n * (k + 1)].eq(beat.data & lanes)
            # Not the descriptor's last octet: the packet is short, or (index saturated) long.
            wrong_length = ~eq(index, beats - 1) | ~eq(beat.keep, full)
            with m.If(beat.last):
                m.d.sync += [self.o.valid.eq(1), err.eq(beat.err | wrong_length), index.eq(0)]
            with m.Elif(~eq(index, beats)):
                m.d.sync += index.eq(add(index, 1)[:len(index)])
        return m


class DescriptorPacker(wiring.Component):
    """A descriptor in, its octets out as one packet.

    Ports
    -----
    i : In(stream.Signature(layout))
    o : Out(BeatStream(data_bytes))
        ``layout.size // 8`` octets in memory order; the first beat is offered in the cycle
        the descriptor is (no register between them).

    Throughput: one beat per cycle; a descriptor is taken with its last beat, and the next
    one's first beat follows with no gap. Back-pressure on ``o`` holds ``i``.
    """

    def __init__(self, layout, data_bytes):
        self.layout, self.data_bytes = layout, check_data_bytes(data_bytes)
        self.octets = _octets(layout)
        super().__init__({"i": In(stream.Signature(layout)), "o": Out(BeatStream(data_bytes))})

    def elaborate(self, platform):
        m = Module()
        n, octets = self.data_bytes, self.octets
        beats = -(-octets // n)
        value = Signal(8 * beats * n)
        index = Signal(range(max(beats, 2)))
        out = self.o.payload
        m.d.comb += value.eq(self.i.payload.as_value())
        last = eq(index, beats - 1)
        for k in range(beats):
            with m.If(eq(index, k)):
                m.d.comb += out.data.eq(value[8 * n * k:8 * n * (k + 1)])
        m.d.comb += [out.keep.eq(mask(n)), out.last.eq(last), self.o.valid.eq(self.i.valid),
                     self.i.ready.eq(self.o.ready & last)]
        with m.If(last):
            m.d.comb += out.keep.eq(mask(octets - n * (beats - 1)))
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += index.eq(0)
            with m.If(~last):
                m.d.sync += index.eq(add(index, 1)[:len(index)])
        return m
