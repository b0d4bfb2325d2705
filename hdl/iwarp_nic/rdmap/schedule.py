"""What a stream sends next: RFC 5040 sections 5.3 and 5.4 (RDMA Read Responses go out in the
order their requests came, beside the requester's own messages), with the payload of each
message read from host memory.

:class:`SendScheduler` takes turns, message by message, between the send queue (work the host
posted: Sends, Writes, Read Requests, ...) and the Read Responses the
:class:`~.read.ReadResponder` produced, so neither starves the other, and turns each payload
fetch of the :class:`~iwarp_nic.ddp.StreamSender` into a host-memory read.
"""

from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..ddp.emit import Fetch, Message
from ..exact import is_zero, wrap_add
from .read import ReadResponse

__all__ = ["HostRead", "SendScheduler"]

#: A read of ``length`` octets of host memory at ``addr``.
HostRead = StructLayout({"addr": 64, "length": 16})

_DEPTH = 4                  # messages planned whose payload is still being fetched


class SendScheduler(wiring.Component):
    """Round-robin between the send queue and the Read Responses; fetches to host reads.

    Ports
    -----
    i_send : In(stream.Signature(ReadResponse))
        Work from the send queue: a message and the host address of its payload (``source``).
    i_response : In(stream.Signature(ReadResponse))
        Read Responses from the :class:`~.read.ReadResponder`.
    o_message : Out(stream.Signature(Message))
        The messages in the order they are to be sent, to the
        :class:`~iwarp_nic.ddp.StreamSender`.
    i_fetch : In(stream.Signature(Fetch))
        The sender's payload fetches, in message order.
    o_read : Out(stream.Signature(HostRead))
        Each fetch as a host-memory read: the message's ``source`` plus the fetch's offset.
    response_sent : Out(1)
        One cycle high as the last fetch of a Read Response is taken (its last segment is then
        in the sender's hands), or as a Read Response without payload is passed on: its IRD
        credit may come back (the ReadResponder's ``done``), as the model's engine gives it
        back when the last segment is handed over.

    When both inputs offer a message, they alternate: the one not served last goes first.
    Throughput: a message per cycle; fetches one per cycle. Latency: one cycle for a message,
    none for a fetch (``o_read`` follows ``i_fetch`` combinationally). Back-pressure passes
    through; at most four messages with a payload may be fetching at once.
    """

    def __init__(self):
        super().__init__({
            "i_send": In(stream.Signature(ReadResponse)),
            "i_response": In(stream.Signature(ReadResponse)),
            "o_message": Out(stream.Signature(Message)),
            "i_fetch": In(stream.Signature(Fetch)),
            "o_read": Out(stream.Signature(HostRead)),
            "response_sent": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        # Per message with a payload, in order: where it comes from, its length and whether it
        # is a Read Response.
        entry = StructLayout({"source": 64, "length": 32, "response": 1})
        m.submodules.sources = sources = SyncFIFOBuffered(width=entry.size, depth=_DEPTH)
        out = self.o_message
        last_response = Signal()        # the last message taken was a Read Response
        pick_response = (self.i_response.valid
                         & (~self.i_send.valid | ~last_response))
        chosen = Signal(ReadResponse)
        with m.If(pick_response):
            m.d.comb += chosen.eq(self.i_response.payload)
        with m.Else():
            m.d.comb += chosen.eq(self.i_send.payload)
        has_payload = ~is_zero(chosen.message.length)
        offered = self.i_send.valid | self.i_response.valid
        take = offered & (~out.valid | out.ready) & sources.w_rdy
        m.d.comb += [
            self.i_response.ready.eq(take & pick_response),
            self.i_send.ready.eq(take & ~pick_response),
            sources.w_en.eq(take & has_payload),
        ]
        written = entry(sources.w_data)
        m.d.comb += [written.source.eq(chosen.source), written.length.eq(chosen.message.length),
                     written.response.eq(pick_response)]
        with m.If(out.ready):
            m.d.sync += out.valid.eq(0)
        with m.If(take):
            m.d.sync += [out.valid.eq(1), out.payload.eq(chosen.message),
                         last_response.eq(pick_response)]

        # Fetches: the head message's source plus the offset; the message is done with when a
        # fetch reaches its end.
        head = entry(sources.r_data)
        fetch = self.i_fetch.payload
        end = wrap_add(m, fetch.offset, fetch.length, 32, "fetch_end")
        m.d.comb += [
            self.o_read.valid.eq(self.i_fetch.valid & sources.r_rdy),
            self.i_fetch.ready.eq(self.o_read.ready & sources.r_rdy),
            self.o_read.payload.addr.eq(wrap_add(m, head.source, fetch.offset, 64, "read_addr")),
            self.o_read.payload.length.eq(fetch.length),
        ]
        finished = self.i_fetch.valid & self.i_fetch.ready & (end == head.length)
        m.d.comb += [
            sources.r_en.eq(finished),
            self.response_sent.eq((finished & head.response)
                                  | (take & pick_response & ~has_payload)),
        ]
        return m
