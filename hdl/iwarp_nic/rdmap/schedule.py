"""What a stream sends next: RFC 5040 sections 5.3 and 5.4 (RDMA Read Responses go out in the
order their requests came, beside the requester's own messages) and RFC 7306 section 5.2
(Atomic Responses among them), with the payload of each message read from host memory or
carried by the message itself.

:class:`SendScheduler` takes turns, message by message, between the send queue (work the host
posted: Sends, Writes, Read Requests, ...) and the responses the
:class:`~.respond.RequestResponder` produced, so neither starves the other, and answers each
payload fetch of the :class:`~iwarp_nic.ddp.StreamSender`: with a host-memory read, or with the
octets an inline message carries.
"""

from amaranth import C, Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..ddp.emit import Fetch, Message
from ..exact import add, is_zero, lt, mask, select, shift_right, widened, wrap_add, wrap_sub
from ..stream import BeatStream, check_data_bytes
from ..tcp.layouts import conn_bits, with_conn
from .respond import INLINE_BYTES, OutboundMessage

__all__ = ["HostRead", "Sent", "SendScheduler"]

#: A read of ``length`` octets of host memory at ``addr``.
HostRead = StructLayout({"addr": 64, "length": 16})
#: A work request whose message no longer needs host memory (:data:`OutboundMessage`
#: ``report``).
Sent = StructLayout({"id": 16})

_DEPTH = 4                  # messages planned whose payload is still being fetched
_FETCHES = 8                # fetches whose payload has not left yet


