"""The send path of one RDMAP stream, from messages to TCP octets: RFC 5041 section 5.1
(segmentation), RFC 5044 sections 4 and 6 (FPDU framing, markers by stream position).

:class:`StreamSender` chains the :class:`~.emit.SegmentEmitter` (and, for the stream's
Terminate, a :class:`~iwarp_nic.rdmap.TerminateEmitter`) and the
:class:`~iwarp_nic.mpa.FpduFramer`, and keeps the stream position (modulo 512, from SeqStart)
that places the markers.
"""

from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..exact import wrap_add
from ..mpa import FpduFramer
from ..rdmap.terminate import TerminateEmitter, TerminateRequest
from ..stream import BeatStream, check_data_bytes
from .emit import Fetch, Message, SegmentEmitter

__all__ = ["StreamSender"]


class StreamSender(wiring.Component):
    """Messages in; the FPDUs of their segments out.

    Ports
    -----
    i_message : In(stream.Signature(Message))
    max_ulpdu, crc, markers : In
        The MULPDU and the negotiated MPA options, held steady while the stream runs.
    o_fetch, i_payload : Out(stream.Signature(Fetch)), In(BeatStream(data_bytes))
        Each segment's payload, asked for and answered as :class:`~.emit.SegmentEmitter` says.
    i_terminate : In(stream.Signature(TerminateRequest))
        The stream's Terminate (RFC 5040 section 7): framed next, between two segments, and
        nothing is sent after it (the segments planned after it are held).
    o : Out(BeatStream(data_bytes, err=True))
        The FPDUs, one packet each, as the model's ``Framer`` frames the model's segments of the
        same messages from SeqStart on; ``err`` as the framer marks a payload of the wrong
        length.

    An FPDU's header goes to the framer once the one before has given back its length on the
    wire (its markers depend on where it starts), a few cycles per FPDU that the framer's
    queues hide for FPDUs longer than a few beats. Throughput: one beat per cycle. Back-pressure
    on ``o`` holds everything behind it.
    """

    def __init__(self, data_bytes):
        self.data_bytes = check_data_bytes(data_bytes)
        super().__init__({
            "i_message": In(stream.Signature(Message)),
            "max_ulpdu": In(16), "crc": In(1), "markers": In(1),
            "o_fetch": Out(stream.Signature(Fetch)),
            "i_payload": In(BeatStream(data_bytes)),
            "i_terminate": In(stream.Signature(TerminateRequest)),
            "o": Out(BeatStream(data_bytes, err=True)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        m.submodules.emitter = emitter = SegmentEmitter(n)
        m.submodules.framer = framer = FpduFramer(n)
        m.d.comb += emitter.max_ulpdu.eq(self.max_ulpdu)
        wiring.connect(m, wiring.flipped(self.i_message), emitter.i_message)
        wiring.connect(m, emitter.o_fetch, wiring.flipped(self.o_fetch))
        wiring.connect(m, wiring.flipped(self.i_payload), emitter.i_payload)
        wiring.connect(m, framer.o, wiring.flipped(self.o))
        m.submodules.terminate = terminate = TerminateEmitter(n)
        wiring.connect(m, wiring.flipped(self.i_terminate), terminate.i)

        # The stream position of the next FPDU, known once the last one's length is back.
        position = Signal(9)
        waiting = Signal()
        header = framer.i_header
        # Whose ULPDU each FPDU header is (1: the Terminate's), for the payload that follows.
        m.submodules.order = order = SyncFIFOBuffered(width=1, depth=4)
        ended = Signal()                # the Terminate is framed: nothing more follows it
        pick_terminate = terminate.o_length.valid
        room = ~waiting & order.w_rdy
        m.d.comb += [
            header.valid.eq((pick_terminate | (emitter.o_length.valid & ~ended)) & room),
            terminate.o_length.ready.eq(header.ready & room & pick_terminate),
            emitter.o_length.ready.eq(header.ready & room & ~pick_terminate & ~ended),
            header.payload.ulpdu_length.eq(Mux(pick_terminate, terminate.o_length.payload,
                                               emitter.o_length.payload)),
            header.payload.crc.eq(self.crc), header.payload.markers.eq(self.markers),
            header.payload.position.eq(position),
            framer.o_length.ready.eq(1),
            order.w_en.eq(header.valid & header.ready), order.w_data.eq(pick_terminate),
        ]
        with m.If(header.valid & header.ready):
            m.d.sync += waiting.eq(1)
            with m.If(pick_terminate):
                m.d.sync += ended.eq(1)
        payload = framer.i_payload
        for source, ours in ((emitter.o, ~order.r_data[0]), (terminate.o, order.r_data[0])):
            with m.If(order.r_rdy & ours):
                m.d.comb += [payload.valid.eq(source.valid), payload.payload.eq(source.payload),
                             source.ready.eq(payload.ready),
                             order.r_en.eq(source.valid & payload.ready & source.payload.last)]
        with m.If(framer.o_length.valid):
            m.d.sync += [waiting.eq(0),
                         position.eq(wrap_add(m, position, framer.o_length.payload[:9], 9,
                                              "next_position"))]
        return m
