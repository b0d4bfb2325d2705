"""The memory target on a board (issue 8): what every board's top shares.

A board serves as an iWARP memory target with no host CPU: Linux with siw (or any iWARP
peer) runs ``rping -c -a <board's address> -p 7174`` against it and RDMA Writes and Reads
its data region (``docs/architecture.md``, Boards):

::

  RJ45 ─ PHY ═ RGMII ═ RgmiiPins ─ RgmiiAdapter ─ GMII ─ MemoryTarget: NicCore's MAC (1 byte, mac)
                                                  ═ crossings ═ NicCore (CORE_BYTES, sync)
                                                                 ├ AxiRam (host memory)
                                                                 └ TargetHost (the plan)

:class:`TargetCore` is all of it but the clocks and the pins, so it simulates
(:class:`TargetSim` puts :class:`~iwarp_nic.eth.rgmii.RgmiiPinsModel` on its pins for
Verilator; ``tb/board``). :class:`TargetTop` adds what a board has: the PLL, the PHY's
reset, the DDR pins and the lights. A board module describes its board in a
:class:`TargetBoard` and calls :class:`TargetTop` with it.

Clocks (every board):

* ``osc``: the board's oscillator: the PHY's reset (held :data:`PHY_RESET_SECONDS` after
  configuration and while the button is pressed) and the heartbeat.
* ``mac`` (``clk_mac``): 125 MHz, an EHXPLLL's CLKOP from the oscillator: the RGMII adapter
  and the MAC at one byte per cycle; ``TD``/``TX_CTL`` leave from it.
* ``sync`` (``clk_core``): :data:`CORE_HZ`, 31.25 MHz, the PLL's CLKOS2: NicCore at
  :data:`CORE_BYTES` (4) per cycle, the RAM and the host, behind NicCore's clock-domain
  crossings.
* ``tx90`` (boards whose PHY adds no transmit delay): the PLL's CLKOS, ``clk_mac`` 90 degrees
  (2 ns) late, only for the DDR output that makes ``TXC``.
* ``rgmii_rx`` (``rgmii_rx_clk``): the PHY's ``RXC``.

The lights (:class:`TargetCore`'s ports, each board maps them to its LEDs): ``link`` (``RXC``
runs at 125 MHz: a 1000 Mb/s link), ``activity`` (a frame in or out in the last ~34 ms),
``listening`` (ready for a connection), ``connected`` (a connection accepted and not ended),
``error`` (in the last ~1 s a connection was given up: a Request refused, a Terminate either
way, a completion in error, a peer silent after connecting) and the heartbeat (~1 Hz from
the oscillator).
"""

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

from amaranth import (
    ClockDomain,
    ClockSignal,
    DomainRenamer,
    Elaboratable,
    Instance,
    Module,
    ResetSignal,
    Signal,
)
from amaranth.lib import io, wiring
from amaranth.lib.cdc import FFSynchronizer, ResetSynchronizer
from amaranth.lib.wiring import In, Out

from iwarp_nic.apps.target import TargetPlan
from iwarp_nic.apps.target_host import MemoryTarget
from iwarp_nic.eth.rgmii import (
    GMII_RX_PINS,
    GMII_TX_PINS,
    RGMII_EDGES,
    RgmiiAdapter,
    RgmiiPins,
    RgmiiPinsModel,
)

from .common import ClockTarget, Ecp5Pll, pll_config, stretched

__all__ = ["GMII_HZ", "CORE_HZ", "CORE_BYTES", "PLAN", "CORE", "MAC", "IP", "KEYS",
           "PHY_RESET_SECONDS", "TargetBoard", "TargetCore", "TargetSim", "BoardFrame",
           "board_clocks", "board_frame", "TargetTop"]

