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
    """Apply one verdict per buffered payload: deliver its new bytes, drop it, or park it.

    Ports
    -----
    i_verdict : In(stream Verdict)
        One per payload packet: of ``i`` (in the order of ``i``) or, with ``parked``, of
        ``i_parked`` (in its order). Deliver ``length`` bytes to ``conn`` after skipping
        ``trim`` (bytes the connection already had), or drop the packet; with ``park``, move
        the packet of ``i`` whole to ``o_park``.
    i : In(BeatStream(data_bytes))
        The payload packets, from the receive buffer.
    i_parked : In(BeatStream(data_bytes))
        Parked payload packets, from the park buffer (what ``o_park`` stored).
    o_park : Out(BeatStream(data_bytes, err=True))
        Packets to park, unchanged (``err`` always 0), to the park buffer.
    o_header : Out(stream ChunkHeader); o : Out(BeatStream(data_bytes))
        Per delivered payload, ``{conn, length}`` and then its ``length`` bytes as one packet
        (realigned to lane 0). The header may be taken before or after the bytes.

    A verdict is held until its packet's last beat has been taken and, for a delivery, its
    header too, so the packets of the two inputs never mix. Throughput: one beat per cycle,
    plus one cycle per packet between verdicts and at most one in :class:`HeadTrim`; a
    dropped packet costs its beats. Back-pressure on ``o_header``, ``o`` or ``o_park`` holds
    the verdict and the packet it is for.
    """

    def __init__(self, data_bytes, conns):
        check_data_bytes(data_bytes)
        self.data_bytes = data_bytes
        self.conns = conns
        super().__init__({
            "i_verdict": In(stream.Signature(Verdict(conns))),
            "i": In(BeatStream(data_bytes)),
            "i_parked": In(BeatStream(data_bytes)),
            "o_park": Out(BeatStream(data_bytes, err=True)),
            "o_header": Out(stream.Signature(ChunkHeader(conns))),
            "o": Out(BeatStream(data_bytes)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.trim = trim = HeadTrim(self.data_bytes, 16)
        wiring.connect(m, trim.o, wiring.flipped(self.o))

        v = self.i_verdict.payload
        active = self.i_verdict.valid
        count_done, header_done, data_done = Signal(), Signal(), Signal()
        moving = v.park                      # this packet goes whole to o_park

        # The packet: from `i` to o_park, or from `i` or `i_parked` through the trim.
        take = active & ~data_done
        m.d.comb += [
            self.o_park.payload.data.eq(self.i.payload.data),
            self.o_park.payload.keep.eq(self.i.payload.keep),
            self.o_park.payload.last.eq(self.i.payload.last),
            self.o_park.valid.eq(take & moving & ~v.parked & self.i.valid),
            trim.i.payload.eq(Mux(v.parked, self.i_parked.payload, self.i.payload)),
            trim.i.valid.eq(take & ~moving & Mux(v.parked, self.i_parked.valid, self.i.valid)),
            self.i.ready.eq(take & ~v.parked & Mux(moving, self.o_park.ready, trim.i.ready)),
            self.i_parked.ready.eq(take & v.parked & ~moving & trim.i.ready),
        ]
        ended = Signal()
        m.d.comb += ended.eq(Mux(v.parked, self.i_parked.valid & self.i_parked.ready
                                 & self.i_parked.payload.last,
                                 self.i.valid & self.i.ready & self.i.payload.last))

        # The trim's count and the delivery's header, once each per verdict.
        m.d.comb += [
            trim.i_count.payload.eq(Mux(v.deliver, v.trim, _DROP_ALL)),
            trim.i_count.valid.eq(active & ~moving & ~count_done),
            self.o_header.payload.conn.eq(v.conn),
            self.o_header.payload.length.eq(v.length),
            self.o_header.valid.eq(active & v.deliver & ~header_done),
        ]
        count_ok = count_done | moving | trim.i_count.ready
        header_ok = header_done | ~v.deliver | self.o_header.ready
        data_ok = data_done | ended
        with m.If(active):
            with m.If(count_ok & header_ok & data_ok):
                m.d.comb += self.i_verdict.ready.eq(1)
                m.d.sync += [count_done.eq(0), header_done.eq(0), data_done.eq(0)]
            with m.Else():
                m.d.sync += [count_done.eq(count_ok), header_done.eq(header_ok),
                             data_done.eq(data_ok)]
        return m
