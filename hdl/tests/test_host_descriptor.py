# amaranth: UnusedElaboratable=no
"""DescriptorPacker and DescriptorUnpacker under the Amaranth simulator: random send queue
entries, receive queue entries and completions (:mod:`iwarp_nic.host.formats`) to octets and
back at 1, 8 and 64 bytes per beat, with random idle and stall, against Python's little-endian
``int.to_bytes``; packets of the wrong length or with ``err`` come out with ``err``."""

import random

import pytest

from iwarp_nic.host.descriptor import DescriptorPacker, DescriptorUnpacker
from iwarp_nic.host.formats import Cqe, RqWqe, SqWqe
from iwarp_tb.amsim import run
from iwarp_tb.beats import Packet
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, recv_packets, send, send_packets

LAYOUTS = {"sq": SqWqe, "rq": RqWqe, "cqe": Cqe}


def whole(port):
    """The stream ``port`` with its payload as one integer, ``bits``."""
    return StreamPort(port.valid, port.ready, {"bits": port.payload.as_value()})


@pytest.mark.parametrize("n", [1, 8, 64])
@pytest.mark.parametrize("kind", LAYOUTS)
def test_packer(kind, n):
    layout, rng = LAYOUTS[kind], random.Random(f"pack-{kind}-{n}")
    values = [rng.getrandbits(layout.size) for _ in range(12)] + [0, (1 << layout.size) - 1]
    dut, got = DescriptorPacker(layout, n), []

    async def source(ctx):
        await send(AmaranthBus(ctx), whole(dut.i), [{"bits": v} for v in values], rng=rng,
                   idle=0.3)

    async def sink(ctx):
        got.extend(await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.o),
                                      len(values), n, rng=rng, stall=0.3))

    run(dut, source, sink, name=f"pack_{kind}_w{n}")
    assert got == [Packet(v.to_bytes(layout.size // 8, "little")) for v in values]


@pytest.mark.parametrize("n", [1, 8, 64])
@pytest.mark.parametrize("kind", LAYOUTS)
def test_unpacker(kind, n):
    """Good descriptors, and between them a short one (its missing octets read as zero), a
    long one (its extra octets dropped) and one whose read failed, each with ``err``; the
    descriptor after each bad one is read as if nothing had happened."""
    layout, rng = LAYOUTS[kind], random.Random(f"unpack-{kind}-{n}")
    size = layout.size // 8
    cases = []
    for _ in range(10):
        v = rng.getrandbits(layout.size)
        cases.append((Packet(v.to_bytes(size, "little")), v, 0))
    good = bytes(cases[0][0])
    cases.insert(2, (Packet(good[:size - 3]), int.from_bytes(good[:size - 3], "little"), 1))
    cases.insert(4, (Packet(good + b"\xff" * (n + 5)), cases[0][1], 1))
    cases.insert(6, (Packet(good, err=True), cases[0][1], 1))
    dut, got = DescriptorUnpacker(layout, n), []

    async def source(ctx):
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.i),
                           [p for p, _, _ in cases], n, rng=rng, idle=0.3)

    async def sink(ctx):
        got.extend(await recv(AmaranthBus(ctx), whole(dut.o), len(cases), rng=rng, stall=0.3))

    run(dut, source, sink, name=f"unpack_{kind}_w{n}")
    assert [(g["bits"] & ((1 << layout.size) - 1), g["bits"] >> layout.size) for g in got] == \
        [(v, err) for _, v, err in cases]


def test_not_whole_octets():
    from amaranth.lib.data import StructLayout
    with pytest.raises(ValueError, match="whole octets"):
        DescriptorPacker(StructLayout({"a": 12}), 8)
