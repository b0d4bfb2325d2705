"""The receive front end of the TCP offload engine: checked segments as descriptors + payload.

Implements:

* RFC 9293 section 3.1 (header format): the fixed header's fields; Data Offset checked (at least
  5 words, not past the segment); the checksum over the pseudo-header (source, destination, zero,
  protocol 6, TCP length) and the whole segment verified; options received on any segment, and
  the ones not implemented skipped by their length without error; an illegal option length
  (below 2, or past the option area) ends option parsing without rejecting the segment;
* RFC 9293 section 3.2 (End of Option List, No-Operation, Maximum Segment Size kind 2 length 4);
* RFC 7323 section 2.2 (Window Scale kind 3 length 3) and 2.3 (a shift above 14 is used as 14);
* RFC 2018 section 2 (SACK-permitted, kind 4 length 2; SACK blocks, kind 5, are skipped);
* RFC 1071 for the checksum arithmetic (:mod:`iwarp_nic.ip.checksum`).

Options are only recorded here; deciding what they mean for a connection is the control's job.
"""

from amaranth import C, Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..exact import add, eq, gt, is_zero, lt, mask, ne, select, sub
from ..hdrparse import HeaderParser, HeaderStream
from ..headers import IPV4, TCP
from ..ip.checksum import lane_words, ones_sum
from ..ip.stack import PROTO_TCP
from ..stream import BeatLayout, BeatStream, HalfRateSlice, SkidBuffer, check_data_bytes
from ..trim import HeadTrim
from .layouts import RxSegment

__all__ = ["TcpRx", "COUNTERS", "MAX_WINDOW_SHIFT"]

#: Counters of :class:`TcpRx`: good segments, then one per reason a segment was dropped.
COUNTERS = ("segments", "bad_checksum", "bad_header", "discarded")

#: RFC 7323 section 2.3: the largest shift count a window scale option can take effect with.
MAX_WINDOW_SHIFT = 14

OPT_EOL, OPT_NOP, OPT_MSS, OPT_WS, OPT_SACK_OK = 0, 1, 2, 3, 4
OPT_MSS_LEN, OPT_WS_LEN, OPT_SACK_OK_LEN = 4, 3, 2
OPTION_BYTES = 40                          # Data Offset 15: 60 header bytes, 20 of them fixed
COUNT_BITS = 16                            # a trim count that can cover any segment
DROP_ALL = mask(COUNT_BITS)                # ... and the count that drops one whole

# The pseudo-header's protocol word is left out of the running sum, so a correct segment sums
# to 0xFFFF minus it: the ones' complement sum S + 6 is 0xFFFF exactly when S is 0xFFF9.
GOOD_SUM = 0xFFFF - PROTO_TCP

# What became of a segment, in the order the reasons are checked (the first one wins).
GOOD, BAD_CHECKSUM, BAD_HEADER, DISCARDED = range(4)


