# amaranth: UnusedElaboratable=no
"""The header + payload Arbiter against a Python oracle: every source's packets come out whole,
in the source's order, each payload behind its own header, with random idle and stall cycles on
every port; with ``ahead``, at most ``ahead`` further headers pass while a payload is still on
its way, and they do pass (the property the TCP engine's chunk admission relies on)."""

import random

import pytest
from amaranth import unsigned

from iwarp_nic.ip.mux import Arbiter
from iwarp_tb.amsim import run
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, recv_packets, send, send_packets

PACKETS = 40


def source_packets(rng, way, ways, n):
    """``PACKETS`` (header, payload) pairs of source ``way``: the header names the way and the
    packet's index, the payload (1 to 5 beats and a bit) is random."""
    out = []
    for k in range(PACKETS):
        payload = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 5 * n + 1)))
        out.append((k * ways + way, payload))
    return out


@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.parametrize("ways", [2, 3])
@pytest.mark.parametrize("ahead", [0, 1, 2])
def test_arbiter(n, ways, ahead):
    rng = random.Random(n * 100 + ways * 10 + ahead)
    dut = Arbiter(unsigned(16), n, ways, ahead=ahead)
    sources = [source_packets(rng, way, ways, n) for way in range(ways)]
    total = ways * PACKETS
    state = {"most_ahead": 0, "early": 0}

    def feeder(way):
        async def headers(ctx):
            await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i_header[way]),
                       [{"data": h} for h, _ in sources[way]], rng=random.Random(rng.random()),
                       idle=0.3)

        async def payloads(ctx):
            await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.i_payload[way]),
                               [p for _, p in sources[way]], n, rng=random.Random(rng.random()),
                               idle=0.2)
        return headers, payloads

    async def header_sink(ctx):
        state["headers"] = [t["data"] for t in await recv(
            AmaranthBus(ctx), StreamPort.amaranth(dut.o_header), total,
            rng=random.Random(rng.random()), stall=0.2)]

    async def payload_sink(ctx):
        state["payloads"] = await recv_packets(
            AmaranthBus(ctx), StreamPort.amaranth(dut.o_payload), total, n,
            rng=random.Random(rng.random()), stall=0.4)

    async def watch(ctx):
        # Headers taken minus payloads ended: the packets granted and not yet through.
        granted = 0
        while "payloads" not in state:
            _, _, hv, hr, pv, pr, last = await ctx.tick().sample(
                dut.o_header.valid, dut.o_header.ready, dut.o_payload.valid,
                dut.o_payload.ready, dut.o_payload.payload.last)
            if hv and hr:
                state["early"] += granted > 0
                granted += 1
            if pv and pr and last:
                granted -= 1
            assert granted >= 0, "a payload passed before its header"
            state["most_ahead"] = max(state["most_ahead"], granted - 1)

    benches = [b for way in range(ways) for b in feeder(way)]
    run(dut, *benches, header_sink, payload_sink, watch, name=f"arbiter_w{n}_{ways}_{ahead}")

    expected = {h: p for way in sources for h, p in way}
    assert sorted(state["headers"]) == sorted(expected), "headers lost or repeated"
    for way in range(ways):
        mine = [h for h in state["headers"] if h % ways == way]
        assert mine == [h for h, _ in sources[way]], f"way {way}'s packets out of order"
    for h, payload in zip(state["headers"], state["payloads"]):
        assert bytes(payload) == expected[h], f"packet {h}: payload not behind its own header"
    assert state["most_ahead"] <= ahead, f"{state['most_ahead']} headers ahead, limit {ahead}"
    if ahead:
        assert state["early"] > 0, "no header ever passed while a payload was on its way"
    else:
        assert state["early"] == 0
