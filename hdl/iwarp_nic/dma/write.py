"""DMA writes to host memory over the write channels of an AXI4 manager port: ARM IHI 0022,
A3.2 (channel handshakes), A3.3 (write response after the write data's last transfer; write
data may not lead its address here), A3.4.1 (INCR bursts, 4 KiB boundary, at most 256 beats),
A3.4.3 (unaligned start address, write strobes), A3.4.4 (``bresp``).
"""

from amaranth import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..axi import Axi4, Burst
from ..exact import add, same, wire
from ..stream import BeatStream, SkidBuffer
from .align import LanePad, StrobeLayout
from .split import BurstLayout, BurstSplitter, DmaCommand, DmaDone, check_dma, take_commands

__all__ = ["DmaWriter", "drive_constants"]

#: ``axcache``: Normal Non-cacheable Bufferable (A4.4), the usual value for a DMA engine.
CACHE = 0b0011


def drive_constants(m, axi, channel, data_bytes):
    """Drive the fixed fields of ``channel`` ("aw" or "ar") of ``axi``: ID 0 (one ID, so
    responses come in order, A5.3), full-width beats, INCR, normal access, unprivileged
    secure data access."""
    m.d.comb += [
        getattr(axi, f"{channel}id").eq(0),
        getattr(axi, f"{channel}size").eq(data_bytes.bit_length() - 1),
        getattr(axi, f"{channel}burst").eq(Burst.INCR),
        getattr(axi, f"{channel}lock").eq(0),
        getattr(axi, f"{channel}cache").eq(CACHE),
        getattr(axi, f"{channel}prot").eq(0),
    ]


