"""The requester's side of RDMAP: RFC 5040 sections 5.1 and 5.2 (the untagged queues' MSNs:
queue 0 for the Sends and Immediate Data, queue 1 for Read and Atomic Requests), 4.4 and 5.2
(a Read Request waits for the answer it asks for) and RFC 7306 section 5.2 (so does an Atomic
Request), with the outbound credit (ORD) of RFC 6581 section 4: at most ORD Reads and atomics
outstanding.

:class:`RequestIssuer` turns the host's work requests into messages for the
:class:`~.schedule.SendScheduler`, as the model's engine starts them (``_next_request``,
``_start``, ``_start_request``), and keeps the Reads and atomics outstanding, oldest first, for
the placer, which places their answers and takes each as it completes. With several
connections the Reads and atomics go to the :class:`~iwarp_nic.ddp.outstanding.OutstandingTable`.
"""

from amaranth import C, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..ddp.emit import Message
from ..ddp.placement import OutstandingRead
from ..exact import add, eq, is_zero, lt, one_of, same, widened
from ..tcp.layouts import conn_bits, with_conn
from .respond import OutboundMessage

__all__ = ["WorkRequest", "Refused", "RequestIssuer"]

_READ_REQUEST, _ATOMIC_REQUEST = 1, 10
_QUEUE_0 = (3, 4, 5, 6, 8, 9)       # the Sends and Immediate Data (RFC 5040 5.1, RFC 7306 10.2)

#: One work request, as the host's send queue engine gives it: the ``message`` to send (its
#: ``msn`` is assigned here) and ``source``, the host address of its payload. For a Read or
#: Atomic Request the payload is its RDMAP header (RFC 5040 figure 9, RFC 7306 figure 10),
#: which the driver writes into the work request, ``request_id`` included; the answer's sink
#: is ``sink_stag``/``sink_to`` (an lkey and address this end checks when the answer comes),
#: ``size`` octets (8 for an atomic). ``id`` names the work request in its completion;
#: ``fence``: it waits until no Read or atomic before it is outstanding. ``rtr``: the
#: peer-to-peer Initiator's RTR message (RFC 6581 section 7), which the engine sends first: a
#: Read RTR is sent whatever the ORD, and its end is not reported.
WorkRequest = StructLayout({
    "message": Message, "source": 64, "id": 16, "sink_stag": 32, "sink_to": 64, "size": 32,
    "request_id": 32, "fence": 1, "rtr": 1,
})

#: A work request not sent: ``id``; ``flushed`` 0 for the Read or atomic refused for an ORD
#: of 0 (the model completes it with a local QP operation error), 1 for each work request of
#: the stream taken after it (the model flushes them).
Refused = StructLayout({"id": 16, "flushed": 1})

# What the issuer keeps of a stream: the next MSNs of queues 0 and 1, the ORD, whether a
# refusal put the send queue in error, and (several connections) the work request deferred.
_Context = StructLayout({"msn_0": 32, "msn_1": 32, "ord": 14, "halted": 1, "waiting": 1,
                         "waiting_id": 16})
_FRESH = {"msn_0": 1, "msn_1": 1}


