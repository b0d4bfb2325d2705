"""TCP segment transmission: the control's segment records become segments for the IP layer.

Implements RFC 9293 section 3.1 (the header, and its checksum over the IPv4 pseudo-header, the
header and the data), section 3.2 (the MSS option, kind 2 length 4, and NOP, kind 1) and
RFC 7323 section 2.2 (the window scale option, kind 3 length 3), sent together on SYN segments
as ``MSS, NOP, WS`` (or ``MSS, NOP, NOP, NOP, NOP`` without window scaling): 8 option bytes,
data offset 7. RFC 1071 for the checksum arithmetic.

Sequence numbers, windows and which segment to send are the control's (:mod:`.layouts`); this
block lays the segment out, fetches its data from the send ring and sums it.
"""

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.data import ArrayLayout, StructLayout
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..exact import add, eq, gt, is_zero, mask, select
from ..hdrparse import HeaderEmitter
from ..headers import TCP, Field, HeaderFormat
from ..ip.checksum import lane_words, ones_reduce, ones_sum, words
from ..ip.ipv4 import TxRequest
from ..ip.stack import PROTO_TCP
from ..stream import BeatLayout, BeatStream, SkidBuffer, check_data_bytes
from .layouts import RingRequest, TxSegment

__all__ = ["TcpTx", "SYN_OPTIONS"]

#: The options of our SYN segments, in the order RFC 9293 3.2 and RFC 7323 2.2 lay them out.
SYN_OPTIONS = HeaderFormat("tcp_syn_options", [
    Field("mss_kind", 0, 0, 8),
    Field("mss_len", 1, 0, 8),
    Field("mss", 2, 0, 16),
    Field("nop", 4, 0, 8),
    Field("ws_kind", 5, 0, 8),
    Field("ws_len", 6, 0, 8),
    Field("ws", 7, 0, 8),
])
MSS_KIND, MSS_LEN, NOP, WS_KIND, WS_LEN = 2, 4, 1, 3, 3
DATA_OFFSET, DATA_OFFSET_SYN = 5, 7       # header length in 32-bit words, without and with options

#: Most payload bytes a segment can carry: the IPv4 Total Length is 16 bits, two 20-byte headers.
MAX_PAYLOAD = 65535 - 40


