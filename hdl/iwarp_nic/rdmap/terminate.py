"""The Terminate message: RFC 5040 sections 4.8 and 7 (figures 7, 8 and 10) with the error codes
of RFC 6580 section 3; built for sending (:class:`TerminateEmitter`) and decoded on receipt
(:class:`TerminateParser`).

A Terminate is an untagged DDP segment on queue 2 (RFC 5040 4.8, 5.1): the DDP header (T 0,
L 1, DV 1; RDMAP control RV 1, opcode 7; QN 2, the queue's next MSN, MO 0) and the Terminate
header: ``Layer | EType | Error Code | M D R | reserved``, then, when the error is about a
segment that arrived and is not an RDMAP Local Catastrophic error nor an LLP (MPA) error, the
offending segment's length (M), a copy of its DDP header (D: 14 bytes if tagged, 18 if not)
and, for a Remote Protection error on an RDMA Read Request, a copy of its 28-byte Read Request
header (R). This is what the model's ``Terminate.for_error(code, offending)`` encodes.
"""

from amaranth import C, Cat, Module, Mux, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.wiring import In, Out

from ..errors import OFFENDING_BYTES
from ..exact import add, eq, gt, is_zero, lt, mask, select, sub, widened, wire
from ..stream import BeatStream, check_data_bytes
from ..tcp.layouts import conn_bits, with_conn

__all__ = ["OFFENDING_BYTES", "TerminateRequest", "TerminateEmitter", "TerminateHeader",
           "TerminateParser"]

_UNTAGGED, _TAGGED, _READ_REQUEST = 18, 14, 28
_TERMINATE_QN, _TERMINATE_OPCODE, _READ_REQUEST_OPCODE = 2, 7, 1
_LLP, _RDMAP = 2, 0
#: DDP control (T 0, L 1, DV 1) and RDMAP control (RV 1, Terminate).
_DDP_CONTROL, _RDMAP_CONTROL = 0x41, 1 << 6 | _TERMINATE_OPCODE
#: The longest Terminate: DDP header, Terminate control, segment length, both copies.
_LONGEST = _UNTAGGED + 4 + 2 + OFFENDING_BYTES

#: One Terminate to send. ``layer``, ``etype``, ``ecode``: the RFC 6580 code. ``msn``: the MSN
#: of queue 2 it takes. ``offending_length``: the length of the DDP segment it is about (the
#: ULPDU), 0 for none; ``offending``: that segment's first :data:`OFFENDING_BYTES` octets, lane
#: (octet) 0 first, those past its length ignored.
TerminateRequest = StructLayout({
    "layer": 4, "etype": 4, "ecode": 8, "msn": 32,
    "offending": 8 * OFFENDING_BYTES, "offending_length": 16,
})


def _be(value, octets):
    """``value`` as ``octets`` octets, most significant first, lane 0 first."""
    return Cat(value.word_select(octets - 1 - k, 8) for k in range(octets))


