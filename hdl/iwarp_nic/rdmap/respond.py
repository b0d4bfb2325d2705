"""The responder's side of RDMA Read and of the atomics: RFC 5040 sections 4.4 (Read Request
header), 5.1 and 5.2 (queue 1, the Read Response as a tagged message to the sink), 6.4 (the
Data Source is checked for Remote Read), 7.1 (Remote Protection errors), RFC 7306 sections 5.2
and 6 (the Atomic Request on queue 1, its target checked for Remote Atomic and 8-octet
alignment, the Atomic Response on queue 3) and RFC 5041 section 7.2 (queue 1 MSN range), with
the inbound credit (IRD) of RFC 6581 section 4, which Reads and atomics share.

:class:`RequestResponder` takes the Read and Atomic Requests of one stream in order and turns
each into the response to send, as the model's engine does (``_check_ird``,
``_on_read_request``, ``_on_atomic_request``).
"""

from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.wiring import In, Out

from ..ddp.emit import Message
from ..ddp.segment import SegmentHeader
from ..ddp.stag import Access, Fault, LookupRequest, LookupResult
from ..errors import OFFENDING_BYTES, TerminateCode, Violation
from ..exact import Machine, add, eq, is_zero, select, sub, widened, wire, wrap_add
from ..headers import ATOMIC_REQUEST, ATOMIC_RESPONSE, DDP_UNTAGGED, READ_REQUEST
from .atomic import HostAtomic

__all__ = ["OutboundMessage", "RequestResponder", "INLINE_BYTES"]

_READ_RESPONSE, _ATOMIC_REQUEST, _ATOMIC_RESPONSE = 2, 10, 11
_CMP_SWAP = 2                       # AOpCode (RFC 7306 10.1)
#: Octets of the longest payload a message carries itself: an Atomic Response's.
INLINE_BYTES = ATOMIC_RESPONSE.length

