"""MPA FPDU deframing, the receive side: RFC 5044 sections 4.1 to 4.4 and 8 (errors).

The receiver's view of :mod:`.framer`'s FPDUs, on one connection's byte stream from SeqStart
(the first octet of the first FPDU) on. For each FPDU the deframer

* finds it by its ULPDU_Length field (4.1), checking the length against ``max_ulpdu``;
* checks its CRC32c (4.4, when negotiated) over the FPDU from its first octet through the pad,
  leading and inner markers included, the received CRC field read least significant octet first;
* removes the markers (4.2, 4.3, when negotiated) and checks each one's FPDUPTR (its two low bits
  ignored) against the octets between the FPDU's ULPDU_Length field and the marker (0 for a
  leading marker, which sits right before the field);
* hands on the FPDU's ULPDU_Length field and ULPDU, markers, pad and CRC removed.

Errors (RFC 5044 section 8: nothing is delivered after an error on a stream): the first bad FPDU
gives one error event, as the model's :class:`iwarp_model.wire.fpdu.Deframer` raises, in its
order: a ULPDU_Length above ``max_ulpdu`` as soon as the field is read; else, at the FPDU's end, a
CRC mismatch before a marker mismatch. The bad FPDU's packet ends with ``err`` (a
:class:`~iwarp_nic.fifo.PacketFifo` behind rolls it back) and every later octet of the stream is
thrown away. The bad FPDU always gives a packet, if only one octet long (an oversize one), so
that what follows the deframer meets the error in stream order: the engine reports the error
when its placer reaches that packet, after every segment before it.

:class:`FpduDeframer` is four stages in a row, on beats of at least 4 bytes (narrower streams are
gathered into 4-byte beats first and spread out again after):

1. :class:`FpduSplitter` cuts the stream into FPDUs, each a packet from lane 0 without its CRC
   field, which rides along on the last beat;
2. :class:`CrcChecker` computes the CRC of each packet beside a FIFO and flags a mismatch;
3. :class:`MarkerRemover` takes out the marker words, checks their FPDUPTR, and cuts the pad;
4. :class:`StreamVerdict` reports the first error and drops everything after it.

Every FPDU and every marker is a multiple of 4 octets long and starts at a stream offset that is a
multiple of 4, so from stage 2 on a marker is one whole word of a beat.

Several connections (``conns``): the same stages take the pieces that
:class:`~iwarp_nic.mpa.gather.FrameGather` releases, each a run of one connection's whole FPDUs
with its marker position and settings. Each FPDU's beats carry a tag (connection, CRC in use,
first of the connection) through the stages, the splitter and the verdict keep one failed bit
per connection, and so each connection is deframed, and fails, as its own stream.
"""


from amaranth import C, Cat, Module, Mux, Signal
from amaranth.lib import enum, stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..crc import CRC32CEngine
from ..exact import (
    Machine,
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
    wrap_sub,
)
from ..stream import BeatStream, check_data_bytes, keep_count
from ..tcp.layouts import conn_bits
from ..width import BeatDownsizer, BeatUpsizer
from .gather import Release

__all__ = ["ErrorKind", "ConnError", "PieceTag", "FpduBeat", "LogicalBeat", "FpduSplitter",
           "CrcChecker", "MarkerRemover", "StreamVerdict", "FpduDeframer"]

#: Octets of the ULPDU_Length field, of a marker, of the CRC field.
_LENGTH, _MARKER, _CRC = 2, 4, 4
#: The narrowest beat the deframing stages work on: one word.
_CORE_BYTES = 4


class ErrorKind(enum.Enum, shape=2):
    """Why a stream failed (the model's exceptions of :mod:`iwarp_model.wire.errors`)."""
    CRC = 0      # CrcError
    MARKER = 1   # MarkerError
    LENGTH = 2   # OversizeError: ULPDU_Length above max_ulpdu


def ConnError(conns):
    """An error event of the several-connection deframer: why, and whose stream failed."""
    return StructLayout({"kind": ErrorKind, "conn": conn_bits(conns)})


def _error_event(conns):
    """The error event's shape: the kind alone for one stream, with the connection for many."""
    return ErrorKind if conns is None else ConnError(conns)


def PieceTag(conns):
    """What every beat of an FPDU carries through the several-connection stages: its
    connection, ``first`` (the FPDU is the first of the connection's first piece: whatever the
    slot's earlier connection did is forgotten) and ``crc`` (CRCs are in use on it)."""
    return StructLayout({"conn": conn_bits(conns), "first": 1, "crc": 1})


def _tagged(fields, conns):
    """A beat layout of ``fields``, plus the ``tag`` of :func:`PieceTag` with ``conns``."""
    if conns is not None:
        fields["tag"] = PieceTag(conns)
    return StructLayout(fields)


def FpduBeat(data_bytes, conns=None):
    """A beat of an FPDU without its CRC field, lane 0 first.

    ``length`` (the FPDU's ULPDU_Length) is on every beat, ``crc_field`` (the received CRC
    field as a little-endian word) and ``crc_bad`` (set by :class:`CrcChecker`) on the last.
    ``marker``: word ``marker_lane`` of the beat is a marker, whose FPDUPTR must be
    ``fpduptr`` (its two low bits aside). An FPDU whose ULPDU_Length is too long is a one-beat
    packet with ``oversize`` and no other meaning. With ``conns``, every beat has the FPDU's
    ``tag`` (:func:`PieceTag`)."""
    return _tagged({"data": 8 * data_bytes, "keep": data_bytes, "last": 1,
                    "length": 16, "crc_field": 32, "crc_bad": 1, "oversize": 1,
                    "marker": 1, "marker_lane": _lane_bits(data_bytes), "fpduptr": 16}, conns)


