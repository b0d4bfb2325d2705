# amaranth: UnusedElaboratable=no
"""StreamSender (segment emitter, FPDU framer, stream position) against the model, at 1, 8 and
64 bytes: messages of every opcode, cut at a random ``max_ulpdu``, framed with CRC and markers
each on and off; every FPDU must be the model ``Framer``'s frame of the model's segment, with
the markers where the stream position puts them, under random idles, stalls and late fetches.
"""

import random

import pytest

from iwarp_model.wire.fpdu import Framer
from iwarp_nic.ddp.send import StreamSender
from iwarp_tb.amsim import run
from iwarp_tb.messages import fetches, messages
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, recv_packets, send, send_packets

IDLE = STALL = 0.25


def simulate(n, max_ulpdu, items, *, crc, markers, seed, idle=IDLE, stall=STALL):
    dut = StreamSender(n)
    framer = Framer(crc=crc, markers=markers)
    wanted = [framer.frame(u) for _, _, ulpdus in items for u in ulpdus]
    got = {}

    async def source(ctx):
        ctx.set(dut.max_ulpdu, max_ulpdu)
        ctx.set(dut.crc, crc)
        ctx.set(dut.markers, markers)
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i_message),
                   [msg for msg, _, _ in items], rng=random.Random(seed), idle=idle)

    async def answer(ctx):
        bus, rng = AmaranthBus(ctx), random.Random(seed + 1)
        for payload, offset, length in fetches(max_ulpdu, items):
            fetch = (await recv(bus, StreamPort.amaranth(dut.o_fetch), 1, rng=rng,
                                stall=stall))[0]
            assert (fetch["offset"], fetch["length"]) == (offset, length)
            await send_packets(bus, StreamPort.amaranth(dut.i_payload),
                               [payload[offset:offset + length]], n, rng=rng, idle=idle)

    async def fpdus(ctx):
        got["fpdus"] = await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.o),
                                          len(wanted), n, rng=random.Random(seed + 2),
                                          stall=stall)

    run(dut, source, answer, fpdus, name=f"ddp_send_w{n}")
    for k, (fpdu, want) in enumerate(zip(got["fpdus"], wanted)):
        assert bytes(fpdu) == want and not fpdu.err, k
    assert len(got["fpdus"]) == len(wanted)
    return [bytes(f) for f in got["fpdus"]]


@pytest.mark.parametrize("n", [1, 8, 64])
@pytest.mark.parametrize("crc, markers", [(True, True), (False, False), (False, True)])
def test_against_model(n, crc, markers):
    rng = random.Random(n * 4 + crc * 2 + markers)
    max_ulpdu = rng.choice([100, 700, 1460])
    simulate(n, max_ulpdu, messages(rng, 24, max_ulpdu), crc=crc, markers=markers, seed=n)


@pytest.mark.tshark
@pytest.mark.parametrize("n", [1, 8, 64])
def test_tshark(tmp_path, n):
    """tshark reads the sender's stream (messages of every opcode, CRC on, markers off: the
    dissector does not take markers out) as one FPDU per segment with Good CRC32 and the
    opcodes sent."""
    from iwarp_model.capture import StreamCapture
    from iwarp_model.wire.mpa import MpaFrame
    from iwarp_tb.tshark import check_fpdus

    rng = random.Random(90 + n)
    items = messages(rng, 36, 600)
    fpdus = simulate(n, 600, items, crc=True, markers=False, seed=n, idle=0.1, stall=0.1)
    path = tmp_path / f"ddp_send_w{n}.pcap"
    with StreamCapture(path, ("10.0.0.1", 40000), ("10.0.0.2", 5000)) as capture:
        capture.sent(MpaFrame(reply=False, crc=True, revision=1).encode())
        capture.received(MpaFrame(reply=True, crc=True, revision=1).encode())
        for fpdu in fpdus:
            capture.sent(fpdu)
    check_fpdus(path, [u for _, _, ulpdus in items for u in ulpdus])
