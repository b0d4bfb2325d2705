"""LambdaConcept ECPIX-5 85F (LFE5UM5G-85F, caBGA554, speed 8): a gigabit TCP echo server
(``BOARD=ecpix5_echo``; the board's memory target is :mod:`boards.ecpix5`).

The top answers ARP and ping and echoes TCP (RFC 862) on one port, through the board's Ethernet
jack (a Realtek RTL8211E PHY on RGMII):

::

  RJ45 ─ RTL8211E ═ RGMII ═ RgmiiPins ─ RgmiiAdapter ─ GMII ─ EchoNode: MAC (1 byte, mac)
                                                       ═ crossings ═ IP, TCP, echo (2 bytes, sync)

Clocks:

* ``osc``: the board's 100 MHz oscillator. It drives the PHY reset (held :data:`PHY_RESET_CYCLES`
  after configuration and while the user button is pressed: the RTL8211E wants at least 10 ms)
  and a heartbeat LED.
* ``mac`` (``clk_mac``): 125 MHz from an EHXPLLL on the oscillator, the GMII rate: the RGMII
  adapter and the MAC at one byte per cycle. RGMII ``TD``/``TX_CTL`` leave from it.
* ``sync`` (``clk_core``): 62.5 MHz from the same PLL (CLKOS2): IP, TCP and the echo at two bytes
  per cycle (:data:`CORE_BYTES`), the same 1 Gb/s. Frames reach it through the MAC's
  clock-domain crossings (:class:`~iwarp_nic.node.MacIp` with ``mac_bytes=1``). Why not the
  whole server at one byte and 125 MHz: on this part the TCP engine and the IP layer reached
  93-102 MHz routed (``boards/README.md``); at 62.5 MHz they have a margin of half.
* ``tx90``: the PLL's CLKOS, ``clk_mac`` 90 degrees (2 ns) later. It clocks only the DDR
  output that makes ``TXC``, so the PHY samples the middle of each data nibble. This is the
  delay the ECPIX-5 needs on transmit: its RTL8211E adds the RGMII delay on receive (RXDLY
  strap set) but not on transmit, the configuration LiteX's ECPIX-5 target uses (no added
  receive delay, 2 ns on ``TXC``).
* ``rgmii_rx`` (``rgmii_rx_clk``): the PHY's ``RXC``, 125 MHz at 1000 Mb/s, recovered from the link
  partner. The receive DDR registers and the RGMII decoder run on it; frames cross into
  ``mac`` through :class:`~iwarp_nic.eth.rgmii.GmiiRxCrossing`.

Resets: the user button resets every domain; ``mac`` and ``sync`` also wait for the PLL lock, and
``rgmii_rx`` for the PLL and the PHY's reset (it has no clock before). MDC is held low and MDIO
released: the PHY runs on its strapped defaults (auto-negotiation of every speed). Only
1000 Mb/s works (see :mod:`iwarp_nic.eth.rgmii`): a link partner limited to 100 Mb/s gets a
link but no traffic.

LEDs (RGB, active-high here):

* LED 0: green while ``RXC`` runs at 125 MHz (a 1000 Mb/s link), red otherwise;
* LED 1: green for ~34 ms after a good frame is received or a frame sent, blue for ~67 ms after
  an echo (a connection accepted or bytes echoed);
* LED 2: red for ~0.5 s after a line error (bad FCS, PHY error, runt, oversize, MAC, RGMII or
  core crossing overflow, RGMII hole, TX underrun), blue for ~1 s after a TCP timeout or reset;
* LED 3: red ~1 Hz heartbeat from the oscillator, green while the PHY is held in reset, blue
  while the PLL is unlocked.
"""

import ipaddress

from amaranth import Cat, ClockDomain, ClockSignal, DomainRenamer, Elaboratable, Module, Signal
from amaranth.lib import io, wiring
from amaranth.lib.cdc import FFSynchronizer, ResetSynchronizer
from amaranth_boards.ecpix5 import ECPIX585Platform

from iwarp_nic.apps import EchoNode
from iwarp_nic.eth.rgmii import GMII_RX_PINS, GMII_TX_PINS, RgmiiAdapter, RgmiiPins
from iwarp_nic.exact import add

from .common import ClockTarget, Ecp5Pll, pll_config, stretched

__all__ = ["CORE_HZ", "CORE_BYTES", "GMII_HZ", "OSC_HZ", "PHY_RESET_CYCLES", "MAC", "IP", "PORT",
           "ENGINE", "platform", "Top"]

