"""One generic header parser and one generic header emitter, driven by a :mod:`.headers` table.

A parsed packet travels as two streams (DESIGN.md section 2): one transfer of
:func:`HeaderStream` per packet, carrying the header's fields in host order, and the payload as
beats of :func:`~iwarp_nic.stream.BeatStream` realigned to lane 0. :class:`HeaderParser` splits a
byte stream into that pair and :class:`HeaderEmitter` joins the pair back into a byte stream.
Both work for every width in :data:`~iwarp_nic.stream.DATA_BYTES`, whether a beat is narrower or
wider than the header.
"""

from amaranth import C, Cat, Const, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .headers import HeaderFormat
from .stream import BeatStream, check_data_bytes

__all__ = ["HeaderLayout", "HeaderStream", "HeaderParser", "HeaderEmitter"]


def HeaderLayout(fmt):
    """One parsed header of format ``fmt``: ``fields``, a view of ``fmt.layout`` (host-order
    values), and ``has_payload``, 0 when the packet was exactly the header, in which case no
    payload beats belong to it."""
    return data.StructLayout({"fields": fmt.layout, "has_payload": 1})


def HeaderStream(fmt):
    """``stream.Signature`` of parsed headers of format ``fmt`` (:func:`HeaderLayout`): one
    transfer per packet."""
    return stream.Signature(HeaderLayout(fmt))


def _assign(view, fields):
    return [view[name].eq(value) for name, value in fields.items()]


class _Carry:
    """The realigner shared by the parser and the emitter: bytes held back from one beat to
    complete the next output beat.

    With ``width`` carried bytes, an output beat is the carried bytes in lanes ``[0, width)``
    followed by lanes ``[0, cut)`` of an input beat (``cut = data_bytes - width``); the input's
    lanes ``[cut, data_bytes)`` are carried on to the next output beat. When the last beat of a
    packet has bytes past the cut, those bytes are the packet's tail: :attr:`pending` is set and
    :meth:`flush` sends them as a beat of their own. With ``width`` 0 beats pass unchanged.
    """

    def __init__(self, data_bytes, width, err):
        self.cut = data_bytes - width
        # No zero-width signals: they come out as `[-1:0]` ranges in Verilog.
        self.data = Signal(8 * width) if width else Const(0, 0)
        self.keep = Signal(width) if width else Const(0, 0)
        self.err = Signal() if err else None
        self.pending = Signal()

    def has_tail(self, beat):
        """``beat`` is a last beat with bytes past the cut."""
        if self.cut == len(beat.keep):
            return C(0)
        return beat.last & beat.keep[self.cut]

    def join(self, beat, data=None, keep=None):
        """Output beat fields: the carried bytes (or ``data``/``keep``), then the head of
        ``beat``; it is the packet's last beat unless ``beat`` leaves a tail."""
        data = self.data if data is None else data
        keep = self.keep if keep is None else keep
        last = beat.last & ~self.has_tail(beat)
        fields = {"data": Cat(data, beat.data[:8 * self.cut]),
                  "keep": Cat(keep, beat.keep[:self.cut]), "last": last}
        if self.err is not None:
            fields["err"] = beat.err & last
        return fields

    def flush(self, data=None, keep=None, err=None):
        """Output beat fields: the carried bytes (or ``data``/``keep``/``err``) alone, as the
        last beat of their packet."""
        data = self.data if data is None else data
        keep = self.keep if keep is None else keep
        fields = {"data": Cat(data, Const(0, 8 * self.cut)), "keep": Cat(keep, Const(0, self.cut)),
                  "last": 1}
        if self.err is not None:
            fields["err"] = self.err if err is None else err
        return fields

    def take(self, beat):
        """Statements: carry the lanes of ``beat`` past the cut; mark a tail pending if any."""
        stmts = [self.pending.eq(self.has_tail(beat))]
        if self.cut < len(beat.keep):
            stmts += [self.data.eq(beat.data[8 * self.cut:]), self.keep.eq(beat.keep[self.cut:])]
        if self.err is not None:
            stmts.append(self.err.eq(beat.err))
        return stmts


def _check(fmt, data_bytes, err):
    if not isinstance(fmt, HeaderFormat):
        raise TypeError(f"fmt must be a HeaderFormat, not {fmt!r}")
    check_data_bytes(data_bytes)
    if not isinstance(err, bool):
        raise TypeError(f"err must be a bool, not {err!r}")


