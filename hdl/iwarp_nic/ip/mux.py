"""Steering parsed packets: a demultiplexer and a round-robin arbiter for header + payload pairs.

No protocol is implemented here; these are the switches between the RFC 826 / 791 / 792 blocks
of :mod:`iwarp_nic.ip`. A packet is a header transfer and, when the header says so, one packet of
payload beats (DESIGN.md section 2); both blocks keep a packet's header and payload together.
"""

from amaranth import Module, Mux, Signal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..exact import add, eq, select, sub
from ..stream import BeatStream, check_data_bytes

__all__ = ["Demux", "Arbiter"]


def _check_ways(ways, least):
    if not isinstance(ways, int) or ways < least:
        raise ValueError(f"ways must be an integer >= {least}, not {ways!r}")


class Demux(wiring.Component):
    """Route each packet to one of ``ways`` outputs, or drop it.

    Ports
    -----
    i_header : In(stream.Signature(header_shape))
        ``header_shape`` is a struct; with a ``has_payload`` member (a ``HeaderStream`` payload)
        only the headers with it set have a payload, else every header has one.
    i_payload : In(BeatStream(data_bytes, err=err))
        One payload packet per header with a payload.
    sel : In(range(ways + 1))
        The way of the header offered on ``i_header``, decided combinationally by the owner from
        ``i_header.payload``; ``ways`` drops the packet (header and payload consumed, discarded).
    o_header[k] : Out(stream.Signature(header_shape))
        Only when ``headers`` is true: the headers routed to way ``k``. Otherwise headers are
        consumed here and only payloads leave.
    o_payload[k] : Out(BeatStream(data_bytes, err=err))
        The payloads routed to way ``k``.

    Purely combinational between input and output (no register, zero latency). Throughput: one
    beat per cycle within a payload; the header takes a cycle of its own, so a packet costs its
    payload beats plus one cycle. Back-pressure passes straight through from the selected output.
    """

    def __init__(self, header_shape, data_bytes, ways, *, headers=True, err=True):
        check_data_bytes(data_bytes)
        _check_ways(ways, 1)
        self.ways = ways
        self.headers = headers
        members = {
            "i_header": In(stream.Signature(header_shape)),
            "i_payload": In(BeatStream(data_bytes, err=err)),
            "sel": In(range(ways + 1)),
            "o_payload": Out(BeatStream(data_bytes, err=err)).array(ways),
        }
        if headers:
            members["o_header"] = Out(stream.Signature(header_shape)).array(ways)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        hdr, pay = self.i_header, self.i_payload
        busy = Signal()
        way = Signal(range(self.ways + 1))
        # Every way sees the header and the beat (a payload counts only with ``valid``), so
        # no multiplexer stands between them and the outputs.
        for k in range(self.ways):
            if self.headers:
                m.d.comb += self.o_header[k].payload.eq(hdr.payload)
            m.d.comb += self.o_payload[k].payload.eq(pay.payload)

        with m.If(~busy):
            for k in range(self.ways):
                with m.If(eq(self.sel, k)):
                    if self.headers:
                        out = self.o_header[k]
                        m.d.comb += [out.valid.eq(hdr.valid), hdr.ready.eq(out.ready)]
                    else:
                        m.d.comb += hdr.ready.eq(1)
            with m.If(eq(self.sel, self.ways)):
                m.d.comb += hdr.ready.eq(1)
            has_payload = getattr(hdr.payload, "has_payload", 1)
            with m.If(hdr.valid & hdr.ready & has_payload):
                m.d.sync += [busy.eq(1), way.eq(self.sel)]
        with m.Else():
            m.d.comb += pay.ready.eq(eq(way, self.ways))
            for k in range(self.ways):
                out = self.o_payload[k]
                with m.If(eq(way, k)):
                    m.d.comb += [out.valid.eq(pay.valid), pay.ready.eq(out.ready)]
            with m.If(pay.valid & pay.ready & pay.payload.last):
                m.d.sync += busy.eq(0)
        return m