#: The oscillator on the board, and the core clock (GMII rate) made from it.
OSC_HZ = 100_000_000
GMII_HZ = 125_000_000
CORE_HZ = 62_500_000
#: The server's datapath width: two bytes at 62.5 MHz carry GMII's one byte at 125 MHz.
CORE_BYTES = 2
#: Oscillator cycles the PHY is held in reset after configuration or the button (21 ms).
PHY_RESET_CYCLES = 1 << 21
#: Default addresses and port: a locally administered MAC, an address on 192.168.1.0/24, echo.
MAC = 0x02_00_00_00_00_05
IP = "192.168.1.50"
PORT = 7
#: Default TCP engine sizes, about half of the 85F's 208 block RAMs (18 kbit each, 2 KB of
#: bytes): 16 send rings of 8 KB (64 EBR), a 32 KB receive buffer (16 EBR), a park buffer for 8
#: out-of-order segments, the MAC and IP FIFOs and the connection table. (With 16 KB rings and
#: the engine's 32-segment park, 186 EBR, nextpnr's router did not converge in 10-14 min; at
#: this size it routes in 3-6 min.) An 8 KB ring is a connection's send window: 1 Gb/s for a
#: round trip up to 65 us. Timers at the engine's defaults (RFC 6298 and RFC 1122).
ENGINE = dict(conns=16, ring_bytes=8192, rx_buffer_bytes=32768, park_segments=8)
#: Keys of the ISN function (RFC 6528) and the connection lookup hash. Fixed in the bitstream:
#: anyone who has it can predict ISNs; pass your own to :class:`Top`.
ISN_KEY = 0x6563_686F_2D73_6572_7665_722D_6563_7078
HASH_KEY = 0x7463_7065

_ACTIVITY_CYCLES = 1 << 22   # ~34 ms at 125 MHz (~67 ms at 62.5)
_ERROR_CYCLES = 1 << 26      # ~0.5 s at 125 MHz (~1 s at 62.5)


def platform():
    """A fresh amaranth-boards platform for this board."""
    return ECPIX585Platform()


def _changed(m, value, name, domain="sync"):
    """High for one cycle after the low bits of counter ``value`` (of ``domain``) changed
    (counters step by at most 2 a cycle, so 4 bits always see a step)."""
    low = value[:min(4, len(value))]
    last = Signal.like(low, name=f"{name}_last")
    m.d[domain] += last.eq(low)
    return low != last


