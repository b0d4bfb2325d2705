"""ARM IHI 0022 (AMBA AXI and ACE protocol specification), part B: AXI4-Lite as streams of
register accesses, both ways.

:class:`AxiLiteTarget`, a subordinate: the write address and write data channels are joined
into one write request; its answer becomes the write response. The read address channel
becomes a read request; its answer the read data channel. The protection bits (``awprot``,
``arprot``) are ignored.

:class:`AxiLiteManager`, a manager, the other way round: the same request streams become bus
transactions and the responses come back as the same answers, for a gateware host (a board
with no CPU) that drives a register map.
"""

from amaranth import Cat, Const, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.wiring import In, Out

from ..axi import AxiLite

__all__ = ["WriteRequest", "WriteDone", "ReadRequest", "ReadDone", "AxiLiteTarget",
           "AxiLiteManager"]


def WriteRequest(addr_width, data_bytes):
    """One write: the word-aligned byte address, the data and its byte strobes."""
    return StructLayout({"addr": addr_width, "data": 8 * data_bytes, "strb": data_bytes})


#: The answer to a write: ``error`` gives SLVERR, else OKAY.
WriteDone = StructLayout({"error": 1})


def ReadRequest(addr_width):
    """One read: the word-aligned byte address."""
    return StructLayout({"addr": addr_width})


def ReadDone(data_bytes):
    """The answer to a read: the data, and ``error`` for SLVERR (else OKAY)."""
    return StructLayout({"data": 8 * data_bytes, "error": 1})


def _resp(error):
    """``bresp``/``rresp`` for an error bit: SLVERR (0b10) or OKAY (0b00)."""
    return Cat(Const(0, 1), error)