class HeaderParser(wiring.Component):
    """Split each packet of a byte stream into its header (fields) and its payload (beats).

    Ports
    -----
    i : In(BeatStream(data_bytes, err=err))
        Packets, at least one byte each, following the stream rules of :mod:`iwarp_nic.stream`.
    o_header : Out(HeaderStream(fmt))
        One transfer per packet that is kept: the fields of its first ``fmt.length`` bytes, and
        ``has_payload`` = 0 if the packet was exactly that long.
    o_payload : Out(BeatStream(data_bytes, err=err))
        For every kept packet with ``has_payload`` = 1, its bytes after the header, realigned to
        lane 0 and beaten by the stream rules; ``err`` of the input's last beat is on the last
        payload beat.
    drop : Out(1)
        High for one cycle per packet dropped whole (one cycle after its last beat): packets
        shorter than the header, and header-only packets with ``err``. Dropped packets produce
        nothing on ``o_header`` or ``o_payload`` and do not disturb the packets around them.

    Ordering: a packet's header is offered no later than its first payload beat. The two outputs
    are independent registers: a consumer may take each header and then its payload, or serve
    the two streams apart; neither way deadlocks.

    Latency: the header and each payload beat are offered the cycle after the input beat that
    completes them; when the last input beat holds more payload bytes than fit in the output beat
    it completes, they follow as a tail beat one cycle later.

    Throughput: one input beat per cycle, sustained across back-to-back packets of any length
    (header-only and single-beat packets included), while ``o_header`` and ``o_payload`` are
    ready. Back-pressure: ``i`` stalls while a beat that completes a header finds the header
    register full (even when that packet is about to be dropped), and while a payload beat, or a
    header beat whose predecessor left a tail, finds the payload register full. Input that breaks
    the stream rules gives undefined output but never hangs the parser.
    """

    def __init__(self, fmt, data_bytes, *, err=False):
        _check(fmt, data_bytes, err)
        self.fmt = fmt
        self.data_bytes = data_bytes
        self.err = err
        super().__init__({
            "i": In(BeatStream(data_bytes, err=err)),
            "o_header": Out(HeaderStream(fmt)),
            "o_payload": Out(BeatStream(data_bytes, err=err)),
            "drop": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        n, length = self.data_bytes, self.fmt.length
        hdr_beat = (length - 1) // n            # the input beat that completes the header
        head = length - hdr_beat * n            # header bytes in that beat, 1..n
        carry = _Carry(n, n - head, self.err)   # its payload bytes, lanes [head, n)
        beat, hdr, out = self.i.payload, self.o_header, self.o_payload

        # Where the next input beat falls in its packet: one of the `hdr_beat` beats of header
        # bytes only (`todo` has a bit for each still to come; their bytes collect in `early`,
        # first byte lowest), the header beat, or a payload beat (`body`).
        body = Signal()
        if hdr_beat:
            todo = Signal(hdr_beat, init=(1 << hdr_beat) - 1)
            early = Signal(8 * n * hdr_beat)
            collect = todo[0]
        else:
            early = Const(0, 0)
            collect = C(0)
        at_hdr = ~collect & ~body

        hdr_free = ~hdr.valid | hdr.ready
        out_free = ~out.valid | out.ready
        # A pending tail occupies the carry only until the next packet's header beat, which
        # refills the carry as the tail leaves; payload beats never meet a pending tail.
        m.d.comb += self.i.ready.eq(collect | (at_hdr & hdr_free & (~carry.pending | out_free))
                                    | (body & out_free))
        accept = self.i.valid & self.i.ready
        bad = beat.err if self.err else C(0)

        m.d.sync += self.drop.eq(0)
        with m.If(hdr.ready):
            m.d.sync += hdr.valid.eq(0)
        with m.If(out_free):
            m.d.sync += out.valid.eq(0)
            with m.If(carry.pending):
                m.d.sync += [*_assign(out.payload, carry.flush()), out.valid.eq(1),
                             carry.pending.eq(0)]

        with m.If(accept):
            with m.If(body):
                m.d.sync += [*_assign(out.payload, carry.join(beat)), out.valid.eq(1),
                             *carry.take(beat), body.eq(~beat.last)]
            with m.Elif(at_hdr):
                short = beat.last & ~beat.keep[head - 1]
                has_payload = ~beat.last | carry.has_tail(beat)
                with m.If(short | (~has_payload & bad)):
                    m.d.sync += self.drop.eq(1)
                with m.Else():
                    m.d.sync += [
                        hdr.payload.fields.eq(self.fmt.unpack(Cat(early, beat.data[:8 * head]))),
                        hdr.payload.has_payload.eq(has_payload),
                        hdr.valid.eq(1),
                    ]
                m.d.sync += [*carry.take(beat), body.eq(~beat.last)]
            if hdr_beat:
                with m.Else():
                    m.d.sync += [early.eq(Cat(early[8 * n:], beat.data)), todo.eq(todo[1:])]
                    with m.If(beat.last):
                        m.d.sync += self.drop.eq(1)
                with m.If(beat.last):
                    m.d.sync += todo.eq(todo.init)
        return m


class HeaderEmitter(wiring.Component):
    """Join a header stream and a payload stream into packets: header bytes, then payload.

    Ports
    -----
    i_header : In(HeaderStream(fmt))
        One transfer per packet. Its fields are written in wire order (gaps as zeros); with
        ``has_payload`` = 0 the packet is the header alone and takes nothing from ``i_payload``.
    i_payload : In(BeatStream(data_bytes, err=err))
        One packet of beats for each header with ``has_payload`` = 1, in the same order.
    o : Out(BeatStream(data_bytes, err=err))
        The packets, beaten by the stream rules; the payload's ``err`` is on the last beat.

    Each header is taken into a one-header buffer as soon as that is free (it frees as the
    previous header's last byte leaves), so before any payload beat of its packet: a producer may
    offer a header, wait until it is taken, then offer the payload, or offer both at once. A
    payload beat is taken when its first byte enters the output register.

    Latency: two cycles from a header offered to an idle emitter to its first output beat; an
    output beat that starts with a payload beat is offered the cycle after that beat is taken; a
    tail beat (payload bytes of a last input beat that do not fit in the output beat it starts)
    follows one cycle after that output beat.

    Throughput: one output beat per cycle, with no bubble within or between packets, as long as
    ``o`` is ready and the header and payload inputs are offered. Back-pressure on ``o`` stalls
    both inputs. Input that breaks the contract (payload beats that break the stream rules, or a
    payload packet missing or added against ``has_payload``) gives malformed packets; the
    emitter itself never hangs while its inputs keep coming.
    """

    def __init__(self, fmt, data_bytes, *, err=False):
        _check(fmt, data_bytes, err)
        self.fmt = fmt
        self.data_bytes = data_bytes
        self.err = err
        super().__init__({
            "i_header": In(HeaderStream(fmt)),
            "i_payload": In(BeatStream(data_bytes, err=err)),
            "o": Out(BeatStream(data_bytes, err=err)),
        })

    def elaborate(self, platform):
        m = Module()
        n, length = self.data_bytes, self.fmt.length
        hdr_beats = length // n                 # output beats of header bytes only
        tail = length % n                       # header bytes sharing a beat with the payload
        carry = _Carry(n, tail, self.err)       # payload bytes past lane n - tail
        beat, out = self.i_payload.payload, self.o

        # The header being sent: its bytes still to send, next byte in lane 0, and a bit in
        # `todo` for each beat of header bytes only still to send. The next header is taken as
        # the last byte of this one leaves.
        wire = Signal(8 * length)
        has_payload = Signal()
        hdr_valid = Signal()
        hdr_done = Signal()
        todo = Signal(hdr_beats) if hdr_beats else None
        body = Signal()                         # sending payload beats
        m.d.comb += self.i_header.ready.eq(~hdr_valid | hdr_done)

        out_free = ~out.valid | out.ready
        full = Const((1 << n) - 1, n)

        with m.If(out_free):
            m.d.sync += out.valid.eq(0)
            with m.If(carry.pending):
                m.d.sync += [*_assign(out.payload, carry.flush()), out.valid.eq(1),
                             carry.pending.eq(0)]
            with m.Elif(body):
                with m.If(self.i_payload.valid):
                    m.d.comb += self.i_payload.ready.eq(1)
                    m.d.sync += [*_assign(out.payload, carry.join(beat)), out.valid.eq(1),
                                 *carry.take(beat), body.eq(~beat.last)]
            if hdr_beats:
                with m.Elif(todo[0]):
                    m.d.sync += [
                        out.payload.data.eq(wire[:8 * n]),
                        out.payload.keep.eq(full),
                        out.payload.last.eq(0),
                        out.valid.eq(1),
                        wire.eq(wire[8 * n:]),
                        todo.eq(todo[1:]),
                    ]
                    if self.err:
                        m.d.sync += out.payload.err.eq(0)
                    if not tail:
                        # The header ends with its beats: this is the last if no other bit is set.
                        ends = ~todo[1] if hdr_beats > 1 else C(1)
                        with m.If(ends):
                            m.d.comb += hdr_done.eq(1)
                            m.d.sync += [out.payload.last.eq(~has_payload), body.eq(has_payload)]
            if tail:
                with m.Elif(hdr_valid):
                    hdr_tail = wire[:8 * tail]
                    with m.If(~has_payload):
                        m.d.comb += hdr_done.eq(1)
                        m.d.sync += [*_assign(out.payload, carry.flush(hdr_tail, full[:tail], 0)),
                                     out.valid.eq(1)]
                    with m.Elif(self.i_payload.valid):
                        m.d.comb += [hdr_done.eq(1), self.i_payload.ready.eq(1)]
                        m.d.sync += [*_assign(out.payload, carry.join(beat, hdr_tail, full[:tail])),
                                     out.valid.eq(1), *carry.take(beat), body.eq(~beat.last)]

        # After the output logic: a new header overrides the shift of the one leaving.
        with m.If(self.i_header.valid & self.i_header.ready):
            m.d.sync += [wire.eq(self.fmt.pack(self.i_header.payload.fields)),
                         has_payload.eq(self.i_header.payload.has_payload), hdr_valid.eq(1)]
            if hdr_beats:
                m.d.sync += todo.eq((1 << hdr_beats) - 1)
        with m.Elif(hdr_done):
            m.d.sync += hdr_valid.eq(0)
        return m
