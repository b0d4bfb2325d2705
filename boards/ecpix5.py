"""LambdaConcept ECPIX-5 85F (LFE5UM5G-85F, caBGA554, speed 8): the memory target
(:mod:`boards.target`) on the board's Ethernet jack, a Realtek RTL8211E on RGMII.

* Clocks from the 100 MHz oscillator (``clk100``): 125 MHz for the MAC (CLKI_DIV 4,
  CLKFB_DIV 5, CLKOP_DIV 5: VCO 625 MHz), 31.25 MHz for the core, and ``TXC`` 90 degrees
  (2 ns) late: the RTL8211E delays ``RXC`` itself (RXDLY strap set) but not ``TXC``, the
  configuration LiteX's ECPIX-5 target uses (no receive delay added, 2 ns on ``TXC``).
* The user button (``rst``) resets everything and holds the PHY in reset (20 ms).
* LEDs (RGB, active-high): 0 green on a 1000 Mb/s link, red otherwise; 1 green while frames
  pass, blue while a connection is up; 2 red for ~1 s after a connection is aborted; 3 red
  heartbeat (~1 Hz), green while the PHY is held in reset, blue while the PLL is unlocked.

The echo server this board ran before the target is :mod:`boards.ecpix5_echo`.
"""

from amaranth_boards.ecpix5 import ECPIX585Platform

from .target import TargetBoard, TargetTop

__all__ = ["BOARD", "SEED", "platform", "Top"]

#: The nextpnr seed of ``make bitstream BOARD=ecpix5``: at 76 % of the LUTs, seed 1's placement
#: of this top left router2 diverging (73 congested wires after 150 passes, 600 after 260);
#: seed 2's routes in 80 passes and meets every clock (``boards/README.md``).
SEED = 2


def platform():
    """A fresh amaranth-boards platform for this board."""
    return ECPIX585Platform()


def _lights(m, platform, lights):
    leds = [platform.request("rgb_led", i) for i in range(4)]
    m.d.comb += [
        leds[0].g.o.eq(lights["link"]), leds[0].r.o.eq(~lights["link"]),
        leds[1].g.o.eq(lights["activity"]), leds[1].b.o.eq(lights["connected"]),
        leds[2].r.o.eq(lights["error"]),
        leds[3].r.o.eq(lights["heartbeat"]), leds[3].g.o.eq(lights["phy_reset"]),
        leds[3].b.o.eq(lights["unlocked"]),
    ]


#: The ECPIX-5 as a :class:`~boards.target.TargetBoard`.
BOARD = TargetBoard(osc="clk100", osc_hz=100_000_000, button="rst", tx_shifted=True,
                    rx_delay_taps=0, lights=_lights)


class Top(TargetTop):
    """The ECPIX-5's memory target; ``params`` as :class:`~boards.target.TargetTop`'s."""

    def __init__(self, **params):
        super().__init__(BOARD, **params)
