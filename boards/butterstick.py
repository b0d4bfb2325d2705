"""Good Stuff Department ButterStick r1.0 (LFE5UM5G-85F, caBGA381, speed 8): the memory
target (:mod:`boards.target`) on the board's Ethernet jack, a Microchip KSZ9031RNX on RGMII.

* Clocks from the 30 MHz oscillator (``clk30``): 125 MHz for the MAC (CLKI_DIV 6,
  CLKFB_DIV 25, CLKOP_DIV 5: PFD 5 MHz, VCO 625 MHz), 31.25 MHz for the core, and ``TXC``
  90 degrees (2 ns) late: the KSZ9031's default pad skews delay ``RXC`` by about 1.2 ns and
  add nothing on transmit (LiteX's ButterStick target: no receive delay, 2 ns on transmit).
* Button 0 resets everything and holds the PHY in reset (20 ms; the KSZ9031 wants 10 ms).
* LEDs: seven LEDs share one colour (``rgb_leds_muxed``): green, red for ~1 s after a
  connection is aborted. 0 a 1000 Mb/s link; 1 frames passing; 2 a connection up; 3 the
  abort; 4 the PHY held in reset; 5 the PLL unlocked; 6 heartbeat (~1 Hz).
"""

from amaranth_boards.butterstick import ButterStickPlatform

from .target import TargetBoard, TargetTop

__all__ = ["BOARD", "platform", "Top"]


def platform():
    """A fresh amaranth-boards platform for this board."""
    return ButterStickPlatform()


def _lights(m, platform, lights):
    led = platform.request("rgb_leds_muxed", 0,
                           dir={"leds": "o", "r": "o", "g": "o", "b": "o"})
    order = ("link", "activity", "connected", "error", "phy_reset", "unlocked", "heartbeat")
    m.d.comb += [led.leds.o[k].eq(lights[name]) for k, name in enumerate(order)]
    m.d.comb += [led.r.o.eq(lights["error"]), led.g.o.eq(~lights["error"]), led.b.o.eq(0)]


#: The ButterStick as a :class:`~boards.target.TargetBoard`.
BOARD = TargetBoard(osc="clk30", osc_hz=30_000_000, button="button", tx_shifted=True,
                    rx_delay_taps=0, lights=_lights)


class Top(TargetTop):
    """The ButterStick's memory target; ``params`` as :class:`~boards.target.TargetTop`'s."""

    def __init__(self, **params):
        super().__init__(BOARD, **params)
