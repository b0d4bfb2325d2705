"""MPA FPDU framing, the transmit side: RFC 5044 sections 4.1 to 4.4.

* 4.1, the FPDU: ``ULPDU_Length (16) | ULPDU | PAD | CRC (32)``. The pad is 0 to 3 zero octets
  that make ULPDU_Length, ULPDU and pad together a multiple of 4 octets. The CRC field is always
  there; it is zero when CRCs are not in use.
* 4.2 and 4.3, markers: ``RESERVED (16, zero) | FPDUPTR (16)``, 4 octets placed in the TCP stream
  at every 512th octet counted from SeqStart, wherever the FPDUs are. FPDUPTR counts the octets
  from the ULPDU_Length field of the FPDU that contains the marker to the marker. A marker that
  falls exactly between two FPDUs belongs to the next one and holds 0.
* 4.4, the CRC: CRC32c over the FPDU from its first octet (a leading marker included) through the
  pad, with the markers among those octets and a marker right after the pad; not the CRC field.
  It is sent least significant octet first (the reference model's :mod:`iwarp_model.wire.fpdu`
  docstring gives the evidence: RFC 3720 appendix B.4 and RFC 5044's own worked FPDUs).

Every FPDU and every marker is a multiple of 4 octets long and starts at a stream offset that is
a multiple of 4, so the framer works in 4-octet words once the ULPDU_Length field and the pad
have aligned the ULPDU: a marker is always one whole word of the output (at 1 and 2 bytes per
beat, whole beats).

:class:`FpduFramer` is three stages in a row:

1. :class:`UlpduFit` makes the payload exactly ``ULPDU_Length`` + pad octets (truncating or
   zero-filling a payload of the wrong length), and :class:`~iwarp_nic.hdrparse.HeaderEmitter`
   puts the ULPDU_Length field (:data:`ULPDU_LENGTH`) in front: the FPDU without markers or CRC;
2. :class:`MarkerInserter` inserts the markers (a word-lane shifter);
3. :class:`CrcAppender` appends the CRC, computed by a :class:`~iwarp_nic.crc.CRC32CEngine`
   beside a FIFO that holds the beats for the engine's latency.
"""

from amaranth import C, Cat, Module, Mux, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..crc import CRC32CEngine
from ..exact import (
    add,
    eq,
    gt,
    is_zero,
    lt,
    mask,
    select,
    shift_right,
    sub,
    widened,
    wire,
    wrap_add,
)
from ..hdrparse import HeaderEmitter, HeaderStream
from ..headers import Field, Gap, HeaderFormat
from ..stream import BeatLayout, BeatStream, SkidBuffer, check_data_bytes

__all__ = ["ULPDU_LENGTH", "MARKER", "wire_length", "FpduRequest", "MarkerRequest", "CoveredBeat",
           "UlpduFit", "MarkerInserter", "CrcAppender", "FpduFramer"]

#: The FPDU's header: the ULPDU_Length field (RFC 5044 4.1).
ULPDU_LENGTH = HeaderFormat("mpa_fpdu", [Field("ulpdu_length", 0, 0, 16)])
#: A marker (RFC 5044 4.3): 16 reserved bits, zero, then FPDUPTR.
MARKER = HeaderFormat("mpa_marker", [Field("fpduptr", 2, 0, 16)], gaps=[Gap(0, 0, 16)])

MARKER_INTERVAL = 512
#: Octets of the ULPDU_Length field, of a marker, of the CRC field.
_LENGTH, _MARKER, _CRC = 2, 4, 4

#: One FPDU to frame: see :class:`FpduFramer`.
FpduRequest = StructLayout({"ulpdu_length": 16, "crc": 1, "markers": 1, "position": 9})
#: What :class:`MarkerInserter` needs of an FPDU.
MarkerRequest = StructLayout({"crc": 1, "markers": 1, "position": 9})


def CoveredBeat(data_bytes):
    """A beat of an FPDU without its CRC field, and ``crc`` (on every beat): compute the CRC."""
    return StructLayout({"data": 8 * data_bytes, "keep": data_bytes, "last": 1, "err": 1,
                         "crc": 1})


