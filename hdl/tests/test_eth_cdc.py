# amaranth: UnusedElaboratable=no
"""MacRxCrossing and MacTxCrossing with two clocks of different frequencies (125 vs 100 MHz,
156.25 vs 200 MHz), widths 1 and 8, random frames, idle and stall, against the sent frames;
CountCrossing against the events counted where they happened.

RX: never stalls the MAC; without overflow every frame arrives exact; with a small FIFO and a
slow core, every frame arrives exact, cut short with an err end beat, or not at all, in order,
and ``overflows`` counts exactly the frames that did not arrive exact. TX: every frame arrives
exact, none starts before its last beat went in, and none has a gap once started (the framer's
underrun rule)."""

import math
import random

import pytest
from amaranth import ClockDomain, Module
from amaranth.sim import Simulator

from iwarp_nic.eth.cdc import CountCrossing, MacRxCrossing, MacTxCrossing, count_bits
from iwarp_tb.beats import Beat, Packet, from_beats, to_beats
from iwarp_tb.streams import AmaranthBus, StreamPort, send, send_packets

WIDTHS = (1, 8)
# (MAC clock, core clock) periods in seconds.
CLOCKS = {"125/100": (8e-9, 10e-9), "156.25/200": (6.4e-9, 5e-9)}


class DomainBus(AmaranthBus):
    """:class:`AmaranthBus` on the clock of ``domain``."""

    def __init__(self, ctx, domain):
        super().__init__(ctx)
        self.domain = domain

    async def edge(self, *signals):
        _clk, _rst, *values = await self.ctx.tick(self.domain).sample(*signals)
        return values


def simulate(dut, clocks, *testbenches):
    m = Module()
    m.domains.sync = ClockDomain("sync")
    m.domains.mac = ClockDomain("mac")
    m.submodules.dut = dut
    sim = Simulator(m)
    mac_period, core_period = clocks
    sim.add_clock(mac_period, domain="mac")
    sim.add_clock(core_period, domain="sync")
    for tb in testbenches:
        sim.add_testbench(tb)
    sim.run()


def random_frames(rng, n, count, longest, err=0.2):
    return [Packet(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, longest))),
                   rng.random() < err) for _ in range(count)]


def frame_transfers(frames, n):
    """The beats of ``frames`` as transfers for :func:`send`."""
    return [beat._asdict() for frame in frames for beat in to_beats(frame, n)]


# --- RX ----------------------------------------------------------------------------------------

def match_rx(sent, got, n):
    """Walk ``got`` along ``sent``: each received frame is the next sent frame exact, or a
    prefix of whole beats of it followed by a zero byte with err (cut short); sent frames in
    between were lost. Returns the numbers of frames (exact, cut short, lost)."""
    exact = cut = lost = 0
    it = iter(sent)
    for frame in got:
        for want in it:
            if bytes(frame) == bytes(want) and frame.err == want.err:
                exact += 1
                break
            body = bytes(frame)[:-1]
            if (frame.err and bytes(frame)[-1:] == b"\0" and body and len(body) % n == 0
                    and len(body) < len(want) and bytes(want).startswith(body)):
                cut += 1
                break
            lost += 1
        else:
            raise AssertionError(f"received {frame!r} matches no frame sent")
    return exact, cut, lost + sum(1 for _ in it)


