"""Every connection's received octets, gathered into whole MPA frames: RFC 5044 section 7.1 (the
startup frame first: 20 octets and PD_Length octets of private data) and sections 4.1 to 4.3
(then FPDUs: the ULPDU_Length field, the ULPDU, the pad, the CRC field, and the markers among
them every 512 octets from the first FPDU's first octet).

TCP hands over each connection's byte stream in chunks (a segment's new octets each, the chunks of
all connections interleaved, see :class:`~iwarp_nic.tcp.engine.TcpEngine`), and a frame may be
cut anywhere. The layers above take one connection's frames at a time and keep between frames only
a few words of each connection's state, so they want each connection's octets in pieces that begin
and end on frame boundaries. :class:`FrameGather` stores each connection's octets in a ring of its
own and, as each chunk ends, releases the frames the chunk completed.
"""

from amaranth import C, Cat, Module, Mux, Signal
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..exact import (
    Machine,
    add,
    eq,
    gt,
    is_zero,
    same,
    select,
    widened,
    wire,
    wrap_add,
    wrap_sub,
)
from ..stream import BeatLayout, BeatStream, SkidBuffer, check_data_bytes, keep_count
from ..tcp.layouts import ChunkHeader, RingRequest, conn_bits
from ..tcp.ring import TxRing
from .framer import wire_length
from .startup import MAX_PRIVATE_DATA

__all__ = ["GatherOp", "GatherCommand", "ReleaseKind", "Release", "max_frame_ulpdu",
           "FrameGather"]

#: Released pieces that may wait for the ring's read port.
_RELEASES = 16
#: Octets of a startup frame before its private data; where its PD_Length field starts.
_STARTUP_FIXED, _PD_LENGTH_AT = 20, 18
#: Octets of the ULPDU_Length field, of a marker, of the CRC field.
_LENGTH, _MARKER, _CRC = 2, 4, 4


class GatherOp(enum.Enum, shape=1):
    """What a :class:`GatherCommand` does to its connection."""

    START = 0   # a new connection on the slot: its next octet is its startup frame's first
    FPDUS = 1   # the startup exchange is over: FPDUs follow the startup frame, markers and
                # CRCs as given


def GatherCommand(conns):
    """A command to connection ``conn``'s gather: ``op``; for ``FPDUS``, ``markers`` and ``crc``
    say whether the connection negotiated markers and CRCs (both 0 for ``START``)."""
    return data.StructLayout({"op": GatherOp, "conn": conn_bits(conns), "markers": 1, "crc": 1})


class ReleaseKind(enum.Enum, shape=2):
    """What a released piece of a connection's stream holds."""

    STARTUP = 0  # the startup frame (and, if holding ended in its chunk, the octets after it)
    FPDUS = 1    # whole FPDUs, from an FPDU boundary on; after an over-long ULPDU_Length, the
                 # octets as they come, from that FPDU on
    EARLY = 2    # octets that followed the startup frame before FPDU mode was set and could
                 # not be held for it (see FrameGather)


def Release(conns):
    """One released piece: ``length`` (>= 1) octets of connection ``conn``'s stream; ``position``
    is the stream offset of its first octet from the first FPDU's first octet, modulo 512 (where
    the markers are), meaningful for FPDUS and EARLY. For an FPDUS piece, ``markers`` and ``crc``
    are the connection's settings from its FPDUS command, and ``first`` is set on the
    connection's first FPDUS piece after that command (its first FPDU starts the piece); all
    three are 0 for the other kinds."""
    return data.StructLayout({"conn": conn_bits(conns), "length": 16, "kind": ReleaseKind,
                              "position": 9, "markers": 1, "crc": 1, "first": 1})


