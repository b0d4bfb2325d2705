"""DMA reads from host memory over the read channels of an AXI4 manager port: ARM IHI 0022,
A3.2 (channel handshakes), A3.4.1 (INCR bursts, 4 KiB boundary, at most 256 beats), A3.4.3
(unaligned start address: the lanes below it carry no data of the burst), A3.4.4 (``rresp``),
A5.3 (one ID: read data returns in request order).
"""

from amaranth import C, Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..axi import Axi4
from ..exact import lt, mask, wire
from ..stream import BeatLayout, BeatStream, SkidBuffer
from ..trim import HeadTrim
from .split import BurstLayout, BurstSplitter, DmaCommand, check_dma, take_commands
from .write import drive_constants

__all__ = ["DmaReader"]


class DmaReader(wiring.Component):
    """Read each command's bytes from host memory with AXI4 INCR bursts and return them as one
    packet per command.

    Ports
    -----
    i_command : In(stream.Signature(DmaCommand))
        Read ``length`` bytes at ``addr`` (any alignment; must not wrap the address space). A
        command of length 0 is taken and dropped: it reads nothing and returns nothing (a
        stream has no empty packets), so a user must not wait for its data.
    o_data : Out(BeatStream(data_bytes, err=True))
        One packet per command of length 1 or more, in command order: its ``length`` bytes
        packed from lane 0 (the bytes before ``addr`` in the first beat and past the last byte
        in the last are dropped), by the stream rules of :mod:`iwarp_nic.stream`. ``err`` on
        the last beat when any of the command's read responses was not OKAY (the data of such
        a beat is whatever the subordinate returned).
    m_axi : Out(Axi4(addr_width=addr_width, data_bytes=data_bytes, id_width=id_width))
        The read channels (AR, R). The write channels are idle (``awvalid``, ``wvalid`` and
        ``bready`` low).

    The bursts are cut as :class:`~.write.DmaWriter` cuts them (:mod:`.split`): never across
    4 KiB, at most ``max_burst`` beats, full-width ``arsize``, INCR, ID 0 (so R comes in order).

    Outstanding: at most ``outstanding`` bursts between leaving the splitter and their last R
    beat. There is no read-data buffer: ``rready`` follows ``o_data``'s back-pressure (through
    two registers), so a read is issued whenever there is a place for it, and a stalled
    ``o_data`` stalls R.

    Throughput: one R beat per cycle in steady state, across bursts and back-to-back commands,
    and one ``o_data`` beat per R beat that holds one of the command's output beats (a command
    whose first beat holds fewer bytes than its offset leaves a beat fewer than it reads).
    Latency (no stalls, the reader idle): AR is transferred 2 cycles after the command is
    taken; an ``o_data`` beat is offered 2 or 3 cycles after the R transfer that completes it.
    Back-pressure: any channel may stall at any time.
    """

    def __init__(self, data_bytes, *, max_burst=16, outstanding=16, addr_width=64, id_width=4):
        check_dma(data_bytes, max_burst=max_burst, outstanding=outstanding,
                  addr_width=addr_width)
        self.data_bytes, self.max_burst = data_bytes, max_burst
        self.outstanding, self.addr_width, self.id_width = outstanding, addr_width, id_width
        super().__init__({
            "i_command": In(stream.Signature(DmaCommand)),
            "o_data": Out(BeatStream(data_bytes, err=True)),
            "m_axi": Out(Axi4(addr_width=addr_width, data_bytes=data_bytes, id_width=id_width)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        lanes = n.bit_length() - 1
        axi, cmd = self.m_axi, self.i_command
        m.submodules.split = split = BurstSplitter(n, max_burst=self.max_burst,
                                                   addr_width=self.addr_width)
        m.submodules.trim = trim = HeadTrim(n, lanes, err=True)
        # Each command's lane offset (the bytes to drop), queued as the command is taken.
        m.submodules.offsets = offsets = SyncFIFOBuffered(width=lanes, depth=self.outstanding)
        # Every burst from the splitter to its last R beat: `last` of its command, `end` lane.
        m.submodules.track = track = SyncFIFOBuffered(width=1 + lanes, depth=self.outstanding)
        m.submodules.ar = ar = SkidBuffer(BurstLayout(n, self.addr_width))
        m.submodules.out = out = SkidBuffer(BeatLayout(n, err=True))

        take_commands(m, cmd, split, offsets)

        # Bursts: each takes a place in `track` and goes to AR through `ar`; a length-0
        # command's transfer is dropped.
        burst = split.o.payload
        m.d.comb += [
            track.w_data.eq(Cat(burst.last, burst.end)),
            track.w_en.eq(split.o.valid & split.o.ready & ~burst.empty),
            split.o.ready.eq(burst.empty | (ar.i.ready & track.w_rdy)),
            ar.i.valid.eq(split.o.valid & track.w_rdy & ~burst.empty),
            ar.i.payload.eq(burst),
        ]
        drive_constants(m, axi, "ar", n)
        m.d.comb += [
            axi.arvalid.eq(ar.o.valid), ar.o.ready.eq(axi.arready),
            axi.araddr.eq(ar.o.payload.addr), axi.arlen.eq(ar.o.payload.len),
        ]

        # Read data: the command's beats, its last one's keep ending at its last byte, then
        # trimmed of the bytes before its address.
        last, end = track.r_data[0], track.r_data[1:]
        final = wire(m, axi.rlast & last, "final")
        failed = Signal()                       # a response of this command so far was not OKAY
        bad = wire(m, axi.rresp.any(), "bad")
        upto = Cat(C(1, 1), *(~lt(end, k) for k in range(1, n)))
        beat = trim.i.payload
        m.d.comb += [
            trim.i.valid.eq(axi.rvalid & track.r_rdy),
            axi.rready.eq(trim.i.ready & track.r_rdy),
            beat.data.eq(axi.rdata),
            beat.keep.eq(Mux(final, upto, Const(mask(n), n))),
            beat.last.eq(final), beat.err.eq(final & (failed | bad)),
            track.r_en.eq(axi.rvalid & axi.rready & axi.rlast),
            trim.i_count.valid.eq(offsets.r_rdy), trim.i_count.payload.eq(offsets.r_data),
            offsets.r_en.eq(trim.i_count.ready),
        ]
        with m.If(axi.rvalid & axi.rready):
            m.d.sync += failed.eq(~final & (failed | bad))
        wiring.connect(m, trim.o, out.i)
        wiring.connect(m, out.o, wiring.flipped(self.o_data))

        # The write channels are not used.
        m.d.comb += [axi.awvalid.eq(0), axi.wvalid.eq(0), axi.bready.eq(0), axi.awaddr.eq(0),
                     axi.awlen.eq(0), axi.wdata.eq(0), axi.wstrb.eq(0), axi.wlast.eq(0)]
        drive_constants(m, axi, "aw", n)
        return m
