"""The send path of one RDMAP stream, from messages to TCP octets: RFC 5041 section 5.1
(segmentation), RFC 5044 sections 4 and 6 (FPDU framing, markers by stream position).

:class:`StreamSender` chains the :class:`~.emit.SegmentEmitter` (and, for the stream's
Terminate, a :class:`~iwarp_nic.rdmap.TerminateEmitter`) and the
:class:`~iwarp_nic.mpa.FpduFramer`, and keeps the stream position (modulo 512, from SeqStart)
that places the markers: of one stream, or of each of several connections.
"""

from amaranth import C, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..exact import wrap_add
from ..mpa import FpduFramer
from ..rdmap.terminate import TerminateEmitter, TerminateRequest
from ..stream import BeatStream, check_data_bytes
from ..tcp.layouts import ChunkHeader, conn_bits, with_conn, without_conn
from .emit import Fetch, Message, SegmentEmitter

__all__ = ["SenderSettings", "StreamSender"]

#: What a stream's FPDUs are framed with: its MULPDU and the negotiated MPA options.
SenderSettings = StructLayout({"max_ulpdu": 16, "crc": 1, "markers": 1})

# What the sender keeps of a stream: its settings, the stream position of its next FPDU
# (modulo 512, from SeqStart) and whether its Terminate is framed (nothing follows it).
_Context = StructLayout({"settings": SenderSettings, "position": 9, "ended": 1})

_CONNS_AHEAD = 16           # FPDUs whose header is framed and whose last beat has not left