#: A message to send and where its payload comes from: host memory at ``source`` (fetch offset
#: added), or with ``inline`` the first ``message.length`` octets of ``data`` (lane 0 first: an
#: Atomic Response's header).
OutboundMessage = StructLayout({"message": Message, "source": 64, "inline": 1,
                                "data": 8 * INLINE_BYTES})


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
    Throughput: a request every few cycles plus the table's latency (and an atomic's memory
    round trip). Latency: a Read Response is offered two cycles after the
    table's answer, an Atomic Response a cycle after the original value.
    """

    def __init__(self, *, pd_bits=16):
        self.pd_bits = pd_bits
        super().__init__({
            "i_request": In(stream.Signature(SegmentHeader)),
            "ird": In(8), "pd": In(pd_bits),
            "o_lookup": Out(stream.Signature(LookupRequest(pd_bits))),
            "i_lookup": In(stream.Signature(LookupResult)),
            "o_atomic": Out(stream.Signature(HostAtomic)),
            "i_original": In(stream.Signature(64)),
            "o_response": Out(stream.Signature(OutboundMessage)),
            "done": In(1), "done_inline": In(1),
            "o_fault": Out(stream.Signature(Violation)),
        })

    def elaborate(self, platform):
        m = Module()
        hdr = Signal(SegmentHeader)
        request = READ_REQUEST.unpack(
            hdr.head[8 * DDP_UNTAGGED.length:8 * (DDP_UNTAGGED.length + READ_REQUEST.length)])
        atomic = ATOMIC_REQUEST.unpack(
            hdr.head[8 * DDP_UNTAGGED.length:8 * (DDP_UNTAGGED.length + ATOMIC_REQUEST.length)])
        is_atomic = eq(hdr.opcode, _ATOMIC_REQUEST)
        expected = Signal(32, init=1)       # the next MSN on queue 1
        msn_3 = Signal(32, init=1)          # the next MSN of queue 3 (Atomic Responses)
        original = Signal(64)
        used = Signal(8)                    # IRD credits in use
        dead = Signal()
        sink_wraps = Signal()
        source = Signal(64)
        lookup, result, fault, response, execute = (self.o_lookup, self.i_lookup, self.o_fault,
                                                    self.o_response, self.o_atomic)
        # sink_to + size passes 2**64.
        end = wrap_add(m, widened(m, request.sink_to, 65, "sink_to_wide"), request.size, 65,
                       "sink_end")
        wraps = wire(m, end[64] & ~is_zero(end[:64]), "sink_to_wraps")

        for out in (lookup, fault, response, execute):
            with m.If(out.ready):
                m.d.sync += out.valid.eq(0)
        taken = response.valid & response.ready
        # The credits in use, and whether one is free, kept as registers.
        used_next = Signal(8)
        m.d.comb += used_next.eq(used)
        with m.If(taken & ~self.done):
            m.d.comb += used_next.eq(add(used, 1))
        with m.Elif(self.done & ~taken):
            m.d.comb += used_next.eq(sub(used, 1))
        credit = Signal()
        m.d.sync += [used.eq(used_next), credit.eq(used_next < self.ird)]
        msn_ok = Signal()                   # the request's MSN is the next, checked as taken
        # Read Responses offered whose payload fetches have not all been issued.
        reads = Signal(8)
        read_taken = taken & ~response.payload.inline
        read_done = self.done & ~self.done_inline
        with m.If(read_taken & ~read_done):
            m.d.sync += reads.eq(add(reads, 1))
        with m.Elif(read_done & ~read_taken):
            m.d.sync += reads.eq(sub(reads, 1))

        def report(code):
            m.d.sync += [fault.valid.eq(1), fault.payload.code.as_value().eq(code),
                         fault.payload.offending.eq(hdr.head[:8 * OFFENDING_BYTES]),
                         fault.payload.offending_length.eq(hdr.ulpdu_length), dead.eq(1)]

        def respond():
            msg, answer = response.payload.message, {"request_id": atomic.request_id,
                                                     "value": original}
            m.d.sync += [response.valid.eq(1), msg.inv_stag.eq(0),
                         msg.opcode.eq(Mux(is_atomic, _ATOMIC_RESPONSE, _READ_RESPONSE)),
                         msg.stag.eq(request.sink_stag), msg.to.eq(request.sink_to),
                         msg.msn.eq(Mux(is_atomic, msn_3, 0)),
                         msg.length.eq(Mux(is_atomic, ATOMIC_RESPONSE.length, request.size)),
                         response.payload.source.eq(source),
                         response.payload.inline.eq(is_atomic),
                         response.payload.data.eq(ATOMIC_RESPONSE.pack(answer))]
            with m.If(is_atomic):
                m.d.sync += msn_3.eq(add(msn_3, 1))

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
            m.d.comb += self.i_request.ready.eq(1)
            with m.If(self.i_request.valid):
                m.d.sync += [hdr.eq(self.i_request.payload),
                             msn_ok.eq(self.i_request.payload.msn == expected)]
                stage.goto("CHECK")
        with stage.state("CHECK"):
            with m.If(free):
                # The lookup's fields load whatever the verdict (only `valid` waits on it).
                p = lookup.payload
                m.d.sync += [sink_wraps.eq(wraps),
                             p.stag.eq(Mux(is_atomic, atomic.stag, request.src_stag)),
                             p.to.eq(Mux(is_atomic, atomic.to, request.src_to)),
                             p.length.eq(Mux(is_atomic, 8, request.size)),
                             p.access.eq(Mux(is_atomic, Access.REMOTE_ATOMIC, Access.REMOTE_READ)),
                             p.pd.eq(self.pd)]
                with m.If(dead):
                    stage.goto("TAKE")
                with m.Elif(~msn_ok | ~credit):
                    report(TerminateCode.DDP_UNTAGGED_INVALID_MSN_RANGE)
                    stage.goto("TAKE")
                with m.Else():
                    m.d.sync += expected.eq(add(hdr.msn, 1))
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
                    stage.goto("TAKE")
        with stage.state("ANSWER"):
            with m.If(is_atomic & ~is_zero(atomic.to[:3])):
                report(TerminateCode.RDMAP_OPERATION_UNSPECIFIED)
                stage.goto("TAKE")
            with m.Elif(is_atomic & ~is_zero(reads)):
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
                stage.goto("TAKE")
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
                stage.goto("TAKE")
        return m