class TcpTx(wiring.Component):
    """Build TCP segments, with their checksums, from segment records and the send ring.

    Ports
    -----
    i_seg : In(stream.Signature(TxSegment(conns)))
        One record per segment, sent in this order. ``length`` payload bytes (clamped to
        ``max_payload``) are taken from connection ``conn``'s ring from ``seq`` on; a record with
        ``syn_opts`` carries the MSS and window-scale options and no payload (its ``length`` is
        ignored). Records with no payload (pure ACK, SYN, FIN, RST) never touch the ring.
    o_read : Out(stream.Signature(RingRequest(conns))); i_data : In(BeatStream(data_bytes))
        The ring (:class:`.ring.TxRing`): a read of ``(conn, seq, length)`` for each record with
        a payload, offered together with the record, and then exactly those bytes as a packet.
    o_header : Out(stream.Signature(TxRequest)); o : Out(BeatStream(data_bytes, err=True))
        The segments for :class:`~iwarp_nic.ip.IpStack` (``i_tcp_header``/``i_tcp_payload``):
        per segment a request (``dst_ip``, protocol 6, segment length), and the segment as a
        packet: the header (``src_port``, ``dst_port``, ``seq``, ``ack``, data offset 5 or 7,
        ``flags``, ``window``, the checksum, urgent pointer 0), the options, the payload.
        ``err`` is always 0. The two streams are independent (a request may be taken before or
        after the previous segment's bytes).
    ip : In(32)
        Our address, for the pseudo-header.
    segments : Out(32)
        Segments whose header has been handed to both outputs, wrapping.

    Store and forward: a segment's payload is read from the ring into a buffer of two maximum
    segments while its ones' complement sum is accumulated; the header (which needs the sum)
    follows once the last payload byte is in, so the next segment's payload is read while the
    previous one is sent. Ring reads run ahead of the buffer by up to four records. The header's
    checksum is summed over two register stages (:class:`~iwarp_nic.stream.SkidBuffer`) between
    the buffer's records and the outputs.

    Latency (no back-pressure): the request on ``o_header`` is offered six cycles after a
    record without payload is taken, or four cycles after the last payload beat is taken from
    ``i_data`` (the ring's first beat comes three or four cycles after its read), and the
    segment's first beat on ``o`` two cycles after the request. A SYN's options take one cycle
    per beat of their 8 bytes before that.

    Throughput: one beat per cycle on ``o``, with no gap between back-to-back segments as long
    as the ring keeps up (a ring read takes one word per cycle plus at most one cycle per
    segment, against a beat per cycle for the header's 20 bytes and the payload). Measured with
    a :class:`.ring.TxRing` and 50 back-to-back 1460-byte segments at consecutive sequence
    numbers: a beat on every cycle from the first to the last at widths 1, 8 and 64.
    Back-pressure on ``o`` fills the buffer, then stalls ``i_data`` and the ring; back-pressure
    on ``o_header`` stalls the headers only.
    """

    def __init__(self, data_bytes, conns, *, max_payload=1460):
        check_data_bytes(data_bytes)
        TxSegment(conns)                        # validates conns
        if not isinstance(max_payload, int) or not 1 <= max_payload <= MAX_PAYLOAD:
            raise ValueError(f"max_payload must be an integer in [1, {MAX_PAYLOAD}], "
                             f"not {max_payload!r}")
        self.data_bytes = data_bytes
        self.conns = conns
        self.max_payload = max_payload
        super().__init__({
            "i_seg": In(stream.Signature(TxSegment(conns))),
            "o_read": Out(stream.Signature(RingRequest(conns))),
            "i_data": In(BeatStream(data_bytes)),
            "o_header": Out(stream.Signature(TxRequest)),
            "o": Out(BeatStream(data_bytes, err=True)),
            "ip": In(32),
            "segments": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        seg_layout = TxSegment(self.conns)
        filled_layout = StructLayout({"seg": seg_layout, "sum": 16})
        beat_layout = BeatLayout(n)
        # The buffer holds the emitter's payloads (a SYN's options, or the ring's bytes) as
        # beats: two of the largest at least.
        buffer_words = 2 * -(-max(self.max_payload, SYN_OPTIONS.length) // n)
        m.submodules.reads = reads = SyncFIFOBuffered(width=seg_layout.size, depth=4)
        # (A SyncFIFOBuffered of depth 2 would have zero-width pointers in the Verilog.)
        m.submodules.filled = filled = SyncFIFOBuffered(width=filled_layout.size, depth=3)
        m.submodules.buffer = buffer = SyncFIFOBuffered(width=beat_layout.size,
                                                        depth=max(3, buffer_words))
        m.submodules.emitter = emitter = HeaderEmitter(TCP, n, err=True)
        wiring.connect(m, emitter.o, wiring.flipped(self.o))

        # --- Records in: each one queued, and its ring read issued with it. ---
        rec = self.i_seg.payload
        entry = Signal(seg_layout)
        m.d.comb += entry.eq(rec)
        if self.max_payload < 2 ** 16 - 1:
            with m.If(gt(rec.length, self.max_payload)):
                m.d.comb += entry.length.eq(self.max_payload)
        with m.If(rec.syn_opts):
            m.d.comb += entry.length.eq(0)
        reads_ring = ~is_zero(entry.length)
        m.d.comb += [
            self.o_read.payload.conn.eq(entry.conn),
            self.o_read.payload.seq.eq(entry.seq),
            self.o_read.payload.length.eq(entry.length),
            self.o_read.valid.eq(self.i_seg.valid & reads.w_rdy & reads_ring),
            self.i_seg.ready.eq(reads.w_rdy & (~reads_ring | self.o_read.ready)),
            reads.w_data.eq(entry),
            reads.w_en.eq(self.i_seg.valid & self.i_seg.ready),
        ]

        # --- Fill: the payload (options or ring bytes) into the buffer, summed on the way. ---
        head = seg_layout(reads.r_data)
        has_payload = head.syn_opts | ~is_zero(head.length)
        options = Signal(SYN_OPTIONS.layout)
        m.d.comb += [options.mss_kind.eq(MSS_KIND), options.mss_len.eq(MSS_LEN),
                     options.mss.eq(head.mss), options.nop.eq(NOP),
                     options.ws_kind.eq(Mux(head.syn_ws, WS_KIND, NOP)),
                     options.ws_len.eq(Mux(head.syn_ws, WS_LEN, NOP)),
                     options.ws.eq(Mux(head.syn_ws, head.ws, NOP))]
        option_bytes = SYN_OPTIONS.pack(options)
        option_beats = -(-SYN_OPTIONS.length // n)
        option_beat = Signal(beat_layout)
        if option_beats > 1:
            index = Signal(range(option_beats))
            m.d.comb += [
                option_beat.data.eq(select(m, index, [option_bytes.word_select(k, 8 * n)
                                                      for k in range(option_beats)],
                                           8 * n, "option_data")),
                option_beat.keep.eq(mask(n)),
                option_beat.last.eq(eq(index, option_beats - 1)),
            ]
        else:
            m.d.comb += [option_beat.data.eq(option_bytes),
                         option_beat.keep.eq(mask(SYN_OPTIONS.length)),
                         option_beat.last.eq(1)]

        beat = Signal(beat_layout)
        m.d.comb += beat.eq(Mux(head.syn_opts, option_beat, self.i_data.payload))
        beat_valid = head.syn_opts | self.i_data.valid
        acc = Signal(16)                        # the sum of the segment's beats so far
        odd = Signal() if n == 1 else None      # 1-byte beats: the next byte is a low byte
        # Each adder tree is a module of its own, so that the simulator settles its chain of
        # adders without re-running the rest of this block's logic at each step.
        m.submodules.fill_sum = adders = Module()
        beat_sum = ones_sum(adders, [acc, *lane_words(beat.data, beat.keep, odd)], "fill_sum")
        room = buffer.w_rdy & (~beat.last | filled.w_rdy)
        take = reads.r_rdy & has_payload & beat_valid & room
        done = (take & beat.last) | (reads.r_rdy & ~has_payload & filled.w_rdy)
        m.d.comb += [
            self.i_data.ready.eq(reads.r_rdy & ~head.syn_opts & has_payload & room),
            buffer.w_data.eq(beat),
            buffer.w_en.eq(take),
            filled.w_data.eq(Cat(reads.r_data, Mux(has_payload, beat_sum, 0))),
            filled.w_en.eq(done),
            reads.r_en.eq(done),
        ]
        with m.If(take):
            m.d.sync += acc.eq(beat_sum)
            if odd is not None:
                m.d.sync += odd.eq(~odd)
            if option_beats > 1:
                m.d.sync += index.eq(index + 1)
        with m.If(done):
            m.d.sync += acc.eq(0)
            if odd is not None:
                m.d.sync += odd.eq(0)
            if option_beats > 1:
                m.d.sync += index.eq(0)

        # --- Sum: the header's checksum over the pseudo-header, the header and the payload's
        # sum: one level of the adder tree (after the length's adder) into a first skid buffer,
        # two more into a second, the last one on the way to the outputs. ---
        def header(seg, name):
            fields = Signal(TCP.layout, name=name)
            m.d.comb += [
                fields.src_port.eq(seg.src_port), fields.dst_port.eq(seg.dst_port),
                fields.seq.eq(seg.seq), fields.ack.eq(seg.ack),
                fields.data_offset.eq(Mux(seg.syn_opts, DATA_OFFSET_SYN, DATA_OFFSET)),
                fields.flags.eq(seg.flags), fields.window.eq(seg.window),
            ]
            return fields

        def plus_header(seg, extra):
            # ``length`` never exceeds MAX_PAYLOAD, so these sums never wrap.
            return Mux(seg.syn_opts, add(seg.length, 4 * DATA_OFFSET_SYN + extra),
                       add(seg.length, 4 * DATA_OFFSET + extra))

        done_seg = filled_layout(filled.r_data)
        # The pseudo-header's last two words, zero + protocol and the TCP length, as one word
        # (a lone constant word would be narrower than 16 bits in the Verilog).
        pseudo = [self.ip[16:], self.ip[:16], done_seg.seg.dst_ip[16:], done_seg.seg.dst_ip[:16],
                  plus_header(done_seg.seg, PROTO_TCP)]
        head_words = words(TCP.pack(header(done_seg.seg, "sum_fields")), TCP.length)
        m.submodules.tx_sum = adders = Module()
        part_a = ones_reduce(adders, [*pseudo, *head_words, done_seg.sum], "tx_sum_a", levels=1)
        m.submodules.sum_a = sum_a = SkidBuffer(StructLayout({
            "seg": seg_layout, "partial": ArrayLayout(16, len(part_a))}))
        part_b = ones_reduce(adders, sum_a.o.payload.partial, "tx_sum_b", levels=2)
        m.submodules.sum_b = sum_b = SkidBuffer(StructLayout({
            "seg": seg_layout, "partial": ArrayLayout(16, len(part_b))}))
        m.d.comb += [sum_a.i.valid.eq(filled.r_rdy), filled.r_en.eq(sum_a.i.ready),
                     sum_a.i.payload.seg.eq(done_seg.seg),
                     *(sum_a.i.payload.partial[k].eq(v) for k, v in enumerate(part_a)),
                     sum_b.i.valid.eq(sum_a.o.valid), sum_a.o.ready.eq(sum_b.i.ready),
                     sum_b.i.payload.seg.eq(sum_a.o.payload.seg),
                     *(sum_b.i.payload.partial[k].eq(v) for k, v in enumerate(part_b))]

        # --- Send: the header, checksummed, to the IP layer and the emitter. ---
        seg = sum_b.o.payload.seg
        total = ones_sum(adders, sum_b.o.payload.partial, "tx_sum_c")
        fields = header(seg, "fields")
        seg_length = plus_header(seg, 0)
        eh, oh = emitter.i_header, self.o_header
        m.d.comb += [
            eh.payload.fields.eq(fields),
            eh.payload.fields.checksum.eq(~total),
            eh.payload.has_payload.eq(seg.syn_opts | ~is_zero(seg.length)),
            oh.payload.dst.eq(seg.dst_ip),
            oh.payload.protocol.eq(PROTO_TCP),
            oh.payload.length.eq(seg_length),
        ]
        # Each header goes to both outputs, in either order.
        ip_took = Signal()
        emitter_took = Signal()
        m.d.comb += [oh.valid.eq(sum_b.o.valid & ~ip_took),
                     eh.valid.eq(sum_b.o.valid & ~emitter_took)]
        ip_now = ip_took | oh.ready
        emitter_now = emitter_took | eh.ready
        with m.If(sum_b.o.valid):
            with m.If(ip_now & emitter_now):
                m.d.comb += sum_b.o.ready.eq(1)
                m.d.sync += [ip_took.eq(0), emitter_took.eq(0),
                             self.segments.eq(self.segments + 1)]
            with m.Else():
                m.d.sync += [ip_took.eq(ip_now), emitter_took.eq(emitter_now)]

        # The payloads leave the buffer as the emitter takes them.
        m.d.comb += [
            emitter.i_payload.payload.data.eq(beat_layout(buffer.r_data).data),
            emitter.i_payload.payload.keep.eq(beat_layout(buffer.r_data).keep),
            emitter.i_payload.payload.last.eq(beat_layout(buffer.r_data).last),
            emitter.i_payload.valid.eq(buffer.r_rdy),
            buffer.r_en.eq(emitter.i_payload.ready),
        ]
        return m
