"""Block RAM as an AXI4 subordinate (ARM IHI 0022, the AXI and ACE protocol specification:
A3 handshakes and channels, A3.4 bursts, A3.4.4 responses): host memory for a NIC with no
host, such as a board's memory target (``boards/``).

:class:`AxiRam` holds ``size`` octets at ``base`` (``size`` a power of two of at least 4 KiB,
``base`` a multiple of it), byte ``base + i`` on lane ``i % data_bytes`` (little-endian, as
AXI places them).
"""

from amaranth import Module, Mux, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In

from .axi import BOUNDARY, Axi4, Burst, Resp
from .exact import add, eq, is_zero, ne, sub

__all__ = ["AxiRam"]


class AxiRam(wiring.Component):
    """``size`` octets of block RAM at ``base`` on an AXI4 subordinate port of ``data_bytes``
    lanes, initialised to ``init`` (octets from ``base``; zeros after them).

    Ports
    -----
    s_axi : In(Axi4(addr_width=addr_width, data_bytes=data_bytes, id_width=id_width))
        Verilog ``s_axi_*``.

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
        super().__init__({"s_axi": In(Axi4(addr_width=addr_width, data_bytes=data_bytes,
                                           id_width=id_width))})

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

        # -- writes: AW, the W beats, B --------------------------------------------------
        w_beat = Signal.like(write.addr)
        w_resp = Signal(2)
        w_id = Signal.like(axi.bid)
        w_busy = Signal()
        aw_beat, aw_resp = self._decode(m, axi.awaddr, axi.awsize, axi.awburst, "aw")
        m.d.comb += [
            axi.awready.eq(~w_busy & ~axi.bvalid),
            axi.wready.eq(w_busy),
            write.addr.eq(w_beat), write.data.eq(axi.wdata),
            axi.bid.eq(w_id), axi.bresp.eq(w_resp),
        ]
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

        # -- reads: AR, then one beat a cycle while R takes them -----------------------------
        r_beat = Signal.like(read.addr)
        r_left = Signal.like(axi.arlen)
        r_busy = Signal()
        r_resp = Signal(2)
        advance = Signal()
        ar_beat, ar_resp = self._decode(m, axi.araddr, axi.arsize, axi.arburst, "ar")
        m.d.comb += [
            axi.arready.eq(~r_busy & ~axi.rvalid),
            advance.eq(~axi.rvalid | axi.rready),
            read.addr.eq(r_beat), read.en.eq(advance & r_busy),
            axi.rdata.eq(Mux(is_zero(axi.rresp), read.data, 0)),
        ]
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
