"""cocotb-side helpers for generated modules: clock, reset, and parameters from the runner."""

import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles

from .streams import CocotbBus

__all__ = ["start", "param", "rng"]


async def start(dut, *, period_ns=8, reset_cycles=4) -> CocotbBus:
    """Start ``clk`` (125 MHz by default), hold ``rst`` for a few cycles, return a bus."""
    cocotb.start_soon(Clock(dut.clk, period_ns, unit="ns").start())
    dut.rst.value = 1
    await ClockCycles(dut.clk, reset_cycles)
    dut.rst.value = 0
    return CocotbBus(dut.clk)


def param(name, default=None, cast=int):
    """A test parameter passed by :func:`iwarp_tb.runner.run_cocotb` through ``env``."""
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise KeyError(f"cocotb test parameter {name} not set by the runner")
        return default
    return cast(value)


def rng() -> random.Random:
    """A random generator seeded from ``IWARP_SEED`` (printed, so a failure can be replayed)."""
    seed = param("IWARP_SEED", 1)
    cocotb.log.info("IWARP_SEED=%d", seed)
    return random.Random(seed)
