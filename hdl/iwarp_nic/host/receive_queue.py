"""Receive queues in host memory: each queue pair's receive buffers, handed to the placer in
the order they were posted, one per untagged message on queue 0 (RFC 5040 section 5.1: each
Send, and Immediate Data of RFC 7306, takes the next receive posted; RFC 5041 section 5.3
for the buffers of DDP's untagged model).

A receive queue is a ring (:mod:`.rings`) of :data:`~.formats.RQ_WQE_BYTES`-octet entries,
each an :data:`~.formats.RqWqe`, read when the placer asks for the connection's next receive.
"""

from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..ddp.placement import ReceiveOffer
from ..exact import eq, select
from ..rdmap import HostRead
from ..stream import BeatStream, check_data_bytes
from ..tcp.layouts import ConnRef, conn_bits, with_conn
from .descriptor import DescriptorUnpacker
from .formats import RQ_WQE_BYTES, RqWqe
from .rings import Doorbell, Ring, Rings

__all__ = ["ReceiveQueueEngine"]


class ReceiveQueueEngine(wiring.Component):
    """The receive queues of ``conns`` queue pairs, one per connection, answering the
    several-connection placer's questions for a connection's next receive.

    Ports
    -----
    i_ring, i_doorbell : In(stream.Signature(with_conn(Ring, conns))), In(... Doorbell ...)
        A receive queue made afresh; the driver's doorbell (:mod:`.rings`). Always ready.
    i_ask, o_receive : In(stream.Signature(ConnRef(conns))), Out(stream.Signature(ReceiveOffer))
        The placer's ``o_ask_receive`` and ``i_receive``: for each question, the
        connection's next receive posted (``id``: its entry's index), or ``posted``
        0 when it has none. One question at a time.
    o_fetch, i_fetched : Out(stream.Signature(HostRead)), In(BeatStream(data_bytes, err=True))
        Reads of host memory, one entry each (the DMA engine's read client).
    o_fetch_error : Out(stream.Signature(ConnRef(conns)))
        An entry of connection ``conn`` could not be read: the question is answered with
        ``posted`` 0 (the message finds no buffer), and the entry is used up.

    Latency: the answer to a connection with nothing posted comes the cycle after the
    question is taken; with an entry posted, after the DMA engine's read and the entry's
    beats, plus a cycle.
    """

    def __init__(self, data_bytes, *, conns=16):
        self.data_bytes = check_data_bytes(data_bytes)
        self.conns = conns
        super().__init__({
            "i_ring": In(stream.Signature(with_conn(Ring, conns))),
            "i_doorbell": In(stream.Signature(with_conn(Doorbell, conns))),
            "i_ask": In(stream.Signature(ConnRef(conns))),
            "o_receive": Out(stream.Signature(ReceiveOffer)),
            "o_fetch": Out(stream.Signature(HostRead)),
            "i_fetched": In(BeatStream(data_bytes, err=True)),
            "o_fetch_error": Out(stream.Signature(ConnRef(conns))),
        })

    def elaborate(self, platform):
        m = Module()
        rings = Rings(self.conns, RQ_WQE_BYTES, "rq")
        m.submodules.unpacker = unpacker = DescriptorUnpacker(RqWqe, self.data_bytes)
        wiring.connect(m, wiring.flipped(self.i_fetched), unpacker.i)
        ask, out, fetch, error = self.i_ask, self.o_receive, self.o_fetch, self.o_fetch_error

        conn, index = Signal(conn_bits(self.conns)), Signal(16)     # the question answered
        fetching = Signal()                 # its entry is being read
        m.d.comb += ask.ready.eq(~(fetching | fetch.valid | out.valid | error.valid))
        addr, next_index = rings.entry(m, ask.payload.conn)
        has = select(m, ask.payload.conn, list(rings.posted()), 1, "has_posted")
        asked = ask.valid & ask.ready
        with m.If(fetch.ready):
            m.d.sync += fetch.valid.eq(0)
        with m.If(out.ready):
            m.d.sync += out.valid.eq(0)
        with m.If(error.ready):
            m.d.sync += error.valid.eq(0)
        with m.If(asked):
            m.d.sync += [conn.eq(ask.payload.conn), index.eq(next_index)]
            with m.If(has):
                m.d.sync += [fetch.valid.eq(1), fetch.payload.addr.eq(addr),
                             fetch.payload.length.eq(RQ_WQE_BYTES), fetching.eq(1)]
            with m.Else():
                m.d.sync += [out.valid.eq(1), out.payload.posted.eq(0)]

        entry = unpacker.o.payload.value
        m.d.comb += unpacker.o.ready.eq(fetching)
        with m.If(unpacker.o.valid & unpacker.o.ready):
            failed = unpacker.o.payload.err
            m.d.sync += [fetching.eq(0), out.valid.eq(1), out.payload.posted.eq(~failed),
                         out.payload.id.eq(index), out.payload.sges.eq(entry.sges.any()),
                         out.payload.lkey.eq(entry.lkey), out.payload.addr.eq(entry.addr),
                         out.payload.length.eq(entry.length),
                         error.valid.eq(failed), error.payload.conn.eq(conn)]

        for k in range(self.conns):
            with m.If(asked & has & eq(ask.payload.conn, k)):
                rings.advance(m, k)
        rings.update(m, self.i_ring, self.i_doorbell)
        return m
