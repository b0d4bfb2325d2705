"""ICMP echo responder: every Echo Request to us is answered with an Echo Reply.

Implements:

* RFC 792 "Echo or Echo Reply Message": type 8 code 0 answered with type 0, identifier,
  sequence number and data echoed, source and destination swapped;
* RFC 1122 section 3.2.2.6: the reply carries the request's data whole; section 3.2.2: a message
  with a bad checksum is discarded (here: the reply, made as the request arrives, is thrown
  away when the request's end shows the checksum wrong, and counted);
* RFC 1624 section 3 (eqn. 3): the reply checksum is the request's, incrementally updated for
  the type change, so no second pass over the data is needed;
* RFC 1071: the request's checksum is verified with a running ones' complement sum over the
  beats, at any width.

Other ICMP types are dropped and counted.
"""

from amaranth import Cat, Const, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..exact import Machine, add_counts, eq, lt, ne, sub
from ..fifo import PacketFifo
from ..hdrparse import HeaderEmitter, HeaderParser, HeaderStream
from ..headers import ICMP_ECHO, IPV4
from ..stream import BeatStream, check_data_bytes
from .checksum import lane_words, ones_reduce, ones_sum, words
from .ipv4 import TxRequest

__all__ = ["IcmpEcho", "PROTO_ICMP", "COUNTERS"]

PROTO_ICMP = 1
ECHO_REPLY, ECHO_REQUEST = 0, 8
#: ``~m + m'`` of RFC 1624 eqn. 3 for the first word (type, code) going from 8 to 0.
TYPE_DELTA = ~(ECHO_REQUEST << 8) & 0xFFFF

#: Counters of :class:`IcmpEcho`.
COUNTERS = ("icmp_replies", "icmp_dropped", "icmp_bad_checksum", "icmp_busy")
#: The reply buffer, in octets: one longest reply (1480 octets, a 1500-octet datagram less its
#: header), rounded up to a power of two.
REPLY_BUFFER_BYTES = 2048

#: Replies made and waiting for the TX side, at most.
REPLIES = 4


