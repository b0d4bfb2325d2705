"""Beat layout, width checks, SkidBuffer and HalfRateSlice under the Amaranth simulator."""

import random

import pytest
from amaranth import unsigned

from iwarp_nic.stream import (
    DATA_BYTES,
    BeatLayout,
    BeatStream,
    HalfRateSlice,
    SkidBuffer,
    check_data_bytes,
)
from iwarp_tb.amsim import run
from iwarp_tb.beats import Packet
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, recv_packets, send, send_packets


def test_beat_layout_fields():
    layout = BeatLayout(8, err=True)
    assert {name: shape.width for name, shape in layout} == {
        "data": 64, "keep": 8, "last": 1, "err": 1}
    assert "err" not in dict(BeatLayout(8).members)
    assert BeatStream(4).members["payload"].shape == BeatLayout(4)


@pytest.mark.parametrize("bad", [0, 3, 128, 8.0, "8"])
def test_bad_width_rejected(bad):
    with pytest.raises(ValueError, match="data_bytes must be one of"):
        check_data_bytes(bad)
    with pytest.raises(ValueError):
        BeatLayout(bad)


@pytest.mark.parametrize("kind", [SkidBuffer, HalfRateSlice])
@pytest.mark.parametrize("width", DATA_BYTES)
def test_slice_random_backpressure(width, kind):
    rng = random.Random(width)
    packets = [Packet(rng.randbytes(rng.randint(1, 4 * width + 3)), rng.random() < 0.3)
               for _ in range(40)]
    dut = kind(BeatLayout(width, err=True))
    got = []

    async def source(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.i), packets, width,
                           rng=rng, idle=0.4)

    async def sink(ctx):
        got.extend(await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.o),
                                      len(packets), width, rng=rng, stall=0.4))

    run(dut, source, sink, name=f"{kind.__name__}_w{width}")
    assert got == packets
    assert [p.err for p in got] == [p.err for p in packets]


def _unstalled(kind, values):
    """``values`` through a fresh ``kind`` of 32 bits with the output always ready: what came
    out, and per cycle until the last came out, ``(o.valid, i.ready)``."""
    dut = kind(unsigned(32))
    got = []
    trace = []

    async def source(ctx):
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i),
                   ({"data": v} for v in values))

    async def sink(ctx):
        bus = AmaranthBus(ctx)
        ctx.set(dut.o.ready, 1)
        while len(got) < len(values):
            valid, data, i_ready = await bus.edge(dut.o.valid, dut.o.payload, dut.i.ready)
            trace.append((valid, i_ready))
            if valid:
                got.append(data)

    run(dut, source, sink)
    return got, trace


def _stalled(kind, offered, held):
    """1, 2, ... ``offered`` offered to a fresh ``kind`` of 32 bits whose output stalls: its
    ``i.ready`` in each of those cycles, then the first ``held`` transfers it gives out."""
    dut = kind(unsigned(32))
    seen = []
    received = []

    async def stalled(ctx):
        bus = AmaranthBus(ctx)
        ctx.set(dut.i.valid, 1)
        ctx.set(dut.o.ready, 0)
        for v in range(1, offered + 1):
            ctx.set(dut.i.payload, v)
            (i_ready,) = await bus.edge(dut.i.ready)
            seen.append(i_ready)
        received.extend(t["data"] for t in await recv(bus, StreamPort.amaranth(dut.o), held))

    run(dut, stalled)
    return seen, received


def test_skid_full_rate_and_registered_ready():
    """With no back-pressure one transfer passes per cycle; i.ready never depends on o.ready
    in the same cycle (it is a register), so a stall is seen at the input a cycle later."""
    values = list(range(1, 101))
    got, trace = _unstalled(SkidBuffer, values)
    assert got == values
    assert len(trace) == len(values) + 1  # one cycle of latency, then one per cycle
    assert all(i_ready for _, i_ready in trace)

    # Now a stalled output: the first stalled transfer lands in the skid slot, then ready falls.
    seen, received = _stalled(SkidBuffer, 5, 2)
    assert received == [1, 2]
    assert seen == [1, 1, 0, 0, 0]


def test_half_rate_slice_every_other_cycle_and_registered_ready():
    """With no back-pressure a transfer passes every other cycle, each a cycle after it was
    taken; i.ready is the slice's emptiness, so it never depends on o.ready in the same cycle,
    and while o stalls the one transfer held waits and nothing more is taken."""
    values = list(range(1, 51))
    got, trace = _unstalled(HalfRateSlice, values)
    assert got == values
    # taken in one cycle, offered in the next (while the input waits), then empty again
    assert trace == [(0, 1), (1, 0)] * len(values)

    seen, received = _stalled(HalfRateSlice, 4, 1)
    assert received == [1]
    assert seen == [1, 0, 0, 0]