def max_frame_ulpdu(ring_bytes, max_chunk):
    """The largest ULPDU_Length whose FPDU fits a ring of ``ring_bytes`` beside one chunk of
    ``max_chunk`` octets, markers included wherever the FPDU starts (0 when none does)."""
    room = ring_bytes - max_chunk
    # An FPDU of ULPDU_Length L takes at most L + 9 octets without markers, plus one marker per
    # 508 octets and a leading one.
    best = 0
    for length in range(min(room, 0xFFFF) + 1):
        if length + 9 + 4 * ((length + 9) // 508 + 2) <= room:
            best = length
    return best


class _Mode(enum.Enum, shape=2):
    STARTUP = 0     # gathering the startup frame
    AWAIT = 1       # the startup frame is out, FPDU mode not set yet
    FPDUS = 2       # gathering FPDUs


#: A connection's state between chunks (one block-RAM word each).
_Context = data.StructLayout({
    "wseq": 32,         # stream offset of the next octet to arrive (octet 0: the startup frame's)
    "start": 32,        # offset of the first octet not released yet: a frame boundary
    "held": 16,         # AWAIT: octets of whole FPDUs from `start` on, held back until FPDUS
    "mode": _Mode,
    "kind": ReleaseKind,    # the kind of the next release
    "passing": 1,       # framing is lost: every octet is released as it comes
    "markers": 1,
    "crc": 1,
    "first": 1,         # no FPDUS piece released since the FPDUS command
    "origin": 9,        # the first FPDU's offset, modulo 512
    "framed": 1,        # inside a frame whose end is `need` octets on; else before its length field
    "need": 17,
    "skip": 5,          # octets before the length field still to come
    "half": 1,          # the length field's first octet has come: `high`
    "high": 8,
})

_FRESH = {"mode": _Mode.STARTUP, "kind": ReleaseKind.STARTUP, "skip": _PD_LENGTH_AT}


class FrameGather(wiring.Component):
    """Gather each of ``conns`` connections' octets into whole MPA frames, in a ring per
    connection, and release them as each chunk ends.

    Ports
    -----
    i_header : In(stream ChunkHeader(conns)); i : In(BeatStream(data_bytes))
        The chunks of every connection, as :class:`~iwarp_nic.tcp.engine.TcpEngine` offers them
        on ``o_rx_header``/``o_rx``: one header (``conn``, ``length`` >= 1, at most
        ``max_chunk``) then ``length`` octets as one packet.
    i_cmd : In(stream GatherCommand(conns))
        ``START``: a new connection on the slot; give it before the connection's first chunk
        (for a passive open when TCP reports it established, before any of its octets can be
        offered). ``FPDUS``: the startup frame has been released and this end has settled the
        exchange: the octets after that frame are FPDUs, with markers or not (``markers``) and
        CRCs or not (``crc``). Give it before this end sends anything that lets the peer send
        FPDUs (its Reply, or its first FPDU), as RFC 5044 7.1 orders the exchange. Commands are
        taken between chunks, before waiting chunks.
    o_header : Out(stream Release(conns)); o : Out(BeatStream(data_bytes))
        The released pieces, in the order of the chunks that completed them, each header then
        its ``length`` octets as one packet. A connection's pieces, in order, are its stream.
        Each header describes its piece: the kind and marker position, and for an FPDUS piece
        the connection's ``markers`` and ``crc`` and whether it is the connection's ``first``
        FPDUS piece, so the deframer needs no state of its own from the commands.

    What is released when a chunk of connection ``c`` ends: its octets up to the end of the last
    frame they complete, from where the previous piece ended. The first frame is the startup
    frame, ``20 + PD_Length`` octets: released as STARTUP, alone. After ``FPDUS``, a frame is an
    FPDU whose length follows from its ULPDU_Length and its stream offset: released as FPDUS.

    Octets after the startup frame that come before ``FPDUS`` are the peer's first FPDUs, sent
    right behind its startup frame. RFC 5044 7.1.2 has a Responder wait for the Initiator's
    first FPDU, but Linux siw's Responder sends at once, and for an Initiator they may come in
    the Reply's own segment. They are framed as FPDUs without markers and held in the ring. The
    ``FPDUS`` command releases them: without markers, the whole FPDUs among them as the first
    FPDUS piece (framing goes on from there); with markers they were framed wrongly, so all of
    them as EARLY, and framing is lost. Holding ends, and the held octets and all that follows
    go as they come, as EARLY, when they would leave no room for a chunk beside them (more than
    ``ring_bytes - max_chunk`` octets) or when one of their lengths is over-long: a peer that
    floods a connection still in its exchange cannot stop the others.

    A PD_Length above 512 or a ULPDU_Length above ``max_ulpdu`` (:func:`max_frame_ulpdu`: the
    largest FPDU that fits the ring beside a chunk) ends the framing: from that frame on the
    connection's octets are released as they come, with the kind they had, for the negotiator
    or deframer to find the same fault and stop the connection. Nothing is lost or reordered,
    and a connection never waits for another's frame.

    Rings: each connection's octets wait in its ring (``ring_bytes``, a power of two, at most
    32 KiB and at least the largest FPDU plus ``max_chunk``) until their piece has been read out.
    A chunk is taken only when its octets fit beside those still unread, so a connection whose
    pieces are not taken holds back every chunk behind it (the ring's room comes back as ``o``
    drains). Where an octet is in a frame is found as it is written, one frame boundary per cycle
    at most.

    Throughput: one beat per cycle within a chunk. Between two chunks the input waits two
    cycles (the first chunk's piece released, the next one's ring write asked) when both are
    the same connection's, four when the next one's context must be loaded; the next header is
    taken while a chunk runs. A frame whose end falls within five beats of its length field
    waits up to four cycles for its markers to be counted. Pieces are read out of the ring at
    one beat per cycle, while later chunks are written. Measured (``make bench``, 1460-octet
    chunks of 4 KiB FPDUs, one connection): 0.977 input beats per cycle at 8 bytes, 0.879 at
    64. Latency: a piece's header is offered six cycles after the last beat of the chunk that
    completes it, its first beat four or five cycles after the header (a register slice and the
    ring's read): the frames of a chunk leave only once the whole chunk is in (store and
    forward). The released pieces queue (16 deep) for the ring's read port, so the chunks of
    other connections go on being written while a piece is read out.
    """

    def __init__(self, data_bytes, *, conns=16, ring_bytes=4096, max_chunk=1460):
        check_data_bytes(data_bytes)
        conn_bits(conns)
        if not isinstance(max_chunk, int) or not 1 <= max_chunk <= 0xFFFF:
            raise ValueError(f"max_chunk must be 1 to 65535 octets, not {max_chunk!r}")
        smallest = max_chunk + _STARTUP_FIXED + MAX_PRIVATE_DATA
        if (not isinstance(ring_bytes, int) or ring_bytes & (ring_bytes - 1)
                or not max(smallest, 4 * data_bytes) <= ring_bytes <= 1 << 15):
            raise ValueError(f"ring_bytes must be a power of two from {smallest} (a chunk and "
                             f"the largest startup frame) to 32768, not {ring_bytes!r}")
        self.data_bytes, self.conns = data_bytes, conns
        self.ring_bytes, self.max_chunk = ring_bytes, max_chunk
        self.max_ulpdu = max_frame_ulpdu(ring_bytes, max_chunk)
        super().__init__({
            "i_header": In(stream.Signature(ChunkHeader(conns))),
            "i": In(BeatStream(data_bytes)),
            "i_cmd": In(stream.Signature(GatherCommand(conns))),
            "o_header": Out(stream.Signature(Release(conns))),
            "o": Out(BeatStream(data_bytes)),
        })

    def elaborate(self, platform):
        m = Module()
        conns = self.conns
        m.submodules.ring = ring = TxRing(self.data_bytes, conns, self.ring_bytes)
        m.submodules.contexts = contexts = Memory(
            shape=_Context, depth=conns, init=[_FRESH] * conns)
        ctx_rd, ctx_wr = contexts.read_port(), contexts.write_port()
        # Each connection's offset up to which its octets have left the ring.
        m.submodules.drained = drained = Memory(shape=32, depth=conns, init=[])
        # Released pieces, until the ring has reported their chunk's octets written and can
        # take their read: deep enough for the chunks of several connections to go on being
        # written while the ring reads out one piece after another.
        # `stored`: a piece a command released, whose octets earlier chunks wrote (it takes no
        # write report).
        pending = data.StructLayout({"read": RingRequest(conns), "kind": ReleaseKind,
                                     "position": 9, "markers": 1, "crc": 1, "first": 1,
                                     "stored": 1})
        m.submodules.releases = releases = SyncFIFOBuffered(width=pending.size,
                                                            depth=_RELEASES)
        # Reads from the ring (and abandoned octets), in order, until their octets have left.
        reading = data.StructLayout({"conn": conn_bits(conns), "end": 32, "octets": 1})
        m.submodules.reads = reads = SyncFIFOBuffered(width=reading.size, depth=4)
        m.submodules.headers = headers = SyncFIFOBuffered(width=Release(conns).size, depth=4)
        wiring.connect(m, ring.o_data, wiring.flipped(self.o))
        m.d.comb += [self.o_header.valid.eq(headers.r_rdy),
                     self.o_header.payload.eq(headers.r_data), headers.r_en.eq(self.o_header.ready)]

        read_push = self._issue(m, ring, releases, pending, reads, reading, headers)
        self._drain(m, ring, reads, reading, drained.write_port())
        self._track(m, ring, ctx_rd, ctx_wr, drained.read_port(), releases, pending, reads,
                    reading, read_push)
        return m

    def _issue(self, m, ring, releases, pending, reads, reading, headers):
        """A released piece, once the ring has reported its chunk written: a read from the ring,
        its header, and its entry among the reads. Returns the signal that pushes that entry."""
        head = data.View(pending, releases.r_data)
        # The read requests reach the ring through a register slice: the ring's read progress
        # does not run on into the release queue and the commands.
        m.submodules.to_read = to_read = SkidBuffer(RingRequest(self.conns))
        wiring.connect(m, to_read.o, ring.i_read)
        # The ring's write reports, taken as they come and counted: one per chunk, in the
        # order of the chunks' releases (at most one per release waiting, and the chunk being
        # written). A stored piece's octets are in: the chunks before it were reported.
        reported = Signal(range(_RELEASES + 2))
        both = releases.r_rdy & (head.stored | ~is_zero(reported))
        empty = is_zero(head.read.length)
        room = to_read.i.ready & headers.w_rdy & reads.w_rdy
        push = Signal()
        issued = both & (empty | room)
        m.d.comb += [
            to_read.i.payload.eq(head.read),
            to_read.i.valid.eq(both & ~empty & headers.w_rdy & reads.w_rdy),
            push.eq(both & ~empty & room),
            headers.w_en.eq(push),
            releases.r_en.eq(issued),
            ring.o_written.ready.eq(1),
        ]
        m.d.sync += reported.eq(reported + ring.o_written.valid - (issued & ~head.stored))
        header = data.View(Release(self.conns), headers.w_data)
        m.d.comb += [header.conn.eq(head.read.conn), header.length.eq(head.read.length),
                     header.kind.eq(head.kind), header.position.eq(head.position),
                     header.markers.eq(head.markers), header.crc.eq(head.crc),
                     header.first.eq(head.first), reads.w_en.eq(push)]
        entry = data.View(reading, reads.w_data)
        with m.If(push):
            m.d.comb += [entry.conn.eq(head.read.conn), entry.octets.eq(1),
                         entry.end.eq(wrap_add(m, head.read.seq, head.read.length, 32,
                                               "read_end"))]
        return push

    def _drain(self, m, ring, reads, reading, drained_wr):
        """The oldest read leaves with its last octet (abandoned octets at once): its
        connection's ring is free up to its end."""
        head = data.View(reading, reads.r_data)
        out = ring.o_data
        gone = reads.r_rdy & (~head.octets | (out.valid & out.ready & out.payload.last))
        m.d.comb += [reads.r_en.eq(gone), drained_wr.en.eq(gone),
                     drained_wr.addr.eq(head.conn), drained_wr.data.eq(head.end)]

    def _track(self, m, ring, ctx_rd, ctx_wr, drained_rd, releases, pending, reads, reading,
               read_push):
        """The chunks and the commands, one at a time: the connection's context in, the octets
        written and their frames found, the piece released, the context back."""
        cur = Signal(_Context)
        conn = Signal(conn_bits(self.conns))
        length = Signal(16)
        cmd = Signal(GatherCommand(self.conns))
        first = Signal(32)          # `cur.start` when the chunk began: the piece's first octet
        kind = Signal(ReleaseKind)  # the piece's kind
        states = ["IDLE", "LOAD", "ROOM", "RUN", "END", "COMMAND"]
        state = Machine(m, states, "gather")
        state_index = {name: k for k, name in enumerate(states)}
        idle = Signal()
        count = self._markers(m, cur)
        counting = count[0]
        # The next chunk's header, taken while the chunk before it runs.
        held = Signal()
        held_conn, held_length = Signal.like(conn), Signal.like(length)
        m.d.comb += self.i_header.ready.eq(~held)
        with m.If(self.i_header.valid & ~held):
            m.d.sync += [held.eq(1), held_conn.eq(self.i_header.payload.conn),
                         held_length.eq(self.i_header.payload.length)]

        cached = Signal()           # `cur` is connection `conn`'s context as written back

        def next_chunk():
            m.d.sync += [held.eq(0), conn.eq(held_conn), length.eq(held_length)]

        # The ring's room for connection `conn` (octets not yet read out: at most ring_bytes),
        # a register worked out from `cur` and the drained offset of the cycle before; good
        # once `cur` has held still for a cycle (`free_ok`). It only grows meanwhile.
        free = Signal(17)
        free_ok = Signal()
        unread = wrap_sub(m, cur.wseq, drained_rd.data, 32, "unread")
        # ring_bytes - unread, as ring_bytes + 1 + ~unread (17 bits).
        m.d.sync += [free.eq(add(~widened(m, unread[:16], 17, "unread_wide"),
                                 self.ring_bytes + 1)),
                     free_ok.eq(~eq(state.reg, state_index["LOAD"])
                                & ~eq(state.reg, state_index["RUN"]))]

        def write(octets):
            """Store the chunk's ``octets`` in the ring once they fit beside the octets still
            unread; then RUN."""
            fits = free_ok & ~(widened(m, octets, 17, "chunk_wide") > free) & releases.w_rdy
            m.d.comb += [ring.i_write.valid.eq(fits), ring.i_write.payload.conn.eq(conn),
                         ring.i_write.payload.seq.eq(cur.wseq),
                         ring.i_write.payload.length.eq(octets)]
            with m.If(fits & ring.i_write.ready):
                state.goto("RUN")
            return fits & ring.i_write.ready

        with state.state("IDLE"):
            m.d.comb += idle.eq(1)
            with m.If(self.i_cmd.valid):
                m.d.comb += self.i_cmd.ready.eq(1)
                m.d.sync += [cmd.eq(self.i_cmd.payload), conn.eq(self.i_cmd.payload.conn),
                             cached.eq(0)]
                state.goto("COMMAND")
            with m.Elif(held & cached & same(held_conn, conn)):
                # The same connection's next chunk: its context is still here.
                with m.If(write(held_length)):
                    next_chunk()
            with m.Elif(held):
                next_chunk()
                state.goto("LOAD")
        m.d.comb += [ctx_rd.addr.eq(Mux(idle, Mux(self.i_cmd.valid, self.i_cmd.payload.conn,
                                                  held_conn), conn)),
                     drained_rd.addr.eq(conn), ctx_wr.addr.eq(conn), ctx_wr.data.eq(cur)]
        with state.state("LOAD"):
            m.d.sync += [cur.eq(ctx_rd.data), first.eq(ctx_rd.data.start),
                         kind.eq(ctx_rd.data.kind)]
            state.goto("ROOM")
        with state.state("ROOM"):
            write(length)
        # The beats reach the ring through a register slice: the decision to take one does
        # not run on into the ring's rotation.
        m.submodules.to_ring = to_ring = SkidBuffer(BeatLayout(self.data_bytes))
        wiring.connect(m, to_ring.o, ring.i_data)
        with state.state("RUN"):
            self._frames(m, to_ring, cur, count, state)
        with state.state("END"):
            # The chunk's octets are all in, its last FPDU's markers counted.
            with m.If(~counting):
                with m.If(cur.framed & is_zero(cur.need)):
                    self._boundary(m, cur, cur.wseq)     # a frame that ends with the chunk
                with m.Else():
                    self._release(m, cur, conn, first, kind, releases, pending, ctx_wr)
                    m.d.sync += [cur.eq(ctx_wr.data), first.eq(ctx_wr.data.start),
                                 kind.eq(cur.kind), cached.eq(1)]
                    state.goto("IDLE")
        with state.state("COMMAND"):
            self._command(m, cmd, conn, ctx_rd.data, ctx_wr, reads, reading, read_push,
                          releases, pending, state)

    def _command(self, m, cmd, conn, ctx, ctx_wr, reads, reading, read_push, releases, pending,
                 state):
        """COMMAND: the connection's context (read in the cycle the command was taken, then
        addressed by ``conn``) changed as ``cmd`` says."""
        with m.If(eq(cmd.op.as_value(), GatherOp.START.value)):
            # Octets of the old connection never released are abandoned: an entry among the
            # reads frees their place in turn.
            with m.If(~read_push & reads.w_rdy):
                entry = data.View(reading, reads.w_data)
                m.d.comb += [reads.w_en.eq(1), entry.conn.eq(conn), entry.end.eq(ctx.wseq),
                             ctx_wr.en.eq(1), ctx_wr.data.eq(_Context.const(_FRESH)),
                             ctx_wr.data.wseq.eq(ctx.wseq), ctx_wr.data.start.eq(ctx.wseq)]
                state.goto("IDLE")
        with m.Else():
            # FPDUS: only after the startup frame, whose end starts the first FPDU. Octets held
            # since (framed without markers) leave now: without markers, the whole FPDUs among
            # them as the first FPDUS piece, and framing goes on from there; with markers, the
            # framing was wrong, so all of them as EARLY, and framing is lost.
            awaiting = eq(ctx.mode.as_value(), _Mode.AWAIT.value)
            unreleased = wrap_sub(m, ctx.wseq[:16], ctx.start[:16], 16, "held_unreleased")
            length = Mux(cmd.markers, unreleased, ctx.held)
            give = awaiting & ~ctx.passing & ~is_zero(length)
            lost = give & cmd.markers
            entry = data.View(pending, releases.w_data)
            m.d.comb += [entry.read.conn.eq(conn), entry.read.seq.eq(ctx.start),
                         entry.read.length.eq(length),
                         entry.kind.eq(Mux(cmd.markers, ReleaseKind.EARLY, ReleaseKind.FPDUS)),
                         entry.crc.eq(~cmd.markers & cmd.crc), entry.first.eq(~cmd.markers),
                         entry.stored.eq(1)]   # position 0: the piece starts the first FPDU
            with m.If(~give | releases.w_rdy):
                m.d.comb += [ctx_wr.en.eq(1), ctx_wr.data.eq(ctx), releases.w_en.eq(give)]
                with m.If(awaiting):
                    m.d.comb += [ctx_wr.data.mode.eq(_Mode.FPDUS),
                                 ctx_wr.data.markers.eq(cmd.markers), ctx_wr.data.crc.eq(cmd.crc),
                                 ctx_wr.data.first.eq(~give | cmd.markers),
                                 ctx_wr.data.skip.eq(Mux(cmd.markers, _MARKER, 0)),
                                 ctx_wr.data.held.eq(0),
                                 ctx_wr.data.start.eq(wrap_add(m, ctx.start, length, 32,
                                                               "held_end"))]
                    with m.If(lost):
                        m.d.comb += ctx_wr.data.passing.eq(1)
                    with m.Elif(~ctx.passing):
                        m.d.comb += ctx_wr.data.kind.eq(ReleaseKind.FPDUS)
                state.goto("IDLE")

    def _release(self, m, cur, conn, first, kind, releases, pending, ctx_wr):
        """The chunk's piece (possibly empty) to the release queue; the context back, ``first``
        cleared once an FPDUS piece goes out (an empty piece is dropped, so it does not count).
        Before FPDU mode, octets are held only while a chunk still fits beside them: past that,
        framing is lost and they go as they are."""
        awaiting = eq(cur.mode.as_value(), _Mode.AWAIT.value)
        unreleased = wrap_sub(m, cur.wseq[:16], cur.start[:16], 16, "unreleased")
        passing = cur.passing | (awaiting & gt(unreleased, self.ring_bytes - self.max_chunk))
        end = Mux(passing, cur.wseq, cur.start)
        entry = data.View(pending, releases.w_data)
        length = wrap_sub(m, end, first, 32, "piece")[:16]
        fpdus = eq(kind.as_value(), ReleaseKind.FPDUS.value)
        m.d.comb += [releases.w_en.eq(1), entry.read.conn.eq(conn), entry.read.seq.eq(first),
                     entry.read.length.eq(length), entry.kind.eq(kind),
                     entry.position.eq(wrap_sub(m, first[:9], cur.origin, 9, "piece_position")),
                     entry.markers.eq(fpdus & cur.markers), entry.crc.eq(fpdus & cur.crc),
                     entry.first.eq(fpdus & cur.first), ctx_wr.en.eq(1)]
        with m.If(passing):
            m.d.comb += [ctx_wr.data.start.eq(cur.wseq), ctx_wr.data.passing.eq(1),
                         ctx_wr.data.held.eq(0)]
        with m.If(fpdus & ~is_zero(length)):
            m.d.comb += ctx_wr.data.first.eq(0)

    def _boundary(self, m, cur, offset):
        """A frame ends before stream offset ``offset``: the next begins there. After the
        startup frame, that is the first FPDU's offset; before FPDU mode, the frames that end
        are held (``start`` stays at the first FPDU)."""
        m.d.sync += [cur.framed.eq(0), cur.half.eq(0), cur.skip.eq(0)]
        with m.If(eq(cur.mode.as_value(), _Mode.STARTUP.value)):
            m.d.sync += [cur.start.eq(offset), cur.mode.eq(_Mode.AWAIT),
                         cur.kind.eq(ReleaseKind.EARLY), cur.origin.eq(offset[:9])]
        with m.Elif(eq(cur.mode.as_value(), _Mode.AWAIT.value)):
            m.d.sync += cur.held.eq(wrap_sub(m, offset[:16], cur.start[:16], 16, "held_next"))
        with m.Else():
            m.d.sync += cur.start.eq(offset)
            with m.If(cur.markers & same(offset[:9], cur.origin)):
                m.d.sync += cur.skip.eq(_MARKER)        # a leading marker

    def _markers(self, m, cur):
        """The wire length of the FPDU whose ULPDU_Length was just read: ``cur.need`` starts as
        the ULPDU and CRC octets, and :func:`~.framer.wire_length` adds the pad and the inner
        markers four cycles later (its three, and one to subtract what ``need`` began with).
        Returns ``counting`` (high meanwhile) and what `_frames` drives: the pulse that starts a
        count, the ULPDU_Length it counts for, and the octets by which ``need`` decreases."""
        start_count = Signal()
        count_length = Signal(16)
        decrease = Signal(len(cur.need), name="need_decrease")
        counting = Signal()
        # What `need` began with, and what it lacked: W less the leading marker, the
        # ULPDU_Length field, the ULPDU and the CRC field.
        counted, counted_extra = Signal(17), Signal(17)
        position = wrap_sub(m, cur.start[:9], cur.origin, 9, "frame_position")
        wired, on_wire = wire_length(m, start_count, count_length, position, cur.markers)
        with m.If(start_count):
            lead = Mux(cur.markers & is_zero(position), _MARKER + _LENGTH + _CRC, _LENGTH + _CRC)
            m.d.sync += [counting.eq(1),
                         counted.eq(wrap_add(m, widened(m, count_length, 17, "count_wide"),
                                             lead, 17, "count_bound"))]
        extra_ready = Signal()
        m.d.sync += [extra_ready.eq(wired),
                     counted_extra.eq(wrap_sub(m, on_wire, counted, 17, "count_extra"))]
        extra = Signal(len(cur.need))
        with m.If(extra_ready):
            m.d.comb += extra.eq(counted_extra)
            m.d.sync += counting.eq(0)
        less = wrap_sub(m, cur.need, decrease, len(cur.need), "need_less")
        m.d.sync += cur.need.eq(wrap_add(m, less, extra, len(cur.need), "need_next"))
        return counting, start_count, count_length, decrease

    def _frames(self, m, to_ring, cur, count, state):
        """RUN: the head beat, lane ``at`` on, as far as the next frame boundary or length
        field; the beat goes to the ring once all its octets are passed."""
        n = self.data_bytes
        count_w = n.bit_length()
        beat = self.i.payload
        at = Signal(count_w)        # lanes of the head beat passed
        k = keep_count(m, beat.keep, n, "beat_bytes")
        avail = wrap_sub(m, k, at, count_w, "avail")     # octets from lane `at` on
        step = Signal(count_w)      # octets passed this cycle
        take = wire(m, same(step, avail), "take")        # ... and with them the beat
        counting, start_count, count_length, decrease = count
        now = self.i.valid & to_ring.i.ready
        m.d.comb += [to_ring.i.valid.eq(self.i.valid & take), to_ring.i.payload.eq(beat),
                     self.i.ready.eq(take & to_ring.i.ready)]
        with m.If(now):
            m.d.sync += [cur.wseq.eq(wrap_add(m, cur.wseq, step, 32, "wseq_next")),
                         at.eq(Mux(take, 0, wrap_add(m, at, step, len(at), "at_next")))]
            with m.If(take & beat.last):
                state.goto("END")

        lane_w = max(len(at), len(cur.skip)) + 1
        lane = wrap_add(m, widened(m, at, lane_w, "at_wide"), cur.skip, lane_w, "field_lane")
        lanes = [beat.data[8 * j:8 * j + 8] for j in range(n)]
        octet = select(m, lane, lanes, 8, "field_octet")
        nxt = add(lane, 1)
        following = select(m, lane, lanes[1:] + [C(0, 8)], 8, "field_next") if n > 1 else C(0, 8)
        # Is the length field's first octet in this beat (after `skip`), and its second?
        cmp_w = max(count_w, len(cur.skip), len(lane)) + 1
        field_here = widened(m, avail, cmp_w, "avail_cmp") > widened(m, cur.skip, cmp_w, "skip_cmp")
        both_here = widened(m, nxt, cmp_w, "next_cmp") < widened(m, k, cmp_w, "beat_cmp")

        def field(value, octets):
            """The length field is ``value``; it ends ``octets`` lanes on."""
            m.d.comb += step.eq(octets)
            m.d.sync += [cur.half.eq(0), cur.skip.eq(0), cur.framed.eq(1)]
            with m.If(eq(cur.mode.as_value(), _Mode.STARTUP.value)):
                m.d.sync += cur.need.eq(value)
                with m.If(gt(value, MAX_PRIVATE_DATA)):
                    m.d.sync += cur.passing.eq(1)
            with m.Else():
                m.d.sync += cur.need.eq(add(widened(m, value, 17, "ulpdu_wide"), _CRC))
                m.d.comb += [start_count.eq(1), count_length.eq(value)]
                with m.If(gt(value, self.max_ulpdu)):
                    m.d.sync += cur.passing.eq(1)

        # How far this cycle goes in the head beat (`step`), by what comes next in it.
        with m.If(now):
            with m.If(cur.passing):
                # No framing: every octet goes.
                m.d.comb += step.eq(avail)
            with m.Elif(cur.framed):
                # need > avail, the high bits apart (a beat holds fewer than 2**count_w octets).
                with m.If(cur.need[count_w:].any() | (cur.need[:count_w] > avail)):
                    m.d.comb += [step.eq(avail), decrease.eq(avail)]
                with m.Elif(~counting):
                    # The frame ends `need` octets on, in this beat.
                    m.d.comb += step.eq(cur.need[:count_w])
                    self._boundary(m, cur, wrap_add(m, cur.wseq, cur.need, 32, "frame_end"))
            with m.Elif(~field_here):
                # The length field begins past this beat.
                m.d.comb += step.eq(avail)
                less = wrap_sub(m, cur.skip, avail[:len(cur.skip)], len(cur.skip), "skip_less")
                m.d.sync += cur.skip.eq(less)
            with m.Elif(cur.half):
                field(Cat(octet, cur.high), add(cur.skip, 1)[:count_w])
            with m.Elif(both_here):
                field(Cat(following, octet), add(cur.skip, 2)[:count_w])
            with m.Else():
                # Only its first octet is in this beat.
                m.d.comb += step.eq(avail)
                m.d.sync += [cur.high.eq(octet), cur.half.eq(1), cur.skip.eq(0)]