class IcmpEcho(wiring.Component):
    """Answer ICMP echo requests.

    Ports
    -----
    i_header : In(HeaderStream(IPV4)); i_payload : In(BeatStream(data_bytes, err=True))
        Datagrams with protocol 1 from :class:`.ipv4.Ipv4Rx`.
    o_header : Out(stream.Signature(TxRequest)); o_payload : Out(BeatStream(data_bytes))
        Echo replies for :class:`.ipv4.Ipv4Tx`: destination the request's source, protocol 1,
        the same length. A reply is offered only once it is whole and good in the reply buffer.
    icmp_replies, icmp_dropped, icmp_bad_checksum, icmp_busy : Out(32)
        Each message is counted once: replies made; messages dropped (not an echo request, type
        8 code 0, shorter than 8 bytes, or a header-only request with a bad checksum); requests
        whose checksum was wrong (found at their end: the reply is thrown away); requests not
        answered for lack of room (:data:`REPLIES` replies waiting, or too few octets free in
        the buffer). A request whose frame was bad is thrown away uncounted (the IPv4
        layer counted it).

    The reply is made in a :class:`~iwarp_nic.fifo.PacketFifo` of :data:`REPLY_BUFFER_BYTES`
    as the request arrives, and handed to the TX side from there: the receive side never
    waits for the transmit side, which may itself be waiting for an ARP reply to arrive
    behind the request. Up to :data:`REPLIES` replies wait for the TX side; a request that
    finds them all waiting, or too little room left in the buffer, is counted in
    ``icmp_busy``. Latency: the reply is offered
    on ``o_header`` about four cycles after the request's last beat (the emitter's two
    stages, the buffer's commit and the record's register); its first beat follows on
    ``o_payload`` two cycles after the buffer commits it. Throughput: one beat per cycle
    within a message, plus about five cycles per message.
    """

    def __init__(self, data_bytes):
        check_data_bytes(data_bytes)
        self.data_bytes = data_bytes
        members = {
            "i_header": In(HeaderStream(IPV4)),
            "i_payload": In(BeatStream(data_bytes, err=True)),
            "o_header": Out(stream.Signature(TxRequest)),
            "o_payload": Out(BeatStream(data_bytes)),
        }
        members.update({name: Out(32) for name in COUNTERS})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes

        def count(name, strobe):
            counter = getattr(self, name)
            with m.If(strobe):
                m.d.sync += counter.eq(counter + 1)

        m.submodules.parser = parser = HeaderParser(ICMP_ECHO, n, err=True)
        m.submodules.emitter = emitter = HeaderEmitter(ICMP_ECHO, n, err=True)
        m.submodules.buffer = buffer = PacketFifo(n, REPLY_BUFFER_BYTES // n)
        wiring.connect(m, wiring.flipped(self.i_payload), parser.i)
        wiring.connect(m, emitter.o, buffer.i)
        wiring.connect(m, buffer.o, wiring.flipped(self.o_payload))

        src = Signal(32)
        length = Signal(16)
        h, p = parser.o_header, parser.o_payload
        f = h.payload.fields
        # The replies made, whole in the buffer, waiting for the TX side (their TxRequests),
        # and whether one is being written into the buffer (its TxRequest in `making`).
        m.submodules.replies = replies = SyncFIFOBuffered(width=48, depth=REPLIES)
        writing = Signal()
        making = Signal(48)
        room = lt(replies.level + writing, REPLIES)
        acc = Signal(16)                        # running ones' complement sum
        odd = Signal()                          # 1-byte beats: next byte is a low byte

        # The header's sum, over two registered levels (`head`, then `acc`) before it is judged,
        # to keep the adder tree out of the parser's handshake.
        head_part = ones_reduce(m, words(ICMP_ECHO.pack(f), ICMP_ECHO.length), "head_sum",
                                levels=1)
        head = [Signal(16, name=f"head_part{k}") for k in range(len(head_part))]
        is_echo = eq(f.type, ECHO_REQUEST) & ~f.code.any()

        oh, eh = self.o_header, emitter.i_header
        m.d.comb += [
            oh.valid.eq(replies.r_rdy), replies.r_en.eq(oh.ready),
            oh.payload.dst.eq(replies.r_data[:32]), oh.payload.protocol.eq(PROTO_ICMP),
            oh.payload.length.eq(replies.r_data[32:]),
            replies.w_data.eq(making),
            eh.payload.fields.eq(f),
            eh.payload.fields.type.eq(ECHO_REPLY),
            eh.payload.fields.checksum.eq(
                ~ones_sum(m, [~f.checksum, Const(TYPE_DELTA, 16)], "reply_sum")),
            eh.payload.has_payload.eq(h.payload.has_payload),
        ]

        beat = p.payload
        beat_sum = ones_sum(m, [acc, *lane_words(beat.data, beat.keep, odd)], "beat_sum")
        bad_sum = beat.last & ne(beat_sum, 0xFFFF)
        m.d.comb += [emitter.i_payload.payload.eq(beat),
                     emitter.i_payload.payload.err.eq(beat.err | bad_sum)]

        # The reply's fate, as its last beat enters the buffer: kept (offered on o_header
        # next), thrown away for err (a bad checksum or frame, counted elsewhere), or dropped
        # for want of room.
        last_in = buffer.i.valid & buffer.i.ready & buffer.i.payload.last
        overflowed, refused = Signal(), Signal()     # the two reasons of icmp_busy
        m.d.sync += self.icmp_busy.eq(add_counts(m, self.icmp_busy, (overflowed, refused),
                                                             "busy_step"))
        with m.If(writing & last_in):
            m.d.sync += writing.eq(0)
            m.d.comb += [replies.w_en.eq(buffer.ended_kept), overflowed.eq(buffer.ended_overflow)]
            count("icmp_replies", buffer.ended_kept)

        fsm = Machine(m, ["IDLE", "MESSAGE", "SUM", "CHECK", "REPLY", "ECHO", "DRAIN"],
                      "fsm_state")
        with fsm.state("IDLE"):
            m.d.comb += self.i_header.ready.eq(1)
            m.d.sync += odd.eq(0)
            with m.If(self.i_header.valid):
                m.d.sync += [src.eq(self.i_header.payload.fields.src),
                             length.eq(sub(self.i_header.payload.fields.total_length, 20))]
                with m.If(self.i_header.payload.has_payload):
                    fsm.goto("MESSAGE")
                with m.Else():
                    count("icmp_dropped", 1)
        with fsm.state("MESSAGE"):
            with m.If(parser.drop):
                count("icmp_dropped", 1)
                fsm.goto("IDLE")
            with m.Elif(h.valid):
                m.d.sync += [r.eq(v) for r, v in zip(head, head_part)]
                fsm.goto("SUM")
        with fsm.state("SUM"):
            m.d.sync += acc.eq(ones_sum(m, head, "head_total"))
            fsm.goto("CHECK")
        with fsm.state("CHECK"):
            dropped = ~is_echo | (~h.payload.has_payload & ne(acc, 0xFFFF))
            with m.If(dropped | ~room):
                m.d.comb += h.ready.eq(1)
                count("icmp_dropped", dropped)
                m.d.comb += refused.eq(~dropped)
                fsm.goto("DRAIN")
                with m.If(~h.payload.has_payload):
                    fsm.goto("IDLE")
            with m.Else():
                fsm.goto("REPLY")
        with fsm.state("REPLY"):
            m.d.comb += [eh.valid.eq(1), h.ready.eq(eh.ready)]
            with m.If(eh.ready):
                m.d.sync += [writing.eq(1), making.eq(Cat(src, length))]
                fsm.goto("ECHO")
                with m.If(~h.payload.has_payload):
                    fsm.goto("IDLE")
        with fsm.state("ECHO"):
            m.d.comb += [emitter.i_payload.valid.eq(p.valid),
                         p.ready.eq(emitter.i_payload.ready)]
            with m.If(p.valid & p.ready):
                m.d.sync += [acc.eq(beat_sum), odd.eq(~odd)]
                with m.If(beat.last):
                    count("icmp_bad_checksum", bad_sum)
                    fsm.goto("IDLE")
        with fsm.state("DRAIN"):
            m.d.comb += p.ready.eq(1)
            with m.If(p.valid & beat.last):
                fsm.goto("IDLE")
        return m
