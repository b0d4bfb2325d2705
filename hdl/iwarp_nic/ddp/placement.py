"""Tagged placement of RDMA Writes: RFC 5041 sections 3 and 7.2 (tagged buffer errors) and
RFC 5040 sections 5.1, 6 and 7 (access rights), with the checks RFC 5042 sections 5 and 6 ask
for before any octet is placed.

:class:`WritePlacer` stands between the :class:`~.segment.SegmentParser` and host memory. Each
good RDMA Write segment with a payload is looked up in the STag table (STag, TO, length, Remote
Write, the stream's PD); it becomes a placement request (host address, length, then the
payload) only if every check passes, as the model's ``MrTable.check`` orders them. A failed
check, or a segment the parser found bad, becomes a Terminate request with the RFC 6580 code
the model's engine sends (tagged faults are DDP's, access rights RDMAP's, RFC 5040 7.1), and
the stream places nothing from then on. Other good segments go on, unchanged, to the stages
that handle them.
"""

from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..errors import OFFENDING_BYTES, TerminateCode, Violation
from ..exact import Machine, eq
from ..fifo import PacketFifo
from ..stream import BeatStream, check_data_bytes
from .segment import SegmentHeader
from .stag import Access, Fault, LookupRequest, LookupResult

__all__ = ["PlaceRequest", "WritePlacer"]

_WRITE = 0


#: A placement: ``length`` octets (1 or more) to write at host address ``addr``; the octets
#: follow as one packet on the data stream.
PlaceRequest = StructLayout({"addr": 64, "length": 16})


#: What the placer does with a segment's payload packet.
_Route = StructLayout({"place": 1, "forward": 1, "addr": 64, "length": 16})


