"""The ready-to-receive check of the peer-to-peer model: RFC 6581 section 7 (the Initiator's
first FPDU is the RTR message agreed on in the MPA exchange: a zero-length Send, RDMA Write or
RDMA Read; anything else is the MPA error "No matching RTR", RFC 6581 section 9 and RFC 6580)
and RFC 5044 section 7.1.2 (the Responder sends nothing before the Initiator's first FPDU).

:class:`RtrCheck` sits between the :class:`~.segment.SegmentParser` and the placer.
"""

from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..errors import TerminateCode
from ..exact import eq, is_zero
from ..headers import DDP_UNTAGGED, READ_REQUEST
from ..mpa.negotiate import Rtr
from .segment import SegmentHeader

__all__ = ["RtrCheck"]

_WRITE, _READ_REQUEST, _SEND = 0, 1, 3


class RtrCheck(wiring.Component):
    """Check the first segment of a peer-to-peer Responder's stream against the RTR awaited.

    Ports
    -----
    i, o : In/Out(stream.Signature(SegmentHeader))
        The parser's headers, passed on combinationally (payloads do not pass here), but for
        the first one with an RTR awaited, which waits a cycle for its registered verdict;
        ``i`` is ready exactly when ``o`` is, but in that cycle.
    expect : In(Rtr)
        The RTR the MPA exchange settled (``NONE``: no check). Held from before the first
        header.
    o_send_rtr : Out(1)
        A cycle's pulse: the Send RTR was taken (queue 0's MSN 1 is used, no receive is).
    started : Out(1)
        Set once the peer's first FPDU is taken, or with ``expect``, its RTR matched: the
        Responder may send from then on.

    The first header, with ``expect`` set and an FPDU the deframer found good, must be the
    model's RTR (``Connection._on_rtr``): a good segment of the awaited opcode, zero length (a
    Read Request: of size 0), MSN 1 when untagged. A Write RTR passes on (the placer places
    nothing for it), a Read RTR too (the Read responder answers it with an empty Read
    Response), a Send RTR is taken here (``o_send_rtr``). Any other first segment passes on
    marked bad with the MPA "No matching RTR" code, so the placer sends its Terminate and
    drops its payload. Later headers pass unchanged.
    """

    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(SegmentHeader)),
            "o": Out(stream.Signature(SegmentHeader)),
            "expect": In(Rtr),
            "o_send_rtr": Out(1),
            "started": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        hdr = self.i.payload
        expect = self.expect.as_value()
        first = Signal(init=1)
        # The first header's verdict, registered: it waits a cycle for it, so that no path
        # runs from the header's fields to ``o.valid``.
        judged, checking, good = Signal(), Signal(), Signal()
        held = first & ~judged & ~is_zero(expect)
        at = DDP_UNTAGGED.length
        size = READ_REQUEST.unpack(hdr.head[8 * at:8 * (at + READ_REQUEST.length)]).size
        empty = is_zero(hdr.length)
        msn_1 = eq(hdr.msn, 1)
        matches = Signal()
        with m.If(eq(expect, Rtr.WRITE.value)):
            m.d.comb += matches.eq(hdr.tagged & eq(hdr.opcode, _WRITE) & empty)
        with m.Elif(eq(expect, Rtr.SEND.value)):
            m.d.comb += matches.eq(~hdr.tagged & eq(hdr.opcode, _SEND) & empty & msn_1)
        with m.Else():
            m.d.comb += matches.eq(~hdr.tagged & eq(hdr.opcode, _READ_REQUEST) &
                                   eq(hdr.length, READ_REQUEST.length) & is_zero(size) & msn_1)
        with m.If(held & self.i.valid):
            m.d.sync += [judged.eq(1), checking.eq(~hdr.fpdu_bad), good.eq(hdr.ok & matches)]
        verdict = first & checking
        swallow = verdict & good & eq(expect, Rtr.SEND.value)
        # Ready does not depend on the header (the parser's pipeline hangs on it): a Send RTR
        # is taken when the consumer could take it.
        m.d.comb += [self.o.payload.eq(hdr), self.o.valid.eq(self.i.valid & ~held & ~swallow),
                     self.i.ready.eq(self.o.ready & ~held)]
        with m.If(verdict & ~good):
            m.d.comb += [self.o.payload.ok.eq(0),
                         self.o.payload.code.eq(TerminateCode.MPA_NO_MATCHING_RTR)]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += first.eq(0)
            with m.If(first & ~hdr.fpdu_bad & (~verdict | good)):
                m.d.sync += self.started.eq(1)
            m.d.comb += self.o_send_rtr.eq(swallow)
        return m
