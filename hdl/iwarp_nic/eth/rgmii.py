"""RGMII (Reduced Gigabit Media Independent Interface, version 2.0, 4/1/2002) at 1000 Mb/s: the
GMII signals of IEEE 802.3 clause 35 on half the pins, each pin carrying two values per clock.

From the RGMII 2.0 signal definitions and functional description:

* ``TXC``/``RXC`` run at 125 MHz at 1000 Mb/s (25 MHz and 2.5 MHz at 100 and 10 Mb/s).
* ``TD[3:0]`` carry ``TXD[3:0]`` at the rising edge of ``TXC`` and ``TXD[7:4]`` at the falling
  edge; ``TX_CTL`` carries ``TX_EN`` at the rising edge and ``TX_EN XOR TX_ER`` at the falling
  edge. ``RD[3:0]``/``RX_CTL`` carry ``RXD``, ``RX_DV`` and ``RX_DV XOR RX_ER`` the same way,
  on ``RXC``.
* Timing: a clock edge must reach the receiver 1.0-2.6 ns after the data it samples (TskewR).
  Version 1.3 left that delay to the board traces; version 2.0 lets the sender or the receiver
  add it inside the chip ("RGMII-ID"). :class:`RgmiiPins` can shift ``TXC`` itself (a clock
  domain 90 degrees late, 2 ns at 125 MHz) and delay ``RD``/``RX_CTL`` (ECP5 ``DELAYG``) where
  the PHY does not delay ``RXC``.
* While ``RX_DV`` is low, ``RD`` may carry the PHY's in-band status; it is ignored here.

This module works on *per-edge values*: a pin's two values of one clock cycle as
``data.ArrayLayout(width, 2)``, element 0 for the rising edge and element 1 for the falling edge,
exactly the ``i``/``o`` members of ``amaranth.lib.io.DDRBuffer``. :class:`RgmiiRx`,
:class:`RgmiiTx`, :class:`GmiiRxCrossing` and :class:`RgmiiAdapter` are plain synchronous logic
that simulates in Amaranth; :class:`RgmiiPins` puts the platform's DDR I/O buffers (``IDDRX1F``/
``ODDRX1F`` on ECP5) between them and the pins, and :class:`RgmiiPinsModel` does their job in
logic a simulator runs.

Only 1000 Mb/s is supported: at 10/100 Mb/s RGMII sends each nibble on both edges of a 2.5/25 MHz
clock, which this adapter does not decode (frames received then fail their FCS and are dropped;
frames sent are garbled). :class:`RxClockMeter` reports whether ``RXC`` runs at the gigabit rate.
"""

from amaranth import (
    Cat,
    ClockDomain,
    ClockSignal,
    Const,
    DomainRenamer,
    Instance,
    Module,
    Mux,
    ResetSignal,
    Signal,
)
from amaranth.lib import data, io, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from ..exact import Machine, add, eq, gt, lt
from ..stream import SkidBuffer
from .cdc import MacRxCrossing

__all__ = ["EdgePair", "GMII_RX_PINS", "GMII_TX_PINS", "RGMII_EDGES", "RgmiiRx", "RgmiiTx",
           "GmiiRxCrossing", "RxClockMeter", "RgmiiAdapter", "RgmiiPins", "RgmiiPinsModel"]

#: GMII pin names of :class:`~.gmii.GmiiMac`, receive side (into the MAC) and transmit side.
GMII_RX_PINS = ("gmii_rxd", "gmii_rx_dv", "gmii_rx_er")
GMII_TX_PINS = ("gmii_txd", "gmii_tx_en", "gmii_tx_er")


def EdgePair(width):
    """The two values of a ``width``-pin DDR signal in one clock cycle: ``[0]`` at the rising
    edge, ``[1]`` at the falling edge (the layout of ``io.DDRBuffer``'s ``i`` and ``o``)."""
    return data.ArrayLayout(width, 2)