class StreamSender(wiring.Component):
    """Messages in; the FPDUs of their segments out.

    ``conns`` None: one stream. ``conns`` an integer: the messages and Terminates of that
    many connections, each naming its own (``conn``), are sent message by message (a
    message's FPDUs leave together, each beat naming the connection), each connection with its
    own settings, stream position and end, kept as a word of a memory (distributed RAM).

    Ports
    -----
    i_message : In(stream.Signature(with_conn(Message, conns)))
    max_ulpdu, crc, markers : In
        One stream: the MULPDU and the negotiated MPA options, held steady while the stream
        runs.
    i_open : In(stream.Signature(with_conn(SenderSettings, conns)))
        Several connections: connection ``conn``'s slot made afresh for a new stream (position
        0 at SeqStart, not ended) with its settings, before its first message. Always ready;
        the stream that had the slot must have nothing in the sender any more.
    o_fetch, i_payload : Out(stream.Signature(Fetch)), In(BeatStream(data_bytes))
        Each segment's payload, asked for and answered as :class:`~.emit.SegmentEmitter` says.
    i_terminate : In(stream.Signature(with_conn(TerminateRequest, conns)))
        A stream's Terminate (RFC 5040 section 7): framed next, between two segments, and
        nothing of that stream is sent after it (its segments planned after it are fetched and
        dropped).
    o : Out(BeatStream(data_bytes, err=True, conns=conns))
        The FPDUs, one packet each, as the model's ``Framer`` frames the model's segments of the
        same messages from SeqStart on; ``err`` as the framer marks a payload of the wrong
        length.
    o_header : Out(stream.Signature(ChunkHeader(conns)))
        Several connections: one transfer per FPDU of ``o``, in the same order: its connection
        and its length on the wire (markers included), the chunk header
        :class:`~iwarp_nic.tcp.engine.TcpEngine` takes before the chunk's bytes. It is known
        from the FPDU's header, a few cycles after the framer takes it and before the FPDU's
        first beat is framed. A queue of 16 holds them; once it is full, FPDUs wait to be
        framed.

    An FPDU's header goes to the framer once the one before has given back its length on the
    wire (its markers depend on where it starts), a few cycles per FPDU that the framer's
    queues hide for FPDUs longer than a few beats. Throughput: one beat per cycle. Back-pressure
    on ``o`` holds everything behind it. Bad input: a ``conn`` of ``conns`` or more uses one of
    the memory's spare words, or none.
    """

    def __init__(self, data_bytes, *, conns=None):
        self.data_bytes = check_data_bytes(data_bytes)
        self.conns = conns
        ports = {
            "i_message": In(stream.Signature(with_conn(Message, conns))),
            "o_fetch": Out(stream.Signature(Fetch)),
            "i_payload": In(BeatStream(data_bytes)),
            "i_terminate": In(stream.Signature(with_conn(TerminateRequest, conns))),
            "o": Out(BeatStream(data_bytes, err=True, conns=conns)),
        }
        if conns is None:
            ports |= {"max_ulpdu": In(16), "crc": In(1), "markers": In(1)}
        else:
            ports["i_open"] = In(stream.Signature(with_conn(SenderSettings, conns)))
            ports["o_header"] = Out(stream.Signature(ChunkHeader(conns)))
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        n, several = self.data_bytes, self.conns is not None
        m.submodules.emitter = emitter = SegmentEmitter(n, conns=self.conns)
        m.submodules.framer = framer = FpduFramer(n)
        m.submodules.terminate = terminate = TerminateEmitter(n)
        wiring.connect(m, wiring.flipped(self.i_message), emitter.i_message)
        wiring.connect(m, emitter.o_fetch, wiring.flipped(self.o_fetch))
        wiring.connect(m, wiring.flipped(self.i_payload), emitter.i_payload)
        m.d.comb += [terminate.i.valid.eq(self.i_terminate.valid),
                     terminate.i.payload.eq(without_conn(self.i_terminate.payload,
                                                         TerminateRequest)),
                     self.i_terminate.ready.eq(terminate.i.ready)]

        header, length = framer.i_header, framer.o_length
        pick_terminate = terminate.o_length.valid
        waiting = Signal()              # an FPDU's header is framed, its length not back yet
        # The stream of the next segment and, while waiting, of the FPDU framed (`held`): its
        # context `now`, and what it becomes (`update`, written when `write`).
        conn, held = Signal(conn_bits(self.conns or 1)), Signal(conn_bits(self.conns or 1))
        now, update, write = Signal(_Context), Signal(_Context), Signal()
        m.d.comb += update.eq(now)
        if several:
            m.submodules.contexts = mem = Memory(shape=_Context,
                                                 depth=1 << conn_bits(self.conns), init=[])
            message_rd, read, wr = (mem.read_port(domain="comb"), mem.read_port(domain="comb"),
                                    mem.write_port())
            opening = self.i_open
            terminate_conn = Signal.like(conn)      # the Terminate in the TerminateEmitter's
            with m.If(self.i_terminate.valid & self.i_terminate.ready):
                m.d.sync += terminate_conn.eq(self.i_terminate.payload.conn)
            m.d.comb += [conn.eq(Mux(pick_terminate, terminate_conn,
                                     emitter.o_length.payload.conn)),
                         read.addr.eq(Mux(waiting, held, conn)), now.eq(read.data),
                         message_rd.addr.eq(self.i_message.payload.conn),
                         opening.ready.eq(1)]
            # The MULPDU of the message the emitter is cutting.
            max_ulpdu = Signal(16)
            with m.If(emitter.i_message.valid & emitter.i_message.ready):
                m.d.sync += max_ulpdu.eq(message_rd.data.settings.max_ulpdu)
            m.d.comb += emitter.max_ulpdu.eq(max_ulpdu)
            with m.If(opening.valid):
                m.d.comb += [wr.en.eq(1), wr.addr.eq(opening.payload.conn), wr.data.eq(0),
                             wr.data.settings.eq(without_conn(opening.payload, SenderSettings))]
            with m.Else():
                m.d.comb += [wr.en.eq(write), wr.addr.eq(Mux(waiting, held, conn)),
                             wr.data.eq(update)]
            busy = opening.valid
            segment_length = emitter.o_length.payload.length
            # The connection of each FPDU framed, for its beats on the way out.
            m.submodules.conns_ahead = ahead = SyncFIFOBuffered(width=len(conn),
                                                                depth=_CONNS_AHEAD)
            out = self.o
            m.d.comb += [out.payload.eq(framer.o.payload), out.payload.conn.eq(ahead.r_data),
                         out.valid.eq(framer.o.valid & ahead.r_rdy),
                         framer.o.ready.eq(out.ready & ahead.r_rdy),
                         ahead.r_en.eq(out.valid & out.ready & out.payload.last),
                         ahead.w_data.eq(conn), ahead.w_en.eq(header.valid & header.ready)]
            room_ahead = ahead.w_rdy
            # Each FPDU's chunk header, once its wire length is known.
            m.submodules.headers = headers = SyncFIFOBuffered(
                width=ChunkHeader(self.conns).size, depth=_CONNS_AHEAD)
            chunk = ChunkHeader(self.conns)(headers.w_data)
            m.d.comb += [chunk.conn.eq(held), chunk.length.eq(length.payload[:16]),
                         headers.w_en.eq(length.valid & length.ready),
                         self.o_header.payload.eq(headers.r_data),
                         self.o_header.valid.eq(headers.r_rdy),
                         headers.r_en.eq(self.o_header.ready)]
            length_room = headers.w_rdy
        else:
            stream_state = Signal(_Context)
            m.d.comb += [now.eq(stream_state), now.settings.max_ulpdu.eq(self.max_ulpdu),
                         now.settings.crc.eq(self.crc), now.settings.markers.eq(self.markers),
                         emitter.max_ulpdu.eq(self.max_ulpdu)]
            with m.If(write):
                m.d.sync += stream_state.eq(update)
            busy = C(0, 1)
            segment_length = emitter.o_length.payload
            wiring.connect(m, framer.o, wiring.flipped(self.o))
            room_ahead = length_room = C(1, 1)

        # Whose ULPDU each planned segment is, for the payload that follows: the Terminate's,
        # or the emitter's, framed or (its stream ended) dropped.
        order_layout = StructLayout({"terminate": 1, "drop": 1})
        m.submodules.order = order = SyncFIFOBuffered(width=order_layout.size, depth=4)
        written, head = order_layout(order.w_data), order_layout(order.r_data)
        drop = ~pick_terminate & now.ended
        room = ~waiting & order.w_rdy & room_ahead & ~busy
        m.d.comb += [
            header.valid.eq((pick_terminate | (emitter.o_length.valid & ~drop)) & room),
            terminate.o_length.ready.eq(header.ready & room & pick_terminate),
            emitter.o_length.ready.eq((header.ready | drop) & room & ~pick_terminate),
            header.payload.ulpdu_length.eq(Mux(pick_terminate, terminate.o_length.payload,
                                               segment_length)),
            header.payload.crc.eq(now.settings.crc),
            header.payload.markers.eq(now.settings.markers),
            header.payload.position.eq(now.position),
            written.terminate.eq(pick_terminate), written.drop.eq(drop),
            order.w_en.eq(terminate.o_length.ready | (emitter.o_length.valid
                                                      & emitter.o_length.ready)),
            length.ready.eq(~busy & length_room),
        ]
        with m.If(header.valid & header.ready):
            m.d.sync += [waiting.eq(1), held.eq(conn)]
            with m.If(pick_terminate):
                m.d.comb += [write.eq(1), update.ended.eq(1)]
        with m.If(length.valid & length.ready):
            m.d.sync += waiting.eq(0)
            m.d.comb += [write.eq(1),
                         update.position.eq(wrap_add(m, now.position, length.payload[:9], 9,
                                                     "next_position"))]
        payload = framer.i_payload
        for source, ours in ((emitter.o, ~head.terminate), (terminate.o, head.terminate)):
            with m.If(order.r_rdy & ours):
                m.d.comb += [payload.valid.eq(source.valid & ~head.drop),
                             payload.payload.eq(source.payload),
                             source.ready.eq(payload.ready | head.drop),
                             order.r_en.eq(source.valid & source.ready & source.payload.last)]
        return m