class TcpRx(wiring.Component):
    """Check each received TCP segment, parse its header and options, and pass its payload on.

    Ports
    -----
    i_header : In(HeaderStream(IPV4))
        One transfer per IPv4 datagram carrying TCP (``IpStack.o_tcp_header``): source and
        destination for the pseudo-header, TCP length ``total_length - 4 * ihl``. With
        ``has_payload`` = 0 there is no segment: it is counted in ``bad_header``.
    i : In(BeatStream(data_bytes, err=True))
        The segment of each header with ``has_payload`` (``IpStack.o_tcp_payload``): TCP header,
        options and payload. ``err`` on its last beat means the segment is to be discarded. It is
        taken only after its header, so a producer offers the header first (as ``IpStack`` does).
    o_seg : Out(stream.Signature(RxSegment))
        One record per good segment, in arrival order: the fixed header's fields, ``src_ip``,
        MSS and window scale options if present (the last of each counts; the shift clamped to
        14), ``sack_ok`` if SACK-permitted is present, ``length`` = payload bytes (segment
        minus ``4 * data_offset``).
    o_data : Out(BeatStream(data_bytes, err=True))
        For each segment whose header passes the checks and that has bytes after its options,
        those bytes realigned to lane 0, as one packet. ``err`` on its last beat when the
        segment turns out bad at its end (checksum, input ``err`` or length); no ``o_seg``
        follows such a packet. A segment with no payload has no packet.
    segments, bad_checksum, bad_header, discarded : Out(32)
        Wrapping counts of segments delivered on ``o_seg`` and of segments dropped, each counted
        once, by the first reason that holds: ``discarded`` (input ``err``, or a segment whose
        byte count is not the TCP length), ``bad_header`` (no segment, fewer than 20 bytes,
        Data Offset below 5 or ``4 * data_offset`` beyond the segment), ``bad_checksum``.

    Ordering guarantee: a segment's ``o_seg`` record is offered only after the last beat of its
    ``o_data`` packet has been transferred, so a consumer that stores ``o_data`` first finds the
    payload in place when it handles the record.

    Throughput: one input beat per cycle within a segment, and one cycle between segments (the
    next IPv4 header is taken in the cycle the previous segment's record is written, once it
    has been on offer for two cycles: its pseudo-header sum is staged), as long as
    the option walker is done: it walks one option per cycle (an EOL or a malformed option
    counts as one) from the cycle after the option area has streamed in, so it is hidden
    behind a segment's payload but adds its cycles to a segment whose options end in its last
    beat.
    Measured, back to back without stall: 1448-byte segments with timestamps take their beats
    plus 1 cycle each; pure ACKs their beats plus 3, with timestamps plus 5. Back-pressure: on
    ``o_data``, it stalls the input of segments with payload once the skid buffers', the
    parser's and the trim's registers are full; on ``o_seg``, a record waiting there stalls the
    input at the end of the next segment.

    Latency from the last input beat (cycle 0) to ``o_seg`` valid, with ``o_data`` ready: 4
    cycles for a segment without payload (skid buffers before and after the parser), or 3 plus
    one to start the walk and one per option walked when its options end in that beat (6 for a
    pure ACK with timestamps, 8 for a SYN with MSS, NOP, window scale, SACK-permitted, EOL); 5
    to 7 cycles for a segment with payload (skid buffers before the parser and between the
    parser and the trim, and one more for each tail beat of the parser and of the trim), or
    until its walk ends if that is later.

    The checksum of the last beat (a tree over its ``data_bytes / 2`` words) is combinational
    into the ``err`` of the beat entering the skid buffer before the parser. Timing: the
    parser's input and outputs and the trim's count pass skid buffers, and the option walker
    decides each step from a registered window of the option area: ``i.ready`` depends on
    registers only, ``i_header.ready`` on registers and ``o_seg.ready``.
    """

    def __init__(self, data_bytes):
        check_data_bytes(data_bytes)
        self.data_bytes = data_bytes
        members = {
            "i_header": In(HeaderStream(IPV4)),
            "i": In(BeatStream(data_bytes, err=True)),
            "o_seg": Out(stream.Signature(RxSegment)),
            "o_data": Out(BeatStream(data_bytes, err=True)),
        }
        members.update({name: Out(32) for name in COUNTERS})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        m.submodules.parser = parser = HeaderParser(TCP, n, err=True)
        m.submodules.trim = trim = HeadTrim(n, COUNT_BITS, err=True)
        # Register slices around the parser: on its input, so that the verdicts at a segment's last
        # beat (its err input) come from a register; on both its outputs, so that what is decided
        # from the parsed header (the trim's count and handshake, the end of the segment) stays
        # out of the parser's ready, and so out of the input's. The trim's count passes one too
        # (it still meets its first payload beat, which the parser offers a cycle after the
        # header), so the trim's handshake depends on registers only. The header's slice holds
        # one header (a header every other cycle at most: more than TcpControl takes, a segment
        # in nine cycles or more); the others are skid buffers, at a beat per cycle.
        m.submodules.in_skid = in_skid = SkidBuffer(BeatLayout(n, err=True))
        wiring.connect(m, in_skid.o, parser.i)
        m.submodules.header_skid = header_skid = HalfRateSlice(parser.o_header.payload.shape())
        m.submodules.payload_skid = payload_skid = SkidBuffer(BeatLayout(n, err=True))
        wiring.connect(m, parser.o_header, header_skid.i)
        wiring.connect(m, parser.o_payload, payload_skid.i)
        wiring.connect(m, payload_skid.o, trim.i)
        wiring.connect(m, trim.o, wiring.flipped(self.o_data))
        m.submodules.count_skid = count_skid = SkidBuffer(COUNT_BITS)
        wiring.connect(m, count_skid.o, trim.i_count)
        trim_count = count_skid.i
        beat, hdr, ip = self.i.payload, header_skid.o, self.i_header.payload.fields

        # --- The segment being taken in: busy from its IPv4 header until its record is written.
        busy = Signal()
        ended = Signal()                # its last beat was taken (or it has none)
        src = Signal(32)
        tcp_length = Signal(16)         # from the IPv4 header
        seen = Signal(16)               # bytes taken before the current beat
        seg_len = Signal(16)            # bytes in the segment, once ended
        acc = Signal(16)                # running ones' complement sum, pseudo-header first
        odd = Signal() if n == 1 else None  # 1-byte beats: the next byte is a low byte
        data_offset = Signal(4)         # byte 12's high nibble, once taken
        options = Signal(8 * OPTION_BYTES)  # bytes 20..59, once taken
        bad_in = Signal()               # input err, or seg_len != tcp_length
        bad_sum = Signal()
        short = Signal()                # seg_len < 20, registered with it (out of `finish`'s
        longer = Signal()               # paths into the next header's ready); seg_len > 20
        counted = Signal()              # the trim has the count for its options

        take = self.i.valid & self.i.ready
        m.d.comb += [
            in_skid.i.valid.eq(self.i.valid & busy & ~ended),
            self.i.ready.eq(busy & ~ended & in_skid.i.ready),
        ]

        # Verdicts at the last beat; err goes into the parser with it, so the bad segment's
        # payload leaves the trim with err on its last beat.
        beat_sum = ones_sum(m, [acc, *lane_words(beat.data, beat.keep, odd)], "beat_sum")
        # `seen` is a multiple of n before every beat: the segment's length is `seen` plus the
        # last beat's highest kept lane, plus one.
        lanes = n.bit_length() - 1
        end_len = Signal(16)
        if lanes:
            top_lane = select(m, beat.keep, {mask(k): k - 1 for k in range(1, n + 1)}, lanes,
                              "top_lane")
            m.d.comb += end_len.eq(add(Cat(top_lane, seen[lanes:]), 1))
        else:
            m.d.comb += end_len.eq(add(seen, 1))
        end_bad_in = beat.err | (end_len != tcp_length)
        end_bad_sum = ne(beat_sum, GOOD_SUM)
        m.d.comb += [in_skid.i.payload.eq(beat),
                     in_skid.i.payload.err.eq(beat.last & (end_bad_in | end_bad_sum))]

        with m.If(take):
            m.d.sync += [acc.eq(beat_sum), seen.eq(add(seen, n))]
            if odd is not None:
                m.d.sync += odd.eq(~odd)
            with m.If(beat.last):
                m.d.sync += [ended.eq(1), seg_len.eq(end_len), bad_in.eq(end_bad_in),
                             bad_sum.eq(end_bad_sum), short.eq(lt(end_len, 20)),
                             longer.eq(gt(end_len, 20))]
            # Capture the data offset and the option area as they stream past.
            for first in range(12 // n * n, 20 + OPTION_BYTES, n):
                with m.If(eq(seen, first)):
                    for lane in range(n):
                        offset = first + lane
                        byte = beat.data[8 * lane:8 * lane + 8]
                        if offset == 12:
                            m.d.sync += data_offset.eq(byte[4:])
                        elif 20 <= offset < 20 + OPTION_BYTES:
                            k = offset - 20
                            m.d.sync += options[8 * k:8 * k + 8].eq(byte)

        # --- Header checks, and the option count handed to the trim when the parser has the
        # fixed header (a bad header's count drops the whole rest of the segment).
        offset_ok = ~lt(data_offset, 5) & _covers(tcp_length, data_offset)
        option_len = sub(Cat(C(0, 2), data_offset), 20)
        m.d.comb += [
            trim_count.valid.eq(busy & hdr.valid & hdr.payload.has_payload & ~counted),
            trim_count.payload.eq(Mux(offset_ok, Cat(option_len, C(0, COUNT_BITS - 6)),
                                      Const(DROP_ALL, COUNT_BITS))),
        ]
        count_taken = trim_count.valid & trim_count.ready
        with m.If(count_taken):
            m.d.sync += counted.eq(1)

        # --- The option walker: one option per cycle over the captured option area, started
        # the cycle after all of it has been taken; done when it stops or steps to the end of
        # the area. The 4 bytes at `pos` are registered (`window`, loaded with those at the next
        # position as the walker steps), so each step is decided from registers; they hold the
        # whole option area by the time `start` is set.
        pos = Signal(6)                 # offset of the next option in the option area
        walked = Signal()
        start = Signal()
        mss = Signal(16)
        has_mss = Signal()
        ws = Signal(4)
        has_ws = Signal()
        sack_ok = Signal()
        window = Signal(32)
        kind, size, value = window[:8], window[8:16], window[16:32]
        nop = eq(kind, OPT_NOP)
        left = Signal(6)
        next_pos = Signal(6)
        m.d.comb += [left.eq(option_len - pos),
                     next_pos.eq(Mux(nop, add(pos, 1), (pos + size[:6])[:6]))]
        malformed = lt(left, 2) | lt(size, 2) | size[6:].any() | (size[:6] > left)
        stop = is_zero(kind) | (~nop & malformed)
        m.d.sync += start.eq(busy & offset_ok & (ended | _covers(seen, data_offset)))
        walking = busy & start & ~walked
        # A shifter (zeros in past the area): its stages take the position's bits from the
        # lowest, the first the adder of `next_pos` settles. (Once the walker stops, `window` is
        # not read again for this segment.)
        shifted = Signal(8 * OPTION_BYTES)
        m.d.comb += shifted.eq(options >> Cat(C(0, 3), Mux(walking, next_pos, pos)))
        m.d.sync += window.eq(shifted[:32])
        with m.If(walking):
            m.d.sync += walked.eq(stop | ~(next_pos < option_len))
            with m.If(~stop):
                m.d.sync += pos.eq(next_pos)
                with m.If(eq(kind, OPT_MSS) & eq(size, OPT_MSS_LEN)):
                    m.d.sync += [mss.eq(Cat(value[8:], value[:8])), has_mss.eq(1)]
                with m.If(eq(kind, OPT_WS) & eq(size, OPT_WS_LEN)):
                    shift = value[:8]
                    m.d.sync += [ws.eq(Mux(gt(shift, MAX_WINDOW_SHIFT),
                                           Const(MAX_WINDOW_SHIFT, 4), shift[:4])),
                                 has_ws.eq(1)]
                with m.If(eq(kind, OPT_SACK_OK) & eq(size, OPT_SACK_OK_LEN)):
                    m.d.sync += sack_ok.eq(1)
        walk_done = ~offset_ok | eq(data_offset, 5) | walked

        # --- The segment's end: its record goes to the output slot once the parser's header
        # (if it makes one: the same rule as HeaderParser's) has been seen and the walk is done.
        rec = Signal(RxSegment)
        rec_valid = Signal()
        rec_kind = Signal(2)
        rec_data = Signal()             # an o_data packet belongs to it
        release = Signal()
        parsed = ~short & (longer | ~(bad_in | bad_sum))
        header_done = ~parsed | (hdr.valid & (counted | ~hdr.payload.has_payload))
        finish = busy & ended & header_done & walk_done & (~rec_valid | release)
        bad_header = short | ~offset_ok
        f = hdr.payload.fields
        with m.If(finish):
            m.d.comb += hdr.ready.eq(parsed)
            m.d.sync += [
                busy.eq(0),
                rec_valid.eq(1),
                rec.src_ip.eq(src), rec.src_port.eq(f.src_port), rec.dst_port.eq(f.dst_port),
                rec.seq.eq(f.seq), rec.ack.eq(f.ack), rec.flags.eq(f.flags),
                rec.window.eq(f.window),
                rec.mss.eq(mss), rec.has_mss.eq(has_mss), rec.ws.eq(ws), rec.has_ws.eq(has_ws),
                rec.sack_ok.eq(sack_ok),
                rec.length.eq(_minus(tcp_length, Cat(C(0, 2), data_offset, C(0, 10)))),
                rec_kind.eq(Mux(bad_in, DISCARDED,
                                Mux(bad_header, BAD_HEADER, Mux(bad_sum, BAD_CHECKSUM, GOOD)))),
                rec_data.eq(offset_ok & _covers(sub(seg_len, 1), data_offset)),
            ]
        with m.Elif(release):
            m.d.sync += rec_valid.eq(0)

        # The next IPv4 header is taken when idle, or in the cycle the previous segment ends.
        ip_tcp_length = Signal(16)
        m.d.comb += ip_tcp_length.eq(_minus(ip.total_length, Cat(C(0, 2), ip.ihl, C(0, 10))))
        # The pseudo-header sum is staged over two cycles from the header offered (held while
        # offered): the TCP length and the sums of each address's words, then their sum. A
        # header is taken from its third cycle on offer (the next one usually waits that long
        # behind the segment before it).
        ph_len, ph_src, ph_dst, pseudo_sum = (Signal(16, name=n) for n in (
            "ph_len", "ph_src", "ph_dst", "pseudo_sum"))
        offered = Signal(2)             # cycles the header has been on offer, up to 2
        m.d.sync += [ph_len.eq(ip_tcp_length),
                     ph_src.eq(ones_sum(m, [ip.src[16:], ip.src[:16]], "ph_src_sum")),
                     ph_dst.eq(ones_sum(m, [ip.dst[16:], ip.dst[:16]], "ph_dst_sum")),
                     pseudo_sum.eq(ones_sum(m, [ph_src, ph_dst, ph_len], "pseudo_sum_stage"))]
        with m.If(self.i_header.valid & ~self.i_header.ready):
            m.d.sync += offered.eq(Mux(offered[1], offered, add(offered, 1)))
        with m.Else():
            m.d.sync += offered.eq(0)
        m.d.comb += self.i_header.ready.eq((~busy | finish) & offered[1])
        with m.If(self.i_header.valid & self.i_header.ready):
            has_segment = self.i_header.payload.has_payload
            m.d.sync += [
                busy.eq(1), ended.eq(~has_segment), src.eq(ip.src),
                tcp_length.eq(ph_len), seen.eq(0), seg_len.eq(0), short.eq(1), longer.eq(0),
                acc.eq(pseudo_sum), data_offset.eq(0), bad_in.eq(0), bad_sum.eq(0),
                counted.eq(0), pos.eq(0), walked.eq(0), start.eq(0), mss.eq(0), has_mss.eq(0),
                ws.eq(0), has_ws.eq(0), sack_ok.eq(0),
            ]
            if odd is not None:
                m.d.sync += odd.eq(0)

        # --- The output slot: a record waits for its o_data packet (counted in `credit` as it
        # completes; at most two can complete before their records are released), then a good
        # one is offered and the others are counted and dropped.
        credit = Signal(2)
        data_done = self.o_data.valid & self.o_data.ready & self.o_data.payload.last
        waiting = rec_data & is_zero(credit)
        good = eq(rec_kind, GOOD)
        m.d.comb += [
            self.o_seg.valid.eq(rec_valid & good & ~waiting),
            self.o_seg.payload.eq(rec),
            release.eq(rec_valid & ~waiting & (~good | self.o_seg.ready)),
        ]
        used = release & rec_data
        with m.If(data_done & ~used):
            m.d.sync += credit.eq(add(credit, 1))
        with m.Elif(used & ~data_done):
            m.d.sync += credit.eq(sub(credit, 1))
        for name, kind_value in zip(COUNTERS, (GOOD, BAD_CHECKSUM, BAD_HEADER, DISCARDED)):
            counter = getattr(self, name)
            with m.If(release & eq(rec_kind, kind_value)):
                m.d.sync += counter.eq(counter + 1)
        return m


def _minus(a, b):
    """``a - b`` for equally wide ``a`` and ``b``, written ``a + ~b + 1`` so that no operand of
    the generated Verilog is narrower than the other (zero top bits of ``b`` would be trimmed)."""
    return add((a + ~b)[:len(a)], 1)


def _covers(length, data_offset):
    """``length >= 4 * data_offset`` for a 16-bit ``length``, compared in 4-byte words so that
    neither operand is widened."""
    return length[6:].any() | ~(length[2:6] < data_offset)
