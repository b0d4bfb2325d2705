# amaranth: UnusedElaboratable=no
"""SipHash24 and IsnGenerator (RFC 6528) against the reference SipHash of iwarp_model.siphash.

The reference is first checked against the published SipHash-2-4 vectors (the reference
implementation's ``vectors.h``, key 00..0f, message 00 01 .. of each length; the 15-byte one is
also the worked example of the paper's appendix A). The gateware is then checked against both:
every vector length, random keys and messages with random idle/stall, exact latency, and
ISN = M + F with a 4 us timer fast enough to watch it move.
"""

import random

import pytest

from iwarp_model.siphash import siphash24
from iwarp_nic.tcp.isn import ISN_TUPLE, TICKS_PER_SECOND, IsnGenerator, SipHash24
from iwarp_tb.amsim import run
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, send

IDLE = STALL = 0.3
VECTOR_KEY = bytes(range(16))
#: SipHash-2-4 of bytes(range(n)) under VECTOR_KEY, as the 8 output bytes, for n = 0, 1, ...
VECTORS = [bytes.fromhex(h) for h in (
    "310e0edd47db6f72", "fd67dc93c539f874", "5a4fa9d909806c0d", "2d7efbd796666785",
    "b7877127e09427cf", "8da699cd64557618", "cee3fe586e46c9cb", "37d1018bf50002ab",
    "6224939a79f5f593", "b0e4a90bdf82009e", "f3b9dd94c5bb5d7a", "a7ad6b22462fb3f4",
    "fbe50e86bc8f1e75", "903d84c02756ea14", "eef27a8e90ca23f7", "e545be4961ca29a1",
    "db9bc2577fcc2a3f", "9447be2cf5e99a69", "9cd38d96f0b3c14b", "bd6179a71dc96dbb",
)]


def key_int(key):
    """The ``key`` port value: k0 = bytes 0..7 little-endian in bits 0..63, k1 above."""
    return int.from_bytes(key, "little")


def test_reference_vectors():
    for n, want in enumerate(VECTORS):
        assert siphash24(VECTOR_KEY, bytes(range(n))) == int.from_bytes(want, "little"), n
    assert siphash24(VECTOR_KEY, b"") == 0x726FDB47DD0E0E31
    assert siphash24(VECTOR_KEY, b"\x00") == 0x74F839C593DC67FD


def hash_run(dut, key, messages, *, seed=0, idle=0.0, stall=0.0):
    """Hash ``messages`` under ``key``; return the outputs and, for each message, the cycles from
    its transfer on ``i`` to ``o.valid`` (measured with ``o`` always ready)."""
    got, sent_at, valid_at = [], [], []
    state = {"cycle": 0, "done": False}

    async def clock(ctx):
        """Counts edges and notes when each transfer happens and each result appears."""
        seen_valid = False
        while not state["done"]:
            _, _, iv, ir, ov, orr = await ctx.tick().sample(dut.i.valid, dut.i.ready,
                                                            dut.o.valid, dut.o.ready)
            if iv and ir:
                sent_at.append(state["cycle"])
            if ov and not seen_valid:
                valid_at.append(state["cycle"])
            seen_valid = ov and not orr
            state["cycle"] += 1

    async def producer(ctx):
        ctx.set(dut.key, key_int(key))
        rng = random.Random(seed) if idle else None
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i),
                   [{"data": int.from_bytes(msg, "little")} for msg in messages],
                   rng=rng, idle=idle)

    async def consumer(ctx):
        rng = random.Random(seed + 1) if stall else None
        out = await recv(AmaranthBus(ctx), StreamPort.amaranth(dut.o), len(messages),
                         rng=rng, stall=stall)
        got.extend(t["data"] for t in out)
        state["done"] = True

    run(dut, clock, producer, consumer)
    return got, [v - s for s, v in zip(sent_at, valid_at)]