class Arbiter(wiring.Component):
    """Merge ``ways`` sources of packets (a header and exactly one payload packet each) into one,
    round-robin, never interleaving two packets.

    Ports
    -----
    i_header[k] : In(stream.Signature(header_shape)); i_payload[k] : In(BeatStream(.., err=True))
    o_header : Out(stream.Signature(header_shape)); o_payload : Out(BeatStream(.., err=True))

    A source is granted when its header is taken; its payload is then passed until its last beat,
    and the next grant goes to the first requesting source after it. Combinational (zero
    latency); a packet costs one cycle for its header plus its payload beats. Back-pressure
    passes straight through.

    ``ahead``: how many further headers may pass while a payload is still on its way (0: the
    next header waits for the last payload beat). Payloads leave in their headers' order. A
    consumer that prepares for a packet on its header (as the TCP engine admits a chunk into its
    send ring) then does so while the previous payload flows, instead of between payloads,
    where it would leave the payload stream idle.
    """

    def __init__(self, header_shape, data_bytes, ways, *, ahead=0):
        check_data_bytes(data_bytes)
        _check_ways(ways, 2)
        if not isinstance(ahead, int) or ahead < 0:
            raise ValueError(f"ahead must be an integer >= 0, not {ahead!r}")
        self.ways = ways
        self.ahead = ahead
        super().__init__({
            "i_header": In(stream.Signature(header_shape)).array(ways),
            "i_payload": In(BeatStream(data_bytes, err=True)).array(ways),
            "o_header": Out(stream.Signature(header_shape)),
            "o_payload": Out(BeatStream(data_bytes, err=True)),
        })

    def elaborate(self, platform):
        m = Module()
        depth = self.ahead + 1
        flag = depth == 1  # no header ahead: a payload is on its way or not
        # The ways granted whose payloads have not ended, oldest first, and how many.
        level = Signal(range(depth + 1), name="busy" if flag else "level")
        grants = [Signal(range(self.ways), name="grant" if flag else f"grant{j}")
                  for j in range(depth)]
        # Round robin: `after` has a bit set for each way after the last granted one.
        after = Signal(self.ways)
        pick = Signal(range(self.ways))
        req = [h.valid for h in self.i_header]

        # The lowest requesting way after the last grant, else the lowest requesting way.
        for k in reversed(range(self.ways)):
            with m.If(req[k]):
                m.d.comb += pick.eq(k)
        for k in reversed(range(self.ways)):
            with m.If(req[k] & after[k]):
                m.d.comb += pick.eq(k)
        next_after = select(m, pick, [(1 << self.ways) - (2 << k) for k in range(self.ways)],
                            self.ways, "next_after")

        taken = self.o_header.valid & self.o_header.ready
        ended = self.o_payload.valid & self.o_payload.ready & self.o_payload.payload.last
        # The outputs' payloads are the picked header and the granted way's beat whatever
        # ``level`` says (they count only with ``valid``): one multiplexer each, by way.
        header_bits = len(Value.cast(self.o_header.payload))
        beat_bits = len(Value.cast(self.o_payload.payload))
        m.d.comb += [
            self.o_header.payload.eq(select(m, pick, [h.payload for h in self.i_header],
                                            header_bits, "picked_header")),
            self.o_payload.payload.eq(select(m, grants[0], [p.payload for p in self.i_payload],
                                             beat_bits, "granted_beat")),
        ]
        with m.If(~level if flag else ~eq(level, depth)):
            for k in range(self.ways):
                with m.If(eq(pick, k)):
                    src = self.i_header[k]
                    m.d.comb += [self.o_header.valid.eq(src.valid),
                                 src.ready.eq(self.o_header.ready)]
            with m.If(taken):
                m.d.sync += ([level.eq(1), grants[0].eq(pick)] if flag else []) + [
                    after.eq(next_after)]
        with m.Else() if flag else m.If(~eq(level, 0)):
            for k in range(self.ways):
                with m.If(eq(grants[0], k)):
                    src = self.i_payload[k]
                    m.d.comb += [self.o_payload.valid.eq(src.valid),
                                 src.ready.eq(self.o_payload.ready)]
            if flag:
                with m.If(ended):
                    m.d.sync += level.eq(0)
        if not flag:
            # An ended payload shifts the grants down; a taken header joins behind those
            # left.
            at = Mux(ended, sub(level, 1), level)
            for j in range(depth):
                if j + 1 < depth:
                    with m.If(ended):
                        m.d.sync += grants[j].eq(grants[j + 1])
                with m.If(taken & eq(at, j)):
                    m.d.sync += grants[j].eq(pick)
            with m.If(taken & ~ended):
                m.d.sync += level.eq(add(level, 1))
            with m.Elif(ended & ~taken):
                m.d.sync += level.eq(sub(level, 1))
        return m
