"""The ready-to-receive check of the peer-to-peer model: RFC 6581 section 7 (the Initiator's
first FPDU is the RTR message agreed on in the MPA exchange: a zero-length Send, RDMA Write or
RDMA Read; anything else is the MPA error "No matching RTR", RFC 6581 section 9 and RFC 6580)
and RFC 5044 section 7.1.2 (the Responder sends nothing before the Initiator's first FPDU).

:class:`RtrCheck` sits between the :class:`~.segment.SegmentParser` and the placer, for one
stream or for several connections.
"""

from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..errors import TerminateCode
from ..exact import eq, is_zero
from ..headers import DDP_UNTAGGED, READ_REQUEST
from ..mpa.negotiate import Rtr
from ..tcp.layouts import ConnRef, conn_bits, with_conn
from .segment import SegmentHeader, untagged_fields

__all__ = ["RtrCheck", "RtrOpen"]

_WRITE, _READ_REQUEST, _SEND = 0, 1, 3

def RtrOpen(conns):
    """Several connections: connection ``conn``'s stream starts, awaiting the RTR ``expect``."""
    return with_conn(StructLayout({"expect": Rtr}), conns)


# What the check keeps of a stream: whether its first header is still to come, and the RTR
# awaited. With several connections, what ``i_open`` writes: the RTR and a generation that
# flips at each opening.
_Context = StructLayout({"first": 1, "expect": Rtr})
_Opened = StructLayout({"generation": 1, "expect": Rtr})