class RgmiiRx(wiring.Component):
    """RGMII receive decoding: per-edge ``RD``/``RX_CTL`` values to GMII ``RXD``/``RX_DV``/
    ``RX_ER``, through one register, in the domain of ``RXC`` (``sync`` here).

    ``gmii_rxd`` is ``rd[1]:rd[0]`` (falling-edge nibble high), ``gmii_rx_dv`` is ``rx_ctl[0]``
    and ``gmii_rx_er`` is ``rx_ctl[0] XOR rx_ctl[1]``. Latency: one cycle. Every cycle carries a
    value (no handshake); nothing is checked here (the MAC judges frames).
    """

    rd: In(EdgePair(4))
    rx_ctl: In(EdgePair(1))
    gmii_rxd: Out(8)
    gmii_rx_dv: Out(1)
    gmii_rx_er: Out(1)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += [
            self.gmii_rxd.eq(self.rd.as_value()),
            self.gmii_rx_dv.eq(self.rx_ctl[0]),
            self.gmii_rx_er.eq(self.rx_ctl[0] ^ self.rx_ctl[1]),
        ]
        return m


class RgmiiTx(wiring.Component):
    """RGMII transmit encoding: GMII ``TXD``/``TX_EN``/``TX_ER`` to per-edge ``TD``/``TX_CTL``
    values, through one register.

    ``td[0]`` is ``gmii_txd[0:4]``, ``td[1]`` is ``gmii_txd[4:8]``, ``tx_ctl[0]`` is
    ``gmii_tx_en`` and ``tx_ctl[1]`` is ``gmii_tx_en XOR gmii_tx_er``. Latency: one cycle (the
    DDR output buffer adds its own).
    """

    gmii_txd: In(8)
    gmii_tx_en: In(1)
    gmii_tx_er: In(1)
    td: Out(EdgePair(4))
    tx_ctl: Out(EdgePair(1))

    def elaborate(self, platform):
        m = Module()
        m.d.sync += [
            self.td.as_value().eq(self.gmii_txd),
            self.tx_ctl[0].eq(self.gmii_tx_en),
            self.tx_ctl[1].eq(self.gmii_tx_en ^ self.gmii_tx_er),
        ]
        return m


