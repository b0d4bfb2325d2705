"""DDP segments carrying RDMAP, as they arrive: RFC 5041 sections 4.1 to 4.3 (the tagged and
untagged headers) and 7.2 (DDP errors), RFC 5040 sections 4.1 to 4.7 (RDMAP control, opcodes,
Read Request header) and 7 (RDMAP errors), RFC 7306 sections 4 to 6 and 10 (atomics,
immediate data, queue 3).

:class:`SegmentParser` takes the deframer's packets (each the two-octet ULPDU_Length field and
the ULPDU) and checks every DDP segment the way the model's ``decode_segment`` does, in its
order, giving the RFC 6580 code of ``error_code_for`` for the first check that fails:

======================================================  ====================================
check                                                   code
======================================================  ====================================
the ULPDU holds a DDP header (14 octets tagged, 18 not)  RDMAP Catastrophic, RDMAP stream
DV is 1                                                 DDP Invalid DDP version (tagged or
                                                        untagged, as T says)
RV is 1                                                 RDMAP Invalid RDMAP version
the opcode is assigned (0 to 11)                        RDMAP Unexpected OpCode
T agrees with the opcode (tagged: Write, Read Response)  RDMAP Unexpected OpCode
untagged: QN is the opcode's queue                      DDP Invalid QN
an RDMAP header opcode is one whole segment (L 1, MO 0)  DDP Invalid MO
its header is exactly as long as defined (not Terminate) RDMAP Catastrophic, RDMAP stream
an Atomic Request's AOpCode is FetchAdd or CmpSwap       RDMAP Unexpected OpCode
======================================================  ====================================

The Terminate header itself is left to :class:`~iwarp_nic.rdmap.TerminateParser`, which gets
it as this segment's payload: where it is malformed the model reports RDMAP Catastrophic for
the stream, and so must the consumer of both.
"""

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.wiring import In, Out

from ..errors import TerminateCode
from ..exact import add, eq, gt, is_zero, lt, one_of, select, sub, wire, wrap_add
from ..headers import ATOMIC_REQUEST, DDP_TAGGED, DDP_UNTAGGED
from ..stream import BeatStream, check_data_bytes, keep_count
from ..tcp.layouts import conn_bits, with_conn
from ..trim import HeadTrim
from ..width import BeatDownsizer, BeatUpsizer

__all__ = ["HEAD_BYTES", "QUEUE", "TAGGED_OPCODES", "INVALIDATE_OPCODES", "SegmentHeader",
           "TaggedSegmentHeader", "tagged_fields", "untagged_fields", "SegmentParser"]

_LENGTH_FIELD = 2                   # the MPA ULPDU_Length octets ahead of each ULPDU
#: Octets of each ULPDU the parser keeps: an untagged DDP header and the longest RDMAP header
#: (an Atomic Request's 52), enough for every header field and a Terminate's copies.
HEAD_BYTES = DDP_UNTAGGED.length + ATOMIC_REQUEST.length
_CAPTURE = _LENGTH_FIELD + HEAD_BYTES
_COUNT_BITS = 17                    # octets of a packet: up to 2 + 65535
_NO_PAYLOAD = (1 << _COUNT_BITS) - 1

TAGGED_OPCODES = (0, 2)             # Write, Read Response
#: DDP queue of each untagged opcode (RFC 5040 5.1, RFC 7306 10.2).
QUEUE = {1: 1, 3: 0, 4: 0, 5: 0, 6: 0, 7: 2, 8: 0, 9: 0, 10: 1, 11: 3}
#: Length of the RDMAP header of the opcodes that have one of fixed size: Read Request,
#: Immediate Data (twice), Atomic Request and Atomic Response.
_HEADER_SIZE = {1: 28, 8: 8, 9: 8, 10: 52, 11: 12}
_TERMINATE = 7
_ATOMIC_REQUEST = 10
_ATOMIC_OPS = (0, 2)                # FetchAdd, CmpSwap (RFC 7306 10.1)
INVALIDATE_OPCODES = (4, 6)         # Send with Invalidate, with SE and Invalidate
_CORE_BYTES = 4                     # the T bit and opcode in the first beat

