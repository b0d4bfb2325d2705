"""Send queues in host memory: each queue pair's work requests, fetched and given to the
request issuer in the order they were posted (RFC 5040 section 5: a send queue's messages
are sent in order), each connection's given back and fetched again when it must wait.

A send queue is a ring (:mod:`.rings`) of :data:`~.formats.SQ_WQE_BYTES`-octet entries. The
engine reads each entry's first 64 octets (the :data:`~.formats.SqWqe`) through the DMA engine,
and offers the work request it describes with the entry's index as its ``id``.
"""

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..exact import add, eq, same, select
from ..rdmap import HostRead, WorkRequest
from ..roundrobin import round_robin
from ..stream import BeatStream, check_data_bytes
from ..tcp.layouts import ConnRef, conn_bits, with_conn
from .descriptor import DescriptorUnpacker
from .formats import SQ_INLINE_OFFSET, SQ_WQE_BYTES, SqFlags, SqWqe
from .rings import Doorbell, Ring, Rings

__all__ = ["SendQueueEngine"]


class SendQueueEngine(wiring.Component):
    """The send queues of ``conns`` queue pairs, one per connection.

    Ports
    -----
    i_ring : In(stream.Signature(with_conn(Ring, conns)))
        Connection ``conn``'s send queue made afresh: its ring, no entry posted, none
        fetched. Entries of the queue it replaces that are still being fetched are dropped.
        Always ready.
    i_doorbell : In(stream.Signature(with_conn(Doorbell, conns)))
        The driver posted entries up to ``tail`` (free-running): the engine fetches each entry
        before it. Always ready.
    o_fetch, i_fetched : Out(stream.Signature(HostRead)), In(BeatStream(data_bytes, err=True))
        Reads of host memory: 64 octets of an entry each, answered in order (the DMA engine's
        read client).
    o_work : Out(stream.Signature(with_conn(WorkRequest, conns)))
        The work requests, in each connection's posted order (``id``: the entry's index).
    i_deferred : In(stream.Signature(with_conn({"id": 16}, conns)))
        The issuer's ``o_deferred``: the work request ``id`` taken at the edge before must
        wait. The engine fetches the connection's entries again from that one, once the
        connection is woken (``i_wake``, or every ``retry_cycles`` cycles); the issuer gives
        back the entries taken after it too, which the engine does not count again. Always
        ready.
    i_wake : In(stream.Signature(ConnRef(conns)))
        Something a waiting work request may wait for happened on connection ``conn`` (a
        Read's end, the peer's first FPDU). Always ready.
    o_fetch_error : Out(stream.Signature(ConnRef(conns)))
        An entry of connection ``conn`` could not be read: the engine drops that
        connection's entries fetched after it and fetches none until its queue is made
        afresh.

    Throughput: one fetch per cycle, up to ``ahead`` entries fetched and not yet taken, over
    the connections with entries posted, round robin; a work request per cycle. Latency:
    one cycle from the doorbell to the fetch, the DMA engine's read latency, the descriptor's
    beats, then one cycle to ``o_work``.
    """

    def __init__(self, data_bytes, *, conns=16, ahead=8, retry_cycles=256):
        self.data_bytes = check_data_bytes(data_bytes)
        if not isinstance(ahead, int) or ahead < 1:
            raise ValueError(f"ahead must be a positive integer, not {ahead!r}")
        if not isinstance(retry_cycles, int) or retry_cycles < 2 or \
                retry_cycles & (retry_cycles - 1):
            raise ValueError(f"retry_cycles must be a power of two, not {retry_cycles!r}")
        self.conns, self.ahead, self.retry_cycles = conns, ahead, retry_cycles
        super().__init__({
            "i_ring": In(stream.Signature(with_conn(Ring, conns))),
            "i_doorbell": In(stream.Signature(with_conn(Doorbell, conns))),
            "o_fetch": Out(stream.Signature(HostRead)),
            "i_fetched": In(BeatStream(data_bytes, err=True)),
            "o_work": Out(stream.Signature(with_conn(WorkRequest, conns))),
            "i_deferred": In(stream.Signature(with_conn(StructLayout({"id": 16}), conns))),
            "i_wake": In(stream.Signature(ConnRef(conns))),
            "o_fetch_error": Out(stream.Signature(ConnRef(conns))),
        })

    def elaborate(self, platform):
        m = Module()
        conns, bits = self.conns, conn_bits(self.conns)

        # Each queue: its ring (the next entry to fetch), and
        #   epoch: toggled when the entries fetched before are no longer wanted;
        #   rewound: fetching again from a deferred entry (the issuer's later deferrals of
        #     the same connection are of entries after it), until an entry of the new epoch
        #     is taken;
        #   paused: until woken; stopped: a fetch failed.
        rings = Rings(conns, SQ_WQE_BYTES, "sq")

        def regs(name, width):
            return [Signal(width, name=f"{name}{k}") for k in range(conns)]
        epoch, rewound = regs("epoch", 1), regs("rewound", 1)
        paused, stopped = regs("paused", 1), regs("stopped", 1)

        # Fetch: round robin over the queues with entries to fetch, while there is room.
        Pending = StructLayout({"conn": bits, "index": 16, "epoch": 1})
        # The entries fetched and not yet taken or dropped, oldest first.
        m.submodules.pending = pending = SyncFIFOBuffered(width=Pending.size, depth=self.ahead)
        wants = rings.posted() & ~Cat(paused) & ~Cat(stopped)
        fetch = self.o_fetch
        can = (~fetch.valid | fetch.ready) & pending.w_rdy
        take = Signal()
        grant = round_robin(m, wants, take, "fetch")
        m.d.comb += take.eq(can & grant.any())
        chosen = Signal(bits)
        for k in range(conns):
            with m.If(grant[k]):
                m.d.comb += chosen.eq(k)
        addr, index = rings.entry(m, chosen)
        chosen_epoch = select(m, chosen, epoch, 1, "chosen_epoch")
        entry = Pending(pending.w_data)
        m.d.comb += [entry.conn.eq(chosen), entry.index.eq(index),
                     entry.epoch.eq(chosen_epoch), pending.w_en.eq(take)]
        with m.If(fetch.ready):
            m.d.sync += fetch.valid.eq(0)
        with m.If(take):
            m.d.sync += [fetch.valid.eq(1), fetch.payload.addr.eq(addr),
                         fetch.payload.length.eq(SQ_INLINE_OFFSET)]

        # Fetched: each entry, its work request offered unless its queue moved on since.
        m.submodules.unpacker = unpacker = DescriptorUnpacker(SqWqe, self.data_bytes)
        wiring.connect(m, wiring.flipped(self.i_fetched), unpacker.i)
        head = Pending(pending.r_data)
        wqe, work = unpacker.o.payload.value, self.o_work.payload
        current = same(select(m, head.conn, epoch, 1, "head_epoch"), head.epoch)
        arrived = unpacker.o.valid & pending.r_rdy
        failed = unpacker.o.payload.err
        offer = arrived & current & ~failed
        error = self.o_fetch_error
        m.d.comb += [
            work.conn.eq(head.conn), work.id.eq(head.index),
            work.message.opcode.eq(wqe.opcode), work.message.stag.eq(wqe.stag),
            work.message.to.eq(wqe.to), work.message.inv_stag.eq(wqe.inv_stag),
            work.message.length.eq(wqe.length), work.source.eq(wqe.source),
            work.sink_stag.eq(wqe.sink_stag), work.sink_to.eq(wqe.sink_to),
            work.size.eq(wqe.size), work.request_id.eq(wqe.request_id),
            work.fence.eq((wqe.flags & SqFlags.FENCE).any()),
            self.o_work.valid.eq(offer),
            error.payload.conn.eq(head.conn),
            error.valid.eq(arrived & current & failed),
            unpacker.o.ready.eq(pending.r_rdy & Mux(current, Mux(failed, error.ready,
                                                                 self.o_work.ready), 1)),
        ]
        m.d.comb += pending.r_en.eq(unpacker.o.valid & unpacker.o.ready)
        taken = self.o_work.valid & self.o_work.ready

        # Every retry_cycles cycles, each paused queue is woken.
        tick = Signal(range(self.retry_cycles))
        m.d.sync += tick.eq(add(tick, 1))
        back, wake = self.i_deferred, self.i_wake
        m.d.comb += [back.ready.eq(1), wake.ready.eq(1)]
        for k in range(conns):
            # In priority order: each later assignment overrides an earlier one.
            with m.If(take & grant[k]):
                rings.advance(m, k)
            with m.If(eq(tick, 0) | (wake.valid & eq(wake.payload.conn, k))):
                m.d.sync += paused[k].eq(0)
            with m.If(taken & eq(head.conn, k)):
                m.d.sync += rewound[k].eq(0)
            with m.If(error.valid & error.ready & eq(head.conn, k)):
                m.d.sync += [stopped[k].eq(1), epoch[k].eq(~epoch[k])]
            with m.If(back.valid & eq(back.payload.conn, k) & ~rewound[k]):
                m.d.sync += [rings.next[k].eq(back.payload.id), rewound[k].eq(1),
                             paused[k].eq(1),
                             epoch[k].eq(~epoch[k])]
        rings.update(m, self.i_ring, self.i_doorbell, lambda k: [
            epoch[k].eq(~epoch[k]), rewound[k].eq(0), paused[k].eq(0), stopped[k].eq(0)])
        return m