def run_rx(n, clocks, frames, depth, *, idle, stall, seed):
    rng = random.Random(seed)
    dut = MacRxCrossing(n, depth)
    state = {"got": []}

    async def mac(ctx):
        await send(DomainBus(ctx, "mac"), StreamPort.amaranth(dut.i), frame_transfers(frames, n),
                   rng=random.Random(rng.random()), idle=idle, timeout=0)
        state["sent"] = True

    async def ready_always(ctx):
        while "done" not in state:
            _, _, ready = await ctx.tick("mac").sample(dut.i.ready)
            assert ready, "the RX crossing stalled the MAC"

    async def core(ctx):
        sink_rng = random.Random(rng.random())
        beats, quiet = [], 0
        while quiet < 20:                       # the MAC is done and nothing more comes out
            ready = sink_rng.random() >= stall
            ctx.set(dut.o.ready, ready)
            _, _, valid, data, keep, last, err = await ctx.tick().sample(
                dut.o.valid, dut.o.payload.data, dut.o.payload.keep, dut.o.payload.last,
                dut.o.payload.err)
            if ready and valid:
                beats.append(Beat(data, keep, last, err))
            quiet = quiet + 1 if "sent" in state and not valid else 0
        state["got"] = from_beats(beats, n)
        state["overflows"] = ctx.get(dut.overflows)
        state["done"] = True

    simulate(dut, clocks, mac, ready_always, core)
    return state["got"], state["overflows"]


@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("clocks", CLOCKS)
def test_rx_exact(n, clocks):
    """A FIFO of two maximum frames and a core that keeps up: every frame arrives exact."""
    rng = random.Random(n + len(clocks))
    frames = random_frames(rng, n, 12 if n == 1 else 40, 90 if n == 1 else 400)
    got, overflows = run_rx(n, CLOCKS[clocks], frames, None, idle=0.2, stall=0.2,
                            seed=rng.random())
    assert [(bytes(p), p.err) for p in got] == [(bytes(p), p.err) for p in frames]
    assert overflows == 0


@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("clocks", CLOCKS)
def test_rx_overflow(n, clocks):
    """A 16-beat FIFO, frames back to back, a core that stalls most cycles: frames are lost or
    cut short with err, the rest arrive exact and in order, and overflows counts the others."""
    rng = random.Random(7 * n + len(clocks))
    frames = random_frames(rng, n, 40 if n == 1 else 80, 24 * n, err=0.1)
    got, overflows = run_rx(n, CLOCKS[clocks], frames, 16, idle=0.1, stall=0.6,
                            seed=rng.random())
    exact, cut, lost = match_rx(frames, got, n)
    assert overflows == cut + lost
    assert exact > 3 and cut > 3 and lost > 3, (exact, cut, lost)


# --- TX ----------------------------------------------------------------------------------------

def run_tx(n, clocks, frames, depth, *, idle, gap, seed):
    """Frames sent on the core side with ``idle``; the MAC side takes every beat of a frame on
    consecutive cycles, as TxFramer does, and waits up to ``gap`` random cycles between frames.
    """
    rng = random.Random(seed)
    dut = MacTxCrossing(n, depth)
    state = {"in": 0, "started": []}

    async def core(ctx):
        src = random.Random(rng.random())
        bus, port = AmaranthBus(ctx), StreamPort.amaranth(dut.i)
        for frame in frames:
            await send_packets(bus, port, [frame], n, rng=src, idle=idle)
            state["in"] += 1                    # its last beat was taken at the last edge

    async def mac(ctx):
        sink = random.Random(rng.random())
        beats, in_frame = [], False
        while len(state["started"]) < len(frames) or in_frame:
            ready = in_frame or sink.random() >= gap
            ctx.set(dut.o.ready, ready)
            _, _, valid, data, keep, last, err = await ctx.tick("mac").sample(
                dut.o.valid, dut.o.payload.data, dut.o.payload.keep, dut.o.payload.last,
                dut.o.payload.err)
            if in_frame:
                assert valid, f"underrun in frame {len(state['started']) - 1}"
            if ready and valid:
                if not in_frame:
                    state["started"].append(state["in"])
                beats.append(Beat(data, keep, last, err))
                in_frame = not last
        state["got"] = from_beats(beats, n)

    simulate(dut, clocks, core, mac)
    # Store and forward: frame k started only once frames 0..k were wholly taken.
    assert all(done > k for k, done in enumerate(state["started"])), state["started"]
    return state["got"], dut


