"""The requester's side of RDMAP: RFC 5040 sections 5.1 and 5.2 (the untagged queues' MSNs:
queue 0 for the Sends and Immediate Data, queue 1 for Read and Atomic Requests), 4.4 and 5.2
(a Read Request waits for the answer it asks for) and RFC 7306 section 5.2 (so does an Atomic
Request), with the outbound credit (ORD) of RFC 6581 section 4: at most ORD Reads and atomics
outstanding.

:class:`RequestIssuer` turns the host's work requests into messages for the
:class:`~.schedule.SendScheduler`, as the model's engine starts them (``_next_request``,
``_start``, ``_start_request``), and keeps the Reads and atomics outstanding, oldest first, for
the placer, which places their answers and takes each as it completes.
"""

from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..ddp.emit import Message
from ..ddp.placement import OutstandingRead
from ..exact import add, eq, is_zero, one_of, widened
from .respond import OutboundMessage

__all__ = ["WorkRequest", "RequestIssuer"]

_READ_REQUEST, _ATOMIC_REQUEST = 1, 10
_QUEUE_0 = (3, 4, 5, 6, 8, 9)       # the Sends and Immediate Data (RFC 5040 5.1, RFC 7306 10.2)

#: One work request, as the host's send queue engine gives it: the ``message`` to send (its
#: ``msn`` is assigned here) and ``source``, the host address of its payload. For a Read or
#: Atomic Request the payload is its RDMAP header (RFC 5040 figure 9, RFC 7306 figure 10),
#: which the driver writes into the work request, ``request_id`` included; the answer's sink
#: is ``sink_stag``/``sink_to`` (an lkey and address this end checks when the answer comes),
#: ``size`` octets (8 for an atomic). ``id`` names the work request in its completion;
#: ``fence``: it waits until no Read or atomic before it is outstanding.
WorkRequest = StructLayout({
    "message": Message, "source": 64, "id": 16, "sink_stag": 32, "sink_to": 64, "size": 32,
    "request_id": 32, "fence": 1,
})


class RequestIssuer(wiring.Component):
    """Give each work request its MSN, hold Reads and atomics to the ORD, track them.

    Ports
    -----
    i_work : In(stream.Signature(WorkRequest))
        The work requests, in the order posted.
    ord : In(14)
        The ORD negotiated: Reads and atomics that may be outstanding (at most ``max_ord``).
    o_send : Out(stream.Signature(OutboundMessage))
        The messages, in order, to the scheduler's send queue input.
    o_outstanding : Out(stream.Signature(OutstandingRead))
        The Reads and atomics outstanding, oldest first, offered from when the request is
        passed on (the placer's ``i_outstanding``); the consumer takes one when it completes,
        and its credit comes back.
    o_refused : Out(stream.Signature(16))
        The ``id`` of a Read or atomic posted while the ORD is 0: it is not sent, and no work
        request after it is taken until a reset (the model completes it with a local QP
        operation error and puts the send queue in error; the host flushes the rest).

    A Read or atomic waits while ``ord`` of them are outstanding, a fenced request while any
    is; the requests behind it wait too (the send queue is in order). Throughput: a work
    request per cycle. Latency: a message is offered the cycle after its work request is
    taken.
    """

    def __init__(self, *, max_ord=32):
        self.max_ord = max_ord
        super().__init__({
            "i_work": In(stream.Signature(WorkRequest)),
            "ord": In(14),
            "o_send": Out(stream.Signature(OutboundMessage)),
            "o_outstanding": Out(stream.Signature(OutstandingRead)),
            "o_refused": Out(stream.Signature(16)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.outstanding = fifo = SyncFIFOBuffered(width=OutstandingRead.size,
                                                           depth=self.max_ord)
        m.d.comb += [self.o_outstanding.valid.eq(fifo.r_rdy),
                     self.o_outstanding.payload.eq(fifo.r_data),
                     fifo.r_en.eq(self.o_outstanding.ready)]

        work = self.i_work.payload
        opcode = work.message.opcode
        request = one_of(opcode, (_READ_REQUEST, _ATOMIC_REQUEST))
        msn_0, msn_1 = Signal(32, init=1), Signal(32, init=1)
        level = fifo.level
        credit = widened(m, level, 14, "level_wide") < self.ord
        halted = Signal()               # a request was refused: the send queue is in error
        blocked = request & (~credit | ~fifo.w_rdy) | (work.fence & ~is_zero(level))
        refuse = request & is_zero(self.ord)
        out, refused = self.o_send, self.o_refused
        for port in (out, refused):
            with m.If(port.ready):
                m.d.sync += port.valid.eq(0)
        free = (~out.valid | out.ready) & (~refused.valid | refused.ready)

        entry = OutstandingRead(fifo.w_data)
        m.d.comb += [entry.atomic.eq(eq(opcode, _ATOMIC_REQUEST)), entry.complete.eq(1),
                     entry.id.eq(work.id), entry.stag.eq(work.sink_stag),
                     entry.to.eq(work.sink_to), entry.size.eq(work.size),
                     entry.request_id.eq(work.request_id)]
        with m.If(self.i_work.valid & free & ~halted):
            with m.If(refuse):
                m.d.comb += self.i_work.ready.eq(1)
                m.d.sync += [refused.valid.eq(1), refused.payload.eq(work.id), halted.eq(1)]
            with m.Elif(~blocked):
                m.d.comb += [self.i_work.ready.eq(1), fifo.w_en.eq(request)]
                msg = out.payload.message
                m.d.sync += [out.valid.eq(1), msg.eq(work.message), out.payload.inline.eq(0),
                             out.payload.source.eq(work.source), out.payload.data.eq(0)]
                with m.If(one_of(opcode, _QUEUE_0)):
                    m.d.sync += [msg.msn.eq(msn_0), msn_0.eq(add(msn_0, 1))]
                with m.Elif(request):
                    m.d.sync += [msg.msn.eq(msn_1), msn_1.eq(add(msn_1, 1))]
                with m.Else():
                    m.d.sync += msg.msn.eq(0)
        return m