class WritePlacer(wiring.Component):
    """Check the RDMA Writes of one stream and turn them into placement requests.

    Ports
    -----
    i_header, i_payload : In(stream.Signature(SegmentHeader)), In(BeatStream(data_bytes))
        The :class:`~.segment.SegmentParser`'s outputs, connected directly: the payload packets
        are stored as they come (a segment's before its header), in a FIFO of ``fifo_beats``.
    pd : In(pd_bits)
        The protection domain of the stream's QP.
    o_lookup, i_lookup : Out(stream.Signature(LookupRequest(pd_bits))),
                         In(stream.Signature(LookupResult))
        To and from the STag table: one lookup per good Write with a payload, with Remote Write
        access; the results come back in order.
    o_place, o_data : Out(stream.Signature(PlaceRequest)), Out(BeatStream(data_bytes))
        A placement request per checked Write, then its payload as one packet.
    o_fault : Out(stream.Signature(Violation))
        One Terminate request, for the first segment the parser found bad or whose lookup
        failed: codes DDP Invalid STag (also for an invalidated STag), Base or bounds,
        STag not associated with RDMAP stream, TO wrap; RDMAP access rights; or the parser's.
    o_header, o_payload : Out(stream.Signature(SegmentHeader)), Out(BeatStream(data_bytes))
        Every other good segment (all opcodes but Write), header first, then its payload if it
        has one.
    dead : Out(1)
        Set from the first error on: an FPDU the deframer marked bad (its error event is the
        deframer's to report) or a Terminate request. Nothing is placed or forwarded after it;
        payloads are drained.

    A zero-length Write places nothing and is not looked up (the model returns early too).

    Throughput: a segment's header is decided while the payloads of the ones before are still
    going out (a queue of three decisions), so placement runs at one payload beat per cycle
    for segments longer than the decision's few cycles plus the table's latency. Latency: the
    placement request is offered three cycles after the lookup result arrives, two after the
    header for other segments. Back-pressure on any output holds the stages behind it; the
    FIFO then stalls ``i_payload``. A payload packet longer than ``fifo_beats`` would never
    fit: the deframer's ``max_ulpdu`` must keep segments below it.
    """

    def __init__(self, data_bytes, *, pd_bits=16, fifo_beats=512):
        self.data_bytes = check_data_bytes(data_bytes)
        self.pd_bits = pd_bits
        self.fifo_beats = fifo_beats
        super().__init__({
            "i_header": In(stream.Signature(SegmentHeader)),
            "i_payload": In(BeatStream(data_bytes)),
            "pd": In(pd_bits),
            "o_lookup": Out(stream.Signature(LookupRequest(pd_bits))),
            "i_lookup": In(stream.Signature(LookupResult)),
            "o_place": Out(stream.Signature(PlaceRequest)),
            "o_data": Out(BeatStream(data_bytes)),
            "o_fault": Out(stream.Signature(Violation)),
            "o_header": Out(stream.Signature(SegmentHeader)),
            "o_payload": Out(BeatStream(data_bytes)),
            "dead": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = fifo = PacketFifo(self.data_bytes, self.fifo_beats,
                                              overflow="stall")
        m.submodules.routes = routes = SyncFIFOBuffered(width=_Route.size, depth=3)
        m.d.comb += [
            fifo.i.payload.data.eq(self.i_payload.payload.data),
            fifo.i.payload.keep.eq(self.i_payload.payload.keep),
            fifo.i.payload.last.eq(self.i_payload.payload.last),
            fifo.i.payload.err.eq(0),
            fifo.i.valid.eq(self.i_payload.valid),
            self.i_payload.ready.eq(fifo.i.ready),
        ]
        self._decide(m, routes)
        self._route(m, fifo, routes)
        return m

    def _decide(self, m, routes):
        """Stage 1: each header in turn, looked up if it is a Write, into a route."""
        hdr = Signal(SegmentHeader)
        addr = Signal(64)
        route = _Route(routes.w_data)
        lookup, result, fault = self.o_lookup, self.i_lookup, self.o_fault
        good_write = (hdr.ok & eq(hdr.opcode, _WRITE) & ~self.dead)
        code = Signal(TerminateCode)
        with m.Switch(result.payload.fault):
            for kind, tagged in ((Fault.INVALID_STAG, TerminateCode.DDP_TAGGED_INVALID_STAG),
                                 (Fault.INVALIDATED, TerminateCode.DDP_TAGGED_INVALID_STAG),
                                 (Fault.NOT_ASSOCIATED,
                                  TerminateCode.DDP_TAGGED_STAG_NOT_ASSOCIATED),
                                 (Fault.TO_WRAP, TerminateCode.DDP_TAGGED_TO_WRAP),
                                 (Fault.BASE_BOUNDS, TerminateCode.DDP_TAGGED_BASE_BOUNDS)):
                with m.Case(kind):
                    m.d.comb += code.eq(tagged)
            with m.Default():
                m.d.comb += code.eq(TerminateCode.RDMAP_ACCESS_RIGHTS)

        with m.If(lookup.ready):
            m.d.sync += lookup.valid.eq(0)
        with m.If(fault.ready):
            m.d.sync += fault.valid.eq(0)
        with m.If(self.o_header.ready):
            m.d.sync += self.o_header.valid.eq(0)

        def report(with_code):
            m.d.sync += [fault.valid.eq(1), fault.payload.code.eq(with_code),
                         fault.payload.offending.eq(hdr.head[:8 * OFFENDING_BYTES]),
                         fault.payload.offending_length.eq(hdr.ulpdu_length), self.dead.eq(1)]

        def push(place, forward, addr=0):
            m.d.comb += [routes.w_en.eq(hdr.has_payload), route.place.eq(place),
                         route.forward.eq(forward), route.addr.eq(addr),
                         route.length.eq(hdr.length)]

        stage = Machine(m, ["TAKE", "DECIDE", "LOOKUP", "ROUTE"], "decide")
        with stage.state("TAKE"):
            m.d.comb += self.i_header.ready.eq(1)
            with m.If(self.i_header.valid):
                m.d.sync += hdr.eq(self.i_header.payload)
                stage.goto("DECIDE")
        with stage.state("DECIDE"):
            # Outputs of the last segment must have gone before a new one is offered.
            free = routes.w_rdy & ~fault.valid & ~self.o_header.valid & ~lookup.valid
            with m.If(free):
                with m.If(good_write & hdr.has_payload):
                    p = lookup.payload
                    m.d.sync += [lookup.valid.eq(1), p.stag.eq(hdr.stag), p.to.eq(hdr.to),
                                 p.length.eq(hdr.length), p.access.eq(Access.REMOTE_WRITE),
                                 p.pd.eq(self.pd)]
                    stage.goto("LOOKUP")
                with m.Else():
                    stage.goto("TAKE")
                    bad = ~hdr.ok & ~self.dead
                    with m.If(hdr.fpdu_bad):
                        m.d.sync += self.dead.eq(1)
                    with m.Elif(bad):
                        report(hdr.code)
                    forward = hdr.ok & ~self.dead & ~eq(hdr.opcode, _WRITE)
                    with m.If(forward):
                        m.d.sync += [self.o_header.valid.eq(1), self.o_header.payload.eq(hdr)]
                    push(0, forward)
        with stage.state("LOOKUP"):
            m.d.comb += result.ready.eq(1)
            with m.If(result.valid):
                stage.goto("ROUTE")
                m.d.sync += addr.eq(result.payload.addr)
                with m.If(result.payload.fault != Fault.NONE):
                    m.d.sync += hdr.ok.eq(0)
                    report(code)
        with stage.state("ROUTE"):
            # `ok` is now the lookup's verdict.
            with m.If(routes.w_rdy):
                push(hdr.ok, 0, addr)
                stage.goto("TAKE")

    def _route(self, m, fifo, routes):
        """Stage 2: each payload packet to host memory, to the next stage, or away."""
        route = _Route(routes.r_data)
        place, data, other = self.o_place, self.o_data, self.o_payload
        asked = Signal()            # the placement request of this packet has been taken
        with m.If(place.ready):
            m.d.sync += place.valid.eq(0)
        m.d.comb += [data.payload.eq(fifo.o.payload), other.payload.eq(fifo.o.payload)]
        with m.If(routes.r_rdy):
            with m.If(route.place):
                with m.If(~asked & ~place.valid):
                    m.d.sync += [place.valid.eq(1), place.payload.addr.eq(route.addr),
                                 place.payload.length.eq(route.length), asked.eq(1)]
                m.d.comb += [data.valid.eq(fifo.o.valid & asked),
                             fifo.o.ready.eq(data.ready & asked)]
            with m.Elif(route.forward):
                m.d.comb += [other.valid.eq(fifo.o.valid), fifo.o.ready.eq(other.ready)]
            with m.Else():
                m.d.comb += fifo.o.ready.eq(1)
            with m.If(fifo.o.valid & fifo.o.ready & fifo.o.payload.last):
                m.d.comb += routes.r_en.eq(1)
                m.d.sync += asked.eq(0)