def _lane_bits(data_bytes):
    """Bits of a word lane number of a beat."""
    return max(1, (data_bytes // 4 - 1).bit_length())


def LogicalBeat(data_bytes, conns=None):
    """A beat of an FPDU's ULPDU_Length field and ULPDU; the verdict on the last beat. A last
    beat with ``keep`` 0 carries only a verdict (``oversize``). With ``conns``, every beat has
    the FPDU's ``tag``."""
    return _tagged({"data": 8 * data_bytes, "keep": data_bytes, "last": 1, "crc_bad": 1,
                    "marker_bad": 1, "oversize": 1}, conns)


def _check_conns(conns):
    if conns is not None:
        conn_bits(conns)
    return conns


def _check_max_ulpdu(max_ulpdu):
    if not isinstance(max_ulpdu, int) or not 0 <= max_ulpdu <= 0xFFFE:
        raise ValueError(f"with conns, max_ulpdu must be the gather's, 0 to 65534, not "
                         f"{max_ulpdu!r}")
    return max_ulpdu


def _check_core(data_bytes):
    check_data_bytes(data_bytes)
    if data_bytes < _CORE_BYTES:
        raise ValueError(f"this stage works on beats of {_CORE_BYTES} bytes or more, "
                         f"not {data_bytes} (FpduDeframer widens narrower streams)")
    return data_bytes


def _at_most(value, bound):
    """``value <= bound`` for a constant ``bound`` (never, below 0)."""
    return ~gt(value, bound) if bound >= 0 else C(0, 1)


class FpduSplitter(wiring.Component):
    """Cut a stream of FPDUs into one packet per FPDU, realigned to lane 0 (RFC 5044 4.1, 4.5).

    Ports
    -----
    i : In(BeatStream(data_bytes))
        The connection's stream from SeqStart on, in beats (each ``keep`` contiguous from lane
        0) and packets of any size: the packets (the TCP segments' new bytes, say) need not
        follow FPDU boundaries.
    markers : In(1); max_ulpdu : In(16)
        As negotiated; held steady while the stream runs.
    o : Out(stream.Signature(FpduBeat(data_bytes)))
        Per FPDU one packet of its octets up to the pad (a leading marker, inner markers and a
        marker right after the pad included), the CRC field after them on the last beat. An
        FPDU whose ULPDU_Length is above ``max_ulpdu`` gives a one-beat ``oversize`` packet
        (its first octets), and from then on every input octet is taken and thrown away. The
        markers are found by their stream offsets (multiples of 512 from SeqStart): a beat
        with one inside the FPDU flags its word and the FPDUPTR it must hold, the distance from
        the ULPDU_Length field (0 for a leading marker).

    With ``conns`` (several connections' pieces, as :class:`~iwarp_nic.mpa.gather.FrameGather`
    releases them), ``markers`` comes with each piece and ``max_ulpdu`` is a parameter, the
    gather's (so the two agree on where framing is lost):

    i_piece : In(stream Release(conns))
        One header per piece on ``i``, which then carries the piece as one packet. The piece
        begins and ends on FPDU boundaries (until its connection's framing is lost to an
        over-long ULPDU_Length, which the gather finds at the same ``max_ulpdu``); ``position``
        is its first octet's distance past a marker position, ``markers`` and ``crc`` the
        connection's settings, ``first`` set on the connection's first piece. ``length`` and
        ``kind`` are not looked at: only FPDUS pieces belong here.

    Every output beat then has the FPDU's ``tag`` (:func:`PieceTag`). An over-long ULPDU_Length
    marks its connection dead: the rest of its piece and all its later pieces are thrown away,
    until a piece with ``first``. Pieces are not joined in the buffer: a piece's header is
    taken once the previous piece's octets have all been sent, and its first FPDU's length
    field is then read as a stream's first is, which costs about four input cycles per piece
    (measured at 8 and 64 bytes).

    The octets wait in a buffer of ``3 * data_bytes + 8`` bytes: each cycle takes one input beat
    while the buffer has room for it and, once an FPDU's length is known, sends one beat of it
    (a whole beat, or the rest of the FPDU once it and its CRC field are in the buffer).

    Throughput: one beat per cycle, plus the last partial beat of each FPDU. The next FPDU's
    ULPDU_Length field is read as the last beat of one goes, when it is in the buffer by then
    and the FPDU is longer than a beat; otherwise (and for the first FPDU) reading it and
    planning the FPDU's first beat take two cycles. Latency: an FPDU's first beat
    is offered one or two cycles after the input beat that completes its first ``data_bytes``
    octets (or the whole FPDU) is taken.
    Back-pressure on ``o`` fills the buffer, then stalls ``i``.
    """

    def __init__(self, data_bytes, *, conns=None, max_ulpdu=None):
        self.data_bytes = _check_core(data_bytes)
        self.conns = _check_conns(conns)
        self.buffer_bytes = 3 * data_bytes + 8
        ports = {"i": In(BeatStream(data_bytes))}
        if conns is None:
            ports.update(markers=In(1), max_ulpdu=In(16))
        else:
            ports["i_piece"] = In(stream.Signature(Release(conns)))
            self.max_ulpdu = _check_max_ulpdu(max_ulpdu)     # the gather's: a constant
        super().__init__({**ports, "o": Out(stream.Signature(FpduBeat(data_bytes, conns)))})

    def elaborate(self, platform):
        m = Module()
        n, size = self.data_bytes, self.buffer_bytes
        beat, out = self.i.payload, self.o
        buf = Signal(8 * size)      # buffered octets from lane 0; zero past `have`
        have = Signal(range(size + 1))
        state = Machine(m, ["HEAD", "PLAN", "BODY", "DEAD"], "state")
        pieces = self.conns is not None
        if pieces:
            # The piece being cut: its FPDUs' tag, its marker setting, and whether more of its
            # beats are to come; the connections whose framing is lost.
            tag = Signal(PieceTag(self.conns))
            markers = Signal()
            open_piece = Signal()
            dead_conns = Signal(self.conns)
        else:
            markers = self.markers
        have_w = len(have)
        # The FPDU being cut: its ULPDU_Length, whether it starts with a marker, its octets
        # sent, its octets before the CRC field still to send not counting markers, and the
        # octets from the buffer's head to the next marker (modulo 512).
        length = Signal(16)
        leading = Signal()
        sent = Signal(17)
        lrem = Signal(17)
        to_marker = Signal(9)
        # Planned a cycle ahead for the beat at the buffer's head: it is the FPDU's last
        # (`final`), with `end - 4` octets before the CRC field.
        final = Signal()
        end = Signal(range(n + 2 * _CRC + 1))
        ew = len(end)

        def logical(field):
            """ULPDU_Length field, ULPDU and pad: ``(field + 5) & ~3`` octets."""
            return Cat(C(0, 2), add(widened(m, field, 17, "field_wide"), 5)[2:])

        def plan_end(name, lrem_v, inside):
            """``end`` of a head beat that is the FPDU's last: the octets before its CRC field
            (``lrem_v``, plus the marker ``inside`` them), plus the CRC field."""
            low = lrem_v[:ew]
            return wire(m, Mux(inside, add(low, _MARKER + _CRC), add(low, _CRC)), f"{name}_end")

        def header(name, window, avail, leading):
            """The ULPDU_Length field of an FPDU whose octets start at ``window`` (after a
            ``leading`` marker or not), whether it is in the buffer (of ``avail`` octets), and
            whether it is over ``max_ulpdu``."""
            field = wire(m, Mux(leading, Cat(window[40:48], window[32:40]),
                                Cat(window[8:16], window[:8])), f"{name}_field")
            present = wire(m, Mux(leading, ~lt(avail, 6), ~lt(avail, 2)), f"{name}_present")
            over = gt(field, self.max_ulpdu) if pieces else field > self.max_ulpdu
            return field, present, wire(m, over, f"{name}_oversize")

        # The first beat of an FPDU whose header is at the buffer's head (HEAD).
        head_leading = wire(m, markers & is_zero(to_marker), "head_leading")
        field, has_field, oversize = header("head", buf, have, head_leading)
        # A marker in a head beat counts when it comes before the end of the pad or right
        # after it (a leading marker always). The first beat is the last when `logical(field)`
        # octets, with such a marker, fit: field <= n - 2 (n - 6 with the marker).
        marker_here = wire(m, markers & lt(to_marker, n), "marker_here")
        # PLAN, the cycle after: the first beat of the FPDU whose header HEAD read.
        head_lrem = wire(m, logical(length), "head_lrem")
        head_inside = wire(m, marker_here & (widened(m, head_lrem[:ew], 9, "head_low")
                                             >= to_marker), "head_inside")
        # A marker right after the pad at the next beat's first lane is covered by the CRC:
        # this beat is then not the last (the next holds the marker and the CRC field).
        head_marker_next = wire(m, markers & eq(head_lrem, n) & eq(to_marker, n),
                                "head_marker_next")
        head_final = Mux(head_inside, _at_most(length, n - 6),
                         _at_most(length, n - 2) & ~head_marker_next)
        head_end = plan_end("head", head_lrem, head_inside)
        # The next beat of this FPDU, after a beat that is not its last. Its marker, if any,
        # counts when it is not after the pad: lrem >= to_marker (then, n <= to_marker < 2n).
        body_lrem = wire(m, Mux(marker_here, sub(lrem, n - _MARKER), sub(lrem, n)), "body_lrem")
        body_to_marker = wire(m, sub(to_marker, n), "body_to_marker")
        body_inside = wire(m, markers & ~marker_here & lt(to_marker, 2 * n)
                           & (lrem >= widened(m, to_marker, 17, "to_marker_wide")),
                           "body_inside")
        body_marker_next = wire(m, markers & eq(lrem, 2 * n) & eq(to_marker, 2 * n),
                                "body_marker_next")
        body_final = wire(m, Mux(marker_here | body_inside, _at_most(lrem, 2 * n - _MARKER),
                                 _at_most(lrem, 2 * n) & ~body_marker_next), "body_final")
        body_end = plan_end("body", body_lrem, body_inside)
        # The first beat of the next FPDU, read as this one's last beat goes: worked out for
        # each word where it may start (after `end` octets), then chosen by `end`.
        next_to_marker = wrap_sub(m, to_marker, end, 9, "next_to_marker")
        choices = {}
        for k in range(2, n // 4 + 2):
            lead_k = wire(m, markers & eq(to_marker, 4 * k), f"next{k}_leading")
            field_k, present_k, oversize_k = header(
                f"next{k}", buf[32 * k:32 * k + 48], wrap_sub(m, have, 4 * k, have_w,
                                                            f"next{k}_avail"), lead_k)
            # Its first beat cannot be its last (then HEAD plans a short FPDU's first beat).
            long_k = present_k & ~oversize_k & gt(field_k, n - 2)
            choices[k] = Cat(field_k, logical(field_k), lead_k, long_k)
        choice = select(m, end[2:], choices, 16 + 17 + 2, "next_choice")
        next_field, next_lrem = choice[:16], choice[16:33]
        next_leading, next_long = choice[33], choice[34]

        # The head beat's marker, if it is inside the FPDU (before its CRC field), and the
        # FPDUPTR it must hold: its distance from the ULPDU_Length field, 0 if leading.
        marker_counts = wire(m, marker_here & (~final | (
            widened(m, sub(end, _CRC), 9, "covered") > to_marker)), "marker_counts")
        offset = wire(m, wrap_add(m, sent, to_marker, 17, "marker_offset"), "offset")
        fpduptr = wire(m, Mux(leading & ~is_zero(offset), sub(offset, _MARKER), offset)[:16],
                       "fpduptr")
        e_low = end[:n.bit_length() + 1]
        final_keep = select(m, e_low, {k + _CRC: mask(k) for k in range(1, n + 1)}, n,
                            "final_keep")
        crc_field = select(m, e_low, {k + _CRC: buf[8 * k:8 * k + 32] for k in range(1, n + 1)},
                           32, "crc_field")
        consumed = Signal(range(n + _CRC + 1))     # octets sent this cycle, and
        drop_end = Signal()                         # ... they are an FPDU's last beat's
        drop_beat = Signal()                        # ... or a whole beat
        cw = len(consumed)
        ready_body = wire(m, Mux(final, have >= widened(m, end, have_w, "end_wide"),
                                 ~lt(have, n)), "ready_body")

        out_free = ~out.valid | out.ready
        with m.If(out.ready):
            m.d.sync += out.valid.eq(0)

        def tag_beat(last):
            """The beat sent carries the FPDU's tag; `first` is the first FPDU's only."""
            if pieces:
                m.d.sync += out.payload.tag.eq(tag)
                with m.If(last):
                    m.d.sync += tag.first.eq(0)
        with state.state("HEAD"):
            with m.If(has_field):
                with m.If(oversize):
                    with m.If(out_free):
                        m.d.sync += [
                            out.valid.eq(1), out.payload.data.eq(buf[:8 * n]),
                            out.payload.keep.eq(mask(min(n, _MARKER + _LENGTH))),
                            out.payload.last.eq(1), out.payload.oversize.eq(1),
                            out.payload.length.eq(field), out.payload.marker.eq(0),
                            out.payload.crc_bad.eq(0), out.payload.crc_field.eq(0),
                        ]
                        tag_beat(C(1, 1))
                        if pieces:
                            m.d.sync += dead_conns.bit_select(tag.conn, 1).eq(1)
                        state.goto("DEAD")
                with m.Else():
                    m.d.sync += [length.eq(field), leading.eq(head_leading), sent.eq(0)]
                    state.goto("PLAN")
        with state.state("PLAN"):
            m.d.sync += [lrem.eq(head_lrem), final.eq(head_final), end.eq(head_end)]
            state.goto("BODY")
        with state.state("BODY"):
            with m.If(ready_body & out_free):
                m.d.sync += [
                    out.valid.eq(1), out.payload.data.eq(buf[:8 * n]),
                    out.payload.keep.eq(Mux(final, final_keep, mask(n))),
                    out.payload.last.eq(final), out.payload.oversize.eq(0),
                    out.payload.length.eq(length),
                    out.payload.crc_bad.eq(0), out.payload.crc_field.eq(crc_field),
                    out.payload.marker.eq(marker_counts), out.payload.marker_lane.eq(
                        to_marker[2:2 + _lane_bits(n)]), out.payload.fpduptr.eq(fpduptr),
                ]
                tag_beat(final)
                with m.If(final):
                    m.d.comb += [consumed.eq(end[:cw]), drop_end.eq(1)]
                    m.d.sync += to_marker.eq(next_to_marker)
                    with m.If(next_long):
                        m.d.sync += [length.eq(next_field), leading.eq(next_leading),
                                     sent.eq(0), lrem.eq(next_lrem), final.eq(0)]
                    with m.Else():
                        state.goto("HEAD")
                with m.Else():
                    m.d.comb += [consumed.eq(n), drop_beat.eq(1)]
                    m.d.sync += [to_marker.eq(body_to_marker), lrem.eq(body_lrem),
                                 final.eq(body_final), end.eq(body_end), sent.eq(add(sent, n))]

        # The buffer: the input beat goes behind what it holds (when there is room even if
        # nothing is sent), then what was sent is dropped (a beat, or up to a word boundary).
        dead = wire(m, eq(state.reg, 3), "dead")
        room = Signal(init=1)       # have <= size - n, kept beside `have` (timing)
        if pieces:
            self._next_piece(m, state, dead, have, tag, markers, open_piece, dead_conns,
                             to_marker)
            m.d.comb += self.i.ready.eq(open_piece & (room | dead))
            take = self.i.valid & room & ~dead & open_piece
        else:
            m.d.comb += self.i.ready.eq(room | dead)
            take = self.i.valid & room & ~dead
        count = keep_count(m, beat.keep, n, "in_count")
        lanes = Cat(beat.data.word_select(j, 8) & beat.keep[j].replicate(8) for j in range(n))
        shift_w = (size - 1).bit_length()
        fill = (1 << shift_w) - 1      # placing at `have` = shifting right by fill - have
        placed = shift_right(m, Cat(C(0, 8 * fill), lanes, C(0, 8 * (size - n))),
                             ~have[:shift_w], 8, "placed")
        joined = wire(m, buf | Mux(take, placed[:8 * size], 0), "joined")
        past_end = select(m, end[2:], {k: joined[32 * k:] for k in range(2, n // 4 + 2)},
                          8 * size, "past_end")
        with_input = wrap_add(m, have, Mux(take, count, 0), have_w, "with_input")
        have_next = wrap_sub(m, with_input, consumed, have_w, "have_next")
        m.d.sync += [
            buf.eq(Mux(drop_end, past_end, Mux(drop_beat, joined[8 * n:], joined))),
            have.eq(have_next), room.eq(~gt(have_next, size - n)),
        ]
        with m.If(dead):
            m.d.sync += [buf.eq(0), have.eq(0), room.eq(1)]
        return m

    def _next_piece(self, m, state, dead, have, tag, markers, open_piece, dead_conns, to_marker):
        """Take the next piece's header once the one before has been sent (or thrown away):
        its settings, the distance to its first marker, and whether its connection is dead."""
        piece = self.i_piece.payload
        head = wire(m, eq(state.reg, 0), "head")
        between = wire(m, ~open_piece & ((head & is_zero(have)) | dead), "between")
        m.d.comb += self.i_piece.ready.eq(between)
        with m.If(self.i.valid & self.i.ready & self.i.payload.last):
            m.d.sync += open_piece.eq(0)
        with m.If(self.i_piece.valid & between):
            conn_dead = select(m, piece.conn, list(dead_conns), 1, "conn_dead")
            m.d.sync += [
                open_piece.eq(1), tag.conn.eq(piece.conn), tag.first.eq(piece.first),
                tag.crc.eq(piece.crc), markers.eq(piece.markers),
                to_marker.eq(add(~piece.position, 1)[:9]),
            ]
            with m.If(piece.first):
                m.d.sync += dead_conns.bit_select(piece.conn, 1).eq(0)
                state.goto("HEAD")
            with m.Elif(conn_dead):
                state.goto("DEAD")
            with m.Else():
                state.goto("HEAD")


class CrcChecker(wiring.Component):
    """Check each FPDU's CRC field against the CRC32c of its octets (RFC 5044 4.4).

    Ports
    -----
    i : In(stream.Signature(FpduBeat(data_bytes)))
        FPDUs from :class:`FpduSplitter`.
    crc : In(1)
        CRCs are in use (negotiated); held steady while the stream runs. With ``conns`` there
        is no such port: each FPDU's ``tag.crc`` says.
    o : Out(stream.Signature(FpduBeat(data_bytes)))
        The same beats; on a last beat ``crc_bad`` when ``crc`` is set and the CRC field (least
        significant octet first) is not the CRC32c of the packet's octets.

    The beats wait in a FIFO while a :class:`~iwarp_nic.crc.CRC32CEngine` (latency
    ``3 + log2(data_bytes)`` cycles) works on them; a last beat leaves with its CRC.
    Throughput: one beat per cycle once the FIFO holds the engine's latency. Latency: a last
    beat is offered ``4 + log2(data_bytes)`` cycles after it is taken. Back-pressure on ``o``
    fills the FIFO, then stalls ``i``.
    """

    def __init__(self, data_bytes, *, conns=None):
        self.data_bytes = _check_core(data_bytes)
        self.conns = _check_conns(conns)
        self._engine = CRC32CEngine(data_bytes)
        layout = FpduBeat(data_bytes, conns)
        super().__init__({"i": In(stream.Signature(layout)),
                          **({"crc": In(1)} if conns is None else {}),
                          "o": Out(stream.Signature(layout))})

    def elaborate(self, platform):
        m = Module()
        layout = FpduBeat(self.data_bytes, self.conns)
        m.submodules.crc = engine = self._engine
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=layout.size,
                                                    depth=engine.latency + 4)
        beat = self.i.payload
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
        go = wire(m, fifo.r_rdy & (~head.last | engine.o.valid), "go")
        mismatch = wire(m, engine.o.payload != head.crc_field, "mismatch")
        m.d.comb += [
            self.o.valid.eq(go),
            self.o.payload.eq(head),
            self.o.payload.crc_bad.eq(head.last & mismatch & (
                self.crc if self.conns is None else head.tag.crc)),
            fifo.r_en.eq(go & self.o.ready),
            engine.o.ready.eq(go & self.o.ready & head.last),
        ]
        return m


class MarkerRemover(wiring.Component):
    """Take the markers out of FPDUs and check them (RFC 5044 4.2, 4.3); cut the pad (4.1).

    Ports
    -----
    i : In(stream.Signature(FpduBeat(data_bytes)))
        FPDUs from :class:`CrcChecker`, their marker words flagged by :class:`FpduSplitter`.
    o : Out(stream.Signature(LogicalBeat(data_bytes)))
        Per FPDU its ULPDU_Length field and ULPDU, from lane 0: the marker words are removed
        and the pad is cut off the last beat. ``marker_bad`` on the last beat when a removed
        marker's FPDUPTR, its two low bits cleared, is not the beat's ``fpduptr``; ``crc_bad``
        passes. An ``oversize`` packet gives one verdict-only beat. With ``conns``, each beat has
        its FPDU's ``tag``.

    The words after a marker move down one lane; the words that do not fill an output beat wait
    in a carry register for the next. Throughput: one input beat per cycle; a beat whose words
    all wait gives no output, and when a packet's last input beat leaves words over, they go out
    alone in the next cycle, while the next packet's first beat is taken into the carry.
    Latency: one cycle. Back-pressure on ``o`` stalls ``i``.
    """

    def __init__(self, data_bytes, *, conns=None):
        self.data_bytes = _check_core(data_bytes)
        self.conns = _check_conns(conns)
        super().__init__({
            "i": In(stream.Signature(FpduBeat(data_bytes, conns))),
            "o": Out(stream.Signature(LogicalBeat(data_bytes, conns))),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        u = n // 4
        wb = (2 * u).bit_length()        # wide enough for 2u words
        beat, out = self.i.payload, self.o
        first = Signal(init=1)           # the next input beat starts a packet
        bad_r = Signal()                 # a marker of this packet was bad
        out_left = Signal(17)            # octets of ULPDU_Length and ULPDU still to send
        few_left = Signal()              # out_left <= data_bytes, kept beside it (timing)
        held = Signal(wb)                # words waiting in `carry`
        carry = Signal(32 * u)
        flush = Signal()                 # a packet's input has ended; its last beat waits
        crc_bad_r = Signal()
        held_now = wire(m, Mux(flush, 0, held), "held_now")   # the carry's words before `i`'s

        left = wire(m, Mux(first, add(widened(m, beat.length, 17, "length_wide"), _LENGTH),
                            out_left), "left")
        bad = wire(m, ~first & bad_r, "bad")
        here, lane = beat.marker, beat.marker_lane
        words_in = keep_count(m, beat.keep, n, "in_bytes")[2:]
        word_at = (select(m, lane, [beat.data.word_select(q, 32) for q in range(u)], 32,
                          "marker_word") if u > 1 else beat.data)
        fpduptr = Cat(word_at[24:32], word_at[16:24])     # octets 2 and 3, big-endian
        wrong = wire(m, here & ((fpduptr & 0xFFFC) != beat.fpduptr), "wrong")
        avail = wrap_sub(m, widened(m, words_in, wb, "words_wide"), here, wb, "avail")

        # x: the input words with the marker's taken out (the words above it move down).
        in_w = [beat.data.word_select(q, 32) for q in range(u)]
        if u > 1:
            above = select(m, lane, {d: mask(u) & ~mask(d) for d in range(u)}, u, "above")
            x = Cat(Mux(here & above[q], in_w[q + 1] if q + 1 < u else C(0, 32), in_w[q])
                    for q in range(u))
            # y: the carried words, then x: x shifted up by `held` words.
            sb = (u - 1).bit_length()
            up = shift_right(m, Cat(C(0, 32 * (u - 1)), x, C(0, 32 * (u - 1))),
                             ~held_now[:sb], 32, "up")
            below = select(m, held_now, {k: mask(k) for k in range(u + 1)}, u, "below")
            y = Cat(Mux(below[q], carry.word_select(q, 32), up.word_select(q, 32))
                    for q in range(u))
            y_rest = Mux(eq(held_now, u), x, up[32 * u:32 * (2 * u - 1)])
        else:
            x = beat.data
            y = Mux(held_now[0], carry, x)
            y_rest = x
        total = wire(m, wrap_add(m, held_now, avail, wb, "total_sum"), "total")
        fills = wire(m, ~lt(total, u), "fills")
        left_keep = select(m, left[:n.bit_length()], {k: mask(k) for k in range(1, n + 1)}, n,
                           "left_keep")
        # What is left fits this output beat; and it will the next, after this one is sent.
        ends = wire(m, Mux(first, _at_most(beat.length, n - _LENGTH), few_left), "ends")
        ends_next = wire(m, Mux(first, _at_most(beat.length, 2 * n - _LENGTH),
                                _at_most(out_left, 2 * n)), "ends_next")

        out_free = ~out.valid | out.ready
        with m.If(out.ready):
            m.d.sync += out.valid.eq(0)

        flush_keep = select(m, out_left[:n.bit_length()], {k: mask(k) for k in range(1, n + 1)},
                            n, "flush_keep")

        tagged = self.conns is not None
        tag_r = Signal(PieceTag(self.conns)) if tagged else None   # the carry's packet's
        beat_tag = beat.tag if tagged else None

        def send(data, last, keep, crc_bad, marker_bad, tag):
            m.d.sync += [
                out.valid.eq(1), out.payload.data.eq(data), out.payload.last.eq(last),
                out.payload.keep.eq(Mux(last, keep, mask(n))),
                out.payload.crc_bad.eq(last & crc_bad),
                out.payload.marker_bad.eq(last & marker_bad), out.payload.oversize.eq(0),
            ]
            if tagged:
                m.d.sync += out.payload.tag.eq(tag)

        def take():
            """Take the input beat: follow its markers; the carry takes what is not sent."""
            m.d.comb += self.i.ready.eq(1)
            m.d.sync += [
                first.eq(beat.last), bad_r.eq(bad | wrong), crc_bad_r.eq(beat.crc_bad),
                out_left.eq(left), few_left.eq(ends),
                carry.eq(y), held.eq(total),
            ]
            if tagged:
                m.d.sync += tag_r.eq(beat.tag)

        with m.If(out_free):
            with m.If(flush):
                # A packet's last beat; the next packet's first beat goes to the carry.
                send(carry, 1, flush_keep, crc_bad_r, bad_r, tag_r)
                m.d.sync += [flush.eq(0), held.eq(0)]
                with m.If(self.i.valid & ~beat.oversize):
                    take()
                    m.d.sync += flush.eq(beat.last)
            with m.Elif(self.i.valid & beat.oversize):
                m.d.comb += self.i.ready.eq(1)
                m.d.sync += [out.valid.eq(1), out.payload.keep.eq(0), out.payload.last.eq(1),
                             out.payload.oversize.eq(1), out.payload.crc_bad.eq(0),
                             out.payload.marker_bad.eq(0), first.eq(1), held.eq(0)]
                if tagged:
                    m.d.sync += out.payload.tag.eq(beat_tag)
            with m.Elif(self.i.valid):
                take()
                with m.If(fills & ~ends):
                    # A whole beat that is not the packet's last (after a last input beat,
                    # the rest follows alone).
                    send(y, 0, left_keep, 0, 0, beat_tag)
                    m.d.sync += [carry.eq(y_rest), held.eq(sub(total, u)),
                                 out_left.eq(sub(left, n)), few_left.eq(ends_next),
                                 flush.eq(beat.last)]
                with m.Elif(beat.last):
                    send(y, 1, left_keep, beat.crc_bad, bad | wrong, beat_tag)
                    m.d.sync += held.eq(0)
                # Else not a whole beat yet, or the packet's last one, which waits for the
                # packet's end (a marker right after the pad may follow) and its verdict.
        return m


class StreamVerdict(wiring.Component):
    """Pass FPDUs on until the first bad one; report it; drop everything after (RFC 5044 8).

    Ports
    -----
    i : In(stream.Signature(LogicalBeat(data_bytes)))
        From :class:`MarkerRemover`.
    o : Out(BeatStream(data_bytes, err=True))
        The packets of ``i``, ``err`` on the last beat of the first bad one, nothing after it.
        A verdict-only beat (``keep`` 0) is left out when good; when bad it goes on as a last
        beat of one octet, so every bad FPDU ends in an ``err`` beat that a parser behind sees
        (an oversize FPDU becomes a packet of one octet, too short to parse).
    o_error : Out(stream.Signature(ErrorKind))
        One transfer at the first bad FPDU: ``LENGTH`` for ``oversize``, else ``CRC`` for
        ``crc_bad``, else ``MARKER``.

    With ``conns``, each connection fails alone: ``o`` beats and ``o_error`` events name the
    connection (``conn``; ``o_error`` is a :func:`ConnError`), and a connection that has failed
    gets nothing through until an FPDU with ``tag.first`` starts it afresh.

    Throughput: one beat per cycle. Latency: one cycle. Back-pressure on either output stalls
    ``i``; once the stream has failed, ``i`` is taken and thrown away.
    """

    def __init__(self, data_bytes, *, conns=None):
        self.data_bytes = _check_core(data_bytes)
        self.conns = _check_conns(conns)
        super().__init__({
            "i": In(stream.Signature(LogicalBeat(data_bytes, conns))),
            "o": Out(BeatStream(data_bytes, err=True, conns=conns)),
            "o_error": Out(stream.Signature(_error_event(conns))),
        })

    def elaborate(self, platform):
        m = Module()
        beat, out, err = self.i.payload, self.o, self.o_error
        bad = wire(m, beat.last & (beat.oversize | beat.crc_bad | beat.marker_bad), "bad")
        kind = Mux(beat.oversize, ErrorKind.LENGTH.value,
                   Mux(beat.crc_bad, ErrorKind.CRC.value, ErrorKind.MARKER.value))
        if self.conns is None:
            failed = record = Signal()
            failed_now = failed
            beat_out, error_out = [], [err.payload.as_value().eq(kind)]
        else:
            states = Signal(self.conns)     # the connections that have failed
            failed = select(m, beat.tag.conn, list(states), 1, "failed")
            record = states.bit_select(beat.tag.conn, 1)
            failed_now = wire(m, failed & ~beat.tag.first, "failed_now")
            beat_out = [out.payload.conn.eq(beat.tag.conn)]
            error_out = [err.payload.kind.eq(kind), err.payload.conn.eq(beat.tag.conn)]
        free = (~out.valid | out.ready) & (~err.valid | err.ready)
        with m.If(out.ready):
            m.d.sync += out.valid.eq(0)
        with m.If(err.ready):
            m.d.sync += err.valid.eq(0)
        m.d.comb += self.i.ready.eq(failed_now | free)
        with m.If(self.i.valid & ~failed_now & free):
            with m.If(~is_zero(beat.keep) | bad):
                m.d.sync += [out.valid.eq(1), out.payload.data.eq(beat.data),
                             out.payload.keep.eq(Mux(is_zero(beat.keep), 1, beat.keep)),
                             out.payload.last.eq(beat.last),
                             out.payload.err.eq(bad), *beat_out]
            m.d.sync += record.eq(bad)
            with m.If(bad):
                m.d.sync += [err.valid.eq(1), *error_out]
        return m


class FpduDeframer(wiring.Component):
    """Deframe one connection's stream of MPA FPDUs (RFC 5044 4.1-4.4, 8), any ``data_bytes``.

    Ports
    -----
    i : In(BeatStream(data_bytes))
        The stream from SeqStart on, in beats and packets of any size (each ``keep``
        contiguous from lane 0): the packets need not follow FPDU boundaries.
    crc, markers : In(1); max_ulpdu : In(16)
        As negotiated; held steady while the stream runs (a new stream starts from reset).
    o : Out(BeatStream(data_bytes, err=True))
        One packet per FPDU: its ULPDU_Length field and ULPDU (so a ULPDU of 0 octets is a
        2-byte packet), exactly the model's ``Deframer`` ULPDU behind its length field.
        ``err`` on the last beat of the first bad FPDU, which is always there (an oversize
        FPDU's packet is one meaningless octet); nothing after it.
    o_error : Out(stream.Signature(ErrorKind))
        One transfer at the first bad FPDU (see :class:`StreamVerdict`).

    Bad input: see the module docstring; a failed stream takes and drops all its input.

    Several connections (``conns``, with ``max_ulpdu`` then a parameter, not a port): the
    pieces of every connection's stream as :class:`~iwarp_nic.mpa.gather.FrameGather` releases
    them (``max_ulpdu`` must be the gather's), each one's header on ``i_piece`` (a ``Release``:
    conn, marker position, markers, crc, first) and its octets as one packet on ``i``. There
    are no ``crc`` and ``markers`` ports. Each connection is deframed as its own stream: ``o``
    beats carry ``conn``, ``o_error`` is a :func:`ConnError`, and a connection's failure stops
    only that connection, until its next piece with ``first``. Between two pieces the input
    waits for the first piece's octets to leave the splitter (about four cycles; see
    :class:`FpduSplitter`).

    Throughput: one beat per cycle, minus one cycle per FPDU (its ULPDU_Length field) and its
    last partial beat; below 4 bytes per beat, the stages run on 4-byte beats, one every
    ``4 / data_bytes`` cycles. Latency: see the stages. Back-pressure on ``o`` or ``o_error``
    stalls ``i``; nothing is lost.
    """

    def __init__(self, data_bytes, *, conns=None, max_ulpdu=None):
        self.data_bytes = check_data_bytes(data_bytes)
        self.conns = _check_conns(conns)
        if conns is None:
            ports = {"crc": In(1), "markers": In(1), "max_ulpdu": In(16)}
        else:
            ports = {"i_piece": In(stream.Signature(Release(conns)))}
            self.max_ulpdu = _check_max_ulpdu(max_ulpdu)     # else a port
        super().__init__({
            **ports,
            "i": In(BeatStream(data_bytes)),
            "o": Out(BeatStream(data_bytes, err=True, conns=conns)),
            "o_error": Out(stream.Signature(_error_event(conns))),
        })

    def elaborate(self, platform):
        m = Module()
        n, conns = self.data_bytes, self.conns
        core = max(n, _CORE_BYTES)
        m.submodules.splitter = splitter = FpduSplitter(
            core, conns=conns, max_ulpdu=None if conns is None else self.max_ulpdu)
        m.submodules.checker = checker = CrcChecker(core, conns=conns)
        m.submodules.remover = remover = MarkerRemover(core, conns=conns)
        m.submodules.verdict = verdict = StreamVerdict(core, conns=conns)
        if conns is None:
            m.d.comb += [splitter.markers.eq(self.markers), splitter.max_ulpdu.eq(self.max_ulpdu),
                         checker.crc.eq(self.crc)]
        else:
            wiring.connect(m, wiring.flipped(self.i_piece), splitter.i_piece)
        wiring.connect(m, splitter.o, checker.i)
        wiring.connect(m, checker.o, remover.i)
        wiring.connect(m, remover.o, verdict.i)
        wiring.connect(m, verdict.o_error, wiring.flipped(self.o_error))
        if n < core:
            m.submodules.widen = widen = BeatUpsizer(n, core)
            m.submodules.narrow = narrow = BeatDownsizer(core, n, err=True, conns=conns)
            wiring.connect(m, wiring.flipped(self.i), widen.i)
            wiring.connect(m, widen.o, splitter.i)
            wiring.connect(m, verdict.o, narrow.i)
            wiring.connect(m, narrow.o, wiring.flipped(self.o))
        else:
            wiring.connect(m, wiring.flipped(self.i), splitter.i)
            wiring.connect(m, verdict.o, wiring.flipped(self.o))
        return m
