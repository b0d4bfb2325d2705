"""The responder's side of RDMA Read and of the atomics: RFC 5040 sections 4.4 (Read Request
header), 5.1 and 5.2 (queue 1, the Read Response as a tagged message to the sink), 6.4 (the
Data Source is checked for Remote Read), 7.1 (Remote Protection errors), RFC 7306 sections 5.2
and 6 (the Atomic Request on queue 1, its target checked for Remote Atomic and 8-octet
alignment, the Atomic Response on queue 3) and RFC 5041 section 7.2 (queue 1 MSN range), with
the inbound credit (IRD) of RFC 6581 section 4, which Reads and atomics share.

:class:`RequestResponder` takes the Read and Atomic Requests of one stream in order and turns
each into the response to send, as the model's engine does (``_check_ird``,
``_on_read_request``, ``_on_atomic_request``); with ``conns`` it does so for that many
connections at once, their requests interleaved, each connection's state a word of a small
memory.
"""

from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..ddp.emit import Message
from ..ddp.segment import SegmentHeader, untagged_fields
from ..ddp.stag import Access, Fault, LookupRequest, LookupResult
from ..errors import OFFENDING_BYTES, TerminateCode, Violation
from ..exact import Machine, add, eq, is_zero, lt, select, widened, wire, wrap_add, wrap_sub
from ..headers import ATOMIC_REQUEST, ATOMIC_RESPONSE, DDP_UNTAGGED, READ_REQUEST
from ..tcp.layouts import conn_bits, with_conn
from .atomic import HostAtomic

__all__ = ["OutboundMessage", "OpenResponder", "RequestResponder", "INLINE_BYTES"]

_READ_RESPONSE, _ATOMIC_REQUEST, _ATOMIC_RESPONSE = 2, 10, 11
_CMP_SWAP = 2                       # AOpCode (RFC 7306 10.1)
#: Octets of the longest payload a message carries itself: an Atomic Response's.
INLINE_BYTES = ATOMIC_RESPONSE.length

#: A message to send and where its payload comes from: host memory at ``source`` (fetch offset
#: added), or with ``inline`` the first ``message.length`` octets of ``data`` (lane 0 first: an
#: Atomic Response's header). With ``report``, the work request ``id`` (a Send, a Write or
#: Immediate Data of the host's) completes when its payload has been read: the scheduler says
#: so (``o_sent``).
OutboundMessage = StructLayout({"message": Message, "source": 64, "inline": 1,
                                "data": 8 * INLINE_BYTES, "id": 16, "report": 1})


def OpenResponder(conns, pd_bits):
    """Several connections: connection ``conn``'s slot made afresh for a new stream, with the
    stream's IRD (the requests it may have outstanding) and protection domain."""
    return with_conn(StructLayout({"ird": 8, "pd": pd_bits}), conns)


#: Responses, and Read Responses among them, as 8-bit counts that wrap.
_Counts = StructLayout({"responses": 8, "reads": 8})


def _Context(pd_bits, conns):
    """A stream's running state: the next MSNs of queue 1 (``expected``) and queue 3, ``dead``,
    and the responses ``offered`` (less those handed over: the IRD credits in use, and the Read
    Responses still fetching). With several connections also the stream's IRD and PD: a word
    of distributed RAM per connection."""
    fields = {"expected": 32, "msn_3": 32, "dead": 1, "offered": _Counts}
    if conns is not None:
        fields.update({"ird": 8, "pd": pd_bits})
    return StructLayout(fields)


#: The state of a stream that has received no request: both MSNs 1.
_FRESH = {"expected": 1, "msn_3": 1}


