"""Completion queues in host memory: RFC 5040 section 5 (each work request completes, in the
order of its queue's kind: a Send, Write or Immediate Data when its payload has been sent, a
Read or an atomic when its answer has been placed, a receive when its message has been
placed) and section 5.4 (a completion is signaled only after its data is placed).

A completion queue is a ring (:mod:`.rings`) of :data:`~.formats.CQE_BYTES`-octet entries
written by the NIC; its doorbell is the driver's head (the index after the last entry it has
read), so the NIC never overwrites an entry not yet read.
"""

from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..ddp.placement import PlaceRequest, ReadDone, ReceiveCompletion
from ..exact import eq, select, wrap_sub
from ..rdmap import Refused, Sent
from ..roundrobin import merge
from ..stream import BeatStream, HalfRateSlice, check_data_bytes, sliced
from ..tcp.layouts import conn_bits, with_conn
from .descriptor import DescriptorPacker
from .fence import WriteFence
from .formats import CQE_BYTES, Cqe, CqeFlags, CqeKind
from .rings import Doorbell, Ring, Rings

__all__ = ["QueuePairCqs", "CqEvent", "CompletionWriter"]

_LOC_QP_OP_ERR, _WR_FLUSH_ERR = 2, 5        # enum ibv_wc_status


def QueuePairCqs(conns, cqs):
    """Queue pair ``conn``'s completion queues: of its send queue and of its receive queue."""
    return StructLayout({"conn": conn_bits(conns), "send_cq": conn_bits(cqs),
                         "recv_cq": conn_bits(cqs)})


def CqEvent(cqs):
    """Completion queue ``cq`` has a new entry in host memory; or, with ``overflow``, one was
    lost, the queue being full; or, with ``error``, an entry's write failed."""
    return StructLayout({"cq": conn_bits(cqs), "overflow": 1, "error": 1})