#: One DDP segment, as parsed. ``fpdu_bad``: the deframer marked the FPDU bad (CRC, marker or
#: length: its own error event says which); nothing else is then meaningful. ``ok``: every
#: check passed; otherwise ``code`` is the first failing check's. ``opcode``, ``tagged`` (the
#: T bit), ``last`` (L): from the control octets. ``length``: octets after the DDP header (the
#: payload, or the RDMAP header); ``ulpdu_length``: octets of the whole ULPDU; ``head``: its
#: first :data:`HEAD_BYTES` octets, lane 0 first, zero past its end; the DDP header's other
#: fields are read from it (:func:`tagged_fields`, :func:`untagged_fields`). ``has_payload``:
#: a packet on ``o_payload`` belongs to this segment. The fields of a segment that is not
#: ``ok`` are as read, for the Terminate's copies.
SegmentHeader = StructLayout({
    "fpdu_bad": 1, "ok": 1, "code": TerminateCode,
    "opcode": 4, "tagged": 1, "last": 1,
    "length": 16, "ulpdu_length": 16, "has_payload": 1, "head": 8 * HEAD_BYTES,
})


def tagged_fields(hdr):
    """The tagged DDP header (``stag``, ``to``) of the :data:`SegmentHeader` ``hdr``, read from
    its ``head`` whatever its T bit says: meaningful for a tagged segment only. Wiring."""
    return DDP_TAGGED.unpack(hdr.head[:8 * DDP_TAGGED.length])


def untagged_fields(hdr):
    """The untagged DDP header (``inv_stag``, ``qn``, ``msn``, ``mo``) of the
    :data:`SegmentHeader` ``hdr``, read from its ``head`` whatever its T bit says: meaningful
    for an untagged segment only, ``inv_stag`` for a Send with Invalidate only. Wiring."""
    return DDP_UNTAGGED.unpack(hdr.head[:8 * DDP_UNTAGGED.length])


def TaggedSegmentHeader(conns):
    """:data:`SegmentHeader` and the connection (of ``conns``) whose segment it is."""
    return with_conn(SegmentHeader, conns)


def _trim_count(t, opcode):
    """Octets before the payload that ``o_payload`` carries: the ULPDU_Length field and the DDP
    header of a tagged segment or of an untagged one whose payload is ULP data or a Terminate
    header; all of them (none goes out) for the other opcodes."""
    carries = one_of(opcode, (3, 4, 5, 6, _TERMINATE))
    return Mux(t, _LENGTH_FIELD + DDP_TAGGED.length,
               Mux(carries, _LENGTH_FIELD + DDP_UNTAGGED.length, _NO_PAYLOAD))