#: The MAC's clock (GMII's rate) and the core's: four bytes at 31.25 MHz carry the line's one
#: byte at 125 MHz, and give the core's paths four times the time. At two bytes and 62.5 MHz
#: the routed core made 52-57 MHz, its worst path a different one in each build
#: (``boards/README.md``).
GMII_HZ = 125_000_000
CORE_HZ = 31_250_000
CORE_BYTES = 4
#: What the target serves: two connection slots (the host uses slot 0), two completion
#: queues, two shared receive queues, 16 STags, 32 KiB of RAM.
PLAN = TargetPlan(ram_bytes=32768, conns=2, cqs=2, srqs=2, stag_entries=16)
#: NicCore's TCP engine, sized for one connection at 1 Gb/s on a LAN: 16 KiB send rings
#: (a window of 16 KiB covers 131 us at 1 Gb/s), a 32 KiB receive buffer, 4 out-of-order
#: segments parked; its timers at the engine's defaults for the core clock. An ARP cache of
#: 4 entries: the peers of both slots and two more (a host that pings, say); a fifth address
#: replaces one, round-robin (an entry is about 160 LUT4 sites and 81 FF).
CORE = dict(tcp=dict(ring_bytes=16384, rx_buffer_bytes=32768, park_segments=4,
                     clock_hz=CORE_HZ), ip_stack=dict(arp_entries=4))
#: Default addresses: a locally administered MAC, an address on 192.168.1.0/24.
MAC = 0x02_00_00_00_00_08
IP = "192.168.1.50"
#: The TCP engine's secrets (RFC 6528's ISN key, 128 bits, and the lookup hash's, 32 bits),
#: fixed in the bitstream: anyone who has it can predict ISNs. Pass your own to the top.
KEYS = 0x6D65_6D6F_7279_2D74_6172_6765_742D_6973_6E6B_6579
#: How long the PHY is held in reset after configuration or the button (the RTL8211E wants
#: 10 ms at least).
PHY_RESET_SECONDS = 0.02

_ACTIVITY_CYCLES = 1 << 22   # ~34 ms at 125 MHz
_ERROR_CYCLES = 1 << 25      # ~1 s at 31.25 MHz


