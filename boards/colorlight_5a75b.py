"""Colorlight 5A-75B v7.0 (LFE5U-25F, caBGA256, speed 6): the memory target
(:mod:`boards.target`) on the first of its two Ethernet ports, a Broadcom B50612D on RGMII.

* Clocks from the 25 MHz oscillator (``clk25``): 125 MHz for the MAC (CLKI_DIV 1,
  CLKFB_DIV 5, CLKOP_DIV 5: VCO 625 MHz) and 31.25 MHz for the core. The B50612D at its
  defaults delays ``TXC`` itself and not ``RXC`` (LiteX's 5A-75x targets: no transmit
  delay, 2 ns on receive), so ``TXC`` leaves with the data and ``RD``/``RX_CTL`` pass a
  ``DELAYG`` of 80 taps (2 ns) before they are sampled.
* The button (``button``, J19's KEY+) resets everything and holds the PHY in reset (20 ms;
  the two PHYs share the reset pin).
* The one LED: steady while a connection is up; blinking with the heartbeat (~1 Hz) while
  the link is at 1000 Mb/s and no connection is up; dark without a link and for ~1 s after
  a connection is aborted.

The board's 25F is far smaller than the core at any width (``boards/README.md``): this top
is here so that the gap is measured by its build.
"""

from amaranth_boards.colorlight_5a75b_r7_0 import Colorlight_5A75B_R70Platform

from .target import TargetBoard, TargetTop

__all__ = ["BOARD", "platform", "Top"]

#: DELAYG taps on RD/RX_CTL: 80 of about 25 ps, RGMII's 2 ns.
RX_DELAY_TAPS = 80


def platform():
    """A fresh amaranth-boards platform for this board."""
    return Colorlight_5A75B_R70Platform()


def _lights(m, platform, lights):
    led = platform.request("led", 0)
    m.d.comb += led.o.eq(~lights["error"] & (lights["connected"]
                                             | (lights["link"] & lights["heartbeat"])))


#: The 5A-75B as a :class:`~boards.target.TargetBoard`.
BOARD = TargetBoard(osc="clk25", osc_hz=25_000_000, button="button", tx_shifted=False,
                    rx_delay_taps=RX_DELAY_TAPS, lights=_lights)


class Top(TargetTop):
    """The 5A-75B's memory target; ``params`` as :class:`~boards.target.TargetTop`'s."""

    def __init__(self, **params):
        super().__init__(BOARD, **params)