class RequestIssuer(wiring.Component):
    """Give each work request its MSN, hold Reads and atomics to the ORD, track them.

    ``conns`` None: one stream, whose state is kept in registers. ``conns`` an integer: that
    many connections, each with its own state (MSNs, ORD, refusal, the request deferred) as a
    word of a memory (distributed RAM), read as its work request is offered and written back
    the cycle after it is taken; the work requests carry their connection, and so does every
    output.

    Ports
    -----
    i_work : In(stream.Signature(with_conn(WorkRequest, conns)))
        The work requests, each connection's in the order posted.
    ord : In(14)
        One stream: the ORD negotiated, Reads and atomics that may be outstanding (at most
        ``max_ord`` are kept).
    i_open : In(stream.Signature(with_conn({"ord": 14}, conns)))
        Several connections: connection ``conn``'s slot is made afresh for a new stream (MSNs
        1, not in error, nothing deferred) with its ORD. Always ready, and taken before a work
        request offered in the same cycle. The stream that had the slot before must have no
        work request in flight (its outstanding Reads are cleared from the table apart).
    o_send : Out(stream.Signature(with_conn(OutboundMessage, conns)))
        The messages, each connection's in order, to the scheduler's send queue input; each
        with its work request's ``id``, and ``report`` for a Send, Write or Immediate Data
        (not a Read or Atomic Request, whose end the placer reports, nor an RTR).
    o_outstanding : Out(stream.Signature(with_conn(OutstandingRead, conns)))
        One stream: the Reads and atomics outstanding, oldest first, offered from when the
        request is passed on (the placer's ``i_outstanding``); the consumer takes one when it
        completes, and its credit comes back. Several connections: each Read or atomic once,
        as its request is passed on, to be appended to its connection's FIFO of the
        :class:`~iwarp_nic.ddp.outstanding.OutstandingTable` (its ``i_push``).
    outstanding_conn, outstanding : Out(conn_bits(conns)), In(14)
        Several connections: the connection of the work request offered, and the number of
        its Reads and atomics outstanding (the table's ``count_conn`` and ``count``,
        combinational).
    o_refused : Out(stream.Signature(with_conn(Refused, conns)))
        The ``id`` of a Read or atomic posted while its stream's ORD is 0: it is not sent, and
        each work request of that stream after it is taken and given here too, ``flushed``,
        until a reset (one stream) or an ``i_open`` of the slot (the model puts the send queue
        in error; the host completes these).
    o_deferred : Out(stream.Signature(with_conn({"id": 16}, conns)))
        Several connections: a work request that must wait is not held (that would hold every
        other connection's work back) but taken and given back here. From then on the
        connection's work requests are all deferred until that one is offered again and can
        go; the send queue engine offers it again later (when the connection's outstanding
        count falls: the placer's retire of that connection).
    held : In(1)
        Several connections: the connection of the work request offered may not send yet (a
        Responder before the Initiator's first FPDU, RFC 5044 section 7.1.2): its work request
        is deferred as one that must wait is (combinational, from ``i_work``'s ``conn``).

    A Read or atomic waits while ``ord`` of them are outstanding (or ``max_ord``), a fenced
    request while any is; with one stream the work requests behind it wait too (the send
    queue is in order; ``i_work`` is not ready). Throughput: a work request per cycle (with
    several connections, one per two cycles of the same connection, and of a connection just
    opened: its state is written back in between; a Read, atomic or fenced request waits a
    cycle after its connection's Read or atomic before it, while that one reaches the table).
    Latency: a message is offered the cycle after its work request is taken. Bad input: a
    ``conn`` of ``conns`` or more reads and writes no real connection's state (its memory word
    is one of the spare ones, or the access is dropped).
    """

    def __init__(self, *, max_ord=32, conns=None):
        if conns is not None:
            conn_bits(conns)                # checks conns
        self.max_ord, self.conns = max_ord, conns
        ports = {
            "i_work": In(stream.Signature(with_conn(WorkRequest, conns))),
            "o_send": Out(stream.Signature(with_conn(OutboundMessage, conns))),
            "o_outstanding": Out(stream.Signature(with_conn(OutstandingRead, conns))),
            "o_refused": Out(stream.Signature(with_conn(Refused, conns))),
        }
        if conns is None:
            ports["ord"] = In(14)
        else:
            ports |= {
                "i_open": In(stream.Signature(with_conn(StructLayout({"ord": 14}), conns))),
                "outstanding_conn": Out(conn_bits(conns)), "outstanding": In(14),
                "held": In(1),
                "o_deferred": Out(stream.Signature(with_conn(StructLayout({"id": 16}),
                                                             conns))),
            }
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        work = self.i_work.payload
        opcode = work.message.opcode
        request = one_of(opcode, (_READ_REQUEST, _ATOMIC_REQUEST))
        out, refused, push = self.o_send, self.o_refused, self.o_outstanding
        several = self.conns is not None
        registered = [out, refused] + ([push, self.o_deferred] if several else [])
        for port in registered:
            with m.If(port.ready):
                m.d.sync += port.valid.eq(0)
        free = Signal()
        m.d.comb += free.eq(1)
        for port in registered:
            with m.If(port.valid & ~port.ready):
                m.d.comb += free.eq(0)

        # The stream's state (`now`), what it becomes if the work request is taken (`update`),
        # and its Reads and atomics outstanding (`level`; `pending`, one not yet counted).
        now, update, level = Signal(_Context), Signal(_Context), Signal(14)
        taken = Signal()
        m.d.comb += [update.eq(now), taken.eq(self.i_work.valid & self.i_work.ready)]
        entry = Signal(OutstandingRead)
        m.d.comb += [entry.atomic.eq(eq(opcode, _ATOMIC_REQUEST)), entry.complete.eq(~work.rtr),
                     entry.id.eq(work.id), entry.stag.eq(work.sink_stag),
                     entry.to.eq(work.sink_to), entry.size.eq(work.size),
                     entry.request_id.eq(work.request_id)]
        sent = Signal()                     # the work request is taken and its message sent
        if several:
            m.submodules.contexts = mem = Memory(shape=_Context,
                                                 depth=1 << conn_bits(self.conns), init=[])
            read, write = mem.read_port(domain="comb"), mem.write_port()
            opening = self.i_open
            m.d.comb += [read.addr.eq(work.conn), now.eq(read.data),
                         self.outstanding_conn.eq(work.conn), level.eq(self.outstanding),
                         opening.ready.eq(1)]
            # The word is written the cycle after (registered: the decision does not reach the
            # memory's write data in its cycle), and a work request of that connection waits
            # for it: read in that cycle, its word would be the old one.
            with m.If(opening.valid):
                m.d.sync += [write.en.eq(1), write.addr.eq(opening.payload.conn),
                             write.data.eq(_Context.const(_FRESH)),
                             write.data.ord.eq(opening.payload.ord)]
            with m.Else():
                m.d.sync += [write.en.eq(taken), write.addr.eq(work.conn), write.data.eq(update)]
            writing = write.en & same(write.addr, work.conn)
            pending = push.valid & same(push.payload.conn, work.conn)
            with m.If(sent & request):
                m.d.sync += [push.valid.eq(1), push.payload.eq(entry),
                             push.payload.conn.eq(work.conn)]
            for port in (out, refused, self.o_deferred):
                with m.If(taken):
                    m.d.sync += port.payload.conn.eq(work.conn)
            offered = self.i_work.valid & free & ~opening.valid & ~writing
        else:
            m.submodules.outstanding = fifo = SyncFIFOBuffered(width=OutstandingRead.size,
                                                               depth=self.max_ord)
            m.d.comb += [push.valid.eq(fifo.r_rdy), push.payload.eq(fifo.r_data),
                         fifo.r_en.eq(push.ready), fifo.w_data.eq(entry),
                         fifo.w_en.eq(sent & request),
                         level.eq(widened(m, fifo.level, 14, "level_wide"))]
            held = Signal(_Context, init=_FRESH)
            m.d.comb += [now.eq(held), now.ord.eq(self.ord)]
            with m.If(taken):
                m.d.sync += held.eq(update)
            pending = C(0, 1)
            offered = self.i_work.valid & free

        credit = (level < now.ord) & lt(level, self.max_ord) & ~pending
        blocked = request & ~credit & ~work.rtr | work.fence & (~is_zero(level) | pending)
        if several:
            blocked |= self.held
        refuse = request & is_zero(now.ord) & ~work.rtr
        resumes = ~now.waiting | same(work.id, now.waiting_id)   # several connections

        def give_back(port, **fields):
            m.d.comb += self.i_work.ready.eq(1)
            m.d.sync += [port.valid.eq(1), port.payload.id.eq(work.id)]
            m.d.sync += [port.payload[name].eq(value) for name, value in fields.items()]

        def defer():
            give_back(self.o_deferred)
            m.d.comb += [update.waiting.eq(1), update.waiting_id.eq(work.id)]

        with m.If(offered):
            with m.If(now.halted):
                give_back(refused, flushed=1)
            if several:
                with m.Elif(~resumes):          # still waiting for the one deferred first
                    give_back(self.o_deferred)
            with m.Elif(refuse):
                give_back(refused, flushed=0)
                m.d.comb += update.halted.eq(1)
            with m.Elif(blocked):
                if several:
                    defer()
            with m.Else():
                m.d.comb += [self.i_work.ready.eq(1), sent.eq(1), update.waiting.eq(0)]
                msg = out.payload.message
                m.d.sync += [out.valid.eq(1), msg.eq(work.message), out.payload.inline.eq(0),
                             out.payload.source.eq(work.source), out.payload.data.eq(0),
                             out.payload.id.eq(work.id),
                             out.payload.report.eq(~request & ~work.rtr)]
                with m.If(one_of(opcode, _QUEUE_0)):
                    m.d.sync += msg.msn.eq(now.msn_0)
                    m.d.comb += update.msn_0.eq(add(now.msn_0, 1))
                with m.Elif(request):
                    m.d.sync += msg.msn.eq(now.msn_1)
                    m.d.comb += update.msn_1.eq(add(now.msn_1, 1))
                with m.Else():
                    m.d.sync += msg.msn.eq(0)
        return m
