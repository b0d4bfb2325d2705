"""CRCEngine against the model's CRCs at every width, with random idles and stalls."""

import gc
import random
import warnings

import pytest
from amaranth.back import verilog
from amaranth.hdl import UnusedElaboratable

from iwarp_model import crc32, crc32c
from iwarp_nic.crc import CRC32, CRC32C, CRC32CEngine, CRCEngine, CRCParams
from iwarp_nic.stream import DATA_BYTES
from iwarp_tb.amsim import run
from iwarp_tb.beats import to_beats
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, send_packets

MODELS = {CRC32C: crc32c, CRC32: crc32}


def crc32_bzip2(data):
    """CRC-32/BZIP2 (not reflected), bit-serial: the oracle for ``reflected=False``."""
    reg = 0xFFFF_FFFF
    for byte in data:
        for bit in range(7, -1, -1):
            fb = (reg >> 31) ^ (byte >> bit) & 1
            reg = ((reg << 1) & 0xFFFF_FFFF) ^ (0x04C11DB7 if fb else 0)
    return reg ^ 0xFFFF_FFFF


BZIP2 = CRCParams(poly=0x04C11DB7, init=0xFFFF_FFFF, xorout=0xFFFF_FFFF, reflected=False)


def random_packets(rng, data_bytes):
    """Every last-beat fill for two beat counts, then random lengths; fewer at narrow widths
    (amaranth.sim time goes with beats)."""
    count, longest = {1: (40, 100), 2: (40, 150)}.get(data_bytes, (60, 300))
    lengths = list(range(1, 2 * data_bytes + 2)) + [rng.randint(1, longest) for _ in range(count)]
    if data_bytes >= 8:
        lengths += [1500, 9000 if data_bytes >= 32 else 2000]
    rng.shuffle(lengths)
    return [b"123456789"] + [rng.randbytes(n) for n in lengths]


def simulate(engine, packets, *, seed=0, idle=0.0, stall=0.0, extra=()):
    """Send ``packets`` (``idle`` > 0: random idle cycles); return the CRCs received (``stall``
    > 0: random cycles with ``o.ready`` low)."""
    got = []

    async def producer(ctx):
        rng = random.Random(seed) if idle else None
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(engine.i), packets,
                           engine.data_bytes, rng=rng, idle=idle)

    async def consumer(ctx):
        rng = random.Random(seed + 1) if stall else None
        transfers = await recv(AmaranthBus(ctx), StreamPort.amaranth(engine.o), len(packets),
                               rng=rng, stall=stall)
        got.extend(t["data"] for t in transfers)

    run(engine, producer, consumer, *extra)
    return got


@pytest.mark.parametrize("params", [CRC32C, CRC32], ids=["crc32c", "crc32"])
@pytest.mark.parametrize("data_bytes", DATA_BYTES)
def test_random_packets(params, data_bytes):
    seed = data_bytes * 2 + (params is CRC32)
    packets = random_packets(random.Random(seed), data_bytes)
    got = simulate(CRCEngine(params, data_bytes), packets, seed=seed, idle=0.3, stall=0.3)
    assert [hex(v) for v in got] == [hex(MODELS[params](p)) for p in packets]


@pytest.mark.parametrize("data_bytes", [1, 8, 64])
def test_heavy_backpressure(data_bytes):
    """Short packets back to back into an output that is mostly stalled: the skid buffer and the
    pipeline fill and hold, nothing is lost or repeated."""
    rng = random.Random(data_bytes)
    packets = [rng.randbytes(rng.randint(1, data_bytes + 1)) for _ in range(60)]
    got = simulate(CRC32CEngine(data_bytes), packets, seed=3, stall=0.8)
    assert got == [crc32c(p) for p in packets]


@pytest.mark.parametrize("data_bytes", [1, 8, 64])
def test_not_reflected(data_bytes):
    assert crc32_bzip2(b"123456789") == 0xFC891918
    rng = random.Random(data_bytes)
    packets = [b"123456789"] + [rng.randbytes(rng.randint(1, 3 * data_bytes)) for _ in range(10)]
    got = simulate(CRCEngine(BZIP2, data_bytes), packets, seed=1, idle=0.3, stall=0.3)
    assert [hex(v) for v in got] == [hex(crc32_bzip2(p)) for p in packets]


@pytest.mark.parametrize("data_bytes", DATA_BYTES)
def test_full_rate(data_bytes):
    """Back-to-back packets with no idles or stalls: one beat accepted every cycle."""
    rng = random.Random(data_bytes)
    packets = [rng.randbytes(rng.randint(1, 3 * data_bytes)) for _ in range(30)]
    beats = sum(len(to_beats(p, data_bytes)) for p in packets)
    engine = CRC32CEngine(data_bytes)
    accepted = []

    async def monitor(ctx):
        cycle = 0
        while len(accepted) < beats:
            *_, valid, ready = await ctx.tick().sample(engine.i.valid, engine.i.ready)
            if valid and ready:
                accepted.append(cycle)
            cycle += 1

    got = simulate(engine, packets, extra=[monitor])
    assert got == [crc32c(p) for p in packets]
    assert accepted[-1] - accepted[0] + 1 == beats


@pytest.mark.parametrize("data_bytes", DATA_BYTES)
def test_latency(data_bytes):
    """From the cycle a last beat is accepted to the cycle its CRC is offered: engine.latency."""
    engine = CRC32CEngine(data_bytes)
    packets = [b"\x5a", bytes(range(data_bytes + 1)), bytes(2 * data_bytes)]
    measured = []

    async def testbench(ctx):
        ctx.set(engine.o.ready, 1)
        for packet in packets:
            for beat in to_beats(packet, data_bytes):
                for name in ("data", "keep", "last"):
                    ctx.set(engine.i.payload[name], getattr(beat, name))
                ctx.set(engine.i.valid, 1)
                *_, ready = await ctx.tick().sample(engine.i.ready)
                assert ready
            ctx.set(engine.i.valid, 0)
            cycles, valid = 0, 0
            while not valid:
                *_, valid, crc = await ctx.tick().sample(engine.o.valid, engine.o.payload)
                cycles += 1
            measured.append(cycles)
            assert crc == crc32c(packet)

    run(engine, testbench)
    assert engine.latency == 3 + data_bytes.bit_length() - 1
    assert measured == [engine.latency] * len(packets)


def assert_rejected(match, build):
    """``build()`` raises ValueError matching ``match``. The half-built component is collected
    here, with Amaranth's warning that it was never elaborated silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match=match):
            build()
        gc.collect()


@pytest.mark.parametrize("data_bytes", [0, 3, 128, 8.0, "8"])
def test_bad_data_bytes(data_bytes):
    assert_rejected("data_bytes", lambda: CRCEngine(CRC32C, data_bytes))


def test_bad_params():
    assert_rejected("params", lambda: CRCEngine("crc32c", 8))
    assert_rejected("poly", lambda: CRCParams(poly=0x04C11DB6, init=0, xorout=0))
    assert_rejected("init", lambda: CRCParams(poly=0x04C11DB7, init=1 << 32, xorout=0))


@pytest.mark.parametrize("data_bytes", [1, 8, 64])
def test_converts_to_verilog(data_bytes):
    assert "module" in verilog.convert(CRC32CEngine(data_bytes))