class TerminateEmitter(wiring.Component):
    """Build the ULPDU of each requested Terminate (RFC 5040 4.8 and figure 10).

    Ports
    -----
    i : In(stream.Signature(TerminateRequest))
        One request per Terminate.
    o_length : Out(stream.Signature(unsigned(7)))
        The ULPDU's length (22, 38, 42 or 70 octets), offered as the request is taken, for the
        framer's header; it must be taken before the next request is.
    o : Out(BeatStream(data_bytes))
        The ULPDU: ``Segment(TERMINATE, msn=msn, header=Terminate.for_error(code,
        offending)).encode()`` of the model.

    The copies are made when ``offending_length`` is not 0, the error type is not 0 (RDMAP Local
    Catastrophic) and the layer is not 2 (LLP), and the segment is at least as long as its DDP
    header (its T bit says which); the Read Request copy when, in addition, the layer and type
    are RDMAP Remote Protection (0, 1), the segment is untagged with RDMAP opcode 1 and at least
    46 octets long. Codes outside the RFC 6580 registry are sent as given.

    Throughput: one beat per cycle; a request is taken as the previous ULPDU's last beat goes.
    Latency: the first beat is offered the cycle after the request is taken. Back-pressure on
    ``o`` holds the ULPDU.
    """

    def __init__(self, data_bytes):
        self.data_bytes = check_data_bytes(data_bytes)
        super().__init__({
            "i": In(stream.Signature(TerminateRequest)),
            "o_length": Out(stream.Signature(unsigned(7))),
            "o": Out(BeatStream(data_bytes)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        req, out = self.i.payload, self.o
        offending = req.offending
        length = req.offending_length
        tagged = offending[7]                      # T, the first octet's top bit
        long_enough = Mux(tagged, ~lt(length, _TAGGED), ~lt(length, _UNTAGGED))
        copy = wire(m, long_enough & ~is_zero(req.etype) & ~eq(req.layer, _LLP), "copy")
        read_request = ~tagged & eq(offending[8:12], _READ_REQUEST_OPCODE)
        rdma = wire(m, copy & eq(req.layer, _RDMAP) & eq(req.etype, 1) & read_request
                    & ~lt(length, OFFENDING_BYTES), "rdma")
        flags = Cat(C(0, 5), rdma, copy, copy)      # M D R in the top bits of the third octet
        ulpdu = Cat(
            C(_DDP_CONTROL, 8), C(_RDMAP_CONTROL, 8), C(0, 32),          # DDP control, RsvdULP
            _be(C(_TERMINATE_QN, 32), 4), _be(req.msn, 4), C(0, 32),     # QN, MSN, MO
            Cat(req.etype, req.layer), req.ecode, flags, C(0, 8),         # Terminate control
            _be(length, 2), offending,                                    # M, D and R copies
        )
        total = select(m, Cat(tagged, rdma, copy), {
            0b100: _UNTAGGED + 4 + 2 + _UNTAGGED, 0b101: _UNTAGGED + 4 + 2 + _TAGGED,
            0b110: _LONGEST, 0b000: _UNTAGGED + 4}, 7, "total")

        held = Signal(8 * _LONGEST)
        left = Signal(range(_LONGEST + 1))
        busy = wire(m, ~is_zero(left), "busy")
        last = wire(m, ~gt(left, n), "last")
        out_take = out.valid & out.ready
        with m.If(self.o_length.ready):
            m.d.sync += self.o_length.valid.eq(0)
        m.d.comb += [
            out.valid.eq(busy),
            out.payload.data.eq(held[:8 * n]),
            out.payload.keep.eq(Mux(last, select(m, left[:n.bit_length()],
                                                 {k: mask(k) for k in range(1, n + 1)}, n,
                                                 "last_keep"), mask(n))),
            out.payload.last.eq(last),
        ]
        with m.If(out_take):
            m.d.sync += [held.eq(held >> 8 * n), left.eq(Mux(last, 0, sub(left, n)))]
        take = self.i.valid & (~busy | (out_take & last)) & (~self.o_length.valid
                                                               | self.o_length.ready)
        m.d.comb += self.i.ready.eq(take)
        with m.If(take):
            m.d.sync += [held.eq(ulpdu), left.eq(total),
                         self.o_length.valid.eq(1), self.o_length.payload.eq(total)]
        return m


#: Octets of a Terminate header that carry fields: control, segment length and both copies.
_PARSED = 4 + 2 + _UNTAGGED + _READ_REQUEST

#: One received Terminate header, decoded (RFC 5040 4.8). ``m``: the DDP segment length
#: ``segment_length`` is valid. ``ddp_size``: octets of the terminated DDP header copy in
#: ``ddp_header`` (0, 14 or 18), lane 0 first; ``rdma``: ``rdma_header`` holds the 28-octet Read
#: Request copy. ``bad``: the header is malformed (truncated, or octets after its last part),
#: which the receiver treats as an RDMAP Local Catastrophic error; the fields are then
#: meaningless.
TerminateHeader = StructLayout({
    "layer": 4, "etype": 4, "ecode": 8, "m": 1, "segment_length": 16,
    "ddp_size": 5, "ddp_header": 8 * _UNTAGGED, "rdma": 1, "rdma_header": 8 * _READ_REQUEST,
    "bad": 1,
})


class TerminateParser(wiring.Component):
    """Decode the Terminate header of a received Terminate message (RFC 5040 4.8, figure 7).

    ``conns`` None: one stream. ``conns`` an integer: the Terminates of that many connections,
    one at a time, each length naming its connection, and so does its decoded header.

    Ports
    -----
    i_length : In(stream.Signature(unsigned(16) or with_conn({"length": 16}, conns)))
        One per Terminate: the octets of its header, the DDP segment's payload (0 or more).
    i : In(BeatStream(data_bytes))
        For each length above 0, that many octets as one packet.
    o : Out(stream.Signature(with_conn(TerminateHeader, conns)))
        One per Terminate, offered the cycle after its last octet is taken (after its length,
        for 0 octets): what the model's ``Terminate.decode`` returns, or ``bad`` where it raises
        (and the length's ``conn``).

    The decoding follows the header's own flags: the segment length field is there when M or D
    is set, the DDP header copy when D is (14 or 18 octets as the copy's T bit says), the Read
    Request copy when R is and the DDP copy is absent or an untagged RDMA Read Request's; any
    octet missing or left over makes the header ``bad``. Only the first 52 octets are kept.

    Throughput: one beat per cycle; a header of 0 octets takes a cycle. Back-pressure on ``o``
    stalls ``i``.
    """

    def __init__(self, data_bytes, *, conns=None):
        self.data_bytes = check_data_bytes(data_bytes)
        self.conns = conns
        super().__init__({
            "i_length": In(stream.Signature(
                unsigned(16) if conns is None else with_conn(StructLayout({"length": 16}),
                                                             conns))),
            "i": In(BeatStream(data_bytes)),
            "o": Out(stream.Signature(with_conn(TerminateHeader, conns))),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        beats = -(-_PARSED // n)
        held = Signal(8 * beats * n)        # the header's first octets, lane 0 first
        length = Signal(16)
        index = Signal(range(beats + 1))    # beats taken, up to the last one kept
        busy = Signal()
        conn = Signal(conn_bits(self.conns or 1))     # the Terminate's connection
        out = self.o

        def octet(k):
            return held[8 * k:8 * k + 8]

        flags = octet(2)
        has_m, has_d, has_r = flags[7], flags[6], flags[5]
        has_length = has_m | has_d
        tagged_copy = octet(6)[7]
        ddp_size = wire(m, Mux(has_d, Mux(tagged_copy, _TAGGED, _UNTAGGED), 0), "ddp_size")
        read_copy = ~tagged_copy & eq(octet(7)[:4], _READ_REQUEST_OPCODE)
        rdma = wire(m, has_r & (~has_d | read_copy), "rdma")
        # Where each part ends: control, segment length, DDP copy, RDMA copy.
        after_length = Mux(has_length, 6, 4)
        after_ddp = widened(m, Mux(has_d, Mux(tagged_copy, 6 + _TAGGED, 6 + _UNTAGGED),
                                   after_length), 7, "after_ddp")
        total = wire(m, Mux(rdma, add(after_ddp, _READ_REQUEST), after_ddp), "total")
        rdma_at = select(m, after_ddp, {4: held[32:32 + 8 * _READ_REQUEST],
                                        6: held[48:48 + 8 * _READ_REQUEST],
                                        6 + _TAGGED: held[8 * 20:8 * 20 + 8 * _READ_REQUEST],
                                        6 + _UNTAGGED: held[8 * 24:8 * 24 + 8 * _READ_REQUEST]},
                         8 * _READ_REQUEST, "rdma_at")
        short_control = lt(length, 4)
        bad = wire(m, short_control | (length != widened(m, total, 16, "total_wide")), "bad")

        with m.If(out.ready):
            m.d.sync += out.valid.eq(0)

        def emit():
            m.d.sync += [
                out.valid.eq(1),
                out.payload.layer.eq(octet(0)[4:]), out.payload.etype.eq(octet(0)[:4]),
                out.payload.ecode.eq(octet(1)), out.payload.m.eq(has_m),
                out.payload.segment_length.eq(Cat(octet(5), octet(4))),
                out.payload.ddp_size.eq(ddp_size),
                out.payload.ddp_header.eq(held[48:48 + 8 * _UNTAGGED]),
                out.payload.rdma.eq(rdma), out.payload.rdma_header.eq(rdma_at),
                out.payload.bad.eq(bad),
            ]
            if self.conns is not None:
                m.d.sync += out.payload.conn.eq(conn)

        out_free = ~out.valid | out.ready
        # The header is complete when its last beat went in (or it has no octet at all).
        m.d.comb += self.i_length.ready.eq(~busy)
        given = self.i_length.payload
        with m.If(self.i_length.valid & ~busy):
            m.d.sync += [busy.eq(1), index.eq(0), held.eq(0)]
            if self.conns is None:
                m.d.sync += length.eq(given)
            else:
                m.d.sync += [length.eq(given.length), conn.eq(given.conn)]
        done = Signal()
        pending = Signal()                  # decode `held` (complete) into `o` this cycle
        with m.If(busy & ~pending & out_free):
            with m.If(is_zero(length)):
                m.d.comb += done.eq(1)
            with m.Else():
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    for k in range(beats):
                        with m.If(eq(index, k)):
                            m.d.sync += held[8 * n * k:8 * n * (k + 1)].eq(
                                self.i.payload.data & Cat(self.i.payload.keep[j].replicate(8)
                                                          for j in range(n)))
                    with m.If(lt(index, beats)):
                        m.d.sync += index.eq(add(index, 1))
                    with m.If(self.i.payload.last):
                        m.d.comb += done.eq(1)
        # The decode reads `held` a cycle after the last beat is stored.
        with m.If(done):
            m.d.sync += [pending.eq(1)]
        with m.If(pending):
            emit()
            m.d.sync += [pending.eq(0), busy.eq(0)]
        return m
