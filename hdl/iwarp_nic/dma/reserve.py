"""A read client's data buffer, reserved before each read is issued, so that the client never
holds up the read data of the others (ARM IHI 0022 A5.3: with one ID, read data returns in
request order, so a client that stalls its data stalls every read issued after it).

The :class:`~.read.DmaReader` has no read-data buffer and returns every client's data in the
order of the reads. A client whose data waits for something that itself waits for another
client's read (the send queue's next entry waits until the issuer has taken the entry before,
and the issuer waits for that entry's payload, read after it) would deadlock the reader.
:class:`ReadReserve` in front of such a client takes the data into a buffer as it comes and
lets a read through only once the buffer has room for all of its data.
"""

from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..exact import add, widened
from ..stream import BeatLayout, BeatStream, check_data_bytes
from .split import DmaCommand

__all__ = ["ReadReserve"]


class ReadReserve(wiring.Component):
    """Issue a client's reads only when its data has a place, and buffer the data.

    Ports
    -----
    i_command, o_command : In(stream.Signature(DmaCommand)), Out(...)
        The client's reads, passed on unchanged once ``beats`` less those reserved by the
        reads before it (issued, and their data not yet taken from ``o_data``) can hold its
        ``ceil(length / data_bytes)`` beats. A read must need at most ``beats`` beats (the
        clients here read fixed-size descriptors and operands, or payloads of at most a
        segment). A read of length 0 reserves nothing (it returns nothing).
    i_data, o_data : In(BeatStream(data_bytes, err=True)), Out(...)
        The reads' data, as the reader returns it (packed from lane 0), through a FIFO of
        ``beats`` beats. ``i_data`` is always ready for the data of the reads passed on.

    Latency: a read passes in the cycle it is offered when there is room (combinational);
    data leaves the FIFO one cycle after it entered. Throughput: a read and a beat per cycle.
    """

    def __init__(self, data_bytes, beats):
        self.data_bytes = check_data_bytes(data_bytes)
        if not isinstance(beats, int) or beats < 1:
            raise ValueError(f"beats must be a positive integer, not {beats!r}")
        self.beats = beats
        super().__init__({
            "i_command": In(stream.Signature(DmaCommand)),
            "o_command": Out(stream.Signature(DmaCommand)),
            "i_data": In(BeatStream(data_bytes, err=True)),
            "o_data": Out(BeatStream(data_bytes, err=True)),
        })

    def elaborate(self, platform):
        m = Module()
        n, layout = self.data_bytes, BeatLayout(self.data_bytes, err=True)
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=layout.size, depth=max(2, self.beats))
        shift = n.bit_length() - 1
        width = max(self.beats.bit_length(), 17 - shift)
        free = Signal(width, init=self.beats)       # beats not reserved
        need = Signal(width)                        # the offered read's beats
        length = widened(m, self.i_command.payload.length, 17, "length")
        m.d.comb += need.eq((add(length, n - 1) if n > 1 else length) >> shift)
        room = free >= need
        cmd_in, cmd_out = self.i_command, self.o_command
        m.d.comb += [cmd_out.payload.eq(cmd_in.payload),
                     cmd_out.valid.eq(cmd_in.valid & room),
                     cmd_in.ready.eq(cmd_out.ready & room)]
        issued = cmd_in.valid & cmd_in.ready
        left = self.o_data.valid & self.o_data.ready
        with m.If(issued):
            m.d.sync += free.eq((free - need)[:width] + left)
        with m.Elif(left):
            m.d.sync += free.eq(add(free, 1))

        m.d.comb += [fifo.w_data.eq(self.i_data.payload), fifo.w_en.eq(self.i_data.valid),
                     self.i_data.ready.eq(fifo.w_rdy),
                     self.o_data.payload.eq(fifo.r_data), self.o_data.valid.eq(fifo.r_rdy),
                     fifo.r_en.eq(self.o_data.ready)]
        return m
