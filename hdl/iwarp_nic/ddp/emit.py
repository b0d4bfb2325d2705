"""DDP segments to send: RFC 5041 sections 4.2 and 4.3 (the tagged and untagged headers), 5.1
(segmentation of a message: the TO or MO of each segment, L on the last), with the RDMAP control
field of RFC 5040 section 4.1 and the queue of each opcode (RFC 5040 5.1, RFC 7306 10.2).

:class:`SegmentEmitter` cuts each message into segments of at most ``max_ulpdu`` octets, as the
model's engine does (``_tagged``/``_untagged``): a payload of ``max_ulpdu`` less the header per
segment, one empty segment for an empty message. It asks for each segment's payload as a fetch
(offset and length in the message), which a DMA read or a buffer answers with one packet, and
puts the DDP header in front.
"""

from amaranth import Module, Mux, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..exact import Machine, add, is_zero, one_of, select, sub, widened, wire, wrap_add, wrap_sub
from ..hdrparse import HeaderEmitter, HeaderLayout
from ..headers import DDP_TAGGED, DDP_UNTAGGED
from ..stream import BeatStream, HalfRateSlice, check_data_bytes
from ..tcp.layouts import with_conn
from .segment import QUEUE, TAGGED_OPCODES

__all__ = ["Message", "Fetch", "SegmentEmitter"]

#: One RDMAP message to send: its opcode, where it goes (``stag`` and ``to`` when tagged; the
#: ``msn`` of its queue, which the opcode gives, and ``inv_stag`` for a Send with Invalidate,
#: when untagged) and its ``length`` in octets (an RDMAP header counts as payload).
Message = StructLayout({"opcode": 4, "stag": 32, "to": 64, "msn": 32, "inv_stag": 32,
                        "length": 32})

#: A request for ``length`` octets (1 or more) of the message being sent, from ``offset``.
Fetch = StructLayout({"offset": 32, "length": 16})

_DEPTH = 4                  # segments between planning and output