class SegmentParser(wiring.Component):
    """Check and split the DDP segments of one stream of deframed ULPDUs.

    Ports
    -----
    i : In(BeatStream(data_bytes, err=True))
        The :class:`~iwarp_nic.mpa.FpduDeframer`'s output: per FPDU a packet of its ULPDU_Length
        field and ULPDU, ``err`` on the last beat of a bad FPDU. The segment's length is what
        arrives (up to 65535 octets after the field), not what the field says.
    o_header : Out(stream.Signature(SegmentHeader))
        One per packet, offered after its last beat: its fields and verdict.
    o_payload : Out(BeatStream(data_bytes))
        Per header with ``has_payload``, the octets after the DDP header of a tagged segment, of
        a Send of any variant or of a Terminate (its Terminate header), from lane 0; these beats
        leave as they arrive, so before their header. Segments with an RDMAP header of fixed
        size send nothing here: their header is in ``head``. A segment that fails a check still
        sends its payload if it has one; the consumer drops it.

    Throughput: one beat per cycle (below 4 bytes per beat, the parser runs on 4-byte beats
    between an upsizer and a downsizer), one header per cycle for back-to-back one-beat
    packets. Latency: a header is offered in the cycle after its packet's last beat is taken;
    a payload beat one cycle after the beat that completes it (HeadTrim's). The header is
    decoded combinationally from the register that gathered the packet's first octets, so the
    packet is held once: ``o_header.valid`` is that register's, its payload comes through the
    checks' logic (the consumer registers it). Back-pressure: ``o_payload`` stalls ``i`` for
    beats that complete a payload beat; a header not taken stalls ``i`` at the next packet's
    first beat (in the cycle it is taken, that beat may come in). The consumer must drain
    ``o_payload`` without waiting for the header, which comes with or after the payload's last
    beat.

    Bad input: any octets give a header per packet and never hang the parser; a packet of
    fewer than 3 octets is a segment without a DDP header.

    Several connections (``conns``): ``i`` interleaves the packets of that many connections,
    each beat naming its own (:class:`~iwarp_nic.mpa.FpduDeframer`'s output with ``conns``);
    the parser keeps nothing from one packet to the next, and each header
    (:func:`TaggedSegmentHeader`) names its packet's connection. The payload packets keep the
    order of their headers.
    """

    def __init__(self, data_bytes, *, conns=None):
        self.data_bytes = check_data_bytes(data_bytes)
        self.conns = conns
        header = SegmentHeader if conns is None else TaggedSegmentHeader(conns)
        super().__init__({
            "i": In(BeatStream(data_bytes, err=True, conns=conns)),
            "o_header": Out(stream.Signature(header)),
            "o_payload": Out(BeatStream(data_bytes)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        if n < _CORE_BYTES:
            m.submodules.widen = widen = BeatUpsizer(n, _CORE_BYTES, err=True, conns=self.conns)
            m.submodules.core = core = SegmentParser(_CORE_BYTES, conns=self.conns)
            m.submodules.narrow = narrow = BeatDownsizer(_CORE_BYTES, n)
            wiring.connect(m, wiring.flipped(self.i), widen.i)
            wiring.connect(m, widen.o, core.i)
            wiring.connect(m, core.o_payload, narrow.i)
            wiring.connect(m, narrow.o, wiring.flipped(self.o_payload))
            wiring.connect(m, core.o_header, wiring.flipped(self.o_header))
            return m

        beats = -(-_CAPTURE // n)
        beat, out = self.i.payload, self.o_header
        m.submodules.trim = trim = HeadTrim(n, _COUNT_BITS)
        wiring.connect(m, trim.o, wiring.flipped(self.o_payload))

        # Capture: the packet's first octets (`held`, lane 0 first, zero past the packet), the
        # beat index within them and the octets of the beats before this one. After the last
        # beat `held` is the whole packet's capture (`full`), and its header, decoded from it,
        # is offered until taken; taking it clears `held` for the next packet, whose first beat
        # may arrive in that cycle (it then overrides the clear of its lanes).
        held = Signal(8 * n * beats)
        full = Signal()
        index = Signal(range(beats + 1))
        octets = Signal(_COUNT_BITS)
        first = Signal(init=1)
        count_given = Signal()
        lanes = Cat(beat.keep[k].replicate(8) for k in range(n))
        in_last = keep_count(m, beat.keep, n, "in_last")

        # The decode stage's input beside `held`: the packet's octets (ULPDU_Length field
        # included) and its err.
        total = Signal(_COUNT_BITS)
        held_err = Signal()
        tagged = self.conns is not None
        held_conn = Signal(conn_bits(self.conns)) if tagged else None
        taken = wire(m, full & out.ready, "taken")
        room = wire(m, ~full | out.ready, "room")

        m.d.comb += [
            trim.i.payload.data.eq(beat.data), trim.i.payload.keep.eq(beat.keep),
            trim.i.payload.last.eq(beat.last),
            trim.i.valid.eq(self.i.valid & room),
            self.i.ready.eq(trim.i.ready & room),
            trim.i_count.valid.eq(self.i.valid & first & ~count_given),
            trim.i_count.payload.eq(_trim_count(beat.data[23], beat.data[24:28])),
        ]
        with m.If(trim.i_count.valid & trim.i_count.ready):
            m.d.sync += count_given.eq(1)

        with m.If(taken):
            m.d.sync += [held.eq(0), full.eq(0)]

        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [first.eq(beat.last), count_given.eq(0)]
            for k in range(beats):
                with m.If(eq(index, k)):
                    m.d.sync += held[8 * n * k:8 * n * (k + 1)].eq(beat.data & lanes)
            with m.If(beat.last):
                m.d.sync += [index.eq(0), octets.eq(0), full.eq(1),
                             total.eq(wrap_add(m, octets, in_last, _COUNT_BITS, "octets_all")),
                             held_err.eq(beat.err)]
                if tagged:
                    m.d.sync += held_conn.eq(beat.conn)
            with m.Else():
                m.d.sync += octets.eq(add(octets, n)[:_COUNT_BITS])
                with m.If(lt(index, beats)):
                    m.d.sync += index.eq(add(index, 1))

        # Decode: the packet's length and both readings of its DDP header.
        ulpdu = held[8 * _LENGTH_FIELD:]
        head = ulpdu[:8 * HEAD_BYTES]
        tagged_hdr = DDP_TAGGED.unpack(ulpdu[:8 * DDP_TAGGED.length])
        untagged_hdr = DDP_UNTAGGED.unpack(ulpdu[:8 * DDP_UNTAGGED.length])
        t, opcode = tagged_hdr.t, tagged_hdr.opcode
        # A header-only message's RDMAP header sits after the untagged DDP header; its size
        # must match exactly (_LENGTH_FIELD + 18 + size octets in all).
        rest_ok = select(m, opcode, {op: eq(total, _LENGTH_FIELD + DDP_UNTAGGED.length + size)
                                     for op, size in _HEADER_SIZE.items()}, 1, "rest_ok")
        aopcode = ATOMIC_REQUEST.unpack(
            head[8 * DDP_UNTAGGED.length:8 * HEAD_BYTES]).aopcode
        header_op = one_of(opcode, (*_HEADER_SIZE, _TERMINATE))
        fixed_header = one_of(opcode, tuple(_HEADER_SIZE))

        ok = Signal()
        code = Signal(TerminateCode)
        checks = [
            (lt(total, _LENGTH_FIELD + 1)
             | (t & lt(total, _LENGTH_FIELD + DDP_TAGGED.length))
             | (~t & lt(total, _LENGTH_FIELD + DDP_UNTAGGED.length)),
             TerminateCode.RDMAP_CATASTROPHIC_STREAM),
            (~eq(tagged_hdr.dv, 1) & t, TerminateCode.DDP_TAGGED_INVALID_VERSION),
            (~eq(tagged_hdr.dv, 1), TerminateCode.DDP_UNTAGGED_INVALID_VERSION),
            (~eq(tagged_hdr.rv, 1), TerminateCode.RDMAP_INVALID_VERSION),
            (gt(opcode, 11) | (one_of(opcode, TAGGED_OPCODES) != t),
             TerminateCode.RDMAP_UNEXPECTED_OPCODE),
            (~t & ~select(m, opcode, {op: eq(untagged_hdr.qn, qn) for op, qn in QUEUE.items()},
                          1, "qn_ok"), TerminateCode.DDP_UNTAGGED_INVALID_QN),
            (~t & header_op & (~untagged_hdr.l | ~is_zero(untagged_hdr.mo)),
             TerminateCode.DDP_UNTAGGED_INVALID_MO),
            (~t & fixed_header & ~rest_ok, TerminateCode.RDMAP_CATASTROPHIC_STREAM),
            (~t & eq(opcode, _ATOMIC_REQUEST) & ~one_of(aopcode, _ATOMIC_OPS),
             TerminateCode.RDMAP_UNEXPECTED_OPCODE),
        ]
        m.d.comb += ok.eq(~held_err)
        for failed, failed_code in reversed(checks):
            with m.If(failed):
                m.d.comb += [ok.eq(0), code.eq(failed_code)]

        count = wire(m, _trim_count(t, opcode), "count")
        p = out.payload
        m.d.comb += [
            out.valid.eq(full),
            p.fpdu_bad.eq(held_err), p.ok.eq(ok), p.code.eq(code),
            p.opcode.eq(opcode), p.tagged.eq(t), p.last.eq(tagged_hdr.l),
            p.length.eq(Mux(t, sub(total, _LENGTH_FIELD + DDP_TAGGED.length),
                            sub(total, _LENGTH_FIELD + DDP_UNTAGGED.length))[:16]),
            p.ulpdu_length.eq(sub(total, _LENGTH_FIELD)[:16]),
            p.has_payload.eq(count < total),
            p.head.eq(head),
        ]
        if tagged:
            m.d.comb += p.conn.eq(held_conn)
        return m
