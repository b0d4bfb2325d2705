"""Placement of what a stream receives: RFC 5041 sections 3, 4 and 7.2 (tagged placement,
untagged queue 0 placement into posted buffers, MSN/MO, their errors), RFC 5040 sections 5.1
to 5.3, 6 and 7 (RDMA Write, Read Response, Send and its SE and Invalidate variants, remote
invalidation, access rights), RFC 7306 sections 5.2.2 and 6 (Atomic Response, Immediate Data),
with the checks RFC 5042 sections 5 and 6 ask for before any octet is placed.

:class:`SegmentPlacer` stands between the :class:`~.segment.SegmentParser` and host memory. It
decides, one segment at a time in stream order, where each payload goes, exactly as the model's
engine does (``Connection._on_write`` and ``_on_untagged``):

* an RDMA Write with a payload is looked up in the STag table (STag, TO, length, Remote Write,
  the stream's PD) and placed at the host address of its TO;
* an RDMA Read Response must answer the oldest outstanding Read: its Data Sink STag, the TO
  that continues what has arrived, within the Read's size; it is looked up (Local Write) and
  placed; the last one must complete the size, and the Read is done;
* an Atomic Response (queue 3) must carry the queue's next MSN and answer the oldest
  outstanding request, an atomic with its Request Identifier; the original value it carries
  is placed in the atomic's 8-octet sink (looked up for Local Write), and the atomic is done;
* a Send of any variant or Immediate Data (queue 0) must carry the queue's next MSN; the first
  segment of a message (MO 0) takes the next posted receive, whose buffer is looked up (Local
  Write, all of it), and invalidates the STag of a Send with Invalidate; every segment must
  continue at the MO received so far and fit the buffer; its payload is placed at the buffer's
  host address plus its MO; the last one completes the receive;
* every other good segment goes on, unchanged, to the stages that handle it.

The first violation becomes a Terminate request with the RFC 6580 code the model's engine sends
(tagged faults are DDP's, access rights RDMAP's, RFC 5040 7.1), and the stream places nothing
from then on.
"""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import enum, stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..errors import OFFENDING_BYTES, TerminateCode, Violation
from ..exact import (
    Machine,
    add,
    eq,
    is_zero,
    mask,
    one_of,
    same,
    select,
    widened,
    wire,
    wrap_add,
    wrap_sub,
)
from ..fifo import PacketFifo
from ..headers import ATOMIC_RESPONSE, DDP_UNTAGGED
from ..stream import BeatLayout, BeatStream, SkidBuffer, check_data_bytes
from ..tcp.layouts import ConnRef, conn_bits, with_conn, without_conn
from .segment import INVALIDATE_OPCODES, QUEUE, SegmentHeader, tagged_fields, untagged_fields
from .stag import Access, Fault, InvalidateRequest, LookupRequest, LookupResult

__all__ = ["PlaceRequest", "PostedReceive", "CompletionStatus", "ReceiveCompletion",
           "OutstandingRead", "ReadDone", "OpenContext", "ReceiveOffer", "OldestRead",
           "SegmentPlacer"]

_WRITE, _READ_RESPONSE, _ATOMIC_RESPONSE = 0, 2, 11
_ATOMIC_BYTES = 8
_QUEUE_0 = tuple(op for op, qn in QUEUE.items() if qn == 0)
_IMMEDIATE = (8, 9)                 # Immediate Data, with SE
_SOLICITED = (5, 6, 9)              # Send with SE, with SE and Invalidate, Immediate Data with SE


#: A placement: ``length`` octets (1 or more) to write at host address ``addr``; the octets
#: follow as one packet on the data stream.
PlaceRequest = StructLayout({"addr": 64, "length": 16})

#: A receive posted on the stream's queue 0: ``id`` names it in its completion; with ``sges``
#: 1 its buffer is ``length`` octets at ``addr`` of the region of STag ``lkey``, with ``sges``
#: 0 it has none (it takes only empty messages and Immediate Data).
PostedReceive = StructLayout({"id": 16, "sges": 1, "lkey": 32, "addr": 64, "length": 32})


class CompletionStatus(enum.Enum, shape=3):
    """How a receive or a Read ended: the values of ``enum ibv_wc_status``."""

    SUCCESS = 0
    LOC_LEN_ERR = 1     # the message is longer than the receive's buffer
    LOC_PROT_ERR = 4    # the buffer failed its check (STag, PD, bounds, Local Write)


#: A receive is done: ``byte_len`` octets were placed; ``imm_data`` (with ``with_imm``) of an
#: Immediate Data message, ``invalidated`` (with ``with_inv``) the STag a Send with Invalidate
#: invalidated; ``solicited`` for the SE variants. The model's ``QP.complete_recv`` arguments.
ReceiveCompletion = StructLayout({
    "id": 16, "status": CompletionStatus, "byte_len": 32, "with_imm": 1, "imm_data": 64,
    "with_inv": 1, "invalidated": 32, "solicited": 1,
})

#: A Read or atomic this end asked for, oldest first, as its request was sent: its sink,
#: ``size`` octets at ``to`` under ``stag`` (8 for an atomic, which also has the
#: ``request_id`` of its Request); ``id`` names it in its :data:`ReadDone`, given only with
#: ``complete`` (not for the RTR Read of RFC 6581).
OutstandingRead = StructLayout({"atomic": 1, "complete": 1, "id": 16, "stag": 32, "to": 64,
                                "size": 32, "request_id": 32})

#: A Read or atomic is done: its Read Response or original value placed (``SUCCESS``), or its
#: sink failed the Local Write check (``LOC_PROT_ERR``, the stream ends).
ReadDone = StructLayout({"id": 16, "status": CompletionStatus})


