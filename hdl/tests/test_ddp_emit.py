# amaranth: UnusedElaboratable=no
"""SegmentEmitter against the model's segmentation and encoding, at 1, 8 and 64 bytes.

Messages of every opcode (payloads of 0 octets to several segments, RDMAP headers as the
payload of the opcodes that carry one) are cut at a random ``max_ulpdu`` the way the model's
engine cuts them (``max_ulpdu`` less the header per segment, TO or MO advancing, L on the
last, one empty segment for an empty message); every ULPDU must be the model's
``Segment(...).encode()`` and ``o_length`` its length, every fetch the segment's part of the
payload; random idles, stalls and late answers to fetches.
"""

import random

import pytest
from amaranth.back import verilog

from iwarp_nic.ddp.emit import SegmentEmitter
from iwarp_tb import toolchain
from iwarp_tb.amsim import run
from iwarp_tb.lint import lint
from iwarp_tb.messages import fetches, messages
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, recv_packets, send, send_packets

IDLE = STALL = 0.25


def simulate(n, max_ulpdu, items, *, seed, idle=IDLE, stall=STALL):
    dut = SegmentEmitter(n)
    wanted = [u for _, _, ulpdus in items for u in ulpdus]
    asked = fetches(max_ulpdu, items)
    got = {"fetches": []}

    async def source(ctx):
        ctx.set(dut.max_ulpdu, max_ulpdu)
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i_message),
                   [msg for msg, _, _ in items], rng=random.Random(seed), idle=idle)

    async def answer(ctx):
        bus, rng = AmaranthBus(ctx), random.Random(seed + 1)
        for payload, offset, length in asked:
            fetch = (await recv(bus, StreamPort.amaranth(dut.o_fetch), 1, rng=rng,
                                stall=stall))[0]
            got["fetches"].append((fetch["offset"], fetch["length"]))
            assert (fetch["offset"], fetch["length"]) == (offset, length)
            await send_packets(bus, StreamPort.amaranth(dut.i_payload),
                               [payload[offset:offset + length]], n, rng=rng, idle=idle)

    async def ulpdus(ctx):
        got["ulpdus"] = await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.o),
                                           len(wanted), n, rng=random.Random(seed + 2),
                                           stall=stall)

    async def lengths(ctx):
        got["lengths"] = await recv(AmaranthBus(ctx), StreamPort.amaranth(dut.o_length),
                                    len(wanted), rng=random.Random(seed + 3), stall=stall)

    run(dut, source, answer, ulpdus, lengths, name=f"ddp_emit_w{n}")
    for k, (got_ulpdu, want) in enumerate(zip(got["ulpdus"], wanted)):
        assert bytes(got_ulpdu) == want, k
    assert len(got["ulpdus"]) == len(wanted)
    assert [t["data"] for t in got["lengths"]] == [len(u) for u in wanted]
    return wanted


@pytest.mark.parametrize("n", [1, 8, 64])
@pytest.mark.parametrize("max_ulpdu", [80, 1000])
def test_against_model(n, max_ulpdu):
    rng = random.Random(n + max_ulpdu)
    items = messages(rng, 36 if n > 1 else 24, max_ulpdu)
    wanted = simulate(n, max_ulpdu, items, seed=n)
    assert len(wanted) > len(items)
    assert {msg["opcode"] for msg, _, _ in items} >= {0, 3}


@pytest.mark.parametrize("n", [8, 64])
def test_full_rate(n):
    rng = random.Random(50 + n)
    simulate(n, 1460, messages(rng, 20, 1460), seed=n, idle=0, stall=0)


def test_lint(tmp_path):
    toolchain.setup()
    path = tmp_path / "emit.v"
    path.write_text(verilog.convert(SegmentEmitter(8), name="emit"))
    assert lint(path) == ""