@pytest.mark.parametrize("n", range(len(VECTORS)))
def test_siphash_vectors(n):
    dut = SipHash24(n)
    got, latency = hash_run(dut, VECTOR_KEY, [bytes(range(n))])
    assert got == [int.from_bytes(VECTORS[n], "little")]
    assert latency == [dut.rounds + 1]
    assert dut.rounds == 2 * (n // 8 + 1) + 4


@pytest.mark.parametrize("n", [0, 5, 8, 12, 23])
def test_siphash_random(n):
    rng = random.Random(n)
    key = rng.randbytes(16)
    dut = SipHash24(n)
    messages = [rng.randbytes(n) for _ in range(12)]
    got, _ = hash_run(dut, key, messages, seed=n, idle=IDLE, stall=STALL)
    assert got == [siphash24(key, msg) for msg in messages]
    # Back to back with o always ready: one hash per rounds + 1 cycles, every one on time.
    got, latency = hash_run(dut, key, messages)
    assert got == [siphash24(key, msg) for msg in messages]
    assert latency == [dut.rounds + 1] * len(messages)


def tuple_bytes(t):
    return (t["local_ip"].to_bytes(4, "big") + t["local_port"].to_bytes(2, "big")
            + t["remote_ip"].to_bytes(4, "big") + t["remote_port"].to_bytes(2, "big"))


@pytest.mark.parametrize("tick_cycles,stall", [(2, 0.0), (3, STALL), (7, STALL)])
def test_isn(tick_cycles, stall):
    """ISN = M + F: M counted here from the edges since reset (timer 0 at reset, +1 every
    ``tick_cycles`` edges) at the edge the request transfers, F from the reference SipHash."""
    rng = random.Random(tick_cycles)
    key = rng.randbytes(16)
    dut = IsnGenerator(tick_cycles * TICKS_PER_SECOND)
    assert dut.tick_cycles == tick_cycles
    requests = [{name: rng.getrandbits(width) for name, width in
                 [("local_ip", 32), ("local_port", 16), ("remote_ip", 32), ("remote_port", 16)]}
                for _ in range(25)]
    requests.append(dict(requests[0]))          # the same 4-tuple later: only M differs
    accepted, got = [], []
    state = {"cycle": 0, "done": False}

    async def clock(ctx):
        while not state["done"]:
            _, _, valid, ready = await ctx.tick().sample(dut.i.valid, dut.i.ready)
            if valid and ready:
                accepted.append(state["cycle"])
            state["cycle"] += 1

    async def producer(ctx):
        ctx.set(dut.key, key_int(key))
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i), requests,
                   rng=random.Random(1), idle=0.6)       # long gaps: M moves between requests

    async def consumer(ctx):
        out = await recv(AmaranthBus(ctx), StreamPort.amaranth(dut.o), len(requests),
                         rng=random.Random(2), stall=stall)
        got.extend(t["data"] for t in out)
        state["done"] = True

    run(dut, clock, producer, consumer)
    timer = [(cycle // tick_cycles) & 0xFFFF_FFFF for cycle in accepted]
    want = [(m + siphash24(key, tuple_bytes(t))) & 0xFFFF_FFFF for m, t in zip(timer, requests)]
    assert got == want
    assert len(set(timer)) > len(requests) // 2          # the test did see M advance
    assert (got[-1] - got[0]) & 0xFFFF_FFFF == timer[-1] - timer[0]


def test_isn_tuple_layout():
    """The 4-tuple goes to F in network order, local side first (RFC 6528 section 3)."""
    assert ISN_TUPLE.length == 12
    assert [name for name, _ in ISN_TUPLE.layout] == [
        "local_ip", "local_port", "remote_ip", "remote_port"]


@pytest.mark.parametrize("bad", [0, 100_000, 499_999, -1, "125e6", True, None])
def test_isn_bad_clock(bad):
    with pytest.raises(ValueError):
        IsnGenerator(bad)


@pytest.mark.parametrize("bad", [-1, 1.5, True, None])
def test_siphash_bad_length(bad):
    with pytest.raises(ValueError):
        SipHash24(bad)


def test_isn_tick_from_clock():
    assert IsnGenerator(125_000_000).tick_cycles == 500
    assert IsnGenerator(156_250_000).tick_cycles == 625
