"""TCP segment transmission: the control's segment records become segments for the IP layer.

Implements RFC 9293 section 3.1 (the header, and its checksum over the IPv4 pseudo-header, the
header and the data), section 3.2 (the MSS option, kind 2 length 4, and NOP, kind 1),
RFC 7323 section 2.2 (the window scale option, kind 3 length 3) and RFC 2018 section 2
(SACK-permitted, kind 4 length 2), sent together on SYN segments as ``MSS, NOP, WS, NOP, NOP,
SACK-permitted`` (NOPs in place of an option not offered): 12 option bytes, data offset 8;
and RFC 2018 section 3 (one SACK block, kind 5 length 10) on segments without payload as
``NOP, NOP, SACK``: 12 option bytes, data offset 8. RFC 1071 for the checksum arithmetic.

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
from ..stream import BeatLayout, BeatStream, HalfRateSlice, check_data_bytes
from .layouts import RingRequest, TxSegment

__all__ = ["TcpTx", "SYN_OPTIONS", "SACK_OPTION"]

#: The options of our SYN segments, in the order RFC 9293 3.2 and RFC 7323 2.2 lay them out.
SYN_OPTIONS = HeaderFormat("tcp_syn_options", [
    Field("mss_kind", 0, 0, 8),
    Field("mss_len", 1, 0, 8),
    Field("mss", 2, 0, 16),
    Field("nop", 4, 0, 8),
    Field("ws_kind", 5, 0, 8),
    Field("ws_len", 6, 0, 8),
    Field("ws", 7, 0, 8),
    Field("nop2", 8, 0, 8),
    Field("nop3", 9, 0, 8),
    Field("sack_ok_kind", 10, 0, 8),
    Field("sack_ok_len", 11, 0, 8),
])
#: One SACK block (RFC 2018 section 3), aligned by two NOPs as its section 5 example shows.
SACK_OPTION = HeaderFormat("tcp_sack_option", [
    Field("nop0", 0, 0, 8),
    Field("nop1", 1, 0, 8),
    Field("kind", 2, 0, 8),
    Field("len", 3, 0, 8),
    Field("left", 4, 0, 32),
    Field("right", 8, 0, 32),
])
assert SYN_OPTIONS.length == SACK_OPTION.length
MSS_KIND, MSS_LEN, NOP, WS_KIND, WS_LEN = 2, 4, 1, 3, 3
SACK_OK_KIND, SACK_OK_LEN, SACK_KIND, SACK_LEN = 4, 2, 5, 10
#: Header length in 32-bit words, without and with options (either kind: 12 bytes).
DATA_OFFSET, DATA_OFFSET_OPTS = 5, 5 + SYN_OPTIONS.length // 4

#: Most payload bytes a segment can carry: the IPv4 Total Length is 16 bits, two 20-byte headers.
MAX_PAYLOAD = 65535 - 40


def _has_options(seg):
    """The segment record ``seg`` carries options (and so no payload)."""
    return seg.syn_opts | seg.sack


class TcpTx(wiring.Component):
    """Build TCP segments, with their checksums, from segment records and the send ring.

    Ports
    -----
    i_seg : In(stream.Signature(TxSegment(conns)))
        One record per segment, sent in this order. ``length`` payload bytes (clamped to
        ``max_payload``) are taken from connection ``conn``'s ring from ``seq`` on; a record with
        ``syn_opts`` (the SYN options) or ``sack`` (a SACK block) carries those options and no
        payload (its ``length`` is ignored). Records with no payload (pure ACK, SYN, FIN, RST)
        never touch the ring.
    o_read : Out(stream.Signature(RingRequest(conns))); i_data : In(BeatStream(data_bytes))
        The ring (:class:`.ring.TxRing`): a read of ``(conn, seq, length)`` for each record with
        a payload, offered together with the record, and then exactly those bytes as a packet.
    o_header : Out(stream.Signature(TxRequest)); o : Out(BeatStream(data_bytes, err=True))
        The segments for :class:`~iwarp_nic.ip.IpStack` (``i_tcp_header``/``i_tcp_payload``):
        per segment a request (``dst_ip``, protocol 6, segment length), and the segment as a
        packet: the header (``src_port``, ``dst_port``, ``seq``, ``ack``, data offset 5 or 8,
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
    checksum is summed over two register stages between the buffer's records and the outputs.
    Records are taken into, and summed through, one-entry register slices
    (:class:`~iwarp_nic.stream.HalfRateSlice`): a record every other cycle at most, where
    :class:`.control.TcpControl` gives one per transmit turn of twelve cycles or more.

    Latency (no back-pressure): the request on ``o_header`` is offered seven cycles after a
    record without payload is taken, or four cycles after the last payload beat is taken from
    ``i_data`` (the ring's first beat comes three or four cycles after its read), and the
    segment's first beat on ``o`` two cycles after the request. Options take one cycle per beat
    of their 12 bytes before that.

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

        # --- Records in: each one's payload length clamped and registered with the flag "reads
        # the ring" (a register slice, so that the clamp's comparisons stay out of the handshakes
        # below), then queued, and its ring read issued with it. ---
        rec = self.i_seg.payload
        m.submodules.seg_skid = seg_skid = HalfRateSlice(StructLayout({"seg": seg_layout,
                                                                    "ring": 1}))
        clamped = seg_skid.i.payload.seg
        m.d.comb += [clamped.eq(rec), self.i_seg.ready.eq(seg_skid.i.ready),
                     seg_skid.i.valid.eq(self.i_seg.valid)]
        if self.max_payload < 2 ** 16 - 1:
            with m.If(gt(rec.length, self.max_payload)):
                m.d.comb += clamped.length.eq(self.max_payload)
        with m.If(_has_options(rec)):
            m.d.comb += clamped.length.eq(0)
        m.d.comb += seg_skid.i.payload.ring.eq(~is_zero(clamped.length))
        entry, reads_ring, offered = seg_skid.o.payload.seg, seg_skid.o.payload.ring, seg_skid.o
        m.d.comb += [
            self.o_read.payload.conn.eq(entry.conn),
            self.o_read.payload.seq.eq(entry.seq),
            self.o_read.payload.length.eq(entry.length),
            self.o_read.valid.eq(offered.valid & reads.w_rdy & reads_ring),
            offered.ready.eq(reads.w_rdy & (~reads_ring | self.o_read.ready)),
            reads.w_data.eq(entry),
            reads.w_en.eq(offered.valid & offered.ready),
        ]

        # --- Fill: the payload (options or ring bytes) into the buffer, summed on the way. ---
        head = seg_layout(reads.r_data)
        head_opts = _has_options(head)
        has_payload = head_opts | ~is_zero(head.length)
        syn_options = Signal(SYN_OPTIONS.layout)
        m.d.comb += [syn_options.mss_kind.eq(MSS_KIND), syn_options.mss_len.eq(MSS_LEN),
                     syn_options.mss.eq(head.mss), syn_options.nop.eq(NOP),
                     syn_options.ws_kind.eq(Mux(head.syn_ws, WS_KIND, NOP)),
                     syn_options.ws_len.eq(Mux(head.syn_ws, WS_LEN, NOP)),
                     syn_options.ws.eq(Mux(head.syn_ws, head.ws, NOP)),
                     syn_options.nop2.eq(NOP), syn_options.nop3.eq(NOP),
                     syn_options.sack_ok_kind.eq(Mux(head.syn_sack, SACK_OK_KIND, NOP)),
                     syn_options.sack_ok_len.eq(Mux(head.syn_sack, SACK_OK_LEN, NOP))]
        sack_option = Signal(SACK_OPTION.layout)
        m.d.comb += [sack_option.nop0.eq(NOP), sack_option.nop1.eq(NOP),
                     sack_option.kind.eq(SACK_KIND), sack_option.len.eq(SACK_LEN),
                     sack_option.left.eq(head.sack_left), sack_option.right.eq(head.sack_right)]
        option_bytes = Mux(head.syn_opts, SYN_OPTIONS.pack(syn_options),
                           SACK_OPTION.pack(sack_option))
        option_beats = -(-SYN_OPTIONS.length // n)
        option_beat = Signal(beat_layout)
        if option_beats > 1:
            index = Signal(range(option_beats))
            m.d.comb += [
                option_beat.data.eq(select(m, index, [option_bytes.word_select(k, 8 * n)
                                                      for k in range(option_beats)],
                                           8 * n, "option_data")),
                option_beat.keep.eq(Mux(eq(index, option_beats - 1),
                                        mask(SYN_OPTIONS.length - n * (option_beats - 1)),
                                        mask(n))),
                option_beat.last.eq(eq(index, option_beats - 1)),
            ]
        else:
            m.d.comb += [option_beat.data.eq(option_bytes),
                         option_beat.keep.eq(mask(SYN_OPTIONS.length)),
                         option_beat.last.eq(1)]

        beat = Signal(beat_layout)
        m.d.comb += beat.eq(Mux(head_opts, option_beat, self.i_data.payload))
        beat_valid = head_opts | self.i_data.valid
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
            self.i_data.ready.eq(reads.r_rdy & ~head_opts & has_payload & room),
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
                fields.data_offset.eq(Mux(_has_options(seg), DATA_OFFSET_OPTS, DATA_OFFSET)),
                fields.flags.eq(seg.flags), fields.window.eq(seg.window),
            ]
            return fields

        def plus_header(seg, extra):
            # ``length`` never exceeds MAX_PAYLOAD, so these sums never wrap.
            return Mux(_has_options(seg), add(seg.length, 4 * DATA_OFFSET_OPTS + extra),
                       add(seg.length, 4 * DATA_OFFSET + extra))

        done_seg = filled_layout(filled.r_data)
        # The pseudo-header's last two words, zero + protocol and the TCP length, as one word
        # (a lone constant word would be narrower than 16 bits in the Verilog).
        pseudo = [self.ip[16:], self.ip[:16], done_seg.seg.dst_ip[16:], done_seg.seg.dst_ip[:16],
                  plus_header(done_seg.seg, PROTO_TCP)]
        head_words = words(TCP.pack(header(done_seg.seg, "sum_fields")), TCP.length)
        m.submodules.tx_sum = adders = Module()
        part_a = ones_reduce(adders, [*pseudo, *head_words, done_seg.sum], "tx_sum_a", levels=1)
        m.submodules.sum_a = sum_a = HalfRateSlice(StructLayout({
            "seg": seg_layout, "partial": ArrayLayout(16, len(part_a))}))
        part_b = ones_reduce(adders, sum_a.o.payload.partial, "tx_sum_b", levels=2)
        m.submodules.sum_b = sum_b = HalfRateSlice(StructLayout({
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
            eh.payload.has_payload.eq(_has_options(seg) | ~is_zero(seg.length)),
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