class RequestResponder(wiring.Component):
    """Check each RDMA Read Request and Atomic Request and give the response it asks for.

    Ports
    -----
    i_request : In(stream.Signature(SegmentHeader))
        The stream's Read Request and Atomic Request segments, in order, as the parser gave
        them (``ok``).
    ird, pd : In(8), In(pd_bits)
        The requests the stream may have outstanding (the IRD negotiated) and its protection
        domain.
    o_lookup, i_lookup : Out(stream.Signature(LookupRequest(pd_bits))),
                         In(stream.Signature(LookupResult))
        To and from the STag table: a Read's Data Source (source STag, TO, size) with Remote
        Read, for every Read of one octet or more; an atomic's 8 octets with Remote Atomic.
    o_atomic, i_original : Out(stream.Signature(HostAtomic)), In(stream.Signature(64))
        To and from the :class:`~.atomic.AtomicExecutor`: each atomic that passes its checks,
        at its host address; the original value found there.
    o_response : Out(stream.Signature(OutboundMessage))
        One per request that passes, in order: a Read Response (payload from host memory) or
        an Atomic Response (the MSN of queue 3, the Request Identifier and the original value,
        inline).
    done, done_inline : In(1), In(1)
        ``done`` one cycle high for each response whose last segment has been handed over (its
        IRD credit comes back), with ``done_inline`` when that response was an Atomic
        Response.
    o_fault : Out(stream.Signature(Violation))
        The Terminate request for the first bad request, in the model's order: an MSN that is
        not the next one on queue 1, or the IRD already in use (DDP Invalid MSN range); a
        Data Source or atomic target that fails its check (RDMAP Remote Protection: invalid
        STag, base or bounds, access rights, STag not associated, TO wrap); a Read's sink TO
        that wraps with the size (RDMAP TO wrap); an atomic's TO not 8-octet aligned (RDMAP
        Remote Operation, unspecified). Nothing is answered after it.

    The MSN advances once the MSN and IRD checks pass, the IRD credit is taken as the response
    is offered. An atomic is executed only once every Read Response before it has been handed
    over (its payload fetches issued): the Read then returns the memory as the model's engine
    reads it, before the atomic (the responder processes queue 1's requests in order),
    provided host reads and the executor's accesses reach memory in the order given.
    The credits in use and the Read Responses still fetching are registered counts, a
    ``done`` seen the cycle after it (a peer cannot have the response by then, so no request
    it may send is refused), and a request's checks start in its second cycle after it is
    taken. Throughput: a request every few cycles plus the table's latency (and an atomic's
    memory round trip). Latency: a Read Response is offered two cycles after the table's
    answer, an Atomic Response a cycle after the original value.

    Several connections (``conns``)
    -------------------------------
    The requests of ``conns`` connections come interleaved, each naming its own; they are
    handled one at a time, in the order they come, each exactly as one stream's (the same
    checks in the same order, the same codes), against its connection's state: its next MSNs,
    ``dead``, its IRD and PD, and the responses it has offered. That state is a word of a
    memory of ``conns`` words with asynchronous reads (distributed RAM on an FPGA), read as a
    request is taken and written back as its handling ends. The credits come back through a
    second such memory, written only by ``done``: the responses and Read Responses each
    connection has handed over, counted modulo 256 (read, counted and written in one cycle).
    A connection's IRD credits in use are its responses offered less those handed over, its
    Read Responses still fetching likewise, so a ``done`` for any connection is counted at
    once, whichever request is in hand. A response is counted in its connection's context as
    it is offered (it may be taken after the next request, of another connection, is loaded);
    the checks that read the counts wait for it to be taken, as one stream's do. The ports
    that differ from one stream's:

    i_request : In(stream.Signature(with_conn(SegmentHeader, conns)))
        Each request with the connection (``conn``) it came on.
    i_open : In(stream.Signature(OpenResponder(conns, pd_bits)))
        Connection ``conn``'s slot made afresh for a new stream (next MSNs of queue 1 and
        queue 3 both 1, alive, no credit in use), with its IRD and PD; it replaces ``ird`` and
        ``pd``. Taken between requests, before a waiting request (``i_request`` is not ready
        while it is offered), in a cycle of its own. A slot's stream must have had every
        response handed over (its ``done`` given) before the slot is opened again: the
        opened slot counts its responses from the ``done`` counted so far.
    done_conn : In(conn_bits(conns))
        With ``done``: the connection whose response was handed over.
    o_response, o_fault : Out(stream.Signature(with_conn(OutboundMessage, conns))),
                          Out(stream.Signature(with_conn(Violation, conns)))
        As for one stream, each with the ``conn`` it answers.

    A connection that failed answers nothing more (its requests are taken and dropped) while
    the others go on, until ``i_open`` makes its slot afresh. Cost: no cycle per request more
    than one stream's (the context is read in the cycle the request is taken, written back in
    the cycle its handling ends), a cycle per ``i_open``. Latency and back-pressure are one
    stream's. The memories are not emptied by a reset (they start empty at configuration): a
    connection is opened before its first request (a slot never opened has an IRD of 0, so
    its first request is refused as beyond the IRD).

    Bad input: a request, ``i_open`` or ``done`` naming a ``conn`` of ``conns`` or more is
    taken and ignored (no answer, no Terminate). A ``done`` for a connection with no response
    outstanding (or a slot opened while its old stream's responses are still being sent)
    breaks that connection's count: its next request is then refused as beyond the IRD.
    """

    def __init__(self, *, pd_bits=16, conns=None):
        self.pd_bits, self.conns = pd_bits, conns
        ports = {"i_request": In(stream.Signature(with_conn(SegmentHeader, conns)))}
        if conns is None:
            ports.update({"ird": In(8), "pd": In(pd_bits)})
        else:
            ports["i_open"] = In(stream.Signature(OpenResponder(conns, pd_bits)))
        ports.update({
            "o_lookup": Out(stream.Signature(LookupRequest(pd_bits))),
            "i_lookup": In(stream.Signature(LookupResult)),
            "o_atomic": Out(stream.Signature(HostAtomic)),
            "i_original": In(stream.Signature(64)),
            "o_response": Out(stream.Signature(with_conn(OutboundMessage, conns))),
            "done": In(1), "done_inline": In(1),
        })
        if conns is not None:
            ports["done_conn"] = In(conn_bits(conns))
        ports["o_fault"] = Out(stream.Signature(with_conn(Violation, conns)))
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        tagged = self.conns is not None
        hdr = Signal(with_conn(SegmentHeader, self.conns))
        request = READ_REQUEST.unpack(
            hdr.head[8 * DDP_UNTAGGED.length:8 * (DDP_UNTAGGED.length + READ_REQUEST.length)])
        atomic = ATOMIC_REQUEST.unpack(
            hdr.head[8 * DDP_UNTAGGED.length:8 * (DDP_UNTAGGED.length + ATOMIC_REQUEST.length)])
        is_atomic = eq(hdr.opcode, _ATOMIC_REQUEST)
        # The stream's state (the held connection's) as this cycle began, and as it ends: the
        # updates of a cycle are made to `nxt`.
        layout = _Context(self.pd_bits, self.conns)
        ctx, nxt = Signal(layout, init=_FRESH), Signal(layout)
        m.d.comb += nxt.eq(ctx)
        m.d.sync += ctx.eq(nxt)
        original = Signal(64)
        sink_wraps = Signal()
        source = Signal(64)
        msn_ok = Signal()                   # the request's MSN is the next, checked as taken
        lookup, result, fault, response, execute = (self.o_lookup, self.i_lookup, self.o_fault,
                                                    self.o_response, self.o_atomic)
        # sink_to + size passes 2**64.
        end = wrap_add(m, widened(m, request.sink_to, 65, "sink_to_wide"), request.size, 65,
                       "sink_end")
        wraps = wire(m, end[64] & ~is_zero(end[:64]), "sink_to_wraps")

        for out in (lookup, fault, response, execute):
            with m.If(out.ready):
                m.d.sync += out.valid.eq(0)

        # What `done` has counted so far (`before`: of the connection it names now; `handed`:
        # of the held one), and that count with this cycle's `done`.
        counted = Signal(_Counts)
        if tagged:
            m.submodules.handed = handed_mem = Memory(shape=_Counts, depth=max(self.conns, 2),
                                                      init=[])
            done_rd, held_rd, open_rd = (handed_mem.read_port(domain="comb") for _ in range(3))
            handed_wr = handed_mem.write_port()
            m.d.comb += [done_rd.addr.eq(self.done_conn), held_rd.addr.eq(hdr.conn),
                         open_rd.addr.eq(self.i_open.payload.conn),
                         handed_wr.addr.eq(self.done_conn), handed_wr.data.eq(counted),
                         handed_wr.en.eq(self.done & lt(self.done_conn, self.conns))]
            before, handed = done_rd.data, held_rd.data
            ird, pd = ctx.ird, ctx.pd
        else:
            before = handed = Signal(_Counts)
            with m.If(self.done):
                m.d.sync += handed.eq(counted)
            ird, pd = self.ird, self.pd
        m.d.comb += [counted.responses.eq(add(before.responses, 1)),
                     counted.reads.eq(Mux(self.done_inline, before.reads, add(before.reads, 1)))]
        # The IRD credits in use, and the Read Responses whose payload fetches have not all
        # been issued, registered: a cycle late, so a credit handed back is seen a cycle after
        # its `done` (long before the peer can have its response), and a request is checked
        # from its second cycle in CHECK (`settling` its first).
        used, fetching = Signal(8), Signal(8)
        m.d.sync += [used.eq(wrap_sub(m, ctx.offered.responses, handed.responses, 8, "in_use")),
                     fetching.eq(wrap_sub(m, ctx.offered.reads, handed.reads, 8, "unfetched"))]
        credit = wire(m, used < ird, "credit")
        settling = Signal()
        m.d.sync += settling.eq(0)

        if tagged:
            # Each connection's context: read (asynchronously) as its request is taken, written
            # back as the machine returns to TAKE, or made afresh by `i_open` in TAKE.
            m.submodules.contexts = ctx_mem = Memory(shape=layout, depth=max(self.conns, 2),
                                                     init=[])
            ctx_rd, ctx_wr = ctx_mem.read_port(domain="comb"), ctx_mem.write_port()
            opening = self.i_open.payload
            opened = Signal(layout)
            m.d.comb += [ctx_rd.addr.eq(self.i_request.payload.conn),
                         ctx_wr.addr.eq(hdr.conn), ctx_wr.data.eq(nxt),
                         opened.eq(layout.const(_FRESH)), opened.offered.eq(open_rd.data),
                         opened.ird.eq(opening.ird), opened.pd.eq(opening.pd)]

        def finish():
            """The request is done with: its connection's context is written back."""
            stage.goto("TAKE")
            if tagged:
                m.d.comb += ctx_wr.en.eq(1)

        # A Terminate request: each violation names its code; the request is built in one
        # place from the request held (one multiplexer for its octets, not one per violation).
        reporting, report_code = Signal(), Signal(16)
        with m.If(reporting):
            m.d.sync += [fault.valid.eq(1), fault.payload.code.as_value().eq(report_code),
                         fault.payload.offending.eq(hdr.head[:8 * OFFENDING_BYTES]),
                         fault.payload.offending_length.eq(hdr.ulpdu_length)]
            if tagged:
                m.d.sync += fault.payload.conn.eq(hdr.conn)

        def report(code):
            m.d.comb += [reporting.eq(1), report_code.eq(code), nxt.dead.eq(1)]
            finish()

        def respond():
            msg, answer = response.payload.message, {"request_id": atomic.request_id,
                                                     "value": original}
            m.d.sync += [response.valid.eq(1), msg.inv_stag.eq(0),
                         msg.opcode.eq(Mux(is_atomic, _ATOMIC_RESPONSE, _READ_RESPONSE)),
                         msg.stag.eq(request.sink_stag), msg.to.eq(request.sink_to),
                         msg.msn.eq(Mux(is_atomic, ctx.msn_3, 0)),
                         msg.length.eq(Mux(is_atomic, ATOMIC_RESPONSE.length, request.size)),
                         response.payload.source.eq(source),
                         response.payload.inline.eq(is_atomic),
                         response.payload.data.eq(ATOMIC_RESPONSE.pack(answer))]
            if tagged:
                m.d.sync += response.payload.conn.eq(hdr.conn)
            m.d.comb += nxt.offered.responses.eq(add(ctx.offered.responses, 1))
            with m.If(is_atomic):
                m.d.comb += nxt.msn_3.eq(add(ctx.msn_3, 1))
            with m.Else():
                m.d.comb += nxt.offered.reads.eq(add(ctx.offered.reads, 1))
            finish()

        # Remote Protection codes of the Data Source's faults (the model's _SOURCE_CODES).
        code = select(m, result.payload.fault.as_value(), {
            Fault.INVALID_STAG.value: TerminateCode.RDMAP_INVALID_STAG.value,
            Fault.INVALIDATED.value: TerminateCode.RDMAP_INVALID_STAG.value,
            Fault.NOT_ASSOCIATED.value: TerminateCode.RDMAP_STAG_NOT_ASSOCIATED.value,
            Fault.TO_WRAP.value: TerminateCode.RDMAP_TO_WRAP.value,
            Fault.BASE_BOUNDS.value: TerminateCode.RDMAP_BASE_BOUNDS.value,
            Fault.ACCESS_RIGHTS.value: TerminateCode.RDMAP_ACCESS_RIGHTS.value,
        }, 16, "source_code")

        stage = Machine(m, ["TAKE", "CHECK", "LOOKUP", "ANSWER", "EXECUTE", "SEND"], "state")
        free = ~response.valid & ~fault.valid & ~lookup.valid & ~execute.valid
        with stage.state("TAKE"):
            take = self.i_request
            if tagged:
                # A connection made afresh, before any request.
                m.d.comb += [self.i_open.ready.eq(1), take.ready.eq(~self.i_open.valid)]
                with m.If(self.i_open.valid):
                    m.d.comb += [ctx_wr.en.eq(lt(opening.conn, self.conns)),
                                 ctx_wr.addr.eq(opening.conn), ctx_wr.data.eq(opened)]
            else:
                m.d.comb += take.ready.eq(1)
            current = ctx_rd.data if tagged else ctx
            with m.If(take.valid & take.ready):
                m.d.sync += [hdr.eq(take.payload), settling.eq(1),
                             msn_ok.eq(untagged_fields(take.payload).msn == current.expected)]
                if tagged:
                    m.d.sync += ctx.eq(current)
                    with m.If(lt(take.payload.conn, self.conns)):
                        stage.goto("CHECK")
                else:
                    stage.goto("CHECK")
        with stage.state("CHECK"):
            with m.If(free & ~settling):
                # The lookup's fields load whatever the verdict (only `valid` waits on it).
                p = lookup.payload
                m.d.sync += [sink_wraps.eq(wraps),
                             p.stag.eq(Mux(is_atomic, atomic.stag, request.src_stag)),
                             p.to.eq(Mux(is_atomic, atomic.to, request.src_to)),
                             p.length.eq(Mux(is_atomic, 8, request.size)),
                             p.access.eq(Mux(is_atomic, Access.REMOTE_ATOMIC, Access.REMOTE_READ)),
                             p.pd.eq(pd)]
                with m.If(ctx.dead):
                    finish()
                with m.Elif(~msn_ok | ~credit):
                    report(TerminateCode.DDP_UNTAGGED_INVALID_MSN_RANGE)
                with m.Else():
                    m.d.comb += nxt.expected.eq(add(untagged_fields(hdr).msn, 1))
                    with m.If(is_zero(request.size) & ~is_atomic):
                        m.d.sync += source.eq(0)
                        stage.goto("SEND")
                    with m.Else():
                        m.d.sync += lookup.valid.eq(1)
                        stage.goto("LOOKUP")
        with stage.state("LOOKUP"):
            m.d.comb += result.ready.eq(1)
            with m.If(result.valid):
                m.d.sync += source.eq(result.payload.addr)
                with m.If(is_zero(result.payload.fault.as_value())):
                    stage.goto("ANSWER")
                with m.Else():
                    report(code)
        with stage.state("ANSWER"):
            with m.If(is_atomic & ~is_zero(atomic.to[:3])):
                report(TerminateCode.RDMAP_OPERATION_UNSPECIFIED)
            with m.Elif(is_atomic & ~is_zero(fetching)):
                pass                        # earlier Read Responses are still being fetched
            with m.Elif(is_atomic):
                op = execute.payload
                m.d.sync += [execute.valid.eq(1), op.addr.eq(source),
                             op.cmp_swap.eq(eq(atomic.aopcode, _CMP_SWAP)),
                             op.add_swap_data.eq(atomic.add_swap_data),
                             op.add_swap_mask.eq(atomic.add_swap_mask),
                             op.compare_data.eq(atomic.compare_data),
                             op.compare_mask.eq(atomic.compare_mask)]
                stage.goto("EXECUTE")
            with m.Elif(sink_wraps):
                report(TerminateCode.RDMAP_TO_WRAP)
            with m.Else():
                stage.goto("SEND")
        with stage.state("EXECUTE"):
            m.d.comb += self.i_original.ready.eq(1)
            with m.If(self.i_original.valid):
                m.d.sync += original.eq(self.i_original.payload)
                stage.goto("SEND")
        with stage.state("SEND"):
            with m.If(~response.valid):
                respond()
        return m
