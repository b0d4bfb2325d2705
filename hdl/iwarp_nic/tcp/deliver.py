"""Received payloads from the receive buffer to the host, as the control's verdicts say.

Implements the delivery half of RFC 9293 section 3.10.7.4 "seventh" (segment text passed to the
user in sequence): the control has already decided, per segment, which bytes are new; this block
only moves them.
"""

from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..stream import BeatStream, check_data_bytes
from ..trim import HeadTrim
from .control import Verdict
from .layouts import ChunkHeader

__all__ = ["RxDeliver"]

_DROP_ALL = 0xFFFF   # a trim count no payload reaches: HeadTrim then emits nothing


class RxDeliver(wiring.Component):
    """Apply one verdict per buffered payload: deliver its new bytes, or drop it.

    Ports
    -----
    i_verdict : In(stream Verdict)
        One per payload packet of ``i``, in the same order: deliver ``length`` bytes to ``conn``
        after skipping ``trim`` (bytes the connection already had), or drop the packet.
    i : In(BeatStream(data_bytes))
        The payload packets, from the receive buffer.
    o_header : Out(stream ChunkHeader); o : Out(BeatStream(data_bytes))
        Per delivered payload, ``{conn, length}`` and then its ``length`` bytes as one packet
        (realigned to lane 0). The header may be taken before or after the bytes.

    Throughput: one beat per cycle, plus at most one cycle per packet (:class:`HeadTrim`); a
    dropped packet costs its beats. A verdict is held until the trim count and (for a delivery)
    the header have both been taken, so back-pressure on ``o_header`` holds ``o`` too.
    """

    def __init__(self, data_bytes, conns):
        check_data_bytes(data_bytes)
        self.data_bytes = data_bytes
        self.conns = conns
        super().__init__({
            "i_verdict": In(stream.Signature(Verdict(conns))),
            "i": In(BeatStream(data_bytes)),
            "o_header": Out(stream.Signature(ChunkHeader(conns))),
            "o": Out(BeatStream(data_bytes)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.trim = trim = HeadTrim(self.data_bytes, 16)
        wiring.connect(m, wiring.flipped(self.i), trim.i)
        wiring.connect(m, trim.o, wiring.flipped(self.o))

        v = self.i_verdict.payload
        count_done = Signal()
        header_done = Signal()
        m.d.comb += [
            trim.i_count.payload.eq(Mux(v.deliver, v.trim, _DROP_ALL)),
            trim.i_count.valid.eq(self.i_verdict.valid & ~count_done),
            self.o_header.payload.conn.eq(v.conn),
            self.o_header.payload.length.eq(v.length),
            self.o_header.valid.eq(self.i_verdict.valid & v.deliver & ~header_done),
        ]
        count_ok = count_done | trim.i_count.ready
        header_ok = header_done | ~v.deliver | self.o_header.ready
        with m.If(self.i_verdict.valid):
            with m.If(count_ok & header_ok):
                m.d.comb += self.i_verdict.ready.eq(1)
                m.d.sync += [count_done.eq(0), header_done.eq(0)]
            with m.Else():
                m.d.sync += [count_done.eq(count_ok), header_done.eq(header_done
                                                                   | self.o_header.ready)]
        return m