class AxiLiteTarget(wiring.Component):
    """An AXI4-Lite subordinate: each write and each read becomes one request on a stream, and
    the answer to it the AXI response.

    Ports
    -----
    s_axil : In(AxiLite(addr_width=addr_width, data_bytes=data_bytes))
        The bus (Verilog ports ``s_axil_awaddr``, ...).
    o_write : Out(stream.Signature(WriteRequest(addr_width, data_bytes)))
        One transfer per write, offered once both its AW and W transfers have been taken (in
        either order, or in one cycle): ``addr`` is ``awaddr`` with its low
        ``log2(data_bytes)`` bits cleared, ``data``/``strb`` are ``wdata``/``wstrb``.
    i_write_done : In(stream.Signature(WriteDone))
        One answer per ``o_write`` transfer, in order; it is the B response (``bvalid`` is its
        ``valid``, ``bready`` its ``ready``, combinationally): OKAY, or SLVERR with ``error``.
    o_read : Out(stream.Signature(ReadRequest(addr_width)))
        One transfer per AR transfer, the address aligned as for writes.
    i_read : In(stream.Signature(ReadDone(data_bytes)))
        One answer per ``o_read`` transfer, in order; it is the R channel, combinationally
        (``rvalid``/``rready``/``rdata``, ``rresp`` OKAY or SLVERR). A responder should offer
        it from registers.

    Concurrency: the write side (AW, W, B) and the read side (AR, R) are independent and run
    at the same time; the target makes no ordering between a read and a write (AXI requires
    none: a manager that needs one waits for the response first). Within a side, requests and
    responses keep bus order. Each of AW, W and AR has a one-entry buffer whose ``ready`` is
    its emptiness (a register), so the bus never waits on the responder combinationally.

    Latency: a request is offered the cycle after its last address/data transfer is taken.
    Throughput: one write and one read every two cycles, if the responder keeps up; requests
    wait while ``o_write``/``o_read`` stall and then the bus is back-pressured. Nothing is
    dropped or duplicated under any back-pressure.

    Bad input: an unaligned address is aligned down; a responder that answers a request not
    yet made breaks the protocol (the target does not check).
    """

    def __init__(self, addr_width=16, data_bytes=4):
        self.addr_width, self.data_bytes = addr_width, data_bytes
        bus = AxiLite(addr_width=addr_width, data_bytes=data_bytes)     # validates both
        super().__init__({
            "s_axil": In(bus),
            "o_write": Out(stream.Signature(WriteRequest(addr_width, data_bytes))),
            "i_write_done": In(stream.Signature(WriteDone)),
            "o_read": Out(stream.Signature(ReadRequest(addr_width))),
            "i_read": In(stream.Signature(ReadDone(data_bytes))),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.s_axil
        low = self.data_bytes.bit_length() - 1

        def aligned(addr):
            return Cat(Const(0, low), addr[low:])

        aw_full, w_full, ar_full = Signal(), Signal(), Signal()
        m.d.comb += [bus.awready.eq(~aw_full), bus.wready.eq(~w_full),
                     bus.arready.eq(~ar_full)]

        # Write: AW and W are buffered separately; both full make a request.
        wr = self.o_write
        m.d.comb += wr.valid.eq(aw_full & w_full)
        with m.If(bus.awvalid & ~aw_full):
            m.d.sync += [aw_full.eq(1), wr.payload.addr.eq(aligned(bus.awaddr))]
        with m.If(bus.wvalid & ~w_full):
            m.d.sync += [w_full.eq(1), wr.payload.data.eq(bus.wdata),
                         wr.payload.strb.eq(bus.wstrb)]
        with m.If(wr.valid & wr.ready):         # excludes both takes above (both are full)
            m.d.sync += [aw_full.eq(0), w_full.eq(0)]
        done = self.i_write_done
        m.d.comb += [bus.bvalid.eq(done.valid), bus.bresp.eq(_resp(done.payload.error)),
                     done.ready.eq(bus.bready)]

        # Read: AR is buffered; the answer is the R channel.
        rd = self.o_read
        m.d.comb += rd.valid.eq(ar_full)
        with m.If(bus.arvalid & ~ar_full):
            m.d.sync += [ar_full.eq(1), rd.payload.addr.eq(aligned(bus.araddr))]
        with m.If(rd.valid & rd.ready):
            m.d.sync += ar_full.eq(0)
        answer = self.i_read
        m.d.comb += [bus.rvalid.eq(answer.valid), bus.rdata.eq(answer.payload.data),
                     bus.rresp.eq(_resp(answer.payload.error)), answer.ready.eq(bus.rready)]
        return m


class AxiLiteManager(wiring.Component):
    """An AXI4-Lite manager: each write request becomes an AW and a W transfer, its B response
    the answer; each read request an AR transfer, its R transfer the answer.

    Ports
    -----
    m_axil : Out(AxiLite(addr_width=addr_width, data_bytes=data_bytes))
        The bus (Verilog ports ``m_axil_awaddr``, ...).
    i_write : In(stream.Signature(WriteRequest(addr_width, data_bytes)))
        One write: ``addr`` (sent as it is), ``data`` and ``strb``.
    o_write_done : Out(stream.Signature(WriteDone))
        One answer per write, in order: the B channel, combinationally (``error`` for SLVERR or
        DECERR, else OKAY or EXOKAY).
    i_read : In(stream.Signature(ReadRequest(addr_width)))
        One read of ``addr``.
    o_read : Out(stream.Signature(ReadDone(data_bytes)))
        One answer per read, in order: the R channel, combinationally (``error`` as for B).

    One write and one read are outstanding at a time, each side on its own (no order kept
    between a write and a read: a user that needs one waits for the answer first). AW and W
    are offered together, from registers, from the cycle after the request is taken, each
    until the subordinate takes it. Latency: the request's answer is offered as the
    subordinate answers; a side takes its next request the cycle after the answer is taken.
    Back-pressure on an answer holds B or R; nothing is dropped or duplicated.
    """

    def __init__(self, addr_width=16, data_bytes=4):
        self.addr_width, self.data_bytes = addr_width, data_bytes
        bus = AxiLite(addr_width=addr_width, data_bytes=data_bytes)     # validates both
        super().__init__({
            "m_axil": Out(bus),
            "i_write": In(stream.Signature(WriteRequest(addr_width, data_bytes))),
            "o_write_done": Out(stream.Signature(WriteDone)),
            "i_read": In(stream.Signature(ReadRequest(addr_width))),
            "o_read": Out(stream.Signature(ReadDone(data_bytes))),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.m_axil

        # Write: the request is held in the AW and W registers until each is taken, then B.
        wr, done = self.i_write, self.o_write_done
        writing = Signal()
        m.d.comb += [wr.ready.eq(~writing),
                     done.valid.eq(bus.bvalid & writing), done.payload.error.eq(bus.bresp[1]),
                     bus.bready.eq(done.ready & writing)]
        with m.If(wr.valid & wr.ready):
            m.d.sync += [writing.eq(1), bus.awvalid.eq(1), bus.wvalid.eq(1),
                         bus.awaddr.eq(wr.payload.addr), bus.wdata.eq(wr.payload.data),
                         bus.wstrb.eq(wr.payload.strb)]
        with m.If(bus.awvalid & bus.awready):
            m.d.sync += bus.awvalid.eq(0)
        with m.If(bus.wvalid & bus.wready):
            m.d.sync += bus.wvalid.eq(0)
        with m.If(done.valid & done.ready):
            m.d.sync += writing.eq(0)

        # Read: the request is held in the AR register until taken, then R.
        rd, answer = self.i_read, self.o_read
        reading = Signal()
        m.d.comb += [rd.ready.eq(~reading),
                     answer.valid.eq(bus.rvalid & reading),
                     answer.payload.data.eq(bus.rdata), answer.payload.error.eq(bus.rresp[1]),
                     bus.rready.eq(answer.ready & reading)]
        with m.If(rd.valid & rd.ready):
            m.d.sync += [reading.eq(1), bus.arvalid.eq(1), bus.araddr.eq(rd.payload.addr)]
        with m.If(bus.arvalid & bus.arready):
            m.d.sync += bus.arvalid.eq(0)
        with m.If(answer.valid & answer.ready):
            m.d.sync += reading.eq(0)
        return m
