"""Block RAM as an AXI4 subordinate (ARM IHI 0022, the AXI and ACE protocol specification:
A3 handshakes and channels, A3.4 bursts, A3.4.4 responses): host memory for a NIC with no
host, such as a board's memory target (``boards/``), with a word port of its own for the
gateware that plays the host.

:class:`AxiRam` holds ``size`` octets at ``base`` (``size`` a power of two of at least 4 KiB,
``base`` a multiple of it), byte ``base + i`` on lane ``i % data_bytes`` (little-endian, as
AXI places them).
"""

from amaranth import Module, Mux, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .axi import BOUNDARY, Axi4, Burst, Resp
from .exact import add, eq, is_zero, ne, sub
from .host.axil import ReadDone, ReadRequest, WriteDone, WriteRequest

__all__ = ["AxiRam"]


class AxiRam(wiring.Component):
    """``size`` octets of block RAM at ``base`` on an AXI4 subordinate port of ``data_bytes``
    lanes, initialised to ``init`` (octets from ``base``; zeros after them).

    Ports
    -----
    s_axi : In(Axi4(addr_width=addr_width, data_bytes=data_bytes, id_width=id_width))
        Verilog ``s_axi_*``.
    i_write, o_write_done, i_read, o_read
        The word port, for the host's gateware: the streams of
        :class:`~iwarp_nic.host.axil.AxiLiteManager` with ``log2(size)``-bit addresses (the
        offset from ``base``, aligned down to a word) and ``data_bytes``-wide words; a write
        stores the octets ``strb`` selects. ``error`` is always 0. One write and one read at a
        time: a request is taken when its side of ``s_axi`` has no burst in progress (an
        address transfer in the same cycle uses no RAM port: the burst's first beat comes a
        cycle later), and its answer is offered from a register the next cycle (a read's two
        cycles later).

    A burst is decoded by its first address: AXI4 keeps a burst inside 4 KiB, and the RAM is
    a whole number of 4 KiB pages, so a burst is entirely inside or entirely outside it. A
    burst outside it is answered DECERR; one the RAM does not take (``axsize`` narrower than
    the lanes, or a FIXED or WRAP burst) SLVERR. Neither writes anything; such a read
    returns zeros. Every other burst is OKAY: a write stores the octets whose ``wstrb`` bit
    is set (any start address: the first beat's lanes below it are the manager's to strobe
    off), a read returns whole beats.

    One write burst and one read burst are in progress at a time, each independently.
    Throughput: a beat per cycle on W and on R once a burst has started; between bursts,
    writes take 2 cycles more (AW, then B) and reads 2 (AR, then the first beat; the RAM's
    read latency is 1). ``wlast`` ends a write burst (``awlen`` is not counted); back-pressure
    on B or R holds the channel, never loses a beat.
    """

    def __init__(self, data_bytes, size, *, base=0, init=b"", addr_width=64, id_width=4):
        if data_bytes not in (1, 2, 4, 8, 16, 32, 64, 128):
            raise ValueError(f"data_bytes must be a power of two from 1 to 128, not "
                             f"{data_bytes!r}")
        if size < BOUNDARY or size & (size - 1):
            raise ValueError(f"size must be a power of two of at least {BOUNDARY}, not {size}")
        if base % size or not 0 <= base < 1 << addr_width:
            raise ValueError(f"base {base:#x} must be a multiple of size {size:#x} inside the "
                             f"{addr_width}-bit address space")
        if len(init) > size:
            raise ValueError(f"init holds {len(init)} octets, more than size {size}")
        self.data_bytes, self.size, self.base = data_bytes, size, base
        self._init = bytes(init)
        offset_bits = size.bit_length() - 1
        super().__init__({
            "s_axi": In(Axi4(addr_width=addr_width, data_bytes=data_bytes, id_width=id_width)),
            "i_write": In(stream.Signature(WriteRequest(offset_bits, data_bytes))),
            "o_write_done": Out(stream.Signature(WriteDone)),
            "i_read": In(stream.Signature(ReadRequest(offset_bits))),
            "o_read": Out(stream.Signature(ReadDone(data_bytes))),
        })

    def _decode(self, m, addr, size, burst, name):
        """(the burst's first beat in the RAM, its response): OKAY, DECERR or SLVERR."""
        n, depth = self.data_bytes, self.size // self.data_bytes
        lane_bits, beat_bits = n.bit_length() - 1, depth.bit_length() - 1
        inside = Signal(name=f"{name}_inside")
        resp = Signal(2, name=f"{name}_resp")
        page = lane_bits + beat_bits
        m.d.comb += inside.eq(eq(addr[page:], self.base >> page))
        with m.If(~inside):
            m.d.comb += resp.eq(Resp.DECERR)
        with m.Elif(ne(size, lane_bits) | ne(burst, Burst.INCR)):
            m.d.comb += resp.eq(Resp.SLVERR)
        with m.Else():
            m.d.comb += resp.eq(Resp.OKAY)
        return addr[lane_bits:lane_bits + beat_bits], resp

    def elaborate(self, platform):
        m = Module()
        n, depth = self.data_bytes, self.size // self.data_bytes
        axi = self.s_axi
        words = [int.from_bytes(self._init[i:i + n].ljust(n, b"\0"), "little")
                 for i in range(0, len(self._init), n)]
        m.submodules.memory = memory = Memory(shape=unsigned(8 * n), depth=depth, init=words)
        write = memory.write_port(granularity=8)
        read = memory.read_port()

        lane_bits = n.bit_length() - 1

        # -- writes: AW, the W beats, B; between bursts, the word port -----------------------
        w_beat = Signal.like(write.addr)
        w_resp = Signal(2)
        w_id = Signal.like(axi.bid)
        w_busy = Signal()
        local_w, local_done = self.i_write, self.o_write_done
        local_w_take = Signal()
        aw_beat, aw_resp = self._decode(m, axi.awaddr, axi.awsize, axi.awburst, "aw")
        m.d.comb += [
            local_w.ready.eq(~w_busy & ~local_done.valid),
            local_w_take.eq(local_w.valid & local_w.ready),
            axi.awready.eq(~w_busy & ~axi.bvalid),
            axi.wready.eq(w_busy),
            write.addr.eq(Mux(w_busy, w_beat, local_w.payload.addr[lane_bits:])),
            write.data.eq(Mux(w_busy, axi.wdata, local_w.payload.data)),
            axi.bid.eq(w_id), axi.bresp.eq(w_resp),
        ]
        with m.If(local_w_take):
            m.d.comb += write.en.eq(local_w.payload.strb)
            m.d.sync += local_done.valid.eq(1)
        with m.If(local_done.valid & local_done.ready):
            m.d.sync += local_done.valid.eq(0)
        with m.If(axi.awvalid & axi.awready):
            m.d.sync += [w_busy.eq(1), w_beat.eq(aw_beat), w_resp.eq(aw_resp),
                         w_id.eq(axi.awid)]
        with m.If(axi.wvalid & axi.wready):
            m.d.comb += write.en.eq(Mux(is_zero(w_resp), axi.wstrb, 0))
            m.d.sync += w_beat.eq(add(w_beat, 1))
            with m.If(axi.wlast):
                m.d.sync += [w_busy.eq(0), axi.bvalid.eq(1)]
        with m.If(axi.bvalid & axi.bready):
            m.d.sync += axi.bvalid.eq(0)

        # -- reads: AR, then one beat a cycle while R takes them; between bursts, the word
        # port (its word is kept in a register of its own, so a burst may start at once)
        r_beat = Signal.like(read.addr)
        r_left = Signal.like(axi.arlen)
        r_busy = Signal()
        r_resp = Signal(2)
        advance = Signal()
        local_r, local_answer = self.i_read, self.o_read
        local_r_take, local_r_read = Signal(), Signal()
        ar_beat, ar_resp = self._decode(m, axi.araddr, axi.arsize, axi.arburst, "ar")
        m.d.comb += [
            local_r.ready.eq(~r_busy & ~axi.rvalid & ~local_r_read & ~local_answer.valid),
            local_r_take.eq(local_r.valid & local_r.ready),
            axi.arready.eq(~r_busy & ~axi.rvalid),
            advance.eq(~axi.rvalid | axi.rready),
            read.addr.eq(Mux(r_busy, r_beat, local_r.payload.addr[lane_bits:])),
            read.en.eq((advance & r_busy) | local_r_take),
            axi.rdata.eq(Mux(is_zero(axi.rresp), read.data, 0)),
        ]
        m.d.sync += local_r_read.eq(local_r_take)
        with m.If(local_r_read):
            m.d.sync += [local_answer.valid.eq(1), local_answer.payload.data.eq(read.data)]
        with m.If(local_answer.valid & local_answer.ready):
            m.d.sync += local_answer.valid.eq(0)
        with m.If(axi.arvalid & axi.arready):
            m.d.sync += [r_busy.eq(1), r_beat.eq(ar_beat), r_left.eq(axi.arlen),
                         r_resp.eq(ar_resp), axi.rid.eq(axi.arid)]
        with m.If(advance):
            m.d.sync += [axi.rvalid.eq(r_busy), axi.rlast.eq(is_zero(r_left)),
                         axi.rresp.eq(r_resp)]
            with m.If(r_busy):
                m.d.sync += [r_beat.eq(add(r_beat, 1)), r_left.eq(sub(r_left, 1))]
                with m.If(is_zero(r_left)):
                    m.d.sync += r_busy.eq(0)
        return m
