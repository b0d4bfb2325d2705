"""LambdaConcept ECPIX-5 85F (LFE5UM5G-85F, caBGA554, speed 8): a gigabit TCP echo server
(``BOARD=ecpix5_echo``; the board's memory target is :mod:`boards.ecpix5`).

The top answers ARP and ping and echoes TCP (RFC 862) on one port, through the board's Ethernet
jack (a Realtek RTL8211E PHY on RGMII):

::

  RJ45 ─ RTL8211E ═ RGMII ═ RgmiiPins ─ RgmiiAdapter ─ GMII ─ EchoNode: MAC (1 byte, mac)
                                                       ═ crossings ═ IP, TCP, echo (2 bytes, sync)

Clocks, resets and the PHY are the memory target's (:func:`boards.target.board_frame` with
the ECPIX-5's :data:`boards.ecpix5.BOARD`): ``osc`` (100 MHz: the PHY's reset, the heartbeat),
``mac`` (125 MHz: the RGMII adapter and the MAC at one byte per cycle), ``sync`` (62.5 MHz: IP,
TCP and the echo at two bytes per cycle, behind the MAC's clock-domain crossings:
:class:`~iwarp_nic.node.MacIp` with ``mac_bytes=1``), ``tx90`` (``TXC`` 90 degrees late: the
board's RTL8211E adds the RGMII delay on receive, not on transmit) and ``rgmii_rx`` (the PHY's
``RXC``). Why not the whole server at one byte and 125 MHz: on this part the TCP engine and the
IP layer reached 93-102 MHz routed (``boards/README.md``). Only 1000 Mb/s works (see
:mod:`iwarp_nic.eth.rgmii`): a link partner limited to 100 Mb/s gets a link but no traffic.

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

from amaranth import Cat, DomainRenamer, Elaboratable, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.cdc import FFSynchronizer

from iwarp_nic.apps import EchoNode
from iwarp_nic.eth.rgmii import GMII_RX_PINS, GMII_TX_PINS, RgmiiAdapter

from .common import pll_config, stretched
from .ecpix5 import BOARD, platform
from .target import GMII_HZ, board_clocks, board_frame

__all__ = ["CORE_HZ", "CORE_BYTES", "MAC", "IP", "PORT", "ENGINE", "platform", "Top"]

#: The server's clock and width: two bytes at 62.5 MHz carry GMII's one byte at 125 MHz (the
#: memory target's core, larger, runs four bytes at 31.25 MHz).
CORE_HZ = 62_500_000
CORE_BYTES = 2

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
        self.pll = pll_config(BOARD.osc_hz, GMII_HZ, max_error=0)
        self.clocks = board_clocks(BOARD, CORE_HZ)

    def elaborate(self, platform):
        m = Module()

        frame = board_frame(m, platform, BOARD, self.pll, CORE_HZ)
        m.submodules.rgmii = rgmii = DomainRenamer("mac")(RgmiiAdapter(rx_domain="rgmii_rx"))
        wiring.connect(m, rgmii.phy, frame.pins.phy)

        # The echo server.
        m.submodules.server = server = EchoNode(CORE_BYTES, self.port, mac_bytes=1,
                                                engine=self.engine)
        m.d.comb += [getattr(server, name).eq(getattr(rgmii, name)) for name in GMII_RX_PINS]
        m.d.comb += [getattr(rgmii, name).eq(getattr(server, name)) for name in GMII_TX_PINS]
        m.d.comb += [server.mac.eq(self.mac), server.ip.eq(self.ip),
                     server.isn_key.eq(self.isn_key), server.hash_key.eq(self.hash_key)]

        # LEDs.
        # (The RGMII adapter's counters in `mac`; the node's (its MAC's counted again in
        # `sync`), the TCP and echo ones in `sync`, at half the rate.)
        rx_overflow_bit = Signal()
        m.submodules.rx_overflow_sync = FFSynchronizer(rgmii.rx_overflows[0], rx_overflow_bit,
                                                       o_domain="mac")
        mac_errors = [server.rx_bad_fcs, server.rx_phy_errors, server.rx_runts, server.rx_oversize,
                      server.rx_overflows, server.rx_crossing_overflows, server.tx_underruns]
        rgmii_errors = [rgmii.rx_underruns, rx_overflow_bit]
        activity = stretched(m, _changed(m, server.rx_frames_ok, "rx_ok")
                            | _changed(m, server.tx_frames, "tx"), _ACTIVITY_CYCLES >> 1,
                            "activity")
        echoing = stretched(m, _changed(m, server.accepted, "accepted")
                           | _changed(m, server.echoed_bytes, "echoed"), _ACTIVITY_CYCLES,
                           "echoing")
        line_error = (stretched(m, Cat(_changed(m, counter, f"mac_error{k}")
                                       for k, counter in enumerate(mac_errors)).any(),
                                _ERROR_CYCLES >> 1, "mac_error")
                      | stretched(m, Cat(_changed(m, counter, f"rgmii_error{k}", "mac")
                                         for k, counter in enumerate(rgmii_errors)).any(),
                                  _ERROR_CYCLES, "rgmii_error", "mac"))
        tcp_error = stretched(m, _changed(m, server.tcp_timeouts, "timeouts")
                             | _changed(m, server.tcp_resets, "resets"), _ERROR_CYCLES,
                             "tcp_error")

        leds = [platform.request("rgb_led", i) for i in range(4)]
        m.d.comb += [
            leds[0].g.o.eq(rgmii.gigabit), leds[0].r.o.eq(~rgmii.gigabit),
            leds[1].g.o.eq(activity), leds[1].b.o.eq(echoing),
            leds[2].r.o.eq(line_error), leds[2].b.o.eq(tcp_error),
            leds[3].r.o.eq(frame.heartbeat), leds[3].g.o.eq(frame.phy_reset),
            leds[3].b.o.eq(frame.unlocked),
        ]
        return m