class DmaWriter(wiring.Component):
    """Write each command's bytes to host memory with AXI4 INCR bursts, and report when each
    command's writes are all acknowledged.

    Ports
    -----
    i_command : In(stream.Signature(DmaCommand))
        Write ``length`` bytes at ``addr`` (any alignment; must not wrap the address space).
        Length 0 writes nothing (no data packet, no burst) but still gets its ``o_done``.
    i_data : In(BeatStream(data_bytes))
        One packet per command of length 1 or more, in command order, exactly ``length`` bytes
        (stream rules of :mod:`iwarp_nic.stream`). It may be offered before, with or after its
        command; a beat is taken only after its command has been. A packet of another length
        breaks the bursts' beat counts: what is written is undefined, and the writer may hang.
    o_done : Out(stream.Signature(DmaDone))
        One transfer per command, in command order, once every burst of it has its write
        response (``error``: any was not OKAY); a length-0 command's comes in its turn, with
        ``error`` 0. A completion posted after a command's ``o_done`` is ordered after its data.
    m_axi : Out(Axi4(addr_width=addr_width, data_bytes=data_bytes, id_width=id_width))
        The write channels (AW, W, B). The read channels are idle (``arvalid`` and ``rready``
        low).

    The bursts: cut at every ``min(max_burst * data_bytes, 4096)`` bytes of address (see
    :mod:`.split`), so never across 4 KiB and never more than ``max_burst`` beats; ``awsize`` is
    the full width, ``awburst`` INCR, ID 0. The data is shifted to the address's lane
    (:class:`~.align.LanePad`); ``wstrb`` covers exactly the command's bytes. A burst's W beats
    leave only after its AW transfer (an AW FIFO of burst lengths gives ``wlast``).

    Outstanding: at most ``outstanding`` bursts between leaving the splitter and their write
    response (a length-0 command takes one place too), so AW runs ahead of W by up to that
    many bursts and B may lag as far.

    Throughput: one W beat per cycle in steady state, across bursts and back-to-back commands
    (a command whose bytes spill into one more beat than it has input beats takes one input
    beat's cycle for that beat, W itself staying busy); the AW channel one burst per cycle.
    Latency (no stalls, the writer idle): AW is transferred 2 cycles after the command is taken,
    the first W beat 5 cycles after (its data offered with the command); ``o_done`` is offered
    the cycle after the command's last write response. Back-pressure: any channel may stall at
    any time; ``bready`` is high while the ``o_done`` register slice has room.
    """

    def __init__(self, data_bytes, *, max_burst=16, outstanding=16, addr_width=64, id_width=4):
        check_dma(data_bytes, max_burst=max_burst, outstanding=outstanding,
                  addr_width=addr_width)
        self.data_bytes, self.max_burst = data_bytes, max_burst
        self.outstanding, self.addr_width, self.id_width = outstanding, addr_width, id_width
        super().__init__({
            "i_command": In(stream.Signature(DmaCommand)),
            "i_data": In(BeatStream(data_bytes)),
            "o_done": Out(stream.Signature(DmaDone)),
            "m_axi": Out(Axi4(addr_width=addr_width, data_bytes=data_bytes, id_width=id_width)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        lanes = n.bit_length() - 1
        axi, cmd = self.m_axi, self.i_command
        m.submodules.split = split = BurstSplitter(n, max_burst=self.max_burst,
                                                   addr_width=self.addr_width)
        m.submodules.pad = pad = LanePad(n)
        # Each data packet's lane offset, queued as its command is taken.
        m.submodules.offsets = offsets = SyncFIFOBuffered(width=lanes, depth=4)
        # Every burst (and length-0 command) until its response: `last` of its command, `empty`.
        m.submodules.track = track = SyncFIFOBuffered(width=2, depth=self.outstanding)
        # Every burst's awlen from its AW transfer until its last W beat.
        m.submodules.wlens = wlens = SyncFIFOBuffered(width=8, depth=self.outstanding)
        m.submodules.aw = aw = SkidBuffer(BurstLayout(n, self.addr_width))
        m.submodules.w = w = SkidBuffer(StrobeLayout(n))
        m.submodules.done = done = SkidBuffer(DmaDone)

        # Commands: into the splitter, and a non-empty one's offset into `offsets`.
        take_commands(m, cmd, split, offsets)

        # Bursts: each takes a place in `track`; the non-empty ones go to AW through `aw`.
        burst = split.o.payload
        m.d.comb += [
            track.w_data.eq(Cat(burst.last, burst.empty)),
            track.w_en.eq(split.o.valid & split.o.ready),
            split.o.ready.eq(track.w_rdy & (burst.empty | aw.i.ready)),
            aw.i.valid.eq(split.o.valid & track.w_rdy & ~burst.empty),
            aw.i.payload.eq(burst),
        ]
        drive_constants(m, axi, "aw", n)
        # wlens has room for every burst in `track`; its w_rdy only guards.
        m.d.comb += [
            axi.awvalid.eq(aw.o.valid & wlens.w_rdy), aw.o.ready.eq(axi.awready & wlens.w_rdy),
            axi.awaddr.eq(aw.o.payload.addr), axi.awlen.eq(aw.o.payload.len),
            wlens.w_en.eq(axi.awvalid & axi.awready), wlens.w_data.eq(aw.o.payload.len),
        ]

        # Data: shifted to its lanes, cut into bursts by the AW lengths, out through `w`.
        wiring.connect(m, wiring.flipped(self.i_data), pad.i)
        m.d.comb += [
            pad.i_count.valid.eq(offsets.r_rdy), pad.i_count.payload.eq(offsets.r_data),
            offsets.r_en.eq(pad.i_count.ready),
        ]
        beat_no = Signal(8)                     # the beat within its burst
        wlast = wire(m, same(beat_no, wlens.r_data), "wlast")
        m.d.comb += [
            w.i.valid.eq(pad.o.valid & wlens.r_rdy),
            pad.o.ready.eq(w.i.ready & wlens.r_rdy),
            w.i.payload.data.eq(pad.o.payload.data), w.i.payload.strb.eq(pad.o.payload.strb),
            w.i.payload.last.eq(wlast),
            wlens.r_en.eq(w.i.valid & w.i.ready & wlast),
        ]
        with m.If(w.i.valid & w.i.ready):
            m.d.sync += beat_no.eq(add(beat_no, 1))
            with m.If(wlast):
                m.d.sync += beat_no.eq(0)
        m.d.comb += [
            axi.wvalid.eq(w.o.valid), w.o.ready.eq(axi.wready),
            axi.wdata.eq(w.o.payload.data), axi.wstrb.eq(w.o.payload.strb),
            axi.wlast.eq(w.o.payload.last),
        ]

        # Responses, in order (one ID): fold each command's into one `o_done`.
        last, empty = track.r_data[0], track.r_data[1]
        failed = Signal()                       # a response of this command so far was not OKAY
        bad = wire(m, axi.bresp.any(), "bad")
        m.d.comb += [
            axi.bready.eq(track.r_rdy & ~empty & done.i.ready),
            done.i.valid.eq(track.r_rdy & done.i.ready & (empty | (axi.bvalid & last))),
            done.i.payload.error.eq(~empty & (failed | bad)),
            track.r_en.eq(done.i.ready & (empty | axi.bvalid)),
        ]
        with m.If(axi.bvalid & axi.bready):
            m.d.sync += failed.eq(~last & (failed | bad))
        wiring.connect(m, done.o, wiring.flipped(self.o_done))

        # The read channels are not used.
        m.d.comb += [axi.arvalid.eq(0), axi.rready.eq(0), axi.araddr.eq(0), axi.arlen.eq(0)]
        drive_constants(m, axi, "ar", n)
        return m