class Top(Elaboratable):
    """The ECPIX-5 echo server. ``clocks`` lists the clocks the build report checks.

    Parameters
    ----------
    mac : int
        Our MAC address (48 bits, the first byte on the wire in bits 47..40).
    ip : str or int
        Our IPv4 address.
    port : int
        The echo port.
    engine : dict
        :class:`~iwarp_nic.tcp.engine.TcpEngine` parameters (``clock_hz`` is set here);
        ``conns`` is also the echo's.
    isn_key, hash_key : int
        The engine's secrets (128 and 32 bits).
    """

    def __init__(self, *, mac=MAC, ip=IP, port=PORT, engine=None, isn_key=ISN_KEY,
                 hash_key=HASH_KEY):
        self.mac = mac
        self.ip = int(ipaddress.IPv4Address(ip))
        self.port = port
        self.engine = dict(ENGINE if engine is None else engine, clock_hz=CORE_HZ)
        self.isn_key, self.hash_key = isn_key, hash_key
        self.pll = pll_config(OSC_HZ, GMII_HZ, max_error=0)
        self.clocks = (
            ClockTarget("core", "clk_core", CORE_HZ),
            ClockTarget("mac", "clk_mac", GMII_HZ),
            ClockTarget("rx", "rgmii_rx_clk", GMII_HZ),
            ClockTarget("osc", "clk_osc", OSC_HZ),
        )

    def elaborate(self, platform):
        m = Module()

        # Clocks and resets.
        clk_osc = Signal()
        clk_mac = Signal()
        clk_core = Signal()
        m.d.comb += clk_osc.eq(platform.request("clk100", 0).i)
        button = platform.request("rst", 0).i
        m.submodules.pll = pll = Ecp5Pll(self.pll, shifted_deg=90,
                                         divided_by=GMII_HZ // CORE_HZ)
        m.d.comb += [pll.clk_in.eq(clk_osc), clk_mac.eq(pll.clk_out),
                     clk_core.eq(pll.clk_divided)]
        platform.add_clock_constraint(clk_mac, GMII_HZ)
        platform.add_clock_constraint(clk_core, CORE_HZ)

        m.domains.osc = ClockDomain("osc")
        m.domains.mac = ClockDomain("mac")
        m.domains.sync = ClockDomain("sync")
        m.domains.tx90 = ClockDomain("tx90", reset_less=True)
        m.domains.rgmii_rx = ClockDomain("rgmii_rx")
        m.d.comb += [ClockSignal("osc").eq(clk_osc), ClockSignal("mac").eq(clk_mac),
                     ClockSignal("sync").eq(clk_core), ClockSignal("tx90").eq(pll.clk_shifted)]
        m.submodules.osc_reset = ResetSynchronizer(button, domain="osc")
        m.submodules.mac_reset = ResetSynchronizer(button | ~pll.locked, domain="mac")
        m.submodules.core_reset = ResetSynchronizer(button | ~pll.locked, domain="sync")

        # The PHY: reset, management pins idle, RGMII through DDR buffers.
        eth = platform.request("eth_rgmii", 0, dir={
            name: "-" for name in ("rx_clk", "rx_data", "rx_ctrl", "tx_clk", "tx_data",
                                   "tx_ctrl")})
        # RXC: amaranth-boards gives it no frequency; constrained on the pin, whatever name the
        # net ends up with (the report finds it as the domain's clock, rgmii_rx_clk).
        platform.add_clock_constraint(eth.rx_clk.io, GMII_HZ)
        m.submodules.rxc = rxc = io.Buffer("i", eth.rx_clk)
        m.d.comb += ClockSignal("rgmii_rx").eq(rxc.i)
        phy_hold = Signal(range(PHY_RESET_CYCLES + 1), init=PHY_RESET_CYCLES)
        with m.If(phy_hold != 0):
            m.d.osc += phy_hold.eq(phy_hold - 1)
        phy_in_reset = Signal()
        m.d.osc += phy_in_reset.eq(phy_hold != 0)
        m.d.comb += [eth.rst.o.eq(phy_in_reset), eth.mdc.o.eq(0), eth.mdio.oe.eq(0)]
        m.submodules.rx_reset = ResetSynchronizer(button | ~pll.locked | phy_in_reset,
                                                  domain="rgmii_rx")

        # The RGMII side and the MAC run at GMII's rate in `mac`; the rest of the server at two
        # bytes a cycle in `sync` (clk_core).
        m.submodules.rgmii_pins = pins = DomainRenamer("mac")(
            RgmiiPins(eth, rx_domain="rgmii_rx", tx_clock_domain="tx90"))
        m.submodules.rgmii = rgmii = DomainRenamer("mac")(RgmiiAdapter(rx_domain="rgmii_rx"))
        wiring.connect(m, rgmii.phy, pins.phy)

        # The echo server.
        m.submodules.server = server = EchoNode(CORE_BYTES, self.port, mac_bytes=1,
                                                engine=self.engine)
        m.d.comb += [getattr(server, name).eq(getattr(rgmii, name)) for name in GMII_RX_PINS]
        m.d.comb += [getattr(rgmii, name).eq(getattr(server, name)) for name in GMII_TX_PINS]
        m.d.comb += [server.mac.eq(self.mac), server.ip.eq(self.ip),
                     server.isn_key.eq(self.isn_key), server.hash_key.eq(self.hash_key)]

        # LEDs.
        # (MAC and RGMII counters in `mac`, the TCP and echo ones in `sync`.)
        rx_overflow_bit = Signal()
        m.submodules.rx_overflow_sync = FFSynchronizer(rgmii.rx_overflows[0], rx_overflow_bit,
                                                       o_domain="mac")
        line_errors = [server.rx_bad_fcs, server.rx_phy_errors, server.rx_runts, server.rx_oversize,
                       server.rx_overflows, server.rx_crossing_overflows, server.tx_underruns,
                       rgmii.rx_underruns, rx_overflow_bit]
        activity = stretched(m, _changed(m, server.rx_frames_ok, "rx_ok", "mac")
                            | _changed(m, server.tx_frames, "tx", "mac"), _ACTIVITY_CYCLES,
                            "activity", "mac")
        echoing = stretched(m, _changed(m, server.accepted, "accepted")
                           | _changed(m, server.echoed_bytes, "echoed"), _ACTIVITY_CYCLES,
                           "echoing")
        line_error = stretched(m, Cat(_changed(m, counter, f"line_error{k}", "mac")
                                     for k, counter in enumerate(line_errors)).any(),
                              _ERROR_CYCLES, "line_error", "mac")
        tcp_error = stretched(m, _changed(m, server.tcp_timeouts, "timeouts")
                             | _changed(m, server.tcp_resets, "resets"), _ERROR_CYCLES,
                             "tcp_error")

        heartbeat = Signal(27)
        m.d.osc += heartbeat.eq(add(heartbeat, 1))
        unlocked = Signal()
        m.submodules.lock_sync = FFSynchronizer(~pll.locked, unlocked, o_domain="osc")

        leds = [platform.request("rgb_led", i) for i in range(4)]
        m.d.comb += [
            leds[0].g.o.eq(rgmii.gigabit), leds[0].r.o.eq(~rgmii.gigabit),
            leds[1].g.o.eq(activity), leds[1].b.o.eq(echoing),
            leds[2].r.o.eq(line_error), leds[2].b.o.eq(tcp_error),
            leds[3].r.o.eq(heartbeat[-1]), leds[3].g.o.eq(phy_in_reset),
            leds[3].b.o.eq(unlocked),
        ]
        return m