class CompletionWriter(wiring.Component):
    """The completions of ``conns`` queue pairs, written into ``cqs`` completion queues.

    Ports
    -----
    i_cq : In(stream.Signature(with_conn(Ring, cqs)))
        Completion queue ``conn`` made afresh (its ``conn`` field names the queue): empty, the
        next entry written at index 0 with ``owner`` 1. Always ready.
    i_head : In(stream.Signature(with_conn(Doorbell, cqs)))
        The driver has read the entries before ``tail`` (its head) of queue ``conn``. Always
        ready.
    i_qp : In(stream.Signature(QueuePairCqs(conns, cqs)))
        Queue pair ``conn``'s send and receive completion queues. Always ready.
    i_sent, i_read_done, i_refused, i_complete :
        The engine's ``o_sent`` (a Send, Write or Immediate Data done: SUCCESS),
        ``o_read_done`` (a Read or atomic ended), ``o_refused`` (a work request refused:
        LOC_QP_OP_ERR, or flushed: WR_FLUSH_ERR) and ``o_complete`` (a receive done), each
        naming its connection. Taken round robin.
    place_issued, place_done : In(writers), In(writers)
        The host memory writes the engine issues (placements, atomics' results), and their
        ends (:class:`~.fence.WriteFence`): a completion is written only after the writes
        issued before it are done.
    o_write, o_data : Out(stream.Signature(PlaceRequest)), Out(BeatStream(data_bytes))
        The entries' writes (the DMA engine's write client).
    i_written : In(stream.Signature(StructLayout({"error": 1})))
        The DMA engine's ``done`` of each entry's write, in order.
    o_event : Out(stream.Signature(CqEvent(cqs)))
        After each entry's write is done (``error`` if it failed), or, with ``overflow``,
        instead of an entry that did not fit: its queue, for the host's interrupt status.

    Throughput: an entry every two cycles (the fence's), as long as the DMA engine takes
    them. Latency: an entry's write is asked for four cycles after its completion is taken,
    when no write before it is outstanding (its completion is registered, waits a cycle in
    the fence, and is registered again before its queue is chosen). A full queue loses the
    completion and says so; the queue pair's other completions go on. The entries of one
    queue are written in the order the completions came.
    """

    def __init__(self, data_bytes, *, conns=16, cqs=16, writers=1):
        self.data_bytes = check_data_bytes(data_bytes)
        self.conns, self.cqs = conns, cqs
        done = StructLayout({"error": 1})
        super().__init__({
            "i_cq": In(stream.Signature(with_conn(Ring, cqs))),
            "i_head": In(stream.Signature(with_conn(Doorbell, cqs))),
            "i_qp": In(stream.Signature(QueuePairCqs(conns, cqs))),
            "i_sent": In(stream.Signature(with_conn(Sent, conns))),
            "i_read_done": In(stream.Signature(with_conn(ReadDone, conns))),
            "i_refused": In(stream.Signature(with_conn(Refused, conns))),
            "i_complete": In(stream.Signature(with_conn(ReceiveCompletion, conns))),
            "place_issued": In(writers), "place_done": In(writers),
            "o_write": Out(stream.Signature(PlaceRequest)),
            "o_data": Out(BeatStream(data_bytes)),
            "i_written": In(stream.Signature(done)),
            "o_event": Out(stream.Signature(CqEvent(cqs))),
        })
        self._writers = writers

    def elaborate(self, platform):
        m = Module()
        conns, cq_bits = self.conns, conn_bits(self.cqs)

        # Each queue pair's completion queues.
        send_cq = [Signal(cq_bits, name=f"send_cq{k}") for k in range(conns)]
        recv_cq = [Signal(cq_bits, name=f"recv_cq{k}") for k in range(conns)]
        qp = self.i_qp
        m.d.comb += qp.ready.eq(1)
        for k in range(conns):
            with m.If(qp.valid & eq(qp.payload.conn, k)):
                m.d.sync += [send_cq[k].eq(qp.payload.send_cq), recv_cq[k].eq(qp.payload.recv_cq)]

        # The four kinds of completion as entries, one taken at a time, round robin. Each
        # input is registered first (a one-entry slice: a completion of a kind every other
        # cycle at most, as fast as the fence passes entries), so the grant and the decision
        # below reach back into the engine only through a register.
        Entry = StructLayout({"cqe": Cqe, "recv": 1})
        sources = []
        for name in ("sent", "read_done", "refused", "complete"):
            port = getattr(self, f"i_{name}")
            source = stream.Signature(port.payload.shape()).flip().create(path=(f"{name}_in",))
            sliced(m, f"{name}_skid", wiring.flipped(port), source, half_rate=True)
            sources.append(source)
        entries = [Signal(Entry, name=f"entry_{k}") for k in range(len(sources))]
        for entry, source in zip(entries, sources):
            m.d.comb += [entry.cqe.wqe.eq(source.payload.id), entry.cqe.qp.eq(source.payload.conn)]
        sent, ended, refused, received = entries
        m.d.comb += [
            ended.cqe.status.eq(sources[1].payload.status.as_value()),
            refused.cqe.status.eq(Mux(sources[2].payload.flushed, _WR_FLUSH_ERR,
                                      _LOC_QP_OP_ERR)),
        ]
        done = sources[3].payload
        m.d.comb += [
            received.recv.eq(1), received.cqe.kind.eq(CqeKind.RECV),
            received.cqe.status.eq(done.status.as_value()),
            received.cqe.byte_len.eq(done.byte_len), received.cqe.imm_data.eq(done.imm_data),
            received.cqe.invalidated.eq(done.invalidated),
            received.cqe.flags.eq(Mux(done.with_imm, CqeFlags.WITH_IMM, 0)
                                  | Mux(done.with_inv, CqeFlags.WITH_INV, 0)
                                  | Mux(done.solicited, CqeFlags.SOLICITED, 0)),
        ]
        m.submodules.fence = fence = WriteFence(Entry, writers=self._writers)
        m.d.comb += [fence.issued.eq(self.place_issued), fence.done.eq(self.place_done)]
        chosen = fence.i
        offered, _ = merge(m, sources, entries, chosen.payload, chosen.ready, "completion")
        m.d.comb += chosen.valid.eq(offered)

        # Each entry, registered again after the fence, into its queue's next slot, unless the
        # queue is full.
        m.submodules.decided = decided = HalfRateSlice(Entry)
        wiring.connect(m, fence.o, decided.i)
        rings = Rings(self.cqs, CQE_BYTES, "cq")    # next: the producer; tail: the driver's
        head = decided.o.payload
        conn = head.cqe.qp[:conn_bits(conns)]
        cq = Signal(cq_bits)
        m.d.comb += cq.eq(Mux(head.recv, select(m, conn, recv_cq, cq_bits, "recv_cq_of"),
                              select(m, conn, send_cq, cq_bits, "send_cq_of")))
        addr, index = rings.entry(m, cq)
        log2 = select(m, cq, rings.log2, 4, "cq_log2")
        consumed = select(m, cq, rings.tail, 16, "cq_consumed")
        used = wrap_sub(m, index, consumed, 16, "cq_used")   # written and not yet read
        fits = ~select(m, log2, {j: used[j:].any() for j in range(16)}, 1, "cq_full")
        second = select(m, log2, {j: index[j] for j in range(16)}, 1, "cq_pass")   # odd pass

        # Written: the entry's write, its octets through the packer, its queue remembered
        # for the event once the write is done. Not written: the overflow event at once.
        m.submodules.entries = queued = SyncFIFOBuffered(width=Cqe.size, depth=4)
        m.submodules.packer = packer = DescriptorPacker(Cqe, self.data_bytes)
        m.submodules.pending = pending = SyncFIFOBuffered(width=cq_bits, depth=8)
        write, event, written = self.o_write, self.o_event, self.i_written
        cqe = Signal(Cqe)
        m.d.comb += [cqe.eq(head.cqe), cqe.owner.eq(~second), queued.w_data.eq(cqe),
                     packer.i.payload.eq(queued.r_data), packer.i.valid.eq(queued.r_rdy),
                     queued.r_en.eq(packer.i.ready)]
        wiring.connect(m, packer.o, wiring.flipped(self.o_data))
        event_free = ~event.valid | event.ready
        m.d.comb += written.ready.eq(event_free)
        report = written.valid & written.ready
        room = (~write.valid | write.ready) & queued.w_rdy & pending.w_rdy
        go = decided.o.valid & Mux(fits, room, event_free & ~written.valid)
        store = go & fits
        m.d.comb += [decided.o.ready.eq(go), queued.w_en.eq(store),
                     pending.w_data.eq(cq), pending.w_en.eq(store), pending.r_en.eq(report)]
        with m.If(write.ready):
            m.d.sync += write.valid.eq(0)
        with m.If(store):
            m.d.sync += [write.valid.eq(1), write.payload.addr.eq(addr),
                         write.payload.length.eq(CQE_BYTES)]
        with m.If(event.ready):
            m.d.sync += event.valid.eq(0)
        with m.If(report):
            m.d.sync += [event.valid.eq(1), event.payload.cq.eq(pending.r_data),
                         event.payload.overflow.eq(0),
                         event.payload.error.eq(written.payload.error)]
        with m.If(go & ~fits):
            m.d.sync += [event.valid.eq(1), event.payload.cq.eq(cq), event.payload.overflow.eq(1),
                         event.payload.error.eq(0)]
        for k in range(self.cqs):
            with m.If(go & fits & eq(cq, k)):
                rings.advance(m, k)
        rings.update(m, self.i_cq, self.i_head)
        return m
