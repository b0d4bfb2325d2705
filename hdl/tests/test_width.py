# amaranth: UnusedElaboratable=no
"""BeatUpsizer and BeatDownsizer under the Amaranth simulator: random packets (every length
around the beat sizes, with and without err) through each, at several width pairs, with random
idle and stall, compared byte for byte and checked against the stream rules; then the
full-rate claims, alone and back to back."""

import random

import pytest

from iwarp_nic.width import BeatDownsizer, BeatUpsizer
from iwarp_tb.amsim import run
from iwarp_tb.beats import Packet
from iwarp_tb.streams import AmaranthBus, StreamPort, recv_packets, send_packets

PAIRS = [(1, 2), (1, 8), (2, 8), (8, 64)]


def _packets(rng, wide, count=60):
    lengths = list(range(1, 2 * wide + 2)) + [rng.randint(1, 6 * wide) for _ in range(count)]
    return [Packet(rng.randbytes(k), rng.random() < 0.3) for k in lengths]


def _through(dut, packets, n_in, n_out, *, rng, idle, stall):
    got = []

    async def source(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.i), packets, n_in,
                           rng=rng, idle=idle)

    async def sink(ctx):
        got.extend(await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.o),
                                      len(packets), n_out, rng=rng, stall=stall))

    run(dut, source, sink)
    return got


@pytest.mark.parametrize("narrow,wide", PAIRS)
@pytest.mark.parametrize("direction", ["up", "down"])
def test_random(narrow, wide, direction):
    rng = random.Random(f"{narrow}-{wide}-{direction}")
    packets = _packets(rng, wide)
    if direction == "up":
        dut, n_in, n_out = BeatUpsizer(narrow, wide, err=True), narrow, wide
    else:
        dut, n_in, n_out = BeatDownsizer(wide, narrow, err=True), wide, narrow
    got = _through(dut, packets, n_in, n_out, rng=rng, idle=0.3, stall=0.3)
    assert got == packets
    assert [p.err for p in got] == [p.err for p in packets]


def test_without_err():
    rng = random.Random(5)
    packets = [Packet(rng.randbytes(rng.randint(1, 20))) for _ in range(30)]
    for dut, n_in, n_out in ((BeatUpsizer(1, 4), 1, 4), (BeatDownsizer(4, 1), 4, 1)):
        assert _through(dut, packets, n_in, n_out, rng=rng, idle=0.2, stall=0.2) == packets


@pytest.mark.parametrize("bad", [(2, 2), (8, 2), (3, 6)])
def test_bad_widths(bad):
    with pytest.raises(ValueError):
        BeatUpsizer(*bad)
    with pytest.raises(ValueError):
        BeatDownsizer(bad[1], bad[0])


@pytest.mark.parametrize("narrow,wide", [(1, 2), (1, 8), (8, 64)])
def test_full_rate(narrow, wide):
    """Each in the place it serves: the upsizer into a sink that never stalls (a crossing
    FIFO's write side) takes a narrow beat on every cycle; the downsizer fed by a source that
    never idles (a crossing FIFO releasing a whole frame) sends a narrow beat on every cycle,
    back to back across wide beats and packets (what a MAC's transmitter needs)."""
    rng = random.Random(wide)
    packets = _packets(rng, wide, count=20)
    narrow_beats = sum(-(-len(p) // narrow) for p in packets)
    wide_beats = sum(-(-len(p) // wide) for p in packets)

    up = BeatUpsizer(narrow, wide, err=True)
    stalls = []

    async def up_source(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(up.i), packets, narrow)

    async def up_sink(ctx):
        bus = AmaranthBus(ctx)
        ctx.set(up.o.ready, 1)
        taken = 0
        while taken < wide_beats:
            valid, i_valid, i_ready = await bus.edge(up.o.valid, up.i.valid, up.i.ready)
            taken += valid
            stalls.append(i_valid and not i_ready)

    run(up, up_source, up_sink)
    assert not any(stalls), "the upsizer stalled a full-rate source"

    down = BeatDownsizer(wide, narrow, err=True)
    trace = []

    async def down_source(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(down.i), packets, wide)

    async def down_sink(ctx):
        bus = AmaranthBus(ctx)
        ctx.set(down.o.ready, 1)
        while sum(trace) < narrow_beats:
            trace.append((await bus.edge(down.o.valid))[0])

    run(down, down_source, down_sink)
    first = trace.index(1)
    assert first <= 2 and trace[first:] == [1] * narrow_beats, "a gap in the downsizer's output"