class RtrCheck(wiring.Component):
    """Check the first segment of a peer-to-peer Responder's stream against the RTR awaited.

    ``conns`` None: one stream. ``conns`` an integer: the headers of that many connections,
    each naming its own, each connection's first one checked against its own RTR (its state in
    distributed RAM, set by ``i_open``).

    Ports
    -----
    i, o : In/Out(stream.Signature(with_conn(SegmentHeader, conns)))
        The parser's headers, passed on combinationally (payloads do not pass here), but for
        a stream's first one with an RTR awaited, which waits a cycle for its registered
        verdict; ``i`` is ready exactly when ``o`` is, but in that cycle (and, with several
        connections, while an ``o_started`` is not taken).
    expect : In(Rtr)
        One stream: the RTR the MPA exchange settled (``NONE``: no check). Held from before
        the first header.
    i_open : In(stream.Signature(RtrOpen(conns)))
        Several connections: connection ``conn``'s stream starts, awaiting ``expect``; before
        its first header. Always ready, and no header waits for it.
    o_send_rtr : Out(1)
        One stream: a cycle's pulse, the Send RTR was taken (queue 0's MSN 1 is used, no
        receive is). With several connections the placer is told at its ``i_open``.
    started : Out(1)
        One stream: set once the peer's first FPDU is taken, or with ``expect``, its RTR
        matched: the Responder may send from then on.
    o_started : Out(stream.Signature(ConnRef(conns)))
        Several connections: the same, once per stream, naming its connection.

    The first header, with ``expect`` set and an FPDU the deframer found good, must be the
    model's RTR (``Connection._on_rtr``): a good segment of the awaited opcode, zero length (a
    Read Request: of size 0), MSN 1 when untagged. A Write RTR passes on (the placer places
    nothing for it), a Read RTR too (the Read responder answers it with an empty Read
    Response), a Send RTR is taken here (``o_send_rtr``). Any other first segment passes on
    marked bad with the MPA "No matching RTR" code, so the placer sends its Terminate and
    drops its payload. Later headers pass unchanged. Bad input (several connections): a
    ``conn`` of ``conns`` or more uses a spare word of the memory, or none.
    """

    def __init__(self, conns=None):
        self.conns = conns
        ports = {"i": In(stream.Signature(with_conn(SegmentHeader, conns))),
                 "o": Out(stream.Signature(with_conn(SegmentHeader, conns)))}
        if conns is None:
            ports |= {"expect": In(Rtr), "o_send_rtr": Out(1), "started": Out(1)}
        else:
            ports |= {"i_open": In(stream.Signature(RtrOpen(conns))),
                      "o_started": Out(stream.Signature(ConnRef(conns)))}
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        hdr = self.i.payload
        several = self.conns is not None
        now = Signal(_Context)              # the state of the header's stream
        taken = self.i.valid & self.i.ready
        if several:
            # Two memories of one writer each, so that an ``i_open`` and a stream's first
            # header never wait on one another: ``i_open`` flips its connection's generation in
            # `opened` (and sets the RTR awaited), the first header copies it into `seen`; the
            # first header is still to come while they differ.
            depth = 1 << conn_bits(self.conns)
            m.submodules.opened = opened = Memory(shape=_Opened, depth=depth, init=[])
            m.submodules.seen = seen = Memory(shape=1, depth=depth, init=[])
            opened_rd, reopened_rd, opened_wr = (opened.read_port(domain="comb"),
                                                 opened.read_port(domain="comb"),
                                                 opened.write_port())
            seen_rd, seen_wr = seen.read_port(domain="comb"), seen.write_port()
            opening, started = self.i_open, self.o_started
            m.d.comb += [opened_rd.addr.eq(hdr.conn), seen_rd.addr.eq(hdr.conn),
                         now.expect.eq(opened_rd.data.expect),
                         now.first.eq(opened_rd.data.generation ^ seen_rd.data),
                         opening.ready.eq(1),
                         reopened_rd.addr.eq(opening.payload.conn),
                         opened_wr.en.eq(opening.valid), opened_wr.addr.eq(opening.payload.conn),
                         opened_wr.data.generation.eq(~reopened_rd.data.generation),
                         opened_wr.data.expect.eq(opening.payload.expect),
                         seen_wr.en.eq(taken & now.first), seen_wr.addr.eq(hdr.conn),
                         seen_wr.data.eq(opened_rd.data.generation)]
            with m.If(started.ready):
                m.d.sync += started.valid.eq(0)
            free = ~started.valid | started.ready
        else:
            first = Signal(init=1)
            m.d.comb += [now.first.eq(first), now.expect.eq(self.expect)]
            with m.If(taken):
                m.d.sync += first.eq(0)
            free = 1
        expect = now.expect.as_value()
        # The first header's verdict, registered: it waits a cycle for it, so that no path
        # runs from the header's fields to ``o.valid``.
        judged, checking, good = Signal(), Signal(), Signal()
        held = now.first & ~judged & ~is_zero(expect)
        at = DDP_UNTAGGED.length
        size = READ_REQUEST.unpack(hdr.head[8 * at:8 * (at + READ_REQUEST.length)]).size
        empty = is_zero(hdr.length)
        msn_1 = eq(untagged_fields(hdr).msn, 1)
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
        verdict = now.first & judged & checking
        swallow = verdict & good & eq(expect, Rtr.SEND.value)
        # Ready does not depend on the header (the parser's pipeline hangs on it): a Send RTR
        # is taken when the consumer could take it.
        m.d.comb += [self.o.payload.eq(hdr),
                     self.o.valid.eq(self.i.valid & ~held & ~swallow & free),
                     self.i.ready.eq(self.o.ready & ~held & free)]
        with m.If(verdict & ~good):
            m.d.comb += [self.o.payload.ok.eq(0),
                         self.o.payload.code.eq(TerminateCode.MPA_NO_MATCHING_RTR)]
        begins = now.first & ~hdr.fpdu_bad & (~verdict | good)     # the stream may send
        with m.If(taken):
            m.d.sync += judged.eq(0)
            if several:
                with m.If(begins):
                    m.d.sync += [started.valid.eq(1), started.payload.conn.eq(hdr.conn)]
            else:
                with m.If(begins):
                    m.d.sync += self.started.eq(1)
                m.d.comb += self.o_send_rtr.eq(swallow)
        return m
