# amaranth: UnusedElaboratable=no
"""CounterMemory against the events its sources counted, cycle by cycle.

Sources of 6 bits stepping by 0, 1 or 2 a cycle (in bursts), reads of random counters at most
every other cycle: every value read is at most the events counted so far and at least those
counted a few visit periods before, no counter's value falls back, and once the sources stop
every counter reads its events exactly. Then a reset in the middle of the traffic (the
sources reset with it): reads answer 0 while the words are cleared, and then count the
events from the reset, none from before.
"""

import random

import pytest
from amaranth import ClockDomain, Module
from amaranth.sim import Simulator

from iwarp_nic.counters import CounterMemory

COUNT, BITS = 5, 6
#: How many cycles behind its events a value read may be: the words cleared after reset
#: (``COUNT`` cycles), then a visit at most every ``2 * COUNT`` (reads take every other
#: cycle), and three of pipeline.
LAG = 3 * COUNT + 3


def simulate(dut, bench):
    m = Module()
    m.domains.sync = domain = ClockDomain("sync")
    m.submodules.dut = dut
    sim = Simulator(m)
    sim.add_clock(8e-9)

    async def testbench(ctx):
        await bench(ctx, domain)

    sim.add_testbench(testbench)
    sim.run()


class Sources:
    """The events behind each counter, and after each cycle what they were (``history``)."""

    def __init__(self, rng):
        self.rng = rng
        self.events = [0] * COUNT
        self.history = []

    def step(self, ctx, dut, busy):
        for i in range(COUNT):
            if busy:
                burst = self.rng.random() < 0.2
                self.events[i] += self.rng.choice((1, 2)) if burst else int(
                    self.rng.random() < 0.3)
            ctx.set(dut.sources[i], self.events[i] % (1 << BITS))
        self.history.append(list(self.events))


async def traffic(ctx, dut, sources, rng, cycles, last):
    """``cycles`` of events and reads, then quiet until every counter reads its events; checks
    each answer against ``sources``. ``last`` holds each counter's previous value read."""
    asked = False
    for cycle in range(cycles + 4 * COUNT):
        sources.step(ctx, dut, cycle < cycles)
        asked = not asked and rng.random() < 0.6      # at most every other cycle
        index = rng.randrange(COUNT)
        ctx.set(dut.read.en, asked)
        ctx.set(dut.read.addr, index)
        await ctx.tick()
        if asked:
            got = ctx.get(dut.read.data)
            at = len(sources.history) - 1
            now = sources.history[at][index]
            early = sources.history[at - LAG][index] if at >= LAG else 0
            assert early <= got <= now, (cycle, index, early, got, now)
            assert got >= last[index], (cycle, index, last[index], got)
            last[index] = got
    ctx.set(dut.read.en, 0)
    for index in range(COUNT):
        ctx.set(dut.read.en, 1)
        ctx.set(dut.read.addr, index)
        await ctx.tick()
        ctx.set(dut.read.en, 0)
        assert ctx.get(dut.read.data) == sources.events[index]
        await ctx.tick()


@pytest.mark.parametrize("seed", [1, 2])
def test_counter_memory(seed):
    dut = CounterMemory(COUNT, BITS)
    rng = random.Random(seed)

    async def bench(ctx, domain):
        sources = Sources(rng)
        last = [0] * COUNT
        await traffic(ctx, dut, sources, rng, 600, last)
        assert min(sources.events) > 300
        # Reset with traffic on, the sources reset too.
        ctx.set(domain.rst, 1)
        sources.events = [0] * COUNT
        sources.step(ctx, dut, False)
        await ctx.tick()
        ctx.set(domain.rst, 0)
        for _ in range(COUNT):
            ctx.set(dut.read.en, 1)
            ctx.set(dut.read.addr, rng.randrange(COUNT))
            sources.step(ctx, dut, True)
            await ctx.tick()
            assert ctx.get(dut.read.data) == 0
        sources.history = []        # events before the reset do not count
        await traffic(ctx, dut, sources, rng, 300, [0] * COUNT)

    simulate(dut, bench)


def test_counter_memory_parameters():
    with pytest.raises(ValueError, match="count must be"):
        CounterMemory(1, 4)
    with pytest.raises(ValueError, match="bits must be"):
        CounterMemory(4, 33)
