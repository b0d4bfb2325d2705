"""MPA startup frames as they arrive: RFC 5044 section 7.1 (the Request and Reply frames: key,
M, C and R flags, Rev, PD_Length, private data) with RFC 6581 sections 6 and 9 (the S flag and
the enhanced data: IRD, ORD, peer-to-peer and RTR flags at the head of the private data).

:class:`StartupReader` takes one stream's octets from its first one, reads the MPA Request or
Reply it begins with, checks it as the model's ``MpaFrameReader`` does, and passes every octet
after the frame on: the first FPDUs may share a TCP segment with the frame's end.
:class:`StartupWriter` writes one, as the model's ``MpaFrame.encode`` does.
"""

from amaranth import C, Cat, Module, Mux, Signal
from amaranth.lib import enum, stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.wiring import In, Out

from ..exact import add, eq, gt, is_zero, lt, one_of, same, select, sub, wire
from ..stream import BeatStream, check_data_bytes
from ..width import BeatDownsizer, BeatUpsizer

__all__ = ["StartupError", "StartupFrame", "StartupFields", "StartupReader", "StartupWriter",
           "KEY_REQUEST", "KEY_REPLY", "MAX_PRIVATE_DATA"]

KEY_REQUEST = b"MPA ID Req Frame"
KEY_REPLY = b"MPA ID Rep Frame"
_HEADER = 20                        # key, flags, Rev, PD_Length
_ENHANCED = 4                       # RFC 6581 IRD/ORD at the head of the private data
MAX_PRIVATE_DATA = 512  # PD_Length's limit, the enhanced data included


class StartupError(enum.Enum, shape=3):
    """What is wrong with a startup frame, as the model's exceptions tell it apart; ``NONE``:
    the frame is good."""

    NONE = 0
    KEY = 1             # not the key expected (BadKeyError), found at the first wrong octet
    REVISION = 2        # Rev is not 1 or 2 (BadVersionError), found with PD_Length
    PD_LENGTH = 3       # PD_Length above 512 (OversizeError), found with PD_Length
    FIELD = 4           # S with Rev 1, or S with PD_Length below 4 (BadFieldError), at the end


_FIELDS = {"markers": 1, "crc": 1, "reject": 1, "enhanced": 1, "revision": 8,
           "private_length": 10, "ird": 14, "ord": 14, "p2p": 1, "rtr_send": 1, "rtr_write": 1,
           "rtr_read": 1}
#: A startup frame, read: ``error``, then the fields of a good one. ``reject`` only in a Reply;
#: ``enhanced`` (S) says ``ird``, ``ord``, ``p2p`` and the RTR flags were given (the RTR flags
#: count only with ``p2p``); ``private_length`` octets of private data follow them.
StartupFrame = StructLayout({"error": StartupError, "pd_length": 16, **_FIELDS})
#: A startup frame to write: :data:`StartupFrame`'s fields but ``error`` and ``pd_length``
#: (worked out from the others).
StartupFields = StructLayout(_FIELDS)


def _ends(m, name, converter):
    """The end of ``converter`` (between ``data_bytes`` and one octet per beat) that is written
    and the end that is read: one and the same one-octet stream when there is no converter."""
    if converter is None:
        one = BeatStream(1).create(path=(name,))
        return one, one
    m.submodules[name] = converter
    return converter.i, converter.o


class _Path(enum.Enum, shape=2):
    """Where the router sends a chunk of the stream."""

    NONE = 0            # waiting: the chunk is not taken yet
    FRAME = 1           # through the byte reader (the frame is not complete)
    PASS = 2            # straight to ``o``
    DROP = 3            # the frame was bad