class TargetCore(wiring.Component):
    """The memory target behind RGMII's per-edge values: :class:`~iwarp_nic.eth.rgmii.
    RgmiiAdapter` (``mac`` and ``rgmii_rx``) and :class:`~iwarp_nic.apps.target_host.
    MemoryTarget` (its MAC in ``mac``, the rest in ``sync``), with ``plan`` and NicCore's
    ``core`` parameters, at ``mac``/``ip`` with TCP ``keys`` (160 bits).

    Ports
    -----
    phy : Out(RGMII_EDGES)
        To :class:`~iwarp_nic.eth.rgmii.RgmiiPins` (or its model).
    link, activity : Out(1), ``mac``
        ``RXC`` at the gigabit rate; a frame in or out in the last ``activity_cycles``.
    listening, connected, error : Out(1), ``sync``
        Ready for a connection; a connection up; a connection given up in the last
        ``error_cycles``.
    pings : Out(16), ``sync``
        rping's pings served (wraps).
    """

    def __init__(self, *, plan=PLAN, core=None, mac=MAC, ip=IP, keys=KEYS,
                 core_bytes=CORE_BYTES, activity_cycles=_ACTIVITY_CYCLES,
                 error_cycles=_ERROR_CYCLES):
        self._rgmii = DomainRenamer("mac")(RgmiiAdapter(rx_domain="rgmii_rx"))
        self._target = MemoryTarget(core_bytes, plan, mac=mac, ip=int(ipaddress.IPv4Address(ip)),
                                    keys=keys, mac_bytes=1, **(CORE if core is None else core))
        self._cycles = activity_cycles, error_cycles
        super().__init__({"phy": Out(RGMII_EDGES), "link": Out(1), "activity": Out(1),
                          "listening": Out(1), "connected": Out(1), "error": Out(1),
                          "pings": Out(16)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.rgmii = rgmii = self._rgmii
        m.submodules.target = target = self._target
        wiring.connect(m, wiring.flipped(self.phy), rgmii.phy)
        m.d.comb += [getattr(target, name).eq(getattr(rgmii, name)) for name in GMII_RX_PINS]
        m.d.comb += [getattr(rgmii, name).eq(getattr(target, name)) for name in GMII_TX_PINS]
        activity_cycles, error_cycles = self._cycles
        m.d.comb += [
            self.link.eq(rgmii.gigabit),
            self.activity.eq(stretched(m, target.gmii_rx_dv | target.gmii_tx_en,
                                       activity_cycles, "activity_left", "mac")),
            self.listening.eq(target.listening),
            self.connected.eq(target.connected),
            self.error.eq(stretched(m, target.refused, error_cycles, "error_left")),
            self.pings.eq(target.pings),
        ]
        return m


class TargetSim(wiring.Component):
    """:class:`TargetCore` on :class:`~iwarp_nic.eth.rgmii.RgmiiPinsModel`, for Verilator:
    every board's top but its PLL, reset logic and DDR primitives. Ports: the RGMII pins
    (``rd``, ``rx_ctl`` in; ``td``, ``tx_ctl``, ``txc`` out), the lights, and the clocks and
    resets: ``clk``/``rst`` (``sync``, the core), ``mac_clk``/``mac_rst``, ``tx90_clk``
    (``mac_clk`` 90 degrees late: ``TXC``) and ``rgmii_rx_clk``/``rgmii_rx_rst`` (``RXC``).
    The lights' times are a few cycles, not seconds. ``params``: :class:`TargetCore`'s."""

    def __init__(self, **params):
        self._core = TargetCore(activity_cycles=16, error_cycles=16, **params)
        super().__init__({"mac_clk": In(1), "mac_rst": In(1), "tx90_clk": In(1),
                          "rgmii_rx_clk": In(1), "rgmii_rx_rst": In(1),
                          "rd": In(4), "rx_ctl": In(1), "td": Out(4), "tx_ctl": Out(1),
                          "txc": Out(1), "link": Out(1), "activity": Out(1),
                          "listening": Out(1), "connected": Out(1), "error": Out(1),
                          "pings": Out(16)})

    def elaborate(self, platform):
        m = Module()
        m.domains.mac = ClockDomain("mac", async_reset=True)     # as on the boards
        m.domains.tx90 = ClockDomain("tx90", reset_less=True)
        m.domains.rgmii_rx = ClockDomain("rgmii_rx")
        m.d.comb += [ClockSignal("mac").eq(self.mac_clk), ResetSignal("mac").eq(self.mac_rst),
                     ClockSignal("tx90").eq(self.tx90_clk),
                     ClockSignal("rgmii_rx").eq(self.rgmii_rx_clk),
                     ResetSignal("rgmii_rx").eq(self.rgmii_rx_rst)]
        m.submodules.core = core = self._core
        m.submodules.pins = pins = DomainRenamer("mac")(
            RgmiiPinsModel(rx_domain="rgmii_rx", tx_clock_domain="tx90"))
        wiring.connect(m, core.phy, pins.phy)
        m.d.comb += [pins.rd.eq(self.rd), pins.rx_ctl.eq(self.rx_ctl), self.td.eq(pins.td),
                     self.tx_ctl.eq(pins.tx_ctl), self.txc.eq(pins.txc)]
        m.d.comb += [getattr(self, name).eq(getattr(core, name))
                     for name in ("link", "activity", "listening", "connected", "error",
                                  "pings")]
        return m


def _pipelined_reset(m, name, arst, domain, clock, *, stages=2, on_global=False):
    """``domain``'s reset (on ``clock``): ``arst`` through a :class:`ResetSynchronizer`
    (submodule ``name``), then ``stages`` reset-less flip-flops in ``domain``, free to be
    placed away from the synchroniser (which sits by the PLL, tied to the ``arst`` logic).
    The reset is asserted and released ``stages`` cycles later, still at a clock edge.

    ``on_global``: the last stage drives a clock network (``DCCA``), which reaches every
    flip-flop's reset pin, for a domain whose logic spans the die. The MAC side does: by
    the PHY's pins and by the core. One flip-flop driving its resets took a 9.5 ns route
    against the 8 ns period, and 8.7 ns with the stages, the placer keeping them by the
    synchroniser. The domain's reset must then be asynchronous, so that it drives reset
    pins only: yosys merges a synchronous reset with other clears in LUTs, which a clock
    network cannot feed."""
    root = f"{domain}_root"
    m.domains += ClockDomain(root)
    m.d.comb += ClockSignal(root).eq(clock)
    m.submodules[name] = ResetSynchronizer(arst, domain=root)
    reset = ResetSignal(root)
    for k in range(stages):
        stage = Signal(init=1, reset_less=True, name=f"{domain}_reset_stage{k}")
        m.d[domain] += stage.eq(reset)
        reset = stage
    if on_global:
        spread = Signal(name=f"{domain}_reset_global")
        m.submodules[f"{domain}_reset_dcca"] = Instance("DCCA", i_CLKI=reset, i_CE=1,
                                                         o_CLKO=spread)
        reset = spread
    m.d.comb += ResetSignal(domain).eq(reset)


@dataclass(frozen=True)
class TargetBoard:
    """What differs between boards.

    ``osc``/``osc_hz``: the oscillator's resource and frequency; ``button``: the resource
    that resets everything (pressed is 1); ``tx_shifted``: the PHY adds no delay on
    ``TXC`` (we send it 90 degrees late); ``rx_delay_taps``: ``DELAYG`` taps on ``RD``/
    ``RX_CTL`` where the PHY does not delay ``RXC`` (:class:`~iwarp_nic.eth.rgmii.
    RgmiiPins`); ``lights(m, platform, lights)``: drives the board's LEDs from a dict of
    one-bit signals (``link``, ``activity``, ``connected``, ``error``, ``heartbeat``,
    ``phy_reset``, ``unlocked``).
    """

    osc: str
    osc_hz: int
    button: str
    tx_shifted: bool
    rx_delay_taps: int
    lights: Callable


@dataclass(frozen=True)
class BoardFrame:
    """What :func:`board_frame` gives a board's top: ``pins``, the RGMII pins
    (:class:`~iwarp_nic.eth.rgmii.RgmiiPins` in ``mac``) for an RGMII adapter's ``phy``; and
    for the lights ``phy_reset`` (the PHY held in reset), ``unlocked`` (the PLL not locked)
    and ``heartbeat`` (~1 Hz), all in ``osc``."""

    pins: RgmiiPins
    phy_reset: Signal
    unlocked: Signal
    heartbeat: Signal


def board_clocks(board, core_hz=CORE_HZ):
    """The clocks a board's build report checks (:class:`~boards.common.ClockTarget`), the core
    at ``core_hz``. (yosys keeps the core and MAC clocks under their reset synchronisers'
    names.)"""
    return (
        ClockTarget("core", "clk_core", core_hz, aliases=("core_reset.async_ff_clk",)),
        ClockTarget("mac", "clk_mac", GMII_HZ, aliases=("mac_reset.async_ff_clk",)),
        ClockTarget("rx", "rgmii_rx_clk", GMII_HZ),
        ClockTarget("osc", "clk_osc", board.osc_hz),
    )


def board_frame(m, platform, board, pll, core_hz=CORE_HZ):
    """A board's clocks, resets and PHY (the module docstring's clocks), made in ``m`` for
    ``board`` (a :class:`TargetBoard`) with ``pll`` (a :class:`~boards.common.PllConfig`
    from its oscillator to :data:`GMII_HZ`), the core's clock at ``core_hz`` (GMII's divided
    by an integer); returns a :class:`BoardFrame`.

    Resets: the button resets every domain; ``mac`` (asynchronous, on a clock network) and
    ``sync`` also wait for the PLL's lock, ``rgmii_rx`` also for the PHY's reset (it has no
    clock before). The PHY is held in reset :data:`PHY_RESET_SECONDS` after configuration and
    while the button is pressed; MDC is held low and MDIO released: the PHY runs on its
    strapped defaults."""
    clk_osc = Signal()
    clk_mac = Signal()
    clk_core = Signal()
    m.d.comb += clk_osc.eq(platform.request(board.osc, 0).i)
    button = platform.request(board.button, 0).i
    m.submodules.pll = ecp5_pll = Ecp5Pll(pll, shifted_deg=90 if board.tx_shifted else None,
                                          divided_by=GMII_HZ // core_hz)
    m.d.comb += [ecp5_pll.clk_in.eq(clk_osc), clk_mac.eq(ecp5_pll.clk_out),
                 clk_core.eq(ecp5_pll.clk_divided)]
    platform.add_clock_constraint(clk_mac, GMII_HZ)
    platform.add_clock_constraint(clk_core, core_hz)
    m.domains.osc = ClockDomain("osc")
    m.domains.mac = ClockDomain("mac", async_reset=True)
    m.domains.sync = ClockDomain("sync")
    m.domains.rgmii_rx = ClockDomain("rgmii_rx")
    m.d.comb += [ClockSignal("osc").eq(clk_osc), ClockSignal("mac").eq(clk_mac),
                 ClockSignal("sync").eq(clk_core)]
    tx_clock = "sync"                               # renamed to mac with the pins below
    if board.tx_shifted:
        m.domains.tx90 = ClockDomain("tx90", reset_less=True)
        m.d.comb += ClockSignal("tx90").eq(ecp5_pll.clk_shifted)
        tx_clock = "tx90"
    m.submodules.osc_reset = ResetSynchronizer(button, domain="osc")
    _pipelined_reset(m, "mac_reset", button | ~ecp5_pll.locked, "mac", clk_mac, on_global=True)
    _pipelined_reset(m, "core_reset", button | ~ecp5_pll.locked, "sync", clk_core)

    # The PHY: reset, management pins idle, RGMII through DDR buffers.
    pins_of = platform.lookup("eth_rgmii", 0).ios
    eth = platform.request("eth_rgmii", 0, dir={
        pin.name: "-" for pin in pins_of if pin.name not in ("rst", "mdc", "mdio")})
    # RXC: amaranth-boards gives it no frequency; constrained on the pin (the report finds it
    # as the domain's clock, rgmii_rx_clk).
    platform.add_clock_constraint(eth.rx_clk.io, GMII_HZ)
    m.submodules.rxc = rxc = io.Buffer("i", eth.rx_clk)
    m.d.comb += ClockSignal("rgmii_rx").eq(rxc.i)
    reset_cycles = round(PHY_RESET_SECONDS * board.osc_hz)
    phy_hold = Signal(range(reset_cycles + 1), init=reset_cycles)
    with m.If(phy_hold != 0):
        m.d.osc += phy_hold.eq(phy_hold - 1)
    phy_in_reset = Signal()
    m.d.osc += phy_in_reset.eq(phy_hold != 0)
    m.d.comb += [eth.rst.o.eq(phy_in_reset), eth.mdc.o.eq(0), eth.mdio.oe.eq(0)]
    m.submodules.rx_reset = ResetSynchronizer(button | ~ecp5_pll.locked | phy_in_reset,
                                              domain="rgmii_rx")
    m.submodules.pins = pins = DomainRenamer("mac")(RgmiiPins(
        eth, rx_domain="rgmii_rx", tx_clock_domain=tx_clock,
        rx_delay_taps=board.rx_delay_taps))

    heartbeat = Signal(range(board.osc_hz))
    blink = Signal()
    with m.If(heartbeat == 0):
        m.d.osc += [heartbeat.eq(board.osc_hz // 2 - 1), blink.eq(~blink)]
    with m.Else():
        m.d.osc += heartbeat.eq(heartbeat - 1)
    unlocked = Signal()
    m.submodules.lock_sync = FFSynchronizer(~ecp5_pll.locked, unlocked, o_domain="osc")
    return BoardFrame(pins=pins, phy_reset=phy_in_reset, unlocked=unlocked, heartbeat=blink)


class TargetTop(Elaboratable):
    """A board's memory target: ``board`` (a :class:`TargetBoard`), and :class:`TargetCore`'s
    ``params`` (``mac``, ``ip``, ``keys``, ``plan``, ``core``). ``clocks`` lists the clocks
    the build report checks."""

    def __init__(self, board, **params):
        self.board = board
        self.params = params
        self.pll = pll_config(board.osc_hz, GMII_HZ, max_error=0)
        self.clocks = board_clocks(board)

    def elaborate(self, platform):
        m = Module()
        frame = board_frame(m, platform, self.board, self.pll)
        m.submodules.target = target = TargetCore(**self.params)
        wiring.connect(m, target.phy, frame.pins.phy)
        self.board.lights(m, platform, {
            "link": target.link, "activity": target.activity, "connected": target.connected,
            "error": target.error, "heartbeat": frame.heartbeat, "phy_reset": frame.phy_reset,
            "unlocked": frame.unlocked})
        return m