def OpenContext(conns, pd_bits):
    """Several connections: connection ``conn``'s context made afresh, as a new stream takes its
    slot: the stream's protection domain, and ``send_rtr`` when the peer's Send RTR (RFC 6581
    section 7) used queue 0's MSN 1."""
    return StructLayout({"conn": conn_bits(conns), "pd": pd_bits, "send_rtr": 1})


#: Several connections: the answer to a question for a connection's next posted receive: the
#: receive with ``posted``, or ``posted`` 0 when the connection has none posted (the message
#: is then refused, as with ``i_receive`` empty and no ``receive_pending`` for one stream).
ReceiveOffer = StructLayout({**dict(PostedReceive.members), "posted": 1})

#: Several connections: the answer to a question for a connection's oldest outstanding Read or
#: atomic: it, with ``present``, or ``present`` 0 when there is none.
OldestRead = StructLayout({**dict(OutstandingRead.members), "present": 1})


def _Context(pd_bits, conns):
    """A stream's running state: queue 0's and queue 3's next MSNs, ``dead``; the message being
    received (its receive, octets so far, free room, next host address); the progress of the
    oldest Read Response (``fresh``, or its next TO and octets still to come). With several
    connections also the oldest outstanding Read (``head``, held once known and until it is
    retired) and the protection domain: one block-RAM word per connection."""
    fields = {"msn": 32, "msn_3": 32, "dead": 1,
              "active": 1, "receive": PostedReceive, "received": 32, "room": 32,
              "next_addr": 64, "fresh": 1, "expect_to": 64, "room_read": 32}
    if conns is not None:
        fields.update({"head": OutstandingRead, "head_valid": 1, "pd": pd_bits})
    return StructLayout(fields)


#: The state of a stream that has received nothing: both MSNs 1, no Read Response begun.
_FRESH = {"msn": 1, "msn_3": 1, "fresh": 1}

#: What the placer does with a segment: ``packet`` says a payload packet belongs to it, which
#: is placed at ``addr`` (``place``), forwarded (``forward``) or dropped; with ``inline``
#: the 8 octets of ``value`` are placed at ``addr`` instead; then, with ``complete``,
#: ``completion`` is offered, or with ``read_done`` the Read's id and status from it.
_Route = StructLayout({"packet": 1, "place": 1, "forward": 1, "addr": 64, "length": 16,
                       "inline": 1, "value": 64, "complete": 1, "read_done": 1,
                       "completion": ReceiveCompletion})