class SendScheduler(wiring.Component):
    """Round-robin between the send queue and the responses; fetches answered in order.

    ``conns`` None: one stream. ``conns`` an integer: the messages of that many connections,
    each naming its own (``conn``), which the scheduler passes on; the send queue engine
    chooses whose work comes next.

    Ports
    -----
    i_send : In(stream.Signature(with_conn(OutboundMessage, conns)))
        Work from the send queue: a message and the host address of its payload (``source``).
    i_response : In(stream.Signature(with_conn(OutboundMessage, conns)))
        Read and Atomic Responses from the :class:`~.respond.RequestResponder`.
    o_message : Out(stream.Signature(with_conn(Message, conns)))
        The messages in the order they are to be sent, to the
        :class:`~iwarp_nic.ddp.StreamSender`.
    i_fetch : In(stream.Signature(Fetch))
        The sender's payload fetches, in message order.
    o_read : Out(stream.Signature(with_conn(HostRead, conns)))
        Each fetch of a message from host memory as a host-memory read: the message's
        ``source`` plus the fetch's offset (and its connection).
    i_host : In(BeatStream(data_bytes))
        The data of each host read, one packet per read, in order.
    o_payload : Out(BeatStream(data_bytes))
        One packet per fetch, in fetch order, to the sender: the host read's data, or the
        octets an inline message carries (from the fetch's offset).
    response_sent, response_inline : Out(1), Out(1)
        ``response_sent`` one cycle high as the last fetch of a response is taken (its last
        segment is then in the sender's hands), or for a response without payload once it is
        passed on (a cycle later, or more when ends coincide): its IRD credit may come back
        (the RequestResponder's ``done``), as the model's engine gives it back when the last
        segment is handed over. ``response_inline`` with it: that response was inline (an
        Atomic Response).
    response_conn : Out(conn_bits(conns))
        Several connections: with ``response_sent``, that response's connection.
    o_sent : Out(stream.Signature(with_conn(Sent, conns)))
        A message of the send queue with ``report`` is done with host memory: the last
        octet of its payload has been read and passed on (or, without a payload, the message
        was passed on). Its buffer may be used again; its work request completes. A queue
        of 8 holds these; once it is full, the payload of the next such message waits.

    When both inputs offer a message, they alternate: the one not served last goes first.
    Throughput: a message per cycle; fetches one per cycle; payload beats one per cycle.
    Latency: one cycle for a message, none for a fetch (``o_read`` follows ``i_fetch``
    combinationally), none for host data (``o_payload`` follows ``i_host``); an inline packet
    leaves from the cycle after its fetch. Back-pressure passes through; at most four messages
    with a payload may be fetching at once, eight fetches waiting for their data, and eight
    responses without a payload waiting for a cycle to be reported in.
    """

    def __init__(self, data_bytes, *, conns=None):
        self.data_bytes = check_data_bytes(data_bytes)
        self.conns = conns
        ports = {} if conns is None else {"response_conn": Out(conn_bits(conns))}
        super().__init__({
            **ports,
            "i_send": In(stream.Signature(with_conn(OutboundMessage, conns))),
            "i_response": In(stream.Signature(with_conn(OutboundMessage, conns))),
            "o_message": Out(stream.Signature(with_conn(Message, conns))),
            "i_fetch": In(stream.Signature(Fetch)),
            "o_read": Out(stream.Signature(with_conn(HostRead, conns))),
            "i_host": In(BeatStream(data_bytes)),
            "o_payload": Out(BeatStream(data_bytes)),
            "response_sent": Out(1),
            "response_inline": Out(1),
            "o_sent": Out(stream.Signature(with_conn(Sent, conns))),
        })

    def elaborate(self, platform):
        m = Module()
        # Per message with a payload, in order: where it comes from, its length and whether it
        # is a Read Response (and whose).
        several = self.conns is not None
        entry = with_conn(StructLayout({"source": 64, "length": 32, "response": 1, "inline": 1,
                                        "data": 8 * INLINE_BYTES, "id": 16, "report": 1}),
                          self.conns)
        m.submodules.sources = sources = SyncFIFOBuffered(width=entry.size, depth=_DEPTH)
        out = self.o_message
        last_response = Signal()        # the last message taken was a Read Response
        pick_response = (self.i_response.valid
                         & (~self.i_send.valid | ~last_response))
        chosen = Signal(with_conn(OutboundMessage, self.conns))
        with m.If(pick_response):
            m.d.comb += chosen.eq(self.i_response.payload)
        with m.Else():
            m.d.comb += chosen.eq(self.i_send.payload)
        has_payload = ~is_zero(chosen.message.length)
        offered = self.i_send.valid | self.i_response.valid
        # The responses without a payload passed on whose end is not reported yet (whose).
        m.submodules.unpaid = unpaid = SyncFIFOBuffered(width=conn_bits(self.conns or 1),
                                                        depth=_FETCHES)
        # The work requests done with host memory (o_sent): those with a payload as the last
        # octet of it passes, those without as they are passed on (each kind queued).
        sent_shape = with_conn(Sent, self.conns)
        m.submodules.paid_sent = paid_sent = SyncFIFOBuffered(width=sent_shape.size,
                                                              depth=_FETCHES)
        m.submodules.quiet_sent = quiet_sent = SyncFIFOBuffered(width=sent_shape.size,
                                                                depth=_FETCHES)
        take = (offered & (~out.valid | out.ready) & sources.w_rdy & unpaid.w_rdy
                & quiet_sent.w_rdy)
        m.d.comb += [
            self.i_response.ready.eq(take & pick_response),
            self.i_send.ready.eq(take & ~pick_response),
            sources.w_en.eq(take & has_payload),
        ]
        written = entry(sources.w_data)
        m.d.comb += [written.source.eq(chosen.source), written.length.eq(chosen.message.length),
                     written.response.eq(pick_response), written.inline.eq(chosen.inline),
                     written.data.eq(chosen.data), written.id.eq(chosen.id),
                     written.report.eq(chosen.report & ~pick_response)]
        if several:
            m.d.comb += written.conn.eq(chosen.conn)
        with m.If(out.ready):
            m.d.sync += out.valid.eq(0)
        with m.If(take):
            m.d.sync += [out.valid.eq(1), out.payload.eq(chosen.message),
                         last_response.eq(pick_response)]
            if several:
                m.d.sync += out.payload.conn.eq(chosen.conn)

        # Fetches: the head message's source plus the offset, or its inline octets from the
        # offset; the message is done with when a fetch reaches its end. Each fetch leaves a
        # note of where its packet comes from.
        note = StructLayout({"inline": 1, "length": range(INLINE_BYTES + 1),
                             "data": 8 * INLINE_BYTES,
                             "sent": with_conn(Sent, self.conns), "report": 1})
        m.submodules.notes = notes = SyncFIFOBuffered(width=note.size, depth=_FETCHES)
        head = entry(sources.r_data)
        fetch = self.i_fetch.payload
        end = wrap_add(m, fetch.offset, fetch.length, 32, "fetch_end")
        room = sources.r_rdy & notes.w_rdy
        read = self.o_read
        m.d.comb += [
            read.valid.eq(self.i_fetch.valid & room & ~head.inline),
            self.i_fetch.ready.eq(room & (read.ready | head.inline)),
            read.payload.addr.eq(wrap_add(m, head.source, fetch.offset, 64, "read_addr")),
            read.payload.length.eq(fetch.length),
        ]
        if several:
            m.d.comb += read.payload.conn.eq(head.conn)
        fetched = self.i_fetch.valid & self.i_fetch.ready
        written_note = note(notes.w_data)
        skip = fetch.offset[:(INLINE_BYTES - 1).bit_length()]
        padded = Cat(head.data, C(0, 8 * ((1 << len(skip)) - 1)))
        m.d.comb += [notes.w_en.eq(fetched), written_note.inline.eq(head.inline),
                     written_note.length.eq(fetch.length),
                     written_note.data.eq(shift_right(m, padded, skip, 8, "inline_from"))]
        finished = fetched & (end == head.length)
        m.d.comb += [written_note.report.eq(finished & head.report),
                     written_note.sent.id.eq(head.id)]
        if several:
            m.d.comb += written_note.sent.conn.eq(head.conn)
        # A response's end: the last fetch of one with a payload, or, in a cycle without one,
        # one of those without a payload passed on (queued until then: they may coincide).
        response_fetched = finished & head.response
        paid = ~response_fetched & unpaid.r_rdy
        m.d.comb += [
            unpaid.w_en.eq(take & pick_response & ~has_payload), unpaid.r_en.eq(paid),
            sources.r_en.eq(finished),
            self.response_sent.eq(response_fetched | paid),
            self.response_inline.eq(response_fetched & head.inline),
        ]
        if several:
            m.d.comb += [unpaid.w_data.eq(chosen.conn),
                         self.response_conn.eq(Mux(response_fetched, head.conn, unpaid.r_data))]
        quiet = Signal(sent_shape)
        m.d.comb += [quiet.id.eq(chosen.id), quiet_sent.w_data.eq(quiet),
                     quiet_sent.w_en.eq(take & ~pick_response & ~has_payload & chosen.report)]
        if several:
            m.d.comb += quiet.conn.eq(chosen.conn)
        sent = self.o_sent
        m.d.comb += [sent.valid.eq(paid_sent.r_rdy | quiet_sent.r_rdy),
                     sent.payload.eq(Mux(paid_sent.r_rdy, paid_sent.r_data, quiet_sent.r_data)),
                     paid_sent.r_en.eq(sent.ready),
                     quiet_sent.r_en.eq(sent.ready & ~paid_sent.r_rdy)]
        self._payload(m, note(notes.r_data), notes, paid_sent)
        return m

    def _payload(self, m, head, notes, sent):
        """Each fetch's packet: the host data passed through, or the inline octets a beat at
        a time; the last packet of a message with ``report`` writes its work request into the
        FIFO ``sent`` as its last beat passes (and waits for room there)."""
        n = self.data_bytes
        out, host = self.o_payload, self.i_host
        beats = -(-INLINE_BYTES // n)
        chunks = [head.data[8 * n * k:8 * n * (k + 1)] for k in range(beats)]
        left = Signal(range(INLINE_BYTES + 1))  # octets of the inline packet from this beat on
        if beats > 1:
            beat = Signal(range(beats))
            data = select(m, beat, chunks, 8 * n, "inline_data")
            length = widened(m, head.length, 8, "inline_length")
            m.d.comb += left.eq(wrap_sub(m, length, n * beat, 8, "inline_left"))
        else:
            data = chunks[0]
            m.d.comb += left.eq(head.length)
        last = lt(left, n + 1)
        keep = select(m, left, {k: mask(k) for k in range(1, min(n, INLINE_BYTES) + 1)}, n,
                      "inline_keep")
        with m.If(notes.r_rdy & head.inline):
            m.d.comb += [out.valid.eq(1), out.payload.data.eq(data),
                         out.payload.keep.eq(Mux(last, keep, mask(n))),
                         out.payload.last.eq(last), notes.r_en.eq(out.ready & last)]
            if beats > 1:
                with m.If(out.ready):
                    m.d.sync += beat.eq(Mux(last, 0, add(beat, 1)))
        with m.Elif(notes.r_rdy):
            room = ~head.report | sent.w_rdy
            ends = host.valid & out.ready & room & host.payload.last
            m.d.comb += [out.valid.eq(host.valid & room), out.payload.eq(host.payload),
                         host.ready.eq(out.ready & room), notes.r_en.eq(ends),
                         sent.w_data.eq(head.sent), sent.w_en.eq(ends & head.report)]
