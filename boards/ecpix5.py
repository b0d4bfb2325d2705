"""LambdaConcept ECPIX-5 85F (LFE5UM5G-85F, caBGA554, speed 8).

The top for now is a soak load, not yet the NIC:

* the board's 100 MHz oscillator (``osc`` domain) feeds an EHXPLLL making the 156.25 MHz core
  clock (``sync`` domain, the NIC's 10G core clock);
* in the core domain, :class:`~boards.common.CrcSoak` streams pseudo-random packets of 1..9000
  bytes through the 8-byte CRC32c engine and folds every CRC into a register;
* LEDs: RGB LEDs 0-2 show nine XOR-folded bits of that register (so synthesis keeps the whole
  datapath); LED 3 is red for a ~1 Hz heartbeat from the oscillator, green toggling every 2**18
  packets, blue while the PLL is unlocked.

The user button (``rst``) resets both domains; the core domain is also held in reset until the
PLL locks.
"""

from amaranth import ClockDomain, ClockSignal, Elaboratable, Module, Signal
from amaranth.lib.cdc import FFSynchronizer, ResetSynchronizer
from amaranth_boards.ecpix5 import ECPIX585Platform

from .common import ClockTarget, CrcSoak, Ecp5Pll, pll_config, xor_fold

__all__ = ["CORE_HZ", "OSC_HZ", "DATA_BYTES", "platform", "Top"]

#: The oscillator on the board, and the core clock made from it.
OSC_HZ = 100_000_000
CORE_HZ = 156_250_000
#: Datapath width of the core: 8 bytes at 156.25 MHz is the 10G configuration.
DATA_BYTES = 8


def platform():
    """A fresh amaranth-boards platform for this board."""
    return ECPIX585Platform()


class Top(Elaboratable):
    """The ECPIX-5 top. ``clocks`` lists the clocks the build report checks, by net name."""

    def __init__(self):
        self.pll = pll_config(OSC_HZ, CORE_HZ, max_error=0)
        self.clocks = (
            ClockTarget("core", "clk_core", CORE_HZ),
            ClockTarget("osc", "clk_osc", OSC_HZ),
        )

    def elaborate(self, platform):
        m = Module()
        clk_osc = Signal()
        clk_core = Signal()
        m.d.comb += clk_osc.eq(platform.request("clk100", 0).i)
        button = platform.request("rst", 0).i

        m.submodules.pll = pll = Ecp5Pll(self.pll)
        m.d.comb += [pll.clk_in.eq(clk_osc), clk_core.eq(pll.clk_out)]
        platform.add_clock_constraint(clk_core, self.clocks[0].target_hz)

        m.domains.osc = ClockDomain("osc")
        m.domains.sync = ClockDomain("sync")
        m.d.comb += [ClockSignal("osc").eq(clk_osc), ClockSignal("sync").eq(clk_core)]
        m.submodules.osc_reset = ResetSynchronizer(button, domain="osc")
        m.submodules.core_reset = ResetSynchronizer(button | ~pll.locked, domain="sync")

        m.submodules.soak = soak = CrcSoak(DATA_BYTES)

        heartbeat = Signal(27)
        m.d.osc += heartbeat.eq(heartbeat + 1)
        unlocked = Signal()
        m.submodules.lock_sync = FFSynchronizer(~pll.locked, unlocked, o_domain="osc")

        shown = Signal(9)
        m.d.sync += shown.eq(xor_fold(soak.fold, 9))
        leds = [platform.request("rgb_led", i) for i in range(4)]
        for i, led in enumerate(leds[:3]):
            m.d.comb += [led.r.o.eq(shown[3 * i]), led.g.o.eq(shown[3 * i + 1]),
                         led.b.o.eq(shown[3 * i + 2])]
        m.d.comb += [leds[3].r.o.eq(heartbeat[-1]), leds[3].g.o.eq(soak.packets[18]),
                     leds[3].b.o.eq(unlocked)]
        return m