class SegmentPlacer(wiring.Component):
    """Check the segments of one stream and turn their payloads into placement requests.

    Ports
    -----
    i_header, i_payload : In(stream.Signature(SegmentHeader)), In(BeatStream(data_bytes))
        The :class:`~.segment.SegmentParser`'s outputs, connected directly: the payload packets
        are stored as they come (a segment's before its header), in a FIFO of ``fifo_beats``.
    pd : In(pd_bits)
        The protection domain of the stream's QP.
    i_receive : In(stream.Signature(PostedReceive))
        The receives posted on queue 0, in order; one is taken per message.
    receive_pending : In(1)
        A receive is posted that ``i_receive`` does not offer yet (it is being fetched): a
        message that finds ``i_receive`` empty waits for it instead of being refused.
    send_rtr : In(1)
        A cycle's pulse before the first segment: the peer's Send RTR (RFC 6581 section 7) used
        queue 0's MSN 1 (:class:`~.rtr.RtrCheck`).
    i_outstanding : In(stream.Signature(OutstandingRead))
        The Reads and atomics this end has outstanding, oldest first, each offered from when
        its request is sent (long before an answer can come); one is taken when its Read
        Response is complete.
    o_lookup, i_lookup : Out(stream.Signature(LookupRequest(pd_bits))),
                         In(stream.Signature(LookupResult))
        To and from the STag table: a lookup per good Write with a payload (Remote Write), per
        Read Response with a payload and per receive with a buffer (Local Write, the whole
        buffer); one at a time.
    o_invalidate, i_invalidate : Out(stream.Signature(InvalidateRequest(pd_bits))),
                                 In(stream.Signature(LookupResult))
        To and from the STag table: the STag of a Send with Invalidate, on the message's first
        segment, after its receive's lookup.
    o_place, o_data : Out(stream.Signature(PlaceRequest)), Out(BeatStream(data_bytes))
        A placement request per checked payload, then the payload as one packet.
    o_complete : Out(stream.Signature(ReceiveCompletion))
        A completion per receive taken, after the last placement of its message: success, or
        LOC_LEN_ERR (too long) or LOC_PROT_ERR (bad buffer), which also end the stream.
    o_read_done : Out(stream.Signature(ReadDone))
        A Read or atomic is done, after the last placement of its answer.
    o_fault : Out(stream.Signature(Violation))
        One Terminate request, offered two cycles after the check that fails (``dead`` is set
        a cycle before), for the first segment the parser found bad or that fails here:

        ==========================================  =========================================
        violation                                   code
        ==========================================  =========================================
        Write: STag unknown, other key, invalidated  DDP Invalid STag
        Write: STag of another PD                   DDP STag not associated with RDMAP stream
        Write: TO + length past 2**64               DDP TO wrap
        Write: outside the region                   DDP Base or bounds
        Write: no Remote Write right                RDMAP Access rights
        Read Response: no Read outstanding (or an   RDMAP Unexpected OpCode
        atomic is the oldest)
        Read Response: not the Read's sink STag     DDP Invalid STag
        Read Response: not the next TO, or past     DDP Base or bounds
        the Read's size
        Read Response: its sink fails the check     as for a Write, Local Write for Remote
        Read Response: the last one short           RDMAP Catastrophic, RDMAP stream
        Atomic Response: MSN not the next           DDP Invalid MSN, MSN range is not valid
        Atomic Response: no atomic outstanding, or  RDMAP Unexpected OpCode
        another Request Identifier
        Atomic Response: its sink fails the check   RDMAP Local Catastrophic (no copies)
        queue 0: MSN not the next                   DDP Invalid MSN, MSN range is not valid
        queue 0: MO not 0 (new) or not continuing   DDP Invalid MO
        queue 0: no receive posted                  DDP Invalid MSN, no buffer available
        queue 0: the receive's buffer fails          RDMAP Local Catastrophic (no copies)
        Invalidate: STag unknown or invalidated     RDMAP Operation, cannot invalidate
        Invalidate: other PD or not invalidatable   RDMAP Protection, cannot invalidate
        queue 0: message longer than the buffer     DDP Message too long
        ==========================================  =========================================
    o_header, o_payload : Out(stream.Signature(SegmentHeader)), Out(BeatStream(data_bytes))
        Every other good segment (Read Request, Atomic Request, Terminate), header first, then
        its payload if it has one. The header offered is the placer's own register: the next
        header is not taken until it goes.
    dead : Out(1)
        Set from the first error on: an FPDU the deframer marked bad (its error event is the
        deframer's to report) or a Terminate request. Nothing is placed or forwarded after it;
        payloads are drained. A receive taken for a message that then failed without its own
        completion (an MSN, MO or invalidation error after it) is left to the host's flush.
    bad_fpdu : Out(1)
        A cycle's pulse when the FPDU the deframer marked bad is decided: every segment before
        it has been checked, and any Terminate request of theirs offered on ``o_fault``. The
        deframer's error event waits for it, so errors are reported in stream order.

    A zero-length Write places nothing and is not looked up (the model returns early too); an
    empty Send places nothing but completes its receive.

    Throughput: a segment is decided while the payloads of the ones before are still going out
    (a queue of three decisions), so placement runs at one payload beat per cycle for segments
    longer than the decision's few cycles plus, for a Write or a message's first segment, the
    table's latency. Latency: the placement request is offered four cycles after the lookup
    result arrives, three after the header when there is no lookup (a cycle to take the header
    and make its checks, one to decide, one to write the route, one to read it). The FIFO's
    output passes a register slice, a cycle the payload spends while its header is decided (it
    was stored before the header came), so its first beat can go with the request. Back-pressure
    on any output holds the stages behind it; the FIFO then stalls ``i_payload``. A payload
    packet longer than ``fifo_beats`` would never fit: the deframer's ``max_ulpdu`` must keep
    segments below it.

    Several connections (``conns``)
    -------------------------------
    The headers are the several-connection parser's (:func:`~.segment.TaggedSegmentHeader`),
    each naming its connection; the payloads keep their order. Each connection's state (a
    :func:`_Context`, 631 bits with its oldest Read and PD) is a word of a block RAM of
    ``conns`` words; the placer holds one in registers. A header of another connection costs two
    cycles: the held word is written back and the connection's word read. A train of one
    connection's segments costs nothing. The ports that differ from one stream's:

    i_open : In(stream.Signature(OpenContext(conns, pd_bits)))
        A connection's context made afresh (its PD, its Send RTR), before its first segment;
        it replaces ``pd`` and ``send_rtr``. Taken between segments.
    o_ask_receive, i_receive : Out(stream.Signature(ConnRef(conns))),
                               In(stream.Signature(ReceiveOffer))
        For a message's first segment, the connection's next posted receive is asked for and
        waited on; the answer is the receive, or none posted (then the message is refused).
        This replaces ``receive_pending``: the answer comes only once it is known.
    o_ask_oldest, i_oldest, o_retire : Out(stream.Signature(ConnRef(conns))),
                                       In(stream.Signature(OldestRead)),
                                       Out(stream.Signature(ConnRef(conns)))
        A Read or Atomic Response of a connection whose oldest outstanding request is not
        known asks for it (a few cycles, once per request, since an entry stays the oldest
        until it is retired); ``o_retire`` says the oldest is done, and is taken before the
        next question. These replace ``i_outstanding``.
    o_complete, o_read_done, o_fault, o_header :
        As for one stream, each with the ``conn`` it is about (:func:`with_conn`).
    bad_fpdu_conn : Out(conn_bits(conns))
        The connection of the ``bad_fpdu`` pulse.

    ``dead`` is then each connection's own, in its context: a connection that failed places
    nothing more while the others go on, until ``i_open`` makes its context afresh.
    """

    def __init__(self, data_bytes, *, pd_bits=16, fifo_beats=512, conns=None):
        self.data_bytes = check_data_bytes(data_bytes)
        self.pd_bits = pd_bits
        self.fifo_beats = fifo_beats
        self.conns = conns
        ports = {
            "i_header": In(stream.Signature(with_conn(SegmentHeader, conns))),
            "i_payload": In(BeatStream(data_bytes)),
        }
        if conns is None:
            ports.update({
                "pd": In(pd_bits),
                "i_receive": In(stream.Signature(PostedReceive)),
                "receive_pending": In(1),
                "send_rtr": In(1),
                "i_outstanding": In(stream.Signature(OutstandingRead)),
            })
        else:
            ports.update({
                "i_open": In(stream.Signature(OpenContext(conns, pd_bits))),
                "o_ask_receive": Out(stream.Signature(ConnRef(conns))),
                "i_receive": In(stream.Signature(ReceiveOffer)),
                "o_ask_oldest": Out(stream.Signature(ConnRef(conns))),
                "i_oldest": In(stream.Signature(OldestRead)),
                "o_retire": Out(stream.Signature(ConnRef(conns))),
            })
        ports.update({
            "o_lookup": Out(stream.Signature(LookupRequest(pd_bits))),
            "i_lookup": In(stream.Signature(LookupResult)),
            "o_invalidate": Out(stream.Signature(InvalidateRequest(pd_bits))),
            "i_invalidate": In(stream.Signature(LookupResult)),
            "o_place": Out(stream.Signature(PlaceRequest)),
            "o_data": Out(BeatStream(data_bytes)),
            "o_complete": Out(stream.Signature(with_conn(ReceiveCompletion, conns))),
            "o_read_done": Out(stream.Signature(with_conn(ReadDone, conns))),
            "o_fault": Out(stream.Signature(with_conn(Violation, conns))),
            "o_header": Out(stream.Signature(with_conn(SegmentHeader, conns))),
            "o_payload": Out(BeatStream(data_bytes)),
        })
        ports["bad_fpdu"] = Out(1)
        if conns is None:
            ports["dead"] = Out(1)
        else:
            ports["bad_fpdu_conn"] = Out(conn_bits(conns))
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = fifo = PacketFifo(self.data_bytes, self.fifo_beats,
                                              overflow="stall")
        m.submodules.routes = routes = SyncFIFOBuffered(
            width=with_conn(_Route, self.conns).size, depth=3)
        m.d.comb += [
            fifo.i.payload.data.eq(self.i_payload.payload.data),
            fifo.i.payload.keep.eq(self.i_payload.payload.keep),
            fifo.i.payload.last.eq(self.i_payload.payload.last),
            fifo.i.payload.err.eq(0),
            fifo.i.valid.eq(self.i_payload.valid),
            self.i_payload.ready.eq(fifo.i.ready),
        ]
        m.submodules.beats = beats = SkidBuffer(BeatLayout(self.data_bytes))
        wiring.connect(m, fifo.o, beats.i)      # a register slice before the route stage
        self._decide(m, routes)
        self._route(m, beats.o, routes)
        return m

    def _decide(self, m, routes):
        """Stage 1: each header in turn, checked (and looked up), into a route."""
        tagged = self.conns is not None
        hdr = Signal(with_conn(SegmentHeader, self.conns))
        hdr_t, hdr_u = tagged_fields(hdr), untagged_fields(hdr)
        addr = Signal(64)
        lookup, result, fault = self.o_lookup, self.i_lookup, self.o_fault
        inval, inval_result = self.o_invalidate, self.i_invalidate

        # The stream's state (the held connection's), a _Context.
        ctx = Signal(_Context(self.pd_bits, self.conns), init=_FRESH)
        # Queue 0: the next MSN, and the message being received.
        msn, active, receive = ctx.msn, ctx.active, ctx.receive
        received = ctx.received         # octets of the message so far: the next MO
        room = ctx.room                 # octets of the buffer still free
        next_addr = ctx.next_addr       # host address of the next octet of the message
        end = wire(m, wrap_add(m, received, hdr.length, 32, "end_sum"), "end")

        # Read Responses: the oldest outstanding Read, and what is left of it.
        fresh = ctx.fresh               # nothing of it has arrived yet
        expect_to = ctx.expect_to       # with ~fresh: the TO of its next octet
        room_read = ctx.room_read       # with ~fresh: its octets still to come
        msn_3, dead = ctx.msn_3, ctx.dead   # the next MSN on queue 3; the stream has failed
        if tagged:
            head, head_valid, pd = ctx.head, ctx.head_valid, ctx.pd
        else:
            head, head_valid, pd = self.i_outstanding.payload, self.i_outstanding.valid, self.pd
            m.d.comb += self.dead.eq(dead)

        rdmap_header = DDP_UNTAGGED.length
        answer = ATOMIC_RESPONSE.unpack(
            hdr.head[8 * rdmap_header:8 * (rdmap_header + ATOMIC_RESPONSE.length)])
        # Immediate Data's 8 octets, big-endian, after the untagged header.
        imm_data = Cat(hdr.head.word_select(DDP_UNTAGGED.length + 7 - k, 8) for k in range(8))

        tagged_code = Signal(TerminateCode)
        with m.Switch(result.payload.fault):
            for kind, code in ((Fault.INVALID_STAG, TerminateCode.DDP_TAGGED_INVALID_STAG),
                               (Fault.INVALIDATED, TerminateCode.DDP_TAGGED_INVALID_STAG),
                               (Fault.NOT_ASSOCIATED,
                                TerminateCode.DDP_TAGGED_STAG_NOT_ASSOCIATED),
                               (Fault.TO_WRAP, TerminateCode.DDP_TAGGED_TO_WRAP),
                               (Fault.BASE_BOUNDS, TerminateCode.DDP_TAGGED_BASE_BOUNDS)):
                with m.Case(kind):
                    m.d.comb += tagged_code.eq(code)
            with m.Default():
                m.d.comb += tagged_code.eq(TerminateCode.RDMAP_ACCESS_RIGHTS)
        inval_fault = inval_result.payload.fault
        inval_code = Mux(one_of(inval_fault.as_value(),
                                (Fault.INVALID_STAG.value, Fault.INVALIDATED.value)),
                         TerminateCode.RDMAP_OPERATION_CANNOT_INVALIDATE,
                         TerminateCode.RDMAP_PROTECTION_CANNOT_INVALIDATE)

        # Each check against the stream's state, made as the header is taken (the state does
        # not change until it is decided) and kept beside it.
        incoming = self.i_header.payload
        incoming_answer = ATOMIC_RESPONSE.unpack(
            incoming.head[8 * rdmap_header:8 * (rdmap_header + ATOMIC_RESPONSE.length)])
        left = Mux(fresh, head.size, room_read)
        incoming_length = widened(m, incoming.length, 32, "in_length_32")
        in_tagged, in_untagged = tagged_fields(incoming), untagged_fields(incoming)
        checks = {
            "msn_0": same(in_untagged.msn, msn), "msn_3": same(in_untagged.msn, msn_3),
            "mo": same(in_untagged.mo, received), "head": head_valid,
            "stag": same(in_tagged.stag, head.stag),
            "to": same(in_tagged.to, Mux(fresh, head.to, expect_to)),
            "fits": incoming_length <= left,
            "full": same(incoming_length, left),
            "request": same(incoming_answer.request_id, head.request_id),
            "room": incoming_length <= room,
            # and what the segment is
            "write": incoming.ok & eq(incoming.opcode, _WRITE),
            "read_response": incoming.ok & eq(incoming.opcode, _READ_RESPONSE),
            "atomic_response": incoming.ok & eq(incoming.opcode, _ATOMIC_RESPONSE),
            "queue_0": incoming.ok & ~incoming.tagged & one_of(incoming.opcode, _QUEUE_0),
            "immediate": one_of(incoming.opcode, _IMMEDIATE),
            "invalidate": one_of(incoming.opcode, INVALIDATE_OPCODES),
            "solicited": one_of(incoming.opcode, _SOLICITED),
        }
        ok = {name: Signal(name=f"check_{name}") for name in checks}
        good_write = ok["write"] & ~dead
        read_response = ok["read_response"] & ~dead
        atomic_response = ok["atomic_response"] & ~dead
        queue_0 = ok["queue_0"] & ~dead
        immediate, invalidate = ok["immediate"], ok["invalidate"]
        # The route of the segment decided last, written into the route queue a cycle later.
        decided, decided_valid = Signal(with_conn(_Route, self.conns)), Signal()
        m.d.comb += [routes.w_en.eq(decided_valid), routes.w_data.eq(decided)]
        m.d.sync += decided_valid.eq(0)
        room_for_route = routes.w_rdy & ~decided_valid

        asks = (self.o_ask_receive, self.o_ask_oldest, self.o_retire) if tagged else ()
        for port in (lookup, inval, fault, self.o_header, *asks):
            with m.If(port.ready):
                m.d.sync += port.valid.eq(0)

        # A Terminate request: each violation names its code; the request is built once, its
        # code in the cycle of the violation, the offending segment's octets in the next (the
        # stage is then in ROUTE or TAKE, which leave ``hdr`` as it is), when it is offered.
        reporting, report_code, report_copy = Signal(), Signal(TerminateCode), Signal()
        copying, copy = Signal(), Signal()
        with m.If(reporting):
            m.d.sync += [copying.eq(1), copy.eq(report_copy), fault.payload.code.eq(report_code),
                         dead.eq(1)]
        with m.If(copying):
            m.d.sync += [copying.eq(0), fault.valid.eq(1),
                         fault.payload.offending.eq(Mux(copy, hdr.head[:8 * OFFENDING_BYTES], 0)),
                         fault.payload.offending_length.eq(Mux(copy, hdr.ulpdu_length, 0))]
            if tagged:
                m.d.sync += fault.payload.conn.eq(hdr.conn)

        def report(code, copy=True):
            m.d.comb += [reporting.eq(1), report_code.eq(code), report_copy.eq(copy)]

        def push(*, place=None, forward=0, addr=None, status=None, byte_len=0, read=None,
                 inline=None):
            """Route this segment's packet, or place ``inline``'s 8 octets; with ``status``,
            complete the receive after it; with ``read``, end the oldest Read or atomic so
            (with a ReadDone if it asks for one). The wide fields are written only where they
            will be read (a placement's address, a completion's values), so each comes from
            a few sources."""
            complete = status is not None
            read_done = head.complete if read is not None else 0
            route, c = decided, decided.completion
            if tagged:
                m.d.sync += route.conn.eq(hdr.conn)
            m.d.sync += [decided_valid.eq(hdr.has_payload | complete | read_done |
                                          (inline is not None)),
                         route.packet.eq(hdr.has_payload),
                         route.place.eq(0 if place is None else place),
                         route.forward.eq(forward), route.complete.eq(complete),
                         route.read_done.eq(read_done), route.inline.eq(inline is not None)]
            if place is not None:
                m.d.sync += [route.addr.eq(addr), route.length.eq(hdr.length)]
            if inline is not None:
                m.d.sync += [route.value.eq(inline), route.length.eq(_ATOMIC_BYTES)]
            if complete:
                m.d.sync += [c.id.eq(receive.id), c.status.eq(status), c.byte_len.eq(byte_len)]
            if read is not None:
                m.d.sync += [c.id.eq(head.id), c.status.eq(read)]
            if status == CompletionStatus.SUCCESS:
                m.d.sync += [c.with_imm.eq(immediate), c.imm_data.eq(Mux(immediate, imm_data, 0)),
                             c.with_inv.eq(invalidate),
                             c.invalidated.eq(Mux(invalidate, hdr_u.inv_stag, 0)),
                             c.solicited.eq(ok["solicited"])]
            elif complete:
                m.d.sync += [c.with_imm.eq(0), c.imm_data.eq(0), c.with_inv.eq(0),
                             c.invalidated.eq(0), c.solicited.eq(0)]

        # A lookup: each caller names what to look up; the request is built once.
        asking, asked_for = Signal(), Signal(LookupRequest(self.pd_bits))
        with m.If(asking):
            m.d.sync += [lookup.valid.eq(1), lookup.payload.eq(asked_for)]

        def ask(stag, to, length, access):
            m.d.comb += [asking.eq(1), asked_for.stag.eq(stag), asked_for.to.eq(to),
                         asked_for.length.eq(length), asked_for.access.eq(access),
                         asked_for.pd.eq(pd)]

        def finish():
            m.d.sync += [active.eq(0), msn.eq(add(msn, 1))]

        def retire():
            """The oldest outstanding Read or atomic is done."""
            if tagged:
                m.d.sync += [self.o_retire.valid.eq(1), self.o_retire.payload.conn.eq(hdr.conn),
                             head_valid.eq(0)]
            else:
                m.d.comb += self.i_outstanding.ready.eq(1)

        def take_receive(offer):
            """``offer`` is the message's receive: its buffer (if any) is looked up."""
            m.d.sync += [receive[name].eq(offer[name]) for name in PostedReceive.members]
            with m.If(offer.sges):
                ask(offer.lkey, offer.addr, offer.length, Access.LOCAL_WRITE)
            stage.goto("BUFFER")

        states = ["TAKE", "DECIDE", "WRITE", "ROUTE", "RESPONSE", "ATOMIC", "BUFFER",
                  "INVALIDATE", "ACCEPT"]
        stage = Machine(m, states + (["LOAD", "OLDEST", "RECEIVE"] if tagged else []), "decide")
        # A forwarded header is ``hdr`` itself: the next one waits in TAKE until it is taken
        # (from the cycle after: its ready would otherwise reach the other ports' readies).
        forwarding = self.o_header.valid
        offered = self.i_header.valid & ~forwarding
        m.d.comb += self.o_header.payload.eq(hdr)
        with stage.state("TAKE"):
            # The header and its checks are loaded in every cycle of TAKE (nothing reads them
            # here), so ``valid`` only moves the state and does not enable the wide registers.
            with m.If(~forwarding):
                m.d.sync += hdr.eq(self.i_header.payload)
            m.d.sync += [ok[name].eq(check) for name, check in checks.items()]
        if tagged:
            self._contexts(m, stage, ctx, offered, answered=checks["read_response"] |
                           checks["atomic_response"])
            with stage.state("RECEIVE"):
                m.d.comb += self.i_receive.ready.eq(1)
                with m.If(self.i_receive.valid):
                    with m.If(self.i_receive.payload.posted):
                        take_receive(self.i_receive.payload)
                    with m.Else():
                        report(TerminateCode.DDP_UNTAGGED_INVALID_MSN_NO_BUFFER)
                        push()
                        stage.goto("TAKE")
        else:
            with m.If(self.send_rtr):
                m.d.sync += msn.eq(add(msn, 1))
            with stage.state("TAKE"):
                m.d.comb += self.i_header.ready.eq(~forwarding)
                with m.If(offered):
                    stage.goto("DECIDE")
        with stage.state("DECIDE"):
            # Outputs of the last segment must have gone before a new one is offered.
            free = room_for_route & ~fault.valid & ~self.o_header.valid & ~lookup.valid
            with m.If(free):
                with m.If(good_write & hdr.has_payload):
                    ask(hdr_t.stag, hdr_t.to, hdr.length, Access.REMOTE_WRITE)
                    stage.goto("WRITE")
                with m.Elif(read_response):
                    stage.goto("TAKE")
                    with m.If(~ok["head"] | head.atomic):
                        report(TerminateCode.RDMAP_UNEXPECTED_OPCODE)
                        push()
                    with m.Elif(hdr.has_payload & ~ok["stag"]):
                        report(TerminateCode.DDP_TAGGED_INVALID_STAG)
                        push()
                    with m.Elif(hdr.has_payload & (~ok["to"] | ~ok["fits"])):
                        report(TerminateCode.DDP_TAGGED_BASE_BOUNDS)
                        push()
                    with m.Else():
                        with m.If(hdr.has_payload):
                            ask(hdr_t.stag, hdr_t.to, hdr.length, Access.LOCAL_WRITE)
                        stage.goto("RESPONSE")
                with m.Elif(atomic_response):
                    stage.goto("TAKE")
                    with m.If(~ok["msn_3"]):
                        report(TerminateCode.DDP_UNTAGGED_INVALID_MSN_RANGE)
                        push()
                    with m.Elif(~ok["head"] | ~head.atomic | ~ok["request"]):
                        report(TerminateCode.RDMAP_UNEXPECTED_OPCODE)
                        push()
                    with m.Else():
                        m.d.sync += msn_3.eq(add(hdr_u.msn, 1))
                        ask(head.stag, head.to, _ATOMIC_BYTES, Access.LOCAL_WRITE)
                        stage.goto("ATOMIC")
                with m.Elif(queue_0):
                    self._queue_0(m, stage, hdr=hdr, ok=ok, active=active, report=report,
                                  push=push, take_receive=take_receive)
                with m.Else():
                    stage.goto("TAKE")
                    with m.If(hdr.fpdu_bad):
                        m.d.sync += dead.eq(1)
                        m.d.comb += self.bad_fpdu.eq(1)
                        if tagged:
                            m.d.comb += self.bad_fpdu_conn.eq(hdr.conn)
                    with m.Elif(~hdr.ok & ~dead):
                        report(hdr.code)
                    forward = hdr.ok & ~dead & ~eq(hdr.opcode, _WRITE)
                    with m.If(forward):
                        m.d.sync += self.o_header.valid.eq(1)
                    push(forward=forward)
        with stage.state("WRITE"):
            m.d.comb += result.ready.eq(1)
            with m.If(result.valid):
                stage.goto("ROUTE")
                m.d.sync += addr.eq(result.payload.addr)
                with m.If(result.payload.fault != Fault.NONE):
                    m.d.sync += hdr.ok.eq(0)
                    report(tagged_code)
        with stage.state("ROUTE"):
            # `ok` is now the lookup's verdict.
            with m.If(room_for_route):
                push(place=hdr.ok, addr=addr)
                stage.goto("TAKE")
        with stage.state("RESPONSE"):
            # The Read Response's sink checked (an empty one has nothing to check).
            m.d.comb += result.ready.eq(hdr.has_payload)
            with m.If(result.valid | ~hdr.has_payload):
                stage.goto("TAKE")
                where = result.payload.addr
                with m.If(hdr.has_payload & (result.payload.fault != Fault.NONE)):
                    report(tagged_code)
                    push(read=CompletionStatus.LOC_PROT_ERR)
                with m.Elif(hdr.last & ~ok["full"]):
                    report(TerminateCode.RDMAP_CATASTROPHIC_STREAM)
                    push(place=hdr.has_payload, addr=where)
                with m.Elif(hdr.last):
                    push(place=hdr.has_payload, addr=where, read=CompletionStatus.SUCCESS)
                    retire()
                    m.d.sync += fresh.eq(1)
                with m.Else():
                    push(place=hdr.has_payload, addr=where)
                    m.d.sync += [fresh.eq(0),
                                 expect_to.eq(wrap_add(m, hdr_t.to, hdr.length, 64, "to_next")),
                                 room_read.eq(wrap_sub(m, left, hdr.length, 32, "read_left"))]
        with stage.state("ATOMIC"):
            # The atomic's sink checked: its original value placed there.
            m.d.comb += result.ready.eq(1)
            with m.If(result.valid):
                stage.goto("TAKE")
                with m.If(result.payload.fault != Fault.NONE):
                    report(TerminateCode.RDMAP_LOCAL_CATASTROPHIC, copy=False)
                    push(read=CompletionStatus.LOC_PROT_ERR)
                with m.Else():
                    push(place=1, addr=result.payload.addr, read=CompletionStatus.SUCCESS,
                         inline=answer.value)
                    retire()
        with stage.state("BUFFER"):
            # The receive's buffer checked (a receive without one has nothing to check).
            m.d.comb += result.ready.eq(receive.sges)
            with m.If(result.valid | ~receive.sges):
                m.d.sync += [next_addr.eq(result.payload.addr), received.eq(0), active.eq(1),
                             room.eq(Mux(receive.sges, receive.length, 0)),
                             ok["room"].eq(widened(m, hdr.length, 32, "length_32") <=
                                           Mux(receive.sges, receive.length, 0))]
                with m.If(receive.sges & (result.payload.fault != Fault.NONE)):
                    report(TerminateCode.RDMAP_LOCAL_CATASTROPHIC, copy=False)
                    push(status=CompletionStatus.LOC_PROT_ERR)
                    stage.goto("TAKE")
                with m.Elif(invalidate):
                    m.d.sync += [inval.valid.eq(1), inval.payload.stag.eq(hdr_u.inv_stag),
                                 inval.payload.pd.eq(pd)]
                    stage.goto("INVALIDATE")
                with m.Else():
                    stage.goto("ACCEPT")
        with stage.state("INVALIDATE"):
            m.d.comb += inval_result.ready.eq(1)
            with m.If(inval_result.valid):
                with m.If(inval_fault != Fault.NONE):
                    report(inval_code)
                    push()
                    stage.goto("TAKE")
                with m.Else():
                    stage.goto("ACCEPT")
        with stage.state("ACCEPT"):
            # MSN, MO and buffer are good: the payload is placed or the message is too long.
            stage.goto("TAKE")
            with m.If(immediate):
                push(status=CompletionStatus.SUCCESS, byte_len=received)
                finish()
            with m.Elif(~ok["room"]):
                report(TerminateCode.DDP_UNTAGGED_MESSAGE_TOO_LONG)
                push(status=CompletionStatus.LOC_LEN_ERR, byte_len=received)
                m.d.sync += active.eq(0)
            with m.Else():
                with m.If(hdr.last):
                    push(place=hdr.has_payload, addr=next_addr, status=CompletionStatus.SUCCESS,
                         byte_len=end)
                    finish()
                with m.Else():
                    push(place=hdr.has_payload, addr=next_addr)
                m.d.sync += [received.eq(end),
                             room.eq(wrap_sub(m, room, hdr.length, 32, "room_left")),
                             next_addr.eq(wrap_add(m, next_addr, hdr.length, 64, "addr_next"))]

    def _contexts(self, m, stage, ctx, offered, *, answered):
        """Several connections: each connection's :func:`_Context` in a block RAM, the held one
        in ``ctx``. In TAKE, before a header is taken (once ``offered``): a connection made
        afresh (``i_open``), then a switch to the header's connection (its word read while the
        held one is written back, loaded in LOAD), then, for a Read or Atomic Response
        (``answered``) whose oldest outstanding request is not known, the question for it
        (OLDEST)."""
        layout = ctx.shape()
        incoming, opening = self.i_header.payload, self.i_open
        m.submodules.contexts = contexts = Memory(shape=layout, depth=self.conns,
                                                  init=[_FRESH] * self.conns)
        write, read = contexts.write_port(), contexts.read_port()
        held = Signal(conn_bits(self.conns))     # whose context ``ctx`` is
        # ``ctx`` is ``held``'s: not after a reset, nor once ``held`` has been made afresh.
        holding = Signal()
        known = Signal()        # the header's connection's oldest request was asked for
        opened = Signal(layout)
        # The write port's address and data are set whatever the state (``en`` says when they
        # count): a connection made afresh, else the held context written back.
        m.d.comb += [opened.eq(layout.const(_FRESH)), opened.pd.eq(opening.payload.pd),
                     opened.msn.eq(Mux(opening.payload.send_rtr, 2, 1)),
                     read.addr.eq(incoming.conn),
                     write.addr.eq(Mux(opening.valid, opening.payload.conn, held)),
                     write.data.eq(Mux(opening.valid, opened, ctx))]
        hit = holding & same(incoming.conn, held)
        unknown = answered & ~ctx.dead & ~ctx.head_valid & ~known
        with stage.state("TAKE"):
            with m.If(opening.valid):
                m.d.comb += [opening.ready.eq(1), write.en.eq(1)]
                with m.If(same(opening.payload.conn, held)):
                    m.d.sync += holding.eq(0)
            with m.Elif(self.i_header.valid & ~hit):
                m.d.comb += write.en.eq(holding)
                m.d.sync += [held.eq(incoming.conn), holding.eq(1), known.eq(0)]
                stage.goto("LOAD")
            with m.Elif(self.i_header.valid & unknown):
                with m.If(~self.o_retire.valid & ~self.o_ask_oldest.valid):
                    m.d.sync += [self.o_ask_oldest.valid.eq(1),
                                 self.o_ask_oldest.payload.conn.eq(held)]
                    stage.goto("OLDEST")
            with m.Elif(offered):
                m.d.comb += self.i_header.ready.eq(1)
                m.d.sync += known.eq(0)
                stage.goto("DECIDE")
        with stage.state("LOAD"):
            m.d.sync += ctx.eq(read.data)
            stage.goto("TAKE")
        with stage.state("OLDEST"):
            answer = self.i_oldest.payload
            m.d.comb += self.i_oldest.ready.eq(1)
            with m.If(self.i_oldest.valid):
                m.d.sync += [ctx.head[name].eq(answer[name]) for name in OutstandingRead.members]
                m.d.sync += [ctx.head_valid.eq(answer.present), known.eq(1)]
                stage.goto("TAKE")

    def _queue_0(self, m, stage, *, hdr, ok, active, report, push, take_receive):
        """A good queue 0 segment, when the outputs are free: its MSN and MO, and for a new
        message its receive."""
        stage.goto("TAKE")
        with m.If(~ok["msn_0"]):
            report(TerminateCode.DDP_UNTAGGED_INVALID_MSN_RANGE)
            push()
        with m.Elif(active):
            with m.If(~ok["mo"]):
                report(TerminateCode.DDP_UNTAGGED_INVALID_MO)
                push()
            with m.Else():
                stage.goto("ACCEPT")
        with m.Elif(~is_zero(untagged_fields(hdr).mo)):
            report(TerminateCode.DDP_UNTAGGED_INVALID_MO)
            push()
        if self.conns is not None:
            with m.Else():
                m.d.sync += [self.o_ask_receive.valid.eq(1),
                             self.o_ask_receive.payload.conn.eq(hdr.conn)]
                stage.goto("RECEIVE")
            return
        with m.Elif(self.i_receive.valid):
            m.d.comb += self.i_receive.ready.eq(1)
            take_receive(self.i_receive.payload)
        with m.Elif(self.receive_pending):
            stage.goto("DECIDE")            # the receive is on its way
        with m.Else():
            report(TerminateCode.DDP_UNTAGGED_INVALID_MSN_NO_BUFFER)
            push()

    def _route(self, m, beats, routes):
        """Stage 2: each payload packet (``beats``, the FIFO's output through a register
        slice) to host memory, to the next stage, or away; then the receive's completion or the
        Read's end."""
        route = with_conn(_Route, self.conns)(routes.r_data)
        place, data, other = self.o_place, self.o_data, self.o_payload
        asked = Signal()            # the placement request of this packet has been taken
        sent = Signal()             # the packet has gone; its completion is next
        with m.If(place.ready):
            m.d.sync += place.valid.eq(0)
        m.d.comb += [data.payload.eq(beats.payload), other.payload.eq(beats.payload),
                     without_conn(self.o_complete.payload, ReceiveCompletion).eq(route.completion),
                     self.o_read_done.payload.id.eq(route.completion.id),
                     self.o_read_done.payload.status.eq(route.completion.status)]
        if self.conns is not None:
            m.d.comb += [self.o_complete.payload.conn.eq(route.conn),
                         self.o_read_done.payload.conn.eq(route.conn)]

        def request():
            """Offer the placement request of the route at the head, once."""
            with m.If(~asked & ~place.valid):
                m.d.sync += [place.valid.eq(1), place.payload.addr.eq(route.addr),
                             place.payload.length.eq(route.length), asked.eq(1)]

        def gone():
            """The packet (or the inline value) has left: its completion is next, if any."""
            m.d.sync += asked.eq(0)
            with m.If(route.complete | route.read_done):
                m.d.sync += sent.eq(1)
            with m.Else():
                m.d.comb += routes.r_en.eq(1)

        with m.If(routes.r_rdy & route.packet & ~sent):
            with m.If(route.place):
                request()
                m.d.comb += [data.valid.eq(beats.valid & asked),
                             beats.ready.eq(data.ready & asked)]
            with m.Elif(route.forward):
                m.d.comb += [other.valid.eq(beats.valid), beats.ready.eq(other.ready)]
            with m.Else():
                m.d.comb += beats.ready.eq(1)
            with m.If(beats.valid & beats.ready & beats.payload.last):
                gone()
        with m.Elif(routes.r_rdy & route.inline & ~sent):
            request()
            self._inline(m, route, asked, gone)
        with m.Elif(routes.r_rdy):
            m.d.comb += [self.o_complete.valid.eq(route.complete),
                         self.o_read_done.valid.eq(route.read_done)]
            with m.If(Mux(route.complete, self.o_complete.ready, self.o_read_done.ready)):
                m.d.comb += routes.r_en.eq(1)
                m.d.sync += sent.eq(0)

    def _inline(self, m, route, asked, gone):
        """The data of an atomic's original value, once its placement request is taken: the 8
        octets from the route (little-endian, as the model writes the value) in beats of
        ``data_bytes``; ``gone`` after the last."""
        n, data = self.data_bytes, self.o_data
        beats = max(1, _ATOMIC_BYTES // n)
        beat = Signal(range(beats + 1))
        lanes = min(n, _ATOMIC_BYTES)
        last = eq(beat, beats - 1) if beats > 1 else Const(1, 1)
        m.d.comb += [data.valid.eq(asked), data.payload.last.eq(last),
                     data.payload.keep.eq(mask(lanes)),
                     data.payload.data.eq(select(m, beat, [
                         route.value[8 * lanes * k:8 * lanes * (k + 1)] for k in range(beats)],
                         8 * lanes, "inline_beat") if beats > 1 else route.value)]
        with m.If(data.valid & data.ready):
            m.d.sync += beat.eq(add(beat, 1))
            with m.If(last):
                m.d.sync += beat.eq(0)
                gone()