@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("clocks", CLOCKS)
def test_tx(n, clocks):
    """Random frames up to a full FIFO (the default, two maximum frames), idle core side."""
    rng = random.Random(11 * n + len(clocks))
    frames = random_frames(rng, n, 10 if n == 1 else 30, 200 if n == 1 else 1514)
    got, dut = run_tx(n, CLOCKS[clocks], frames, None, idle=0.3, gap=0.5, seed=rng.random())
    assert [(bytes(p), p.err) for p in got] == [(bytes(p), p.err) for p in frames]


@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("clocks", CLOCKS)
def test_tx_small_fifo(n, clocks):
    """A 16-beat FIFO: frames of 1 beat up to exactly 16 beats, many frames in flight."""
    rng = random.Random(13 * n + len(clocks))
    lengths = [1, 16 * n, 16 * n - n + 1] + [rng.randint(1, 16 * n) for _ in range(40)]
    frames = [Packet(bytes(rng.getrandbits(8) for _ in range(k)), rng.random() < 0.2)
              for k in lengths]
    got, dut = run_tx(n, CLOCKS[clocks], frames, 16, idle=0.1, gap=0.3, seed=rng.random())
    assert dut.depth_beats == 16
    assert [(bytes(p), p.err) for p in got] == [(bytes(p), p.err) for p in frames]


def test_parameters():
    assert MacTxCrossing(1).depth_beats == 4096 and MacRxCrossing(8).depth_beats == 512
    assert MacRxCrossing(8, 100).depth_beats == 128
    with pytest.raises(ValueError):
        MacRxCrossing(8, 1)
    with pytest.raises(ValueError):
        MacTxCrossing(8, 64, mac_domain="sync")


#: (source clock, destination clock) periods: the MAC four times as fast as a 4-byte core
#: (the boards' arrangement), a source slower than its destination, and 3.3 times as fast.
COUNT_CLOCKS = {"125/31.25": (8e-9, 32e-9), "100/125": (10e-9, 8e-9),
                "156.25/47": (6.4e-9, 21.3e-9)}


@pytest.mark.parametrize("clocks", COUNT_CLOCKS)
def test_count_crossing(clocks):
    """A source counter stepping by 0, 1 or 2 a cycle (in bursts 1.5 a cycle on average, as
    far ahead of the crossing's follower as its bits allow), an 8-bit count on the other side,
    so that it wraps: on every destination cycle the count never runs ahead of the events,
    never falls back, and advances no more than the clock ratio allows; it ends equal to
    them."""
    source, destination = COUNT_CLOCKS[clocks]
    ratio = destination / source
    dut = CountCrossing(count_bits(ratio), width=8)
    rng = random.Random(clocks)
    state = {"events": 0, "done": False}
    total = 700

    async def events(ctx):
        shown = 0               # where the crossing's follower is: a step a cycle towards i
        while state["events"] < total:
            burst = rng.random() < 0.1
            for _ in range(rng.randint(1, 12) if burst else 1):
                step = rng.choice((1, 2)) if burst else int(rng.random() < 0.3)
                if state["events"] + step - shown < 1 << dut.bits:     # the contract's lead
                    state["events"] = min(total, state["events"] + step)
                ctx.set(dut.i, state["events"] % (1 << dut.bits))
                await ctx.tick("mac")
                shown += shown < state["events"]
        await ctx.tick("mac").repeat(100)
        state["done"] = True

    async def reader(ctx):
        before, counted = 0, 0
        while not state["done"]:
            *_, got = await ctx.tick("sync").sample(dut.o)
            advance = (got - before) % 256
            assert advance <= math.ceil(ratio) + 1, (before, got)
            counted += advance
            assert counted <= state["events"], (counted, state["events"])
            before = got
        assert counted == total and before == total % 256

    simulate(dut, (source, destination), events, reader)


def test_count_crossing_parameters():
    assert [count_bits(r) for r in (0.5, 1, 4, 64)] == [3, 3, 4, 8]
    with pytest.raises(ValueError, match="bits must be"):
        CountCrossing(1)
    with pytest.raises(ValueError, match="must differ"):
        CountCrossing(4, from_domain="sync")
    with pytest.raises(ValueError, match="ratio"):
        count_bits(0)