class StartupReader(wiring.Component):
    """Read the MPA startup frame at the head of a stream, then pass the stream on.

    Ports
    -----
    i : In(BeatStream(data_bytes))
        The stream's octets from its first, in chunks of any size (a packet each, as TCP
        delivers them).
    reply : In(1)
        The frame expected: 0 a Request (the responder's side), 1 a Reply.
    o_frame : Out(stream.Signature(StartupFrame))
        One transfer: the frame once its last octet has arrived, or the first error (the key
        octet by octet, Rev and PD_Length once PD_Length is complete, the S flag's conditions
        at the end, in the model's order). After an error every octet is dropped: the model
        closes the connection.
    o_private : Out(BeatStream(data_bytes))
        The private data after the enhanced data (if any), one packet, when there is some.
        It leaves as it arrives, before ``o_frame``.
    o : Out(BeatStream(data_bytes))
        Every octet after the frame: the rest of the chunk the frame ends in as one packet
        from lane 0, then each later chunk unchanged.

    The frame (20 to 532 octets) is read one octet per cycle: the chunks that hold any of it
    go through a downsizer to one-octet beats, and the rest of the last of them through an
    upsizer back to ``data_bytes``. Later chunks pass straight through, combinationally, at a
    beat per cycle; the first of them waits until the rest before it has left.
    """

    def __init__(self, data_bytes):
        self.data_bytes = check_data_bytes(data_bytes)
        super().__init__({
            "i": In(BeatStream(data_bytes)),
            "reply": In(1),
            "o_frame": Out(stream.Signature(StartupFrame)),
            "o_private": Out(BeatStream(data_bytes)),
            "o": Out(BeatStream(data_bytes)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        # The one-octet side: the frame's chunks go down to it, the private data and the rest
        # of the frame's last chunk come back up (no converter at one octet per beat).
        down = _ends(m, "down", BeatDownsizer(n, 1) if n > 1 else None)
        up_private = _ends(m, "up_private", BeatUpsizer(1, n) if n > 1 else None)
        up_rest = _ends(m, "up_rest", BeatUpsizer(1, n) if n > 1 else None)
        wiring.connect(m, up_private[1], wiring.flipped(self.o_private))
        state = {"done": Signal(), "failed": Signal(), "slow": Signal(), "slow_end": Signal()}
        self._route(m, down[0], up_rest[1], **state)
        self._read(m, down[1], up_private[0], up_rest[0], done=state["done"],
                   failed=state["failed"], slow_end=state["slow_end"])
        return m

    def _route(self, m, slow_in, rest, *, done, failed, slow, slow_end):
        """Each chunk of ``i`` to the octet reader (while the frame is not complete), straight
        to ``o`` (after it), or away (after an error); before a chunk passes straight, the rest
        of the frame's last chunk leaves ``rest`` for ``o``."""
        beat = self.i.payload
        in_chunk = Signal()
        held = Signal(_Path)
        decision = Signal(_Path)
        with m.If(failed):
            m.d.comb += decision.eq(_Path.DROP)
        with m.Elif(slow):
            m.d.comb += decision.eq(_Path.NONE)     # the chunk before is still on its way
        with m.Elif(done):
            m.d.comb += decision.eq(_Path.PASS)
        with m.Else():
            m.d.comb += decision.eq(_Path.FRAME)
        path = Signal(_Path)
        m.d.comb += path.eq(Mux(in_chunk, held, decision))
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [in_chunk.eq(~beat.last), held.eq(path)]
            with m.If(~in_chunk & eq(decision.as_value(), _Path.FRAME.value)):
                m.d.sync += slow.eq(1)
        with m.If(slow_end):
            m.d.sync += slow.eq(0)

        m.d.comb += [slow_in.payload.eq(beat), self.o.payload.eq(rest.payload),
                     self.o.valid.eq(rest.valid), rest.ready.eq(self.o.ready)]
        with m.If(eq(path.as_value(), _Path.FRAME.value)):
            m.d.comb += [slow_in.valid.eq(self.i.valid), self.i.ready.eq(slow_in.ready)]
        with m.Elif(eq(path.as_value(), _Path.PASS.value)):
            m.d.comb += [self.o.payload.eq(beat), self.o.valid.eq(self.i.valid),
                         self.i.ready.eq(self.o.ready), rest.ready.eq(0)]
        with m.Elif(eq(path.as_value(), _Path.DROP.value)):
            m.d.comb += self.i.ready.eq(1)
        # The rest of the frame's last chunk has left: the next chunk may pass.
        with m.If(rest.valid & rest.ready & rest.payload.last):
            m.d.comb += slow_end.eq(1)

    def _read(self, m, octets, private, rest, *, done, failed, slow_end):
        """The frame, one octet per cycle: checked, its private data out; the octets after it
        to ``rest``."""
        octet = octets.payload.data
        offset = Signal(10)             # of the octet on offer, within the frame
        flags, revision, pd_high = Signal(8), Signal(8), Signal(8)
        pd_length = Signal(16)
        enhanced = Signal(8 * _ENHANCED)    # the RFC 6581 octets, the first in the top byte
        total = Signal(10)              # octets of the whole frame
        field_bad = Signal()            # the S flag's conditions fail
        finishing = Signal()            # the frame's last octet was taken: report it
        frame = self.o_frame
        with m.If(frame.ready):
            m.d.sync += frame.valid.eq(0)

        s_flag = flags[4]
        key = select(m, offset[:4], [Mux(self.reply, KEY_REPLY[k], KEY_REQUEST[k])
                                     for k in range(16)], 8, "key_octet")
        reading = ~done & ~failed & ~finishing
        taken = octets.valid & octets.ready
        in_header = lt(offset, _HEADER)
        in_enhanced = s_flag & lt(offset, _HEADER + _ENHANCED)
        frame_last = wire(m, add(offset, 1) == total, "frame_last")

        def fail(error):
            m.d.sync += [failed.eq(1), frame.valid.eq(1), frame.payload.error.eq(error)]

        m.d.comb += [private.payload.data.eq(octet), private.payload.keep.eq(1),
                     private.payload.last.eq(frame_last), rest.payload.eq(octets.payload)]
        with m.If(failed):
            m.d.comb += octets.ready.eq(1)
        with m.Elif(done):
            m.d.comb += [rest.valid.eq(octets.valid), octets.ready.eq(rest.ready)]
        with m.Elif(~finishing & ~in_header & ~in_enhanced & ~field_bad):
            m.d.comb += [private.valid.eq(octets.valid), octets.ready.eq(private.ready)]
        with m.Elif(~finishing):
            m.d.comb += octets.ready.eq(1)
        # A chunk that ends inside the frame, or after an error, lets go of the slow path.
        with m.If(taken & octets.payload.last & (~done | failed)):
            m.d.comb += slow_end.eq(1)

        with m.If(taken & reading):
            m.d.sync += offset.eq(add(offset, 1))
            with m.If(lt(offset, 16)):
                with m.If(octet != key):
                    fail(StartupError.KEY)
            with m.Elif(eq(offset, 16)):
                m.d.sync += flags.eq(octet)
            with m.Elif(eq(offset, 17)):
                m.d.sync += revision.eq(octet)
            with m.Elif(eq(offset, 18)):
                m.d.sync += pd_high.eq(octet)
            with m.Elif(eq(offset, 19)):
                length = Signal(16)
                m.d.comb += length.eq(Cat(octet, pd_high))
                # Compared octet by octet: PD_Length above 512, below 4, 0.
                high = MAX_PRIVATE_DATA >> 8
                over = gt(pd_high, high) | (eq(pd_high, high) & ~is_zero(octet))
                short = is_zero(pd_high) & lt(octet, _ENHANCED)
                m.d.sync += [pd_length.eq(length), total.eq(add(length[:10], _HEADER)),
                             field_bad.eq(s_flag & (~eq(revision, 2) | short))]
                with m.If(~one_of(revision, (1, 2))):
                    fail(StartupError.REVISION)
                with m.Elif(over):
                    fail(StartupError.PD_LENGTH)
                with m.Elif(is_zero(pd_high) & is_zero(octet)):
                    m.d.sync += finishing.eq(1)
            with m.Else():
                with m.If(in_enhanced):
                    m.d.sync += enhanced.eq(Cat(octet, enhanced[:8 * (_ENHANCED - 1)]))
                with m.If(frame_last):
                    m.d.sync += finishing.eq(1)

        with m.If(finishing):
            f = frame.payload
            ird, ord_ = enhanced[16:32], enhanced[:16]
            p2p = s_flag & ird[15]
            m.d.sync += [finishing.eq(0), frame.valid.eq(1)]
            with m.If(field_bad):
                m.d.sync += [failed.eq(1), f.error.eq(StartupError.FIELD)]
            with m.Else():
                m.d.sync += [
                    done.eq(1),
                    f.error.eq(StartupError.NONE), f.markers.eq(flags[7]), f.crc.eq(flags[6]),
                    f.reject.eq(self.reply & flags[5]), f.enhanced.eq(s_flag),
                    f.revision.eq(revision), f.pd_length.eq(pd_length),
                    f.private_length.eq(Mux(s_flag, sub(pd_length, _ENHANCED), pd_length)),
                    f.ird.eq(Mux(s_flag, ird[:14], 0)), f.ord.eq(Mux(s_flag, ord_[:14], 0)),
                    f.p2p.eq(p2p), f.rtr_send.eq(p2p & ird[14]),
                    f.rtr_write.eq(p2p & ord_[15]), f.rtr_read.eq(p2p & ord_[14]),
                ]


class StartupWriter(wiring.Component):
    """Write an MPA Request or Reply: the octets of the model's ``MpaFrame.encode``.

    Ports
    -----
    reply : In(1)
        The frame to write: 0 a Request, 1 a Reply.
    i_frame : In(stream.Signature(StartupFields))
        One transfer per frame: its flags (``reject`` only in a Reply), ``revision``, and
        with ``enhanced`` the RFC 6581 ``ird``, ``ord``, ``p2p`` and RTR flags; then
        ``private_length`` octets of private data. The caller keeps ``private_length`` within
        512 octets, the enhanced data included.
    i_private : In(BeatStream(data_bytes))
        The private data, one packet of ``private_length`` octets (none when it is 0).
    o : Out(BeatStream(data_bytes))
        The frame, one packet from lane 0.

    The frame is written an octet per cycle (a frame per connection, 20 to 532 octets) and
    gathered into ``data_bytes`` beats by an upsizer. Back-pressure on ``o`` holds it.
    """

    def __init__(self, data_bytes):
        self.data_bytes = check_data_bytes(data_bytes)
        super().__init__({
            "reply": In(1),
            "i_frame": In(stream.Signature(StartupFields)),
            "i_private": In(BeatStream(data_bytes)),
            "o": Out(BeatStream(data_bytes)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        private, out = self.i_private, self.o
        if n > 1:
            m.submodules.down = down = BeatDownsizer(n, 1)
            m.submodules.up = up = BeatUpsizer(1, n)
            wiring.connect(m, wiring.flipped(self.i_private), down.i)
            wiring.connect(m, up.o, wiring.flipped(self.o))
            private, out = down.o, up.i

        f = Signal(StartupFields)
        busy = Signal()
        offset = Signal(10)
        head = _HEADER + _ENHANCED
        def pd_length_of(frame):
            return Mux(frame.enhanced, add(frame.private_length, _ENHANCED), frame.private_length)

        pd_length = wire(m, pd_length_of(f), "pd_length")
        final = Signal(10)              # the offset of the frame's last octet
        ird = Cat(f.ird, f.rtr_send, f.p2p)
        ord_ = Cat(f.ord, f.rtr_read, f.rtr_write)
        fixed = [Mux(self.reply, KEY_REPLY[k], KEY_REQUEST[k]) for k in range(16)] + [
            Cat(C(0, 4), f.enhanced, f.reject, f.crc, f.markers), f.revision,
            pd_length[8:], pd_length[:8], ird[8:], ird[:8], ord_[8:], ord_[:8]]
        octet = select(m, Mux(lt(offset, head), offset, head - 1)[:5], fixed, 8, "octet")
        from_header = lt(offset, _HEADER) | (f.enhanced & lt(offset, head))
        last = wire(m, same(offset, final), "last")

        m.d.comb += self.i_frame.ready.eq(~busy)
        with m.If(self.i_frame.valid & ~busy):
            m.d.sync += [f.eq(self.i_frame.payload), busy.eq(1), offset.eq(0),
                         final.eq(add(pd_length_of(self.i_frame.payload), _HEADER - 1))]
        m.d.comb += [out.payload.keep.eq(busy), out.payload.last.eq(last),
                     out.payload.data.eq(Mux(from_header, octet, private.payload.data))]
        with m.If(busy):
            with m.If(from_header):
                m.d.comb += out.valid.eq(1)
            with m.Else():
                m.d.comb += [out.valid.eq(private.valid), private.ready.eq(out.ready)]
            with m.If(out.valid & out.ready):
                m.d.sync += offset.eq(add(offset, 1))
                with m.If(last):
                    m.d.sync += busy.eq(0)
        return m
