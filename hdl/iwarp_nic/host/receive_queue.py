"""Receive queues in host memory: each queue pair's receive buffers, handed to the placer in
the order they were posted, one per untagged message on queue 0 (RFC 5040 section 5.1: each
Send, and Immediate Data of RFC 7306, takes the next receive posted; RFC 5041 section 5.3
for the buffers of DDP's untagged model). A queue pair has a receive queue of its own or takes
its receives from a shared receive queue (an SRQ, as the verbs have it), whose entries go, in
the order posted, to whichever of its queue pairs' messages comes first.

A receive queue is a ring (:mod:`.rings`) of :data:`~.formats.RQ_WQE_BYTES`-octet entries,
each an :data:`~.formats.RqWqe`, read when the placer asks for the connection's next receive.
"""

from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..ddp.placement import ReceiveOffer
from ..exact import add, eq, is_zero, select, widened
from ..rdmap import HostRead
from ..stream import BeatStream, check_data_bytes
from ..tcp.layouts import ConnRef, conn_bits, with_conn
from .descriptor import DescriptorUnpacker
from .formats import RQ_WQE_BYTES, RqWqe
from .rings import Doorbell, ReceiveRing, Ring, Rings

__all__ = ["ReceiveQueueEngine"]


class ReceiveQueueEngine(wiring.Component):
    """The receive queues of ``conns`` queue pairs, one per connection, and ``srqs`` shared
    receive queues, answering the several-connection placer's questions for a connection's
    next receive.

    Queues are numbered: queue pair ``k``'s own is ``k``, shared receive queue ``s`` is
    ``conns + s``.

    Ports
    -----
    i_ring : In(stream.Signature(with_conn(ReceiveRing(srqs), conns)))
        A queue pair made afresh: a receive queue of its own, made afresh, or the shared
        receive queue it takes its receives from (:func:`~.rings.ReceiveRing`). Always ready.
    i_srq_ring : In(stream.Signature(with_conn(Ring, srqs)))
        A shared receive queue made afresh. Ready unless ``i_ring`` is valid.
    i_doorbell : In(stream.Signature(with_conn(Doorbell, conns + srqs)))
        The driver's doorbell of a queue, by its number (:mod:`.rings`). Always ready.
    i_ask, o_receive : In(stream.Signature(ConnRef(conns))), Out(stream.Signature(ReceiveOffer))
        The placer's ``o_ask_receive`` and ``i_receive``: for each question, the next
        receive posted on the connection's queue (``id``: its entry's index in that queue),
        or ``posted`` 0 when it has none. One question at a time.
    o_fetch, i_fetched : Out(stream.Signature(HostRead)), In(BeatStream(data_bytes, err=True))
        Reads of host memory, one entry each (the DMA engine's read client).
    o_fetch_error : Out(stream.Signature(ConnRef(conns)))
        An entry for connection ``conn`` could not be read: the question is answered with
        ``posted`` 0 (the message finds no buffer), and the entry is used up.

    Latency: the answer to a connection with nothing posted comes the cycle after the
    question is taken; with an entry posted, after the DMA engine's read and the entry's
    beats, plus a cycle.
    """

    def __init__(self, data_bytes, *, conns=16, srqs=4):
        if not isinstance(srqs, int) or srqs < 1:
            raise ValueError(f"srqs must be a positive integer, not {srqs!r}")
        self.data_bytes = check_data_bytes(data_bytes)
        self.conns, self.srqs = conns, srqs
        super().__init__({
            "i_ring": In(stream.Signature(with_conn(ReceiveRing(srqs), conns))),
            "i_srq_ring": In(stream.Signature(with_conn(Ring, srqs))),
            "i_doorbell": In(stream.Signature(with_conn(Doorbell, conns + srqs))),
            "i_ask": In(stream.Signature(ConnRef(conns))),
            "o_receive": Out(stream.Signature(ReceiveOffer)),
            "o_fetch": Out(stream.Signature(HostRead)),
            "i_fetched": In(BeatStream(data_bytes, err=True)),
            "o_fetch_error": Out(stream.Signature(ConnRef(conns))),
        })

    def elaborate(self, platform):
        m = Module()
        queues = self.conns + self.srqs
        rings = Rings(queues, RQ_WQE_BYTES, "rq")
        m.submodules.unpacker = unpacker = DescriptorUnpacker(RqWqe, self.data_bytes)
        wiring.connect(m, wiring.flipped(self.i_fetched), unpacker.i)
        ask, out, fetch, error = self.i_ask, self.o_receive, self.o_fetch, self.o_fetch_error
        # Each connection's queue: its own until its queue pair is made with a shared one.
        queue_of = [Signal(conn_bits(queues), name=f"rq_queue{k}", init=k)
                    for k in range(self.conns)]
        opened = self._opened(m, queue_of)

        conn, index = Signal(conn_bits(self.conns)), Signal(16)     # the question answered
        fetching = Signal()                 # its entry is being read
        m.d.comb += ask.ready.eq(~(fetching | fetch.valid | out.valid | error.valid))
        queue = select(m, ask.payload.conn, queue_of, conn_bits(queues), "asked_queue")
        addr, next_index = rings.entry(m, queue)
        has = select(m, queue, list(rings.posted()), 1, "has_posted")
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

        for k in range(queues):
            with m.If(asked & has & eq(queue, k)):
                rings.advance(m, k)
        rings.update(m, opened, self.i_doorbell)
        return m

    def _opened(self, m, queue_of):
        """The queues made afresh, as one stream (a queue pair's own ring from ``i_ring``,
        a shared one's from ``i_srq_ring``); ``queue_of`` set as each queue pair is made."""
        pair, shared = self.i_ring, self.i_srq_ring
        bits = conn_bits(self.conns + self.srqs)
        opened = stream.Signature(with_conn(Ring, self.conns + self.srqs)).create()
        own = is_zero(pair.payload.srq)
        # SRQ s is queue conns + s; a queue pair's ``srq`` is s + 1.
        srq_opened = add(widened(m, shared.payload.conn, bits, "srq_opened"), self.conns)
        srq_taken = add(widened(m, pair.payload.srq, bits, "srq_taken"), self.conns - 1)
        m.d.comb += [
            pair.ready.eq(1), shared.ready.eq(~pair.valid),
            opened.valid.eq((pair.valid & own) | shared.valid),
            opened.payload.base.eq(Mux(pair.valid, pair.payload.base, shared.payload.base)),
            opened.payload.log2_entries.eq(Mux(pair.valid, pair.payload.log2_entries,
                                               shared.payload.log2_entries)),
            opened.payload.conn.eq(Mux(pair.valid, pair.payload.conn, srq_opened)),
        ]
        for k in range(self.conns):
            with m.If(pair.valid & eq(pair.payload.conn, k)):
                m.d.sync += queue_of[k].eq(Mux(own, k, srq_taken))
        return opened
