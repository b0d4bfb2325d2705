# amaranth: UnusedElaboratable=no
"""HeadTrim against a Python oracle (``packet[count:]``), with random idle and stall cycles:
counts of 0, inside the first beat, over whole beats, equal to or beyond the packet's length,
packets with err, and the one-beat-per-cycle throughput with its one tail cycle per packet."""

import random

import pytest

from iwarp_nic.stream import DATA_BYTES
from iwarp_nic.trim import HeadTrim
from iwarp_tb.amsim import run
from iwarp_tb.beats import Packet
from iwarp_tb.streams import AmaranthBus, StreamPort, recv_packets, send, send_packets

IDLE = STALL = 0.3
WIDTHS = DATA_BYTES


def random_case(rng, n, count_bits, packets):
    """``packets`` random (packet, count) pairs: counts of 0, below the length, at and beyond
    it (capped by ``count_bits``), and about 20% of packets with err."""
    most = min(2 ** count_bits - 1, 5 * n + 3)
    cases = []
    for _ in range(packets):
        length = rng.choice([1, n, n + 1, rng.randint(1, 4 * n + 7)])
        data = Packet(bytes(rng.getrandbits(8) for _ in range(length)), rng.random() < 0.2)
        kind = rng.random()
        if kind < 0.2:
            count = 0
        elif kind < 0.35:
            count = rng.randint(length, max(length, most))
        else:
            count = rng.randint(0, length - 1)
        cases.append((data, min(count, 2 ** count_bits - 1)))
    return cases


def oracle(cases):
    return [(bytes(p[c:]), p.err) for p, c in cases if c < len(p)]


def check_trim(n, count_bits, cases, *, idle, stall, seed, err=True):
    rng = random.Random(seed)
    dut = HeadTrim(n, count_bits, err=err)
    expected = oracle(cases)
    state = {"stalls": 0}

    async def counts(ctx):
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i_count),
                   [{"data": c} for _, c in cases], rng=random.Random(rng.random()), idle=idle)

    async def packets(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.i), [p for p, _ in cases],
                           n, rng=random.Random(rng.random()), idle=idle)
        state["sent"] = True

    async def sink(ctx):
        got = await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.o), len(expected), n,
                                 rng=random.Random(rng.random()) if stall else None, stall=stall)
        assert [(bytes(p), p.err) for p in got] == expected
        # Nothing more comes out once the last packet is in.
        ctx.set(dut.o.ready, 1)
        while "sent" not in state:
            await ctx.tick()
        for _ in range(8):
            _, _, valid = await ctx.tick().sample(dut.o.valid)
            assert not valid, "output beyond the expected packets"
        state["done"] = True

    async def stalls(ctx):
        while "done" not in state:
            _, _, valid, ready = await ctx.tick().sample(dut.i.valid, dut.i.ready)
            state["stalls"] += valid and not ready

    run(dut, counts, packets, sink, stalls, name=f"trim_w{n}")
    return state["stalls"]


@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("count_bits", [8, 11])
def test_random(n, count_bits):
    rng = random.Random(n * 100 + count_bits)
    cases = random_case(rng, n, count_bits, 40 if n == 1 else 120)
    check_trim(n, count_bits, cases, idle=IDLE, stall=STALL, seed=rng.random())


@pytest.mark.parametrize("n, count_bits", [(8, 1), (8, 3), (64, 4), (64, 6), (2, 1)])
def test_narrow_counts(n, count_bits):
    """Counts that never reach a whole beat (and one that is exactly a lane index wide)."""
    rng = random.Random(n + count_bits)
    cases = random_case(rng, n, count_bits, 80)
    check_trim(n, count_bits, cases, idle=IDLE, stall=STALL, seed=rng.random())


def tail_stalls(cases, n):
    """The cycles the DUT is allowed to stall ``i`` at full rate: a packet whose first beat
    passes unchanged (count 0) after a packet that ends with a tail beat."""
    stalls, tail = 0, False
    for packet, count in cases:
        stalls += tail and count == 0
        beats = -(-len(packet) // n)
        skip, shift = divmod(count, n)
        last_bytes = len(packet) - (beats - 1) * n
        tail = shift > 0 and skip <= beats - 1 and last_bytes > shift
    return stalls


@pytest.mark.parametrize("n", WIDTHS)
def test_full_rate(n):
    """No idle, no stall: the input is stalled exactly on the tail cycles of tail_stalls."""
    rng = random.Random(5 + n)
    cases = random_case(rng, n, 9, 40 if n == 1 else 150)
    stalls = check_trim(n, 9, cases, idle=0, stall=0, seed=rng.random())
    assert stalls == tail_stalls(cases, n)
    assert tail_stalls(cases, n) > 0 or n == 1


@pytest.mark.parametrize("n", (1, 8))
def test_without_err(n):
    rng = random.Random(50 + n)
    cases = [(Packet(bytes(p)), c) for p, c in random_case(rng, n, 8, 40)]
    check_trim(n, 8, cases, idle=IDLE, stall=STALL, seed=rng.random(), err=False)


def test_aligned_counts_never_stall():
    """Counts that are multiples of the width (and single-beat packets): no stall at all."""
    rng = random.Random(3)
    n = 8
    cases = []
    for _ in range(100):
        length = rng.choice([1, rng.randint(1, 40)])
        cases.append((Packet(bytes(rng.getrandbits(8) for _ in range(length))),
                      n * rng.randint(0, 5)))
    assert check_trim(n, 8, cases, idle=0, stall=0, seed=1) == 0


def test_parameters():
    with pytest.raises(ValueError):
        HeadTrim(3, 8)
    with pytest.raises(ValueError):
        HeadTrim(8, 0)
    with pytest.raises(TypeError):
        HeadTrim(8, 8, err=1)