class SegmentEmitter(wiring.Component):
    """Cut messages into DDP segments and put their headers in front of their payloads.

    ``conns`` None: one stream. ``conns`` an integer: each message names its connection
    (``conn``), and so does each ULPDU length, for a sender of several connections.

    Ports
    -----
    i_message : In(stream.Signature(with_conn(Message, conns)))
    max_ulpdu : In(16)
        The largest ULPDU (the MULPDU of RFC 5044); more than 18 octets. Held steady while a
        message is cut (from the cycle after it is taken to its last segment's planning).
    o_fetch : Out(stream.Signature(Fetch))
        One per segment with a payload, in order.
    i_payload : In(BeatStream(data_bytes))
        One packet per fetch, in the same order, exactly as long as asked.
    o : Out(BeatStream(data_bytes))
        The ULPDUs: the model's ``Segment(...).encode()`` of each segment.
    o_length : Out(stream.Signature(unsigned(16) or with_conn({"length": 16}, conns)))
        Each ULPDU's length, in order, as its header is planned (before its octets), for the
        FPDU framer (and its message's ``conn``).

    Throughput: a segment is planned every two cycles at best; its octets leave at one beat per
    cycle behind two header emitters (tagged and untagged) whose outputs are merged in order.
    Latency: the fetch is offered two cycles after the message is taken. Back-pressure on any
    output holds the planning; a fetch answered late holds the output.
    """

    def __init__(self, data_bytes, *, conns=None):
        self.data_bytes = check_data_bytes(data_bytes)
        self.conns = conns
        super().__init__({
            "i_message": In(stream.Signature(with_conn(Message, conns))),
            "max_ulpdu": In(16),
            "o_fetch": Out(stream.Signature(Fetch)),
            "i_payload": In(BeatStream(data_bytes)),
            "o": Out(BeatStream(data_bytes)),
            "o_length": Out(stream.Signature(
                unsigned(16) if conns is None else with_conn(StructLayout({"length": 16}),
                                                             conns))),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        m.submodules.tagged = tagged_out = HeaderEmitter(DDP_TAGGED, n)
        m.submodules.untagged = untagged_out = HeaderEmitter(DDP_UNTAGGED, n)
        # Headers reach the emitters through register slices: the planner then never waits on
        # a ready that depends on the output's. One-entry slices: the planner makes a header
        # every two cycles at best.
        heads = {}
        for name, emitter, fmt in (("tagged", tagged_out, DDP_TAGGED),
                                   ("untagged", untagged_out, DDP_UNTAGGED)):
            m.submodules[f"{name}_slice"] = cut = HalfRateSlice(HeaderLayout(fmt))
            wiring.connect(m, cut.o, emitter.i_header)
            heads[name] = cut.i
        # Which emitter each payload packet and each output packet belongs to (1: tagged).
        m.submodules.payload_route = payload_route = SyncFIFOBuffered(width=1, depth=_DEPTH)
        m.submodules.output_route = output_route = SyncFIFOBuffered(width=1, depth=_DEPTH)

        msg = Signal(with_conn(Message, self.conns))
        offset = Signal(32)
        left = Signal(32)
        tagged = wire(m, one_of(msg.opcode, TAGGED_OPCODES), "tagged")
        step = wire(m, Mux(tagged, sub(self.max_ulpdu, DDP_TAGGED.length),
                           sub(self.max_ulpdu, DDP_UNTAGGED.length)), "step")
        # The next segment's size and whether it is the last, kept as registers (SIZE works
        # them out, PLAN issues the segment).
        last, size, has_payload = Signal(), Signal(16), Signal()
        next_last = wire(m, left <= widened(m, step, 32, "step_wide"), "next_last")
        next_size = wire(m, Mux(next_last, left[:16], step), "next_size")
        fetch, length = self.o_fetch, self.o_length

        for out in (fetch, length):
            with m.If(out.ready):
                m.d.sync += out.valid.eq(0)

        # The header of the planned segment, for both emitters.
        for head, fmt in ((heads["tagged"], DDP_TAGGED), (heads["untagged"], DDP_UNTAGGED)):
            f = head.payload.fields
            m.d.comb += [f.t.eq(fmt is DDP_TAGGED), f.l.eq(last), f.dv.eq(1), f.rv.eq(1),
                         f.opcode.eq(msg.opcode), head.payload.has_payload.eq(has_payload)]
        m.d.comb += [
            heads["tagged"].payload.fields.stag.eq(msg.stag),
            heads["tagged"].payload.fields.to.eq(wrap_add(m, msg.to, offset, 64, "to")),
            heads["untagged"].payload.fields.inv_stag.eq(msg.inv_stag),
            heads["untagged"].payload.fields.qn.eq(
                select(m, msg.opcode, QUEUE, 32, "qn")),
            heads["untagged"].payload.fields.msn.eq(msg.msn),
            heads["untagged"].payload.fields.mo.eq(offset),
        ]

        plan = Machine(m, ["TAKE", "SIZE", "PLAN"], "plan")
        with plan.state("TAKE"):
            m.d.comb += self.i_message.ready.eq(1)
            with m.If(self.i_message.valid):
                m.d.sync += [msg.eq(self.i_message.payload), offset.eq(0),
                             left.eq(self.i_message.payload.length)]
                plan.goto("SIZE")
        with plan.state("SIZE"):
            m.d.sync += [last.eq(next_last), size.eq(next_size),
                         has_payload.eq(~is_zero(next_size))]
            plan.goto("PLAN")
        with plan.state("PLAN"):
            header_ready = Mux(tagged, heads["tagged"].ready, heads["untagged"].ready)
            free = (header_ready & ~fetch.valid & ~length.valid & payload_route.w_rdy
                    & output_route.w_rdy)
            with m.If(free):
                m.d.comb += [
                    heads["tagged"].valid.eq(tagged),
                    heads["untagged"].valid.eq(~tagged),
                    payload_route.w_en.eq(has_payload), payload_route.w_data.eq(tagged),
                    output_route.w_en.eq(1), output_route.w_data.eq(tagged),
                ]
                m.d.sync += [
                    fetch.valid.eq(has_payload), fetch.payload.offset.eq(offset),
                    fetch.payload.length.eq(size),
                    length.valid.eq(1),
                    length.payload.eq(Mux(tagged, add(size, DDP_TAGGED.length),
                                          add(size, DDP_UNTAGGED.length))),
                    *([] if self.conns is None else [length.payload.conn.eq(msg.conn)]),
                    offset.eq(wrap_add(m, offset, size, 32, "next_offset")),
                    left.eq(wrap_sub(m, left, size, 32, "next_left")),
                ]
                with m.If(last):
                    plan.goto("TAKE")
                with m.Else():
                    plan.goto("SIZE")

        # Payload packets to their emitter, output packets from theirs, in order.
        to_tagged = payload_route.r_data[0]
        for emitter, chosen in ((tagged_out, to_tagged), (untagged_out, ~to_tagged)):
            m.d.comb += [emitter.i_payload.payload.eq(self.i_payload.payload),
                         emitter.i_payload.valid.eq(self.i_payload.valid & payload_route.r_rdy
                                                    & chosen)]
        m.d.comb += [
            self.i_payload.ready.eq(payload_route.r_rdy & Mux(
                to_tagged, tagged_out.i_payload.ready, untagged_out.i_payload.ready)),
            payload_route.r_en.eq(self.i_payload.valid & self.i_payload.ready
                                  & self.i_payload.payload.last),
        ]
        from_tagged = output_route.r_data[0]
        source = {1: tagged_out.o, 0: untagged_out.o}
        for value, out in source.items():
            m.d.comb += out.ready.eq(self.o.ready & output_route.r_rdy & (from_tagged == value))
        m.d.comb += [
            self.o.payload.eq(Mux(from_tagged, tagged_out.o.payload, untagged_out.o.payload)),
            self.o.valid.eq(output_route.r_rdy & Mux(from_tagged, tagged_out.o.valid,
                                                     untagged_out.o.valid)),
            output_route.r_en.eq(self.o.valid & self.o.ready & self.o.payload.last),
        ]
        return m
