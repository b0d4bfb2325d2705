"""The responder's side of RDMA Read: RFC 5040 sections 4.4 (Read Request header), 5.1 and
5.2 (queue 1, the Read Response as a tagged message to the sink), 6.4 (the Data Source is
checked for Remote Read), 7.1 (Remote Protection errors) and RFC 5041 section 7.2 (queue 1 MSN
range), with the inbound Read credit (IRD) of RFC 6581 section 4.

:class:`ReadResponder` takes the Read Requests of one stream in order and turns each into the
Read Response to send, as the model's engine does (``_check_ird``, ``_on_read_request``).
"""

from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.wiring import In, Out

from ..ddp.emit import Message
from ..ddp.segment import SegmentHeader
from ..ddp.stag import Access, Fault, LookupRequest, LookupResult
from ..errors import OFFENDING_BYTES, TerminateCode, Violation
from ..exact import Machine, add, is_zero, select, sub, widened, wire, wrap_add
from ..headers import DDP_UNTAGGED, READ_REQUEST

__all__ = ["ReadResponse", "ReadResponder"]

_READ_RESPONSE = 2

#: A Read Response to send: the message (a Read Response to the sink STag and TO, ``size``
#: octets) and ``source``, the host address its payload is read from (fetch offset added).
ReadResponse = StructLayout({"message": Message, "source": 64})


class ReadResponder(wiring.Component):
    """Check each RDMA Read Request and give the Read Response it asks for.

    Ports
    -----
    i_request : In(stream.Signature(SegmentHeader))
        The stream's Read Request segments, in order, as the parser gave them (``ok``).
    ird, pd : In(8), In(pd_bits)
        The Read Requests the stream may have outstanding (the IRD negotiated) and its
        protection domain.
    o_lookup, i_lookup : Out(stream.Signature(LookupRequest(pd_bits))),
                         In(stream.Signature(LookupResult))
        To and from the STag table: the Data Source (source STag, TO, size) with Remote Read,
        for every request of one octet or more.
    o_response : Out(stream.Signature(ReadResponse))
        One per request that passes, in order.
    done : In(1)
        One cycle high for each Read Response whose last segment has been handed over: its
        IRD credit comes back.
    o_fault : Out(stream.Signature(Violation))
        The Terminate request for the first bad request, in the model's order: an MSN that is
        not the next one on queue 1, or the IRD already in use (DDP Invalid MSN range); a
        Data Source that fails its check (RDMAP Remote Protection: invalid STag, base or
        bounds, access rights, STag not associated, TO wrap); a sink TO that wraps with the
        size (RDMAP TO wrap). Nothing is answered after it.

    The MSN advances once the MSN and IRD checks pass, the IRD credit is taken as the response
    is offered. Throughput: a request every few cycles plus the table's latency. Latency: the
    response is offered two cycles after the table's answer.
    """

    def __init__(self, *, pd_bits=16):
        self.pd_bits = pd_bits
        super().__init__({
            "i_request": In(stream.Signature(SegmentHeader)),
            "ird": In(8), "pd": In(pd_bits),
            "o_lookup": Out(stream.Signature(LookupRequest(pd_bits))),
            "i_lookup": In(stream.Signature(LookupResult)),
            "o_response": Out(stream.Signature(ReadResponse)),
            "done": In(1),
            "o_fault": Out(stream.Signature(Violation)),
        })

    def elaborate(self, platform):
        m = Module()
        hdr = Signal(SegmentHeader)
        request = READ_REQUEST.unpack(
            hdr.head[8 * DDP_UNTAGGED.length:8 * (DDP_UNTAGGED.length + READ_REQUEST.length)])
        expected = Signal(32, init=1)       # the next MSN on queue 1
        used = Signal(8)                    # IRD credits in use
        dead = Signal()
        sink_wraps = Signal()
        source = Signal(64)
        lookup, result, fault, response = (self.o_lookup, self.i_lookup, self.o_fault,
                                           self.o_response)
        # sink_to + size passes 2**64.
        end = wrap_add(m, widened(m, request.sink_to, 65, "sink_to_wide"), request.size, 65,
                       "sink_end")
        wraps = wire(m, end[64] & ~is_zero(end[:64]), "sink_to_wraps")

        for out in (lookup, fault, response):
            with m.If(out.ready):
                m.d.sync += out.valid.eq(0)
        taken = response.valid & response.ready
        with m.If(taken & ~self.done):
            m.d.sync += used.eq(add(used, 1))
        with m.Elif(self.done & ~taken):
            m.d.sync += used.eq(sub(used, 1))

        def report(code):
            m.d.sync += [fault.valid.eq(1), fault.payload.code.as_value().eq(code),
                         fault.payload.offending.eq(hdr.head[:8 * OFFENDING_BYTES]),
                         fault.payload.offending_length.eq(hdr.ulpdu_length), dead.eq(1)]

        def respond(address):
            msg = response.payload.message
            m.d.sync += [response.valid.eq(1), msg.opcode.eq(_READ_RESPONSE),
                         msg.stag.eq(request.sink_stag), msg.to.eq(request.sink_to),
                         msg.msn.eq(0), msg.inv_stag.eq(0), msg.length.eq(request.size),
                         response.payload.source.eq(address)]

        # Remote Protection codes of the Data Source's faults (the model's _SOURCE_CODES).
        code = select(m, result.payload.fault.as_value(), {
            Fault.INVALID_STAG.value: TerminateCode.RDMAP_INVALID_STAG.value,
            Fault.INVALIDATED.value: TerminateCode.RDMAP_INVALID_STAG.value,
            Fault.NOT_ASSOCIATED.value: TerminateCode.RDMAP_STAG_NOT_ASSOCIATED.value,
            Fault.TO_WRAP.value: TerminateCode.RDMAP_TO_WRAP.value,
            Fault.BASE_BOUNDS.value: TerminateCode.RDMAP_BASE_BOUNDS.value,
            Fault.ACCESS_RIGHTS.value: TerminateCode.RDMAP_ACCESS_RIGHTS.value,
        }, 16, "source_code")

        stage = Machine(m, ["TAKE", "CHECK", "LOOKUP", "ANSWER", "SEND"], "state")
        free = ~response.valid & ~fault.valid & ~lookup.valid
        with stage.state("TAKE"):
            m.d.comb += self.i_request.ready.eq(1)
            with m.If(self.i_request.valid):
                m.d.sync += hdr.eq(self.i_request.payload)
                stage.goto("CHECK")
        with stage.state("CHECK"):
            with m.If(free):
                # The lookup's fields load whatever the verdict (only `valid` waits on it).
                p = lookup.payload
                m.d.sync += [sink_wraps.eq(wraps), p.stag.eq(request.src_stag),
                             p.to.eq(request.src_to), p.length.eq(request.size),
                             p.access.eq(Access.REMOTE_READ), p.pd.eq(self.pd)]
                with m.If(dead):
                    stage.goto("TAKE")
                with m.Elif((hdr.msn != expected) | (used >= self.ird)):
                    report(TerminateCode.DDP_UNTAGGED_INVALID_MSN_RANGE)
                    stage.goto("TAKE")
                with m.Else():
                    m.d.sync += expected.eq(add(hdr.msn, 1))
                    with m.If(is_zero(request.size)):
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
                    stage.goto("TAKE")
        with stage.state("ANSWER"):
            with m.If(sink_wraps):
                report(TerminateCode.RDMAP_TO_WRAP)
                stage.goto("TAKE")
            with m.Else():
                stage.goto("SEND")
        with stage.state("SEND"):
            with m.If(~response.valid):
                respond(source)
                stage.goto("TAKE")
        return m
