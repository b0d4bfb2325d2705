"""Running Amaranth-simulator tests: one call sets up the clock, the testbenches and a VCD."""

import os

from amaranth.sim import Simulator

from .toolchain import BUILD

__all__ = ["run"]


def run(dut, *testbenches, name=None, vcd=None, clock_period=8e-9, clocks=None, monitors=()):
    """Simulate ``dut`` with a ``sync`` clock until every testbench returns.

    ``monitors`` are testbenches that run in the background: the simulation ends without
    waiting for them (outputs collected for as long as the stimulus lasts).

    ``clocks`` adds clocks for other domains: ``{domain: period}`` (in seconds).

    Each testbench is ``async def tb(ctx)``. A VCD is written to ``build/amsim/<name>.vcd`` when
    ``vcd`` is true, or when the environment sets ``IWARP_VCD=1``. Hangs are caught by the
    timeouts of :mod:`iwarp_tb.streams`.
    """
    sim = Simulator(dut)
    sim.add_clock(clock_period)
    for domain, period in (clocks or {}).items():
        sim.add_clock(period, domain=domain)
    for tb in testbenches:
        sim.add_testbench(tb)
    for tb in monitors:
        sim.add_testbench(tb, background=True)
    if vcd is None:
        vcd = os.environ.get("IWARP_VCD") == "1"
    if vcd:
        path = BUILD / "amsim" / f"{name or type(dut).__name__}.vcd"
        path.parent.mkdir(parents=True, exist_ok=True)
        with sim.write_vcd(str(path)):
            sim.run()
    else:
        sim.run()