class GmiiRxCrossing(wiring.Component):
    """GMII receive signals from the PHY's receive clock into the core clock: an elastic buffer.

    The two clocks have the same nominal rate but are not the same clock (``RXC`` is recovered
    from the link partner, the core clock comes from the board's oscillator), so a frame's bytes
    must cross through a FIFO and come out again *contiguous*: :class:`~.gmii.GmiiRx` ends a frame
    at the first cycle with ``rx_dv`` low.

    * RX side (``rx_domain``): the bytes of each ``rx_dv`` run become one packet of one-byte beats
      (the last one is known when ``rx_dv`` falls, so beats lag the pins by one cycle), with
      ``err`` on the last beat if ``rx_er`` was high during the run. They enter a
      :class:`~.cdc.MacRxCrossing`, which never stalls: a run that finds the FIFO full is cut and
      ended with ``err`` (``overflows`` counts it, RX domain).
    * Core side (``sync``): once a run's first byte has crossed, the output waits
      :attr:`HOLD` cycles, so that the FIFO holds a few bytes of slack, then drives ``rx_dv`` high
      with one byte per cycle until the run's last byte, with ``rx_er`` on it if the run had an
      error; at least one cycle of ``rx_dv`` low follows each run. Preamble bytes pass like any
      other. Should the FIFO ever run empty mid-run (it cannot while the clocks are within
      +-1000 ppm of each other and runs are shorter than 9000 bytes), a cycle with ``rx_dv`` and
      ``rx_er`` high and data 0 fills the hole, so the MAC drops the frame as a PHY error, and
      ``underruns`` counts such cycles (core domain).
    * Latency: about ``HOLD + 5`` core cycles. Throughput: one byte per cycle; each run costs
      ``HOLD + 1`` idle core cycles, which the inter-frame gap (12 bytes at the sender, at least
      the preamble and a few idle bytes at any receiver) covers, so back-to-back frames do not
      accumulate in the FIFO.

    Parameters
    ----------
    depth : int
        FIFO depth in bytes (a power of two is used), at least ``4 * HOLD``: a run's first
        ``HOLD`` + 5 or so bytes are in the FIFO before the output starts, and back-to-back runs
        with gaps shorter than ``HOLD + 1`` cycles add to that.
    rx_domain : str
        The clock domain of the inputs (the outputs are in ``sync``).
    """

    #: Core cycles between a run's first byte crossing and its first byte on the outputs.
    HOLD = 4

    def __init__(self, depth=64, *, rx_domain="rgmii_rx"):
        if not isinstance(depth, int) or depth < 4 * self.HOLD:
            raise ValueError(f"depth must be an integer of at least {4 * self.HOLD}, "
                             f"not {depth!r}")
        self._crossing = MacRxCrossing(1, depth, mac_domain=rx_domain)
        self.depth = self._crossing.depth_beats
        self._rx = rx_domain
        super().__init__({
            "i_rxd": In(8), "i_rx_dv": In(1), "i_rx_er": In(1),
            "o_rxd": Out(8), "o_rx_dv": Out(1), "o_rx_er": Out(1),
            "overflows": Out(32), "underruns": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.crossing = crossing = self._crossing
        rx = m.d[self._rx]

        # RX side: hold each byte a cycle, until the next cycle tells whether it was the last.
        held = Signal(8)
        held_dv = Signal()
        run_err = Signal()  # rx_er seen in this run, up to the held byte
        rx += [held.eq(self.i_rxd), held_dv.eq(self.i_rx_dv),
               run_err.eq(self.i_rx_dv & (run_err | self.i_rx_er))]
        beat = crossing.i.payload
        m.d.comb += [crossing.i.valid.eq(held_dv), beat.data.eq(held), beat.keep.eq(1),
                     beat.last.eq(~self.i_rx_dv), beat.err.eq(~self.i_rx_dv & run_err),
                     self.overflows.eq(crossing.overflows)]

        # Core side: wait HOLD cycles after a run's first byte, then play it out contiguously.
        # A skid buffer takes the FIFO's output, so the FIFO's read enable (and the pointer and
        # memory address behind it) is a register, not the state machine below.
        m.submodules.out_skid = out_skid = SkidBuffer(crossing.o.payload.shape())
        wiring.connect(m, crossing.o, out_skid.i)
        out = out_skid.o
        fsm = Machine(m, ["IDLE", "HOLD", "RUN"], "gmii_crossing_state")
        wait = Signal(range(self.HOLD + 1))
        with fsm.state("IDLE"):
            m.d.sync += [self.o_rx_dv.eq(0), self.o_rx_er.eq(0)]
            with m.If(out.valid):
                m.d.sync += wait.eq(self.HOLD - 1)
                fsm.goto("HOLD")
        with fsm.state("HOLD"):
            m.d.sync += wait.eq(wait - 1)
            with m.If(eq(wait, 0)):
                fsm.goto("RUN")
        with fsm.state("RUN"):
            m.d.comb += out.ready.eq(1)
            with m.If(out.valid):
                m.d.sync += [self.o_rxd.eq(out.payload.data), self.o_rx_dv.eq(1),
                         self.o_rx_er.eq(out.payload.last & out.payload.err)]
                with m.If(out.payload.last):
                    fsm.goto("IDLE")
            with m.Else():
                m.d.sync += [self.o_rxd.eq(0), self.o_rx_dv.eq(1), self.o_rx_er.eq(1),
                         self.underruns.eq(add(self.underruns, 1))]
        return m


class RxClockMeter(wiring.Component):
    """Whether the PHY's receive clock runs at the gigabit rate, measured against ``sync``.

    RGMII 2.0 ties ``RXC`` to the link speed (125, 25 or 2.5 MHz), so with a 125 MHz core clock
    this tells a 1000 Mb/s link from a slower one, a link down or a PHY held in reset (its
    ``RXC`` then runs slower or not at all). A 4-bit counter in ``rx_domain`` divides ``RXC`` by
    16; its top bit crosses into ``sync`` through a synchroniser, and its edges are counted over
    windows of ``2**window_log2`` core cycles. ``gigabit`` is set at the end of each window if
    the count was within 1/8 of what a clock equal to ``sync`` gives (``2**window_log2 / 8``
    edges), cleared otherwise: it follows the clock within two windows (16 us at 125 MHz).

    Parameters
    ----------
    window_log2 : int
        The window, as a power of two of core cycles, 7 or more.
    rx_domain : str
        The domain of the clock measured.
    """

    gigabit: Out(1)

    def __init__(self, *, window_log2=10, rx_domain="rgmii_rx"):
        if not isinstance(window_log2, int) or window_log2 < 7:
            raise ValueError(f"window_log2 must be an integer of at least 7, not {window_log2!r}")
        self.window_log2 = window_log2
        self._rx = rx_domain
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        divider = Signal(4)
        m.d[self._rx] += divider.eq(add(divider, 1))
        tick = Signal()
        m.submodules.sync_tick = FFSynchronizer(divider[-1], tick)

        expected = 1 << (self.window_log2 - 3)
        last_tick = Signal()
        edges = Signal(self.window_log2 - 1)   # room for twice the expected count
        window = Signal(self.window_log2)
        counted = Signal.like(edges)
        m.d.comb += counted.eq(edges + (tick ^ last_tick))
        m.d.sync += [last_tick.eq(tick), window.eq(add(window, 1))]
        with m.If(eq(window, (1 << self.window_log2) - 1)):
            m.d.sync += [edges.eq(0),
                         self.gigabit.eq(gt(counted, expected - expected // 8 - 1)
                                         & lt(counted, expected + expected // 8 + 1))]
        with m.Elif(lt(edges, (1 << len(edges)) - 1)):
            m.d.sync += edges.eq(counted)
        return m


#: The PHY side of :class:`RgmiiAdapter`, as the adapter sees it: per-edge values of ``RD`` and
#: ``RX_CTL`` in, of ``TD`` and ``TX_CTL`` out.
RGMII_EDGES = wiring.Signature({
    "rd": In(EdgePair(4)), "rx_ctl": In(EdgePair(1)),
    "td": Out(EdgePair(4)), "tx_ctl": Out(EdgePair(1)),
})


class RgmiiAdapter(wiring.Component):
    """The GMII pins of :class:`~.gmii.GmiiMac` on an RGMII PHY at 1000 Mb/s, all in ``sync``
    but for the receive path's first stages, which run on ``RXC`` (``rx_domain``).

    ::

      phy.rd, phy.rx_ctl ─ RgmiiRx ─ GmiiRxCrossing ─ gmii_rxd/rx_dv/rx_er       (to the MAC)
      phy.td, phy.tx_ctl ─ RgmiiTx ─────────────────── gmii_txd/tx_en/tx_er     (from the MAC)

    Ports
    -----
    phy : Out(:data:`RGMII_EDGES`)
        Per-edge pin values: ``rd``/``rx_ctl`` in ``rx_domain``, ``td``/``tx_ctl`` in ``sync``
        (:class:`RgmiiPins` puts them on pins; a testbench drives them directly).
    gmii_rxd, gmii_rx_dv, gmii_rx_er : Out; gmii_txd, gmii_tx_en, gmii_tx_er : In
        GMII, in ``sync``, named as the MAC's pins (:data:`GMII_RX_PINS`, :data:`GMII_TX_PINS`).
    rx_overflows : Out(32), ``rx_domain``; rx_underruns : Out(32), ``sync``
        The crossing's counters (:class:`GmiiRxCrossing`).
    gigabit : Out(1), ``sync``
        ``RXC`` runs at the core rate (:class:`RxClockMeter`): the PHY is at 1000 Mb/s.

    Latency: receive, 2 ``RXC`` cycles plus the crossing (:attr:`GmiiRxCrossing.HOLD` + 4 core
    cycles) from a byte's edge pair on ``phy`` to ``gmii_rxd``; transmit, one cycle. Throughput:
    line rate both ways. Bad input: nothing is judged here; RX errors reach the MAC as ``rx_er``.

    Parameters
    ----------
    rx_depth : int
        Depth of the receive crossing's FIFO, in bytes. The default, 32, holds the slack for
        maximum frames back to back at the shortest gap with the clocks 1000 ppm apart (16 does
        not), and on ECP5 is two banks of LUT RAM with a 2:1 multiplexer behind them (at 64, four
        banks, the FIFO's read path was the MAC domain's slowest at 125 MHz).
    rx_domain : str
        The domain clocked by the PHY's ``RXC``.
    """

    def __init__(self, *, rx_depth=32, rx_domain="rgmii_rx"):
        self._rx = rx_domain
        self._crossing = GmiiRxCrossing(rx_depth, rx_domain=rx_domain)
        super().__init__({
            "phy": Out(RGMII_EDGES),
            "gmii_rxd": Out(8), "gmii_rx_dv": Out(1), "gmii_rx_er": Out(1),
            "gmii_txd": In(8), "gmii_tx_en": In(1), "gmii_tx_er": In(1),
            "rx_overflows": Out(32), "rx_underruns": Out(32), "gigabit": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.rx = rx = DomainRenamer(self._rx)(RgmiiRx())
        m.submodules.crossing = crossing = self._crossing
        m.submodules.tx = tx = RgmiiTx()
        m.submodules.meter = meter = RxClockMeter(rx_domain=self._rx)
        m.d.comb += [
            rx.rd.eq(self.phy.rd), rx.rx_ctl.eq(self.phy.rx_ctl),
            crossing.i_rxd.eq(rx.gmii_rxd), crossing.i_rx_dv.eq(rx.gmii_rx_dv),
            crossing.i_rx_er.eq(rx.gmii_rx_er),
            self.gmii_rxd.eq(crossing.o_rxd), self.gmii_rx_dv.eq(crossing.o_rx_dv),
            self.gmii_rx_er.eq(crossing.o_rx_er),
            tx.gmii_txd.eq(self.gmii_txd), tx.gmii_tx_en.eq(self.gmii_tx_en),
            tx.gmii_tx_er.eq(self.gmii_tx_er),
            self.phy.td.eq(tx.td), self.phy.tx_ctl.eq(tx.tx_ctl),
            self.rx_overflows.eq(crossing.overflows), self.rx_underruns.eq(crossing.underruns),
            self.gigabit.eq(meter.gigabit),
        ]
        return m


class RgmiiPins(wiring.Component):
    """The platform layer: an RGMII resource's data pins as the per-edge values of
    :data:`RGMII_EDGES`, through the platform's DDR I/O (``IDDRX1F``/``ODDRX1F`` on ECP5).
    Connect ``phy`` to :attr:`RgmiiAdapter.phy` with ``wiring.connect``.

    ``resource`` is the RGMII resource requested with ``dir="-"`` for ``rx_data``, ``rx_ctl``
    (or ``rx_ctrl``), ``tx_clk``, ``tx_data`` and ``tx_ctl`` (or ``tx_ctrl``), the amaranth-boards
    names; its ``rx_clk``, requested as an input, is the clock of ``rx_domain``, which the design
    defines (and constrains: amaranth-boards gives it no frequency).

    * ``RD``/``RX_CTL`` are sampled on the edges of ``RXC``. With ``rx_delay_taps`` 0 nothing
      is added: the PHY must delay ``RXC`` itself (RGMII-ID, e.g. an RTL8211E with its RXDLY
      strap set, or a KSZ9031's default skews). Otherwise each of them passes an ECP5
      ``DELAYG`` of that many taps (about 25 ps each; 80 for RGMII's 2 ns) on its way to the
      ``IDDRX1F``: the delay the PHY does not add (a Broadcom B50612D at its defaults).
    * ``TD``/``TX_CTL`` are driven from ``sync``. ``TXC`` is a DDR output of ``1, 0`` clocked by
      ``tx_clock_domain``: with a copy of ``sync`` 90 degrees late (2 ns at 125 MHz) the PHY sees
      its clock edges in the middle of the data, as RGMII 2.0 wants when the PHY adds no
      transmit delay; with ``"sync"`` itself, the PHY must add it (TXDLY strap).

    Latencies are the platform's DDR buffer's (``ODDRX1F`` adds two cycles, the same for data
    and control, so they stay aligned). Only for a platform with DDR I/O: a simulator takes
    :class:`RgmiiPinsModel` in its place.
    """

    def __init__(self, resource, *, rx_domain="rgmii_rx", tx_clock_domain="sync",
                 rx_delay_taps=0):
        if not 0 <= rx_delay_taps < 128:
            raise ValueError(f"rx_delay_taps must be 0 to 127 (DELAYG), not {rx_delay_taps}")
        self._resource = resource
        self._rx = rx_domain
        self._tx_clock = tx_clock_domain
        self._rx_delay = rx_delay_taps
        super().__init__({"phy": In(RGMII_EDGES)})

    @staticmethod
    def _pin(resource, name):
        """Subsignal ``name``, or its ``ctrl`` spelling (ECPIX-5, Versa port 1)."""
        alias = name.replace("_ctl", "_ctrl")
        return getattr(resource, name) if hasattr(resource, name) else getattr(resource, alias)

    def _sampled(self, m, name, pin):
        """``pin``'s per-edge values on ``RXC``, through a ``DELAYG`` if asked for."""
        if not self._rx_delay:
            m.submodules[name] = buffer = io.DDRBuffer("i", pin, i_domain=self._rx)
            return buffer.i
        m.submodules[name] = buffer = io.Buffer("i", pin)
        values = Signal(EdgePair(len(pin)), name=f"{name}_edges")
        for bit in range(len(pin)):
            delayed = Signal(name=f"{name}_delayed{bit}")
            m.submodules[f"{name}_delay{bit}"] = Instance(
                "DELAYG", p_DEL_MODE="USER_DEFINED", p_DEL_VALUE=self._rx_delay,
                i_A=buffer.i[bit], o_Z=delayed)
            m.submodules[f"{name}_ddr{bit}"] = Instance(
                "IDDRX1F", i_SCLK=ClockSignal(self._rx), i_RST=Const(0), i_D=delayed,
                o_Q0=values[0][bit], o_Q1=values[1][bit])
        return values

    def elaborate(self, platform):
        m = Module()
        res = self._resource
        rd = self._sampled(m, "rd", res.rx_data)
        rx_ctl = self._sampled(m, "rx_ctl", self._pin(res, "rx_ctl"))
        m.submodules.td = td = io.DDRBuffer("o", res.tx_data)
        m.submodules.tx_ctl = tx_ctl = io.DDRBuffer("o", self._pin(res, "tx_ctl"))
        m.submodules.txc = txc = io.DDRBuffer("o", res.tx_clk, o_domain=self._tx_clock)
        m.d.comb += [
            self.phy.rd.eq(rd), self.phy.rx_ctl.eq(rx_ctl),
            td.o.eq(self.phy.td), tx_ctl.o.eq(self.phy.tx_ctl),
            txc.o[0].eq(1), txc.o[1].eq(0),
        ]
        return m


class RgmiiPinsModel(wiring.Component):
    """:class:`RgmiiPins` in plain logic, for a simulator (Verilator): the RGMII pins as ports,
    sampled and driven on both edges, so that an RGMII PHY model (cocotbext-eth's
    ``RgmiiPhy``) can stand on them. Not for synthesis: it clocks flip-flops on the falling
    edge of ``RXC`` and multiplexes ``TD`` by the level of the ``sync`` clock.

    * ``rd``/``rx_ctl`` are sampled at each rising edge of ``rx_domain``'s clock and at the
      falling edge after it; the pair reaches ``phy`` at the next rising edge (one cycle, as
      ``IDDRX1F``). The PHY model must hold each nibble across the edge that samples it.
    * ``td``/``tx_ctl`` carry ``phy``'s element 0 while the ``sync`` clock is high and element
      1 while it is low, from a register loaded at each rising edge (one cycle).
    * ``txc`` is ``tx_clock_domain``'s clock: a copy of ``sync`` 90 degrees late puts its
      edges in the middle of the data, where the PHY model samples.
    """

    def __init__(self, *, rx_domain="rgmii_rx", tx_clock_domain="sync"):
        self._rx = rx_domain
        self._tx_clock = tx_clock_domain
        super().__init__({"phy": In(RGMII_EDGES), "rd": In(4), "rx_ctl": In(1),
                          "td": Out(4), "tx_ctl": Out(1), "txc": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.domains.rx_fall = ClockDomain("rx_fall", clk_edge="neg", local=True)
        m.d.comb += [ClockSignal("rx_fall").eq(ClockSignal(self._rx)),
                     ResetSignal("rx_fall").eq(ResetSignal(self._rx))]
        pins = Cat(self.rd, self.rx_ctl)
        rise, fall = Signal.like(pins), Signal.like(pins)
        m.d[self._rx] += rise.eq(pins)
        m.d.rx_fall += fall.eq(pins)
        m.d[self._rx] += [Cat(self.phy.rd[0], self.phy.rx_ctl[0]).eq(rise),
                          Cat(self.phy.rd[1], self.phy.rx_ctl[1]).eq(fall)]
        first, second = Signal(5), Signal(5)
        m.d.sync += [first.eq(Cat(self.phy.td[0], self.phy.tx_ctl[0])),
                     second.eq(Cat(self.phy.td[1], self.phy.tx_ctl[1]))]
        m.d.comb += [Cat(self.td, self.tx_ctl).eq(Mux(ClockSignal("sync"), first, second)),
                     self.txc.eq(ClockSignal(self._tx_clock))]
        return m
