"""Realigning a packed byte stream to a memory address for writing: the write-data side of an
unaligned AXI4 INCR burst, ARM IHI 0022 A3.4.3 (the first transfer of a burst at an unaligned
address has its byte lanes below the address inactive) and A3.4.3/A8 write strobes (``wstrb``
marks the lanes that hold valid data).

The read side's realignment (dropping the bytes before the address, packing to lane 0) is
:class:`iwarp_nic.trim.HeadTrim`.
"""

from amaranth import C, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..exact import shift_right, wire
from ..stream import BeatStream, check_data_bytes

__all__ = ["StrobeLayout", "LanePad"]


def StrobeLayout(data_bytes):
    """A beat bound for memory: ``data`` with ``strb`` marking its valid lanes (any pattern),
    ``last`` on a packet's final beat."""
    return data.StructLayout({"data": 8 * data_bytes, "strb": data_bytes, "last": 1})


class LanePad(wiring.Component):
    """Shift each packet of ``i`` up by ``count`` lanes (``count`` given per packet), so its first
    byte lands in lane ``count``: the beats of a write to an address ``count`` bytes past a
    ``data_bytes`` boundary.

    Ports
    -----
    i_count : In(stream.Signature(unsigned(log2(data_bytes))))
        One transfer per packet of ``i``, in the same order: its lane offset. It is taken with
        the packet's first beat (``i_count.ready`` depends on ``i.valid``), so it must not wait
        for that beat to be taken.
    i : In(BeatStream(data_bytes))
        Packets following the stream rules of :mod:`iwarp_nic.stream` (packed from lane 0,
        ``keep`` partial only on the last beat). A beat is taken only with its packet's count.
    o : Out(stream.Signature(StrobeLayout(data_bytes)))
        Each packet's bytes from lane ``count`` of its first beat on, in order; ``strb`` marks
        exactly the lanes holding them (so the first beat's lanes below ``count`` and the last
        beat's lanes past the packet's last byte are clear; other lanes' data is undefined);
        ``last`` on the beat with the packet's last byte. A packet of ``L`` bytes gives
        ``ceil((count + L) / data_bytes)`` beats: one per input beat, plus a *tail* beat when the
        last input beat's bytes spill over into one more beat.

    Method: every output beat is the window ``(held beat's lanes 1..n-1, new beat)`` shifted
    right by ``n - 1 - count`` lanes (a log shifter), the held beat being the packet's previous
    input beat (with no valid lanes at the start of a packet).

    Latency: an output beat is offered (from a register) the cycle after its input beat is taken;
    a tail beat the cycle after the beat before it. Throughput: one output beat per cycle while
    ``o`` is ready, across packets; an input beat per cycle except the cycle a tail leaves.
    Back-pressure: ``i.ready`` follows the output register (``~o.valid | o.ready``), and is low
    while a tail waits. Input that breaks the stream rules gives undefined strobes but never
    hangs the block.
    """

    def __init__(self, data_bytes):
        check_data_bytes(data_bytes)
        if data_bytes < 2:
            raise ValueError("LanePad needs data_bytes of 2 or more")
        self.data_bytes = data_bytes
        super().__init__({
            "i_count": In(stream.Signature(unsigned(data_bytes.bit_length() - 1))),
            "i": In(BeatStream(data_bytes)),
            "o": Out(stream.Signature(StrobeLayout(data_bytes))),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        lanes = n.bit_length() - 1
        beat, out = self.i.payload, self.o.payload

        body = Signal()                         # inside a packet (its first beat taken)
        pending = Signal()                      # a tail beat is due
        rot = Signal(lanes)                     # the packet's right shift, n - 1 - count
        carry_data = Signal(8 * n)
        carry_keep = Signal(n)

        # n - 1 - count is the complement of count in its lanes bits.
        rot_now = wire(m, Mux(body | pending, rot, ~self.i_count.payload), "rot_now")
        new_keep = Mux(pending, Const(0, n), beat.keep)
        win_data = shift_right(m, Cat(carry_data[8:], beat.data), rot_now, 8, "win_data")
        win_keep = shift_right(m, Cat(carry_keep[1:], new_keep), rot_now, 1, "win_keep")
        # A last beat spills into a tail when its lane rot_now + 1 holds a byte.
        spill = shift_right(m, Cat(beat.keep[1:], C(0, 1)), rot_now, 1, "spill")
        has_tail = wire(m, beat.last & spill, "has_tail")

        out_free = ~self.o.valid | self.o.ready
        m.d.comb += self.i.ready.eq(out_free & ~pending & (body | self.i_count.valid))
        accept = self.i.valid & self.i.ready
        m.d.comb += self.i_count.ready.eq(accept & ~body)

        with m.If(out_free):
            m.d.sync += self.o.valid.eq(0)
            with m.If(pending | accept):
                m.d.sync += [out.data.eq(win_data), out.strb.eq(win_keep), self.o.valid.eq(1),
                             out.last.eq(pending | (beat.last & ~has_tail))]
            with m.If(pending):
                m.d.sync += [pending.eq(0), carry_keep.eq(0)]
        with m.If(accept):
            m.d.sync += [body.eq(~beat.last), rot.eq(rot_now), carry_data.eq(beat.data),
                         carry_keep.eq(Mux(beat.last & ~has_tail, Const(0, n), beat.keep)),
                         pending.eq(has_tail)]
        return m