def _keep_of(m, count, top, data_bytes, name):
    """``keep`` of ``min(count, top)`` lanes (``count`` a Signal; ``top`` at most data_bytes)."""
    return select(m, count, {j: mask(j) for j in range(top + 1)}, data_bytes, name)


class UlpduFit(wiring.Component):
    """Make each ULPDU exactly its announced length and add the pad (RFC 5044 4.1).

    Ports
    -----
    i_length : In(stream.Signature(unsigned(16)))
        One ULPDU_Length per FPDU.
    i : In(BeatStream(data_bytes))
        The ULPDUs: one packet of ``ULPDU_Length`` bytes per FPDU, none when the length is 0.
    o_header : Out(HeaderStream(ULPDU_LENGTH)); o : Out(BeatStream(data_bytes, err=True))
        For a :class:`~iwarp_nic.hdrparse.HeaderEmitter`: per FPDU the length field
        (``has_payload`` always 1) and a packet of ``ULPDU_Length`` + pad bytes (2 at least):
        the ULPDU, then zeros. The header is offered when the FPDU's length is taken.

    Bad input: a payload packet longer than ``ULPDU_Length`` is truncated (the extra beats are
    taken and dropped); a shorter one is filled up with zeros; either way ``err`` is set on the
    last beat of ``o``. The next FPDU is not affected.

    Throughput: one beat per cycle, plus one cycle when the pad does not fit the ULPDU's last
    beat; no bubble between FPDUs. Latency: the first beat is offered the cycle after the first
    payload beat (and the length) are taken. Back-pressure on ``o`` stalls ``i``.
    """

    def __init__(self, data_bytes):
        self.data_bytes = check_data_bytes(data_bytes)
        super().__init__({
            "i_length": In(stream.Signature(unsigned(16))),
            "i": In(BeatStream(data_bytes)),
            "o_header": Out(HeaderStream(ULPDU_LENGTH)),
            "o": Out(BeatStream(data_bytes, err=True)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        beat, out, hdr = self.i.payload, self.o, self.o_header
        busy = Signal()      # an FPDU's payload is being sent
        rem = Signal(17)     # bytes of the padded payload still to send
        real = Signal(16)    # bytes still expected from `i`
        real_zero = Signal(init=1)   # real == 0, kept beside it (timing)
        real_more = Signal()         # real > data_bytes, likewise
        open_ = Signal()     # `i` has not ended the FPDU's packet yet
        drain = Signal()     # dropping the rest of a packet that was too long
        bad = Signal()

        out_free = ~out.valid | out.ready
        expected = _keep_of(m, real, n, n, "expected")
        final = wire(m, ~gt(rem, n), "final")
        more = real_more
        from_input = wire(m, open_ & ~real_zero, "from_input")
        good = Mux(beat.last, (beat.keep == expected) & ~more, more)
        err = wire(m, bad | (from_input & ~good), "err")
        open_after = wire(m, Mux(from_input, ~beat.last, open_), "open_after")
        lanes = wire(m, beat.keep & expected & from_input.replicate(n), "lanes")
        step = Signal()
        finishing = step & final & ~open_after
        rem_keep = _keep_of(m, rem, n, n, "rem_keep")
        length = self.i_length.payload
        pad = select(m, length[:2], {0: 2, 1: 1, 2: 0, 3: 3}, 2, "pad")
        padded_length = wrap_add(m, widened(m, length, 17, "length_inv"), pad, 17,
                                 "padded_length")

        m.d.comb += [
            self.i.ready.eq((busy & out_free & from_input) | drain),
            step.eq(busy & out_free & (~from_input | self.i.valid)),
        ]
        with m.If(out_free):
            m.d.sync += out.valid.eq(0)
        with m.If(hdr.ready):
            m.d.sync += hdr.valid.eq(0)
        with m.If(step):
            m.d.sync += [
                out.valid.eq(1),
                out.payload.data.eq(Cat(beat.data.word_select(j, 8) & lanes[j].replicate(8)
                                        for j in range(n))),
                out.payload.keep.eq(rem_keep),
                out.payload.last.eq(final),
                out.payload.err.eq(final & err),
                rem.eq(sub(rem, n)),
                bad.eq(err),
                open_.eq(open_after),
            ]
            with m.If(from_input):
                m.d.sync += [real.eq(Mux(more, sub(real, n), 0)), real_zero.eq(~more),
                             real_more.eq(more & gt(real, 2 * n))]
            with m.If(final):
                m.d.sync += [busy.eq(0), drain.eq(open_after)]
        with m.If(drain & self.i.valid & beat.last):
            m.d.sync += drain.eq(0)

        # The next FPDU's length, taken as the last beat of this one goes (no bubble).
        m.d.comb += self.i_length.ready.eq(((~busy & ~drain) | finishing)
                                           & (~hdr.valid | hdr.ready))
        with m.If(self.i_length.valid & self.i_length.ready):
            m.d.sync += [
                busy.eq(1), rem.eq(padded_length),
                real.eq(length), real_zero.eq(is_zero(length)), real_more.eq(gt(length, n)),
                open_.eq(~is_zero(length)), bad.eq(0),
                hdr.valid.eq(1), hdr.payload.fields.ulpdu_length.eq(length),
                hdr.payload.has_payload.eq(1),
            ]
        return m


class MarkerInserter(wiring.Component):
    """Insert the markers into FPDUs (RFC 5044 4.2, 4.3).

    Ports
    -----
    i_header : In(stream.Signature(MarkerRequest))
        One per FPDU: ``markers`` (insert them), ``position`` (the stream offset of the FPDU's
        first octet modulo 512; its two low bits are ignored, FPDUs start at multiples of 4) and
        ``crc`` (passed on in the beats).
    i : In(BeatStream(data_bytes, err=True))
        Per FPDU a packet of ULPDU_Length, ULPDU and pad: a multiple of 4 bytes.
    o : Out(stream.Signature(CoveredBeat(data_bytes)))
        The FPDU without its CRC field, markers in: a leading marker (FPDUPTR 0) when
        ``position`` is 0, one at every 512-byte stream boundary inside, and one right after the
        pad when it falls there. ``err`` of the last input beat is on the last output beat.

    A marker word is inserted in lane ``4 * k`` of an output beat and the data after it is
    shifted by 4 bytes, carried over to the next beat (``data_bytes`` >= 8); at 1 to 4 bytes a
    marker is whole beats in between input beats.

    Throughput: one output beat per cycle, with no bubble between FPDUs (the next header is
    taken as the last beat goes); a beat made only of carried bytes and a marker, and the beat
    after a packet's last input beat when the carried bytes or the marker after the pad do not
    fit it, take no input. The output is a register. Back-pressure on ``o`` stalls ``i`` and
    ``i_header``.

    Limit: FPDUPTR is 16 bits; it wraps for a marker more than 65535 bytes past the
    ULPDU_Length field, which only a ULPDU near 65535 bytes with markers can reach (the model
    refuses it; RFC 5044 4.5 keeps an FPDU within one TCP segment, far below that).
    """

    def __init__(self, data_bytes):
        self.data_bytes = check_data_bytes(data_bytes)
        super().__init__({
            "i_header": In(stream.Signature(MarkerRequest)),
            "i": In(BeatStream(data_bytes, err=True)),
            "o": Out(stream.Signature(CoveredBeat(data_bytes))),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        hdr, out = self.i_header.payload, self.o
        active = Signal()
        mk = Signal()        # this FPDU has markers
        crc = Signal()
        dist = Signal(9)     # bytes from the next output beat's first byte to the next marker
        # dist < data_bytes and dist == data_bytes, kept beside it (timing; wide beats only).
        near = Signal()
        next_to = Signal()
        ptr = Signal(16)     # FPDUPTR of the next marker but a leading one
        lead = Signal()      # the next marker is the leading one (FPDUPTR 0)
        flush = Signal()     # the input packet has ended; a last beat is still to be sent
        bad = Signal()

        out_free = ~out.valid | out.ready
        marker = wire(m, MARKER.pack({"fpduptr": ptr & ~lead.replicate(16)}), "marker")
        emit = Signal()      # a beat goes out this cycle
        done = Signal()      # ... and it is the FPDU's last
        marked = Signal()    # ... and it completes a marker

        def send(data, keep, last, err):
            m.d.comb += emit.eq(1)
            m.d.sync += [out.valid.eq(1), out.payload.data.eq(data), out.payload.keep.eq(keep),
                         out.payload.last.eq(last), out.payload.err.eq(last & err),
                         out.payload.crc.eq(crc)]

        with m.If(out_free):
            m.d.sync += out.valid.eq(0)
        if n < 4:
            self._narrow(m, active & out_free, dist, mk, flush, bad, marker, send, done, marked)
        else:
            self._wide(m, active & out_free, dist, near, next_to, mk, flush, bad, marker, send,
                       done, marked)

        with m.If(emit):
            m.d.sync += [dist.eq(sub(dist, n)), near.eq(~lt(dist, n) & lt(dist, 2 * n)),
                         next_to.eq(eq(dist, 2 * n % MARKER_INTERVAL))]
        with m.If(marked):
            m.d.sync += [ptr.eq(add(ptr, MARKER_INTERVAL)), lead.eq(0)]
        with m.If(done):
            m.d.sync += [active.eq(0), flush.eq(0)]

        # The next FPDU's header, taken as the last beat of this one goes (no bubble).
        m.d.comb += self.i_header.ready.eq(~active | done)
        with m.If(self.i_header.valid & self.i_header.ready):
            offset = Cat(C(0, 2), hdr.position[2:])
            to_marker = add(~offset, 1)                      # (-position) mod 512
            leading = hdr.markers & is_zero(hdr.position[2:])
            m.d.sync += [
                active.eq(1), mk.eq(hdr.markers), crc.eq(hdr.crc), dist.eq(to_marker),
                near.eq(lt(to_marker, n)), next_to.eq(eq(to_marker, n)),
                # A leading marker's successor is 508 bytes past the header: start at -4.
                ptr.eq(Cat(C(0, 2), to_marker[2:] | leading.replicate(7),
                           leading.replicate(7))),
                lead.eq(leading), flush.eq(0), bad.eq(0),
            ]
        return m

    def _narrow(self, m, go, dist, mk, flush, bad, marker, send, done, marked):
        """1 or 2 bytes per beat: a marker is ``4 / data_bytes`` beats of its own."""
        n = self.data_bytes
        beat = self.i.payload
        full = mask(n)
        in_marker = wire(m, mk & (is_zero(dist) | gt(dist, MARKER_INTERVAL - _MARKER)),
                          "in_marker")
        index = add(~dist, 1)[n.bit_length() - 1:2]          # the marker's beat being sent
        marker_end = eq(dist, MARKER_INTERVAL - _MARKER + n)  # ... is its last
        follows = mk & eq(dist, n)                            # a marker right after this beat
        piece = select(m, index, [marker.word_select(j, 8 * n) for j in range(_MARKER // n)],
                       8 * n, "marker_piece")
        with m.If(go):
            with m.If(in_marker):
                send(piece, full, flush & marker_end, bad)
                with m.If(marker_end):
                    m.d.comb += [marked.eq(1), done.eq(flush)]
            with m.Elif(self.i.valid):
                m.d.comb += self.i.ready.eq(1)
                send(beat.data, beat.keep, beat.last & ~follows, beat.err)
                with m.If(beat.last):
                    with m.If(follows):
                        m.d.sync += [flush.eq(1), bad.eq(beat.err)]
                    with m.Else():
                        m.d.comb += done.eq(1)

    def _wide(self, m, go, dist, near, next_to, mk, flush, bad, marker, send, done, marked):
        """4 bytes per beat or more: ``u`` words per beat, a marker in one word lane."""
        n = self.data_bytes
        u = n // 4
        beat = self.i.payload
        wb = (2 * u - 1).bit_length()        # wide enough for 2u - 1 words
        held = Signal(wb)                    # words carried in `carry`, fewer than u
        carry = Signal(32 * (u - 1)) if u > 1 else None

        in_w = [beat.data.word_select(q, 32) for q in range(u)]
        count = select(m, beat.keep, {mask(4 * w): w for w in range(1, u + 1)}, wb, "in_words")
        here = wire(m, mk & near, "here")    # a marker starts in this beat, in `lane`
        lane = dist[2:2 + wb]                # (only meaningful when `here`)
        if u > 1:
            # The input beat rotated by `held` words: word q is input word (q - held) mod u.
            rot = shift_right(m, Cat(*in_w[1:], *in_w), ~held[:u.bit_length() - 1], 32, "rot")
            rot_w = [rot.word_select(q, 32) for q in range(u)]
            below = select(m, held, {k: mask(k) for k in range(u)}, u, "below")
            # X: the carried words, then the input beat's (lanes at and past `held`).
            x = [wire(m, Mux(below[q], carry.word_select(q, 32), rot_w[q]), f"x{q}")
                 for q in range(u - 1)]
            x.append(rot_w[u - 1])
            at = wire(m, select(m, lane[:u.bit_length() - 1], {d: 1 << d for d in range(u)}, u,
                                 "at_lane") & here.replicate(u), "at")
            after = wire(m, select(m, lane[:u.bit_length() - 1],
                                    {d: mask(u) & ~mask(d + 1) for d in range(u)}, u,
                                    "after_lane") & here.replicate(u), "after")
            words = wire(m, Cat(Mux(at[q], marker, Mux(after[q], x[q - 1], x[q]) if q else x[q])
                                 for q in range(u)), "words")
            carry_plain = rot[:32 * (u - 1)]
            carry_marked = Cat(x[u - 1], rot[:32 * (u - 2)])
        else:
            words = wire(m, Mux(here, marker, beat.data), "words")

        # Words available for this beat: the carried ones, and the input beat's unless flushing.
        avail = wrap_add(m, held, count & ~flush.replicate(wb), wb, "avail")
        follows = mk & next_to               # a marker starts right after this beat
        ends = wire(m, Mux(here, lt(avail, u), lt(avail, u) | (eq(avail, u) & ~follows)), "ends")
        included = wire(m, here & (lane <= avail), "included")  # on a last beat: before the end
        covered = wrap_add(m, avail, included, wb, "covered")
        end_keep = select(m, covered, {c: mask(4 * c) for c in range(1, u + 1)}, n, "end_keep")
        held_after = Mux(here, sub(avail, u - 1), sub(avail, u))

        with m.If(go):
            with m.If(flush):
                send(words, end_keep, 1, bad)
                m.d.comb += [done.eq(1), marked.eq(included)]
                m.d.sync += held.eq(0)
            with m.Elif(here & eq(held, u - 1)):
                # The carried words and the marker fill the beat: no input taken.
                send(words, mask(n), 0, 0)
                m.d.comb += marked.eq(1)
                m.d.sync += held.eq(0)
            with m.Elif(self.i.valid):
                m.d.comb += self.i.ready.eq(1)
                last = beat.last & ends
                send(words, Mux(last, end_keep, mask(n)), last, beat.err)
                m.d.comb += marked.eq(Mux(last, included, here))
                m.d.sync += held.eq(Mux(last, 0, held_after))
                if u > 1:
                    m.d.sync += carry.eq(Mux(here, carry_marked, carry_plain))
                with m.If(beat.last):
                    with m.If(ends):
                        m.d.comb += done.eq(1)
                    with m.Else():
                        m.d.sync += [flush.eq(1), bad.eq(beat.err)]


class CrcAppender(wiring.Component):
    """Append each FPDU's CRC field (RFC 5044 4.4): CRC32c of the FPDU so far, least
    significant byte first, or zero when the beats' ``crc`` is 0.

    Ports
    -----
    i : In(stream.Signature(CoveredBeat(data_bytes)))
        FPDUs without their CRC field (a multiple of 4 bytes each).
    o : Out(BeatStream(data_bytes, err=True))
        The FPDUs. The CRC takes the lanes after the last beat's bytes, or a beat of its own
        (``4 / data_bytes`` beats at 1 and 2 bytes). ``err`` passes to the last beat.

    The beats wait in a FIFO of :attr:`depth` beats while the CRC engine (latency
    ``3 + log2(data_bytes)`` cycles) works on them; a packet's last beat leaves only with its
    CRC. Throughput: one beat per cycle, plus the CRC's own beats; once the FIFO holds the
    engine's latency (it fills while the first FPDU's CRC is computed), no bubble between FPDUs.
    Latency: a beat goes through the FIFO and the output register; a packet's last beat also
    waits for its CRC, ``3 + log2(data_bytes)`` cycles after it was taken. Back-pressure on
    ``o`` fills the FIFO, then stalls ``i``.
    """

    def __init__(self, data_bytes):
        self.data_bytes = check_data_bytes(data_bytes)
        self._engine = CRC32CEngine(data_bytes)
        self.depth = self._engine.latency + 4
        super().__init__({
            "i": In(stream.Signature(CoveredBeat(data_bytes))),
            "o": Out(BeatStream(data_bytes, err=True)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        layout = CoveredBeat(n)
        m.submodules.crc = engine = self._engine
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=layout.size, depth=self.depth)
        beat, out = self.i.payload, self.o
        m.d.comb += [
            self.i.ready.eq(fifo.w_rdy & engine.i.ready),
            fifo.w_data.eq(beat),
            fifo.w_en.eq(self.i.valid & self.i.ready),
            engine.i.valid.eq(self.i.valid & fifo.w_rdy),
            engine.i.payload.data.eq(beat.data),
            engine.i.payload.keep.eq(beat.keep),
            engine.i.payload.last.eq(beat.last),
        ]

        head = layout(fifo.r_data)
        value = wire(m, engine.o.payload & head.crc.replicate(32), "value")
        tail = Signal(32)                    # CRC bytes still to send, next in lane 0
        tail_n = Signal(range(_CRC + 1))
        tail_err = Signal()

        def by_keep(func, width, name):
            return select(m, head.keep, {mask(k): func(k) for k in range(1, n + 1)}, width, name)

        # The last beat with the CRC after its bytes; what does not fit goes to `tail`.
        spill = by_keep(lambda k: max(0, _CRC - (n - k)), len(tail_n), "spill_n")
        with_crc = by_keep(lambda k: Cat(head.data[:8 * k], value), 8 * n, "with_crc")
        crc_keep = by_keep(lambda k: mask(min(n, k + _CRC)), n, "crc_keep")
        spilled = by_keep(lambda k: value >> 8 * (n - k), 32, "spill")
        tail_keep = _keep_of(m, tail_n, min(n, _CRC), n, "tail_keep")
        tail_last = ~gt(tail_n, n) if n < _CRC else C(1)

        out_free = ~out.valid | out.ready
        with m.If(out_free):
            m.d.sync += out.valid.eq(0)
            with m.If(~is_zero(tail_n)):
                m.d.sync += [
                    out.valid.eq(1), out.payload.data.eq(tail), out.payload.keep.eq(tail_keep),
                    out.payload.last.eq(tail_last), out.payload.err.eq(tail_last & tail_err),
                ]
                if n < _CRC:
                    m.d.sync += [tail.eq(tail >> 8 * n), tail_n.eq(sub(tail_n, n))]
                else:
                    m.d.sync += tail_n.eq(0)
            with m.Elif(fifo.r_rdy & (~head.last | engine.o.valid)):
                m.d.comb += fifo.r_en.eq(1)
                m.d.sync += [out.valid.eq(1), out.payload.data.eq(head.data),
                             out.payload.keep.eq(head.keep), out.payload.last.eq(0),
                             out.payload.err.eq(0)]
                with m.If(head.last):
                    m.d.comb += engine.o.ready.eq(1)
                    m.d.sync += [
                        out.payload.data.eq(with_crc), out.payload.keep.eq(crc_keep),
                        out.payload.last.eq(is_zero(spill)),
                        out.payload.err.eq(is_zero(spill) & head.err),
                        tail.eq(spilled), tail_n.eq(spill), tail_err.eq(head.err),
                    ]
        return m


class FpduFramer(wiring.Component):
    """Frame ULPDUs as MPA FPDUs (RFC 5044 4.1-4.4), for any ``data_bytes``.

    Ports
    -----
    i_header : In(stream.Signature(FpduRequest))
        One transfer per FPDU: ``ulpdu_length``; ``crc`` (1: compute the CRC32c, 0: the CRC
        field is zero); ``markers`` (insert markers); ``position``, the stream offset (counted
        from SeqStart, markers included) of the FPDU's first octet modulo 512. FPDUs start at
        multiples of 4, so the two low bits of ``position`` are ignored.
    i_payload : In(BeatStream(data_bytes))
        The ULPDUs, one packet of exactly ``ulpdu_length`` bytes per FPDU, none for length 0.
        Its beats may come before, with or after the header.
    o : Out(BeatStream(data_bytes, err=True))
        Each FPDU as one packet: the bytes ``iwarp_model.wire.fpdu.Framer(crc=crc,
        markers=markers, position=position).frame(ulpdu)`` returns.
    o_length : Out(stream.Signature(unsigned(17)))
        One transfer per FPDU, in order, offered soon after its header is taken: the FPDU's
        length on the wire, markers included (``iwarp_model.wire.fpdu.wire_length``), so the
        caller can advance ``position``. It is computed from the header alone; a header is
        taken only while this output has room (a queue of 4), so the caller must take it.

    Bad input: a payload packet longer than ``ulpdu_length`` is cut to that length (the rest of
    the packet is taken and dropped), a shorter one is filled up with zeros; the FPDU is sent
    for the fitted ULPDU, well formed, with ``err`` on its last beat. The next FPDU is framed
    normally. A payload packet sent for a length of 0 would be read as the next FPDU's payload.

    Throughput: one beat per cycle in steady state. The ULPDU_Length field, the pad, the
    markers and the CRC take output beats of their own when they do not fit the beats the
    payload fills; there is no bubble between back-to-back FPDUs once the CRC FIFO has filled
    (the first FPDU's last beat waits for its CRC). Back-pressure on ``o`` stalls ``i_payload``
    (and, once the small header queues are full, ``i_header``); nothing is lost.

    Latency, measured (``test_latency``) from the cycle an idle framer takes a header, its
    payload offered from then on, to the first beat offered on ``o``: 10 cycles at 1 byte per
    beat, 11 at 8 and 64; 7 at 1 byte when the FPDU starts with a marker; when everything
    before the CRC fits one beat, that beat waits for the CRC: 15 cycles at 8 bytes, 18 at 64.
    (Register slices before and after the header emitter cost two of them and keep the ready
    chain of the first three stages out of one combinational path.)

    FPDUPTR is 16 bits wide: see :class:`MarkerInserter` for the one case where it wraps.
    """

    def __init__(self, data_bytes):
        self.data_bytes = check_data_bytes(data_bytes)
        super().__init__({
            "i_header": In(stream.Signature(FpduRequest)),
            "i_payload": In(BeatStream(data_bytes)),
            "o": Out(BeatStream(data_bytes, err=True)),
            "o_length": Out(stream.Signature(unsigned(17))),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        m.submodules.fit = fit = UlpduFit(n)
        m.submodules.emitter = emitter = HeaderEmitter(ULPDU_LENGTH, n, err=True)
        m.submodules.inserter = inserter = MarkerInserter(n)
        m.submodules.appender = appender = CrcAppender(n)
        wiring.connect(m, wiring.flipped(self.i_payload), fit.i)
        wiring.connect(m, fit.o_header, emitter.i_header)
        m.submodules.fit_slice = fit_slice = SkidBuffer(BeatLayout(n, err=True))
        wiring.connect(m, fit.o, fit_slice.i)
        wiring.connect(m, fit_slice.o, emitter.i_payload)
        # A register slice: the ready chain through the inserter, the emitter and the fit would
        # otherwise be one combinational path.
        m.submodules.slice = slice_ = SkidBuffer(BeatLayout(n, err=True))
        wiring.connect(m, emitter.o, slice_.i)
        wiring.connect(m, slice_.o, inserter.i)
        wiring.connect(m, inserter.o, appender.i)
        wiring.connect(m, appender.o, wiring.flipped(self.o))

        # Each header goes into three queues at once: the fit's, the inserter's, o_length's.
        hdr = self.i_header.payload
        m.submodules.lengths = lengths = SyncFIFOBuffered(width=16, depth=4)
        m.submodules.markers = markers = SyncFIFOBuffered(width=MarkerRequest.size, depth=4)
        m.submodules.wire = wire = SyncFIFOBuffered(width=17, depth=8)
        # The wire length is worked out over three cycles from the header taken (its adders
        # would otherwise make one long path behind whatever drives the header); the queue
        # keeps a place for each length on the way.
        room = lengths.w_rdy & markers.w_rdy & lt(wire.w_level, wire.depth - _WIRE_STAGES)
        take = self.i_header.valid & room
        wire_valid, wire_data = wire_length(m, take, hdr.ulpdu_length, hdr.position,
                                            hdr.markers)
        request = Signal(MarkerRequest)
        m.d.comb += [
            request.crc.eq(hdr.crc), request.markers.eq(hdr.markers),
            request.position.eq(hdr.position),
            self.i_header.ready.eq(room),
            lengths.w_data.eq(hdr.ulpdu_length), lengths.w_en.eq(take),
            markers.w_data.eq(request), markers.w_en.eq(take),
            wire.w_data.eq(wire_data), wire.w_en.eq(wire_valid),
            fit.i_length.payload.eq(lengths.r_data), fit.i_length.valid.eq(lengths.r_rdy),
            lengths.r_en.eq(fit.i_length.ready),
            inserter.i_header.payload.eq(markers.r_data),
            inserter.i_header.valid.eq(markers.r_rdy),
            markers.r_en.eq(inserter.i_header.ready),
            self.o_length.payload.eq(wire.r_data), self.o_length.valid.eq(wire.r_rdy),
            wire.r_en.eq(self.o_length.ready),
        ]
        return m


#: Cycles :func:`wire_length` takes.
_WIRE_STAGES = 3


def wire_length(m, valid, ulpdu_length, position, markers):
    """``(valid, length)``, :data:`_WIRE_STAGES` cycles after ``valid``: the octets on the wire
    (17 bits) of an FPDU of ``ulpdu_length`` that starts at stream offset ``position`` (modulo
    512), with ``markers`` or not (the model's ``wire_length``). One per cycle.

    In words: ``W = ceil((2 + ULPDU_Length) / 4) + 1`` words of FPDU without markers. With
    markers, the stream's words are periods of 128 whose first is a marker; the FPDU starts
    at word ``r = position / 4`` of one and takes a marker at each period start with one of
    its words after it. Its last word is the ``N``-th non-marker word counted from that
    period's start, ``N = r - [r > 0] + W``, and ``M = (N - 1) // 127 + [r == 0]``. The
    division by 127 is ``x // 127 = a + (a + b) // 127`` for ``x = 128 a + b``, where
    ``a + b < 256``.
    """
    def stage(name, width=1):
        return Signal(width, name=f"wire_{name}")

    # 1: W - 1 and the words before r.
    v1, above1, r1, marked1 = stage("v1"), stage("above1", 15), stage("r1", 7), stage("marked1")
    length = widened(m, ulpdu_length, 17, "wire_length_inv")
    m.d.sync += [v1.eq(valid), above1.eq(add(length, _LENGTH + _CRC - 1)[2:]),
                 r1.eq(position[2:]), marked1.eq(markers)]
    # 2: N - 1.
    v2, above2, n2, first2, marked2 = (stage("v2"), stage("above2", 15), stage("n2", 15),
                                       stage("first2"), stage("marked2"))
    r_zero = is_zero(r1)
    before = Mux(r_zero, 0, sub(r1, 1))                     # non-marker words before r
    m.d.sync += [v2.eq(v1), above2.eq(above1), first2.eq(r_zero), marked2.eq(marked1),
                 n2.eq(wrap_add(m, above1, before, 15, "wire_n1"))]
    # 3: the periods it reaches, and W (the words plus the CRC word's 1).
    v3, words3, periods3, first3, marked3 = (stage("v3"), stage("words3", 15),
                                             stage("periods3", 8), stage("first3"),
                                             stage("marked3"))
    ab = wrap_add(m, n2[7:], n2[:7], 8, "wire_ab")          # a + b, at most 255
    twice = ~lt(ab, 254)
    m.d.sync += [v3.eq(v2), words3.eq(add(above2, 1)), first3.eq(first2),
                 marked3.eq(marked2),
                 periods3.eq(wrap_add(m, n2[7:], Cat(~lt(ab, 127) & ~twice, twice), 8,
                                      "wire_periods"))]
    count = wrap_add(m, periods3, first3, 8, "wire_markers")
    words = wrap_add(m, words3, Mux(marked3, count, 0), 15, "wire_words")
    return v3, Cat(C(0, 2), words)
