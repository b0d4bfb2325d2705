"""A packet FIFO in block RAM: whole, good packets out; bad and overflowing ones rolled back."""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .exact import add, eq, is_zero
from .stream import BeatLayout, BeatStream, check_data_bytes

__all__ = ["PacketFifo", "OVERFLOW"]

#: What :class:`PacketFifo` does with a beat that finds it full.
OVERFLOW = ("drop", "stall")


def _next(m, ptr, depth, name):
    """``ptr + 1`` modulo ``depth``."""
    wire = Signal.like(ptr, name=name)
    if depth & (depth - 1):
        m.d.comb += wire.eq(Mux(eq(ptr, depth - 1), Const(0, len(ptr)), add(ptr, 1)))
    else:
        m.d.comb += wire.eq(add(ptr, 1))
    return wire


class PacketFifo(wiring.Component):
    """Store packets in a ``depth_beats``-beat memory and release each once it is whole and good.

    Ports
    -----
    i : In(BeatStream(data_bytes, err=True))
        Packets following the stream rules of :mod:`iwarp_nic.stream`. A packet whose last beat
        has ``err`` is *rolled back*: its beats already written are freed, it never appears on
        ``o``, and ``discarded`` counts it (its last beat never needs space, but with
        ``overflow="stall"`` it waits for a free beat like any other).
    o : Out(BeatStream(data_bytes))
        Committed packets, whole, in order: a packet becomes visible only after its last beat
        is written. Beats are exactly those written, minus ``err``.
    free : Out(range(depth_beats * data_bytes + 1))
        Free space in bytes: free beats times ``data_bytes``. Beats of the packet being written
        count as used until it is rolled back; beats count as free again from the cycle after
        they are read out of the memory (at most one beat before they leave ``o``).
    overflows : Out(32)
        With ``overflow="drop"``, packets dropped because a beat found no free beat in the
        memory (in the cycle it arrived; a beat read out in the same cycle is not counted on).
        The packet is rolled back and the rest of it taken and thrown away. Always 0 with
        ``overflow="stall"``. Wraps.
    discarded : Out(32)
        Packets rolled back for ``err`` (not those already dropped as overflows). Wraps.
    ended_kept, ended_overflow : Out(1)
        Strobes in the cycle a packet's last beat is taken: it was committed; or it had no
        ``err`` but was dropped as an overflow. (A packet ending in ``err`` raises neither.) A
        user that pairs packets with records made elsewhere learns the fate of each here.

    Back-pressure: with ``overflow="drop"`` ``i.ready`` is always 1; with ``overflow="stall"``
    it is 0 while no beat is free. A packet longer than ``depth_beats`` beats can never be
    committed: with ``"drop"`` it is always an overflow, with ``"stall"`` it deadlocks the FIFO
    (forbidden). ``o`` may stall at any time.

    Throughput: one beat per cycle in and one out at the same time, with no bubble within or
    between packets on ``o`` while committed beats remain. Latency: the first beat of a packet
    that finds ``o`` idle is offered two cycles after its last beat is taken on ``i``.

    Parameters
    ----------
    data_bytes : int
        The width, one of :data:`~iwarp_nic.stream.DATA_BYTES`.
    depth_beats : int
        Memory depth in beats, 2 or more (any number; a power of two maps best to block RAM).
    overflow : str
        One of :data:`OVERFLOW`.
    """

    def __init__(self, data_bytes, depth_beats, *, overflow="drop"):
        check_data_bytes(data_bytes)
        if not isinstance(depth_beats, int) or depth_beats < 2:
            raise ValueError(f"depth_beats must be an integer of 2 or more, not {depth_beats!r}")
        if overflow not in OVERFLOW:
            raise ValueError(f"overflow must be one of {OVERFLOW}, not {overflow!r}")
        self.data_bytes = data_bytes
        self.depth_beats = depth_beats
        self.overflow = overflow
        super().__init__({
            "i": In(BeatStream(data_bytes, err=True)),
            "o": Out(BeatStream(data_bytes)),
            "free": Out(range(depth_beats * data_bytes + 1)),
            "overflows": Out(32),
            "discarded": Out(32),
            "ended_kept": Out(1),
            "ended_overflow": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        n, depth = self.data_bytes, self.depth_beats
        m.submodules.memory = memory = Memory(shape=BeatLayout(n), depth=depth, init=[])
        wr = memory.write_port()
        rd = memory.read_port()
        beat = self.i.payload

        # Addresses: the next beat to write, the first beat of the packet being written (where
        # a rollback returns), the next beat to read. Counts in beats: free slots, beats of the
        # packet being written, committed beats not yet read.
        wr_ptr = Signal(range(depth))
        start_ptr = Signal(range(depth))
        rd_ptr = Signal(range(depth))
        free = Signal(range(depth + 1), init=depth)
        written = Signal(range(depth + 1))
        committed = Signal(range(depth + 1))
        dropping = Signal()                     # throwing away the rest of an overflow

        full = is_zero(free)
        stall = self.overflow == "stall"
        m.d.comb += self.i.ready.eq(~full if stall else 1)
        accept = self.i.valid & self.i.ready
        bad = beat.last & beat.err
        overflow = Const(0, 1) if stall else full & ~bad
        write = accept & ~dropping & ~bad & ~overflow
        commit = write & beat.last
        rollback = accept & ~dropping & (bad | overflow)

        m.d.comb += [wr.addr.eq(wr_ptr), wr.en.eq(write), wr.data.data.eq(beat.data),
                     wr.data.keep.eq(beat.keep), wr.data.last.eq(beat.last)]

        # The read port's data register is the output register: it advances when it is empty
        # or being taken, loading the next committed beat if there is one.
        out_valid = Signal()
        advance = ~out_valid | self.o.ready
        read = advance & ~is_zero(committed)
        m.d.comb += [rd.addr.eq(rd_ptr), rd.en.eq(advance), self.o.valid.eq(out_valid),
                     self.o.payload.eq(rd.data)]
        with m.If(advance):
            m.d.sync += out_valid.eq(read)
        with m.If(read):
            m.d.sync += rd_ptr.eq(_next(m, rd_ptr, depth, "rd_next"))

        wr_next = _next(m, wr_ptr, depth, "wr_next")
        with m.If(write):
            m.d.sync += [wr_ptr.eq(wr_next), written.eq(add(written, 1))]
            with m.If(beat.last):
                m.d.sync += [start_ptr.eq(wr_next), written.eq(0)]
        with m.If(rollback):
            m.d.sync += [wr_ptr.eq(start_ptr), written.eq(0)]
            with m.If(bad):
                m.d.sync += self.discarded.eq(add(self.discarded, 1))
            with m.Else():
                m.d.sync += self.overflows.eq(add(self.overflows, 1))
                m.d.sync += dropping.eq(~beat.last)
        with m.If(accept & dropping & beat.last):
            m.d.sync += dropping.eq(0)
        m.d.comb += [self.ended_kept.eq(commit),
                     self.ended_overflow.eq(accept & beat.last & ~beat.err
                                            & (dropping | overflow))]

        # free' = free - write + read (+ written on rollback); committed' = committed - read
        # (+ written + 1 on commit). Writes and rollbacks exclude each other.
        returned = Signal.like(free)
        m.d.comb += returned.eq(Mux(rollback, written, Const(0, len(free))))
        freed = (free + returned)[:len(free)]
        with m.If(write & ~read):
            m.d.sync += free.eq(add(free, -1))
        with m.Elif(read & ~write):
            m.d.sync += free.eq(add(freed, 1))
        with m.Elif(rollback):
            m.d.sync += free.eq(freed)
        gained = Signal.like(committed)
        m.d.comb += gained.eq(Mux(commit, add(written, 1), Const(0, len(committed))))
        with m.If(read):
            m.d.sync += committed.eq(add((committed + gained)[:len(committed)], -1))
        with m.Else():
            m.d.sync += committed.eq((committed + gained)[:len(committed)])

        lanes = n.bit_length() - 1
        m.d.comb += self.free.eq(Cat(Const(0, lanes), free) if lanes else free)
        return m
