# amaranth: UnusedElaboratable=no
"""StreamSender (segment emitter, FPDU framer, stream position) against the model, at 1, 8 and
64 bytes: messages of every opcode, cut at a random ``max_ulpdu``, framed with CRC and markers
each on and off; every FPDU must be the model ``Framer``'s frame of the model's segment, with
the markers where the stream position puts them, under random idles, stalls and late fetches.
tshark reads the stream; a Terminate requested mid-stream is framed between two segments and
ends it; and a StreamReceiver fed by a StreamSender places RDMA Writes where the model's engine
places them.
"""

import random

import pytest
from amaranth import Module
from amaranth.lib import wiring

from iwarp_model.mr import Access
from iwarp_model.wire.fpdu import Framer
from iwarp_nic.ddp.emit import Message
from iwarp_nic.ddp.receive import StreamReceiver
from iwarp_nic.ddp.send import StreamSender
from iwarp_tb.amsim import run
from iwarp_tb.beats import Beat, from_beats
from iwarp_tb.messages import fetches, messages, segments_of
from iwarp_tb.stags import HostTable
from iwarp_tb.streams import (
    AmaranthBus,
    StreamPort,
    collector,
    recv,
    recv_packets,
    send,
    send_packets,
    until_quiet,
)

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


class Loopback(wiring.Component):
    """A sender's FPDUs straight into a receiver: one stream, both ends in gateware."""

    def __init__(self, n):
        self.tx, self.rx = StreamSender(n), StreamReceiver(n, stag_entries=64)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.tx, m.submodules.rx = self.tx, self.rx
        out, into = self.tx.o, self.rx.i
        m.d.comb += [into.payload.data.eq(out.payload.data),
                     into.payload.keep.eq(out.payload.keep),
                     into.payload.last.eq(out.payload.last),
                     into.valid.eq(out.valid), out.ready.eq(into.ready)]
        return m


@pytest.mark.parametrize("n", [1, 8, 64])
def test_loopback(n):
    """RDMA Writes sent by the StreamSender and received by the StreamReceiver (CRC and
    markers on) are placed where the model's engine places them, with their payloads."""
    rng = random.Random(110 + n)
    table = HostTable(rng, 64, pds=1)
    (pd,) = table.pds
    regions = [table.table.reg_mr(pd, bytearray(5000), Access.REMOTE_WRITE,
                                  iova=rng.getrandbits(40)) for _ in range(3)]
    items = []
    for _ in range(8 if n > 1 else 4):
        region = rng.choice(regions)
        payload = rng.randbytes(rng.choice([0, 1, 100, rng.randrange(3000)]))
        msg = {"opcode": 0, "stag": region.stag, "msn": 0, "inv_stag": 0,
               "to": region.iova + rng.randrange(5000 - len(payload) + 1),
               "length": len(payload)}
        items.append((msg, payload, segments_of(msg, payload, 1000)))
    ulpdus = [u for _, _, us in items for u in us]
    placed, _, fault = table.receive(pd.handle, ulpdus)
    assert fault is None
    dut = Loopback(n)
    got = {}

    async def source(ctx):
        for port, value in ((dut.tx.max_ulpdu, 1000), (dut.tx.crc, 1), (dut.tx.markers, 1),
                            (dut.rx.crc, 1), (dut.rx.markers, 1), (dut.rx.max_ulpdu, 1000),
                            (dut.rx.pd, pd.handle)):
            ctx.set(port, value)
        for region in regions:
            write = table.write(region)
            ctx.set(dut.rx.i_write.payload.index, write["index"])
            for name, value in write["entry"].items():
                ctx.set(dut.rx.i_write.payload.entry[name], value)
            ctx.set(dut.rx.i_write.valid, 1)
            await ctx.tick()
        ctx.set(dut.rx.i_write.valid, 0)
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.tx.i_message),
                   [msg for msg, _, _ in items], rng=random.Random(n), idle=IDLE)

    async def answer(ctx):
        bus, r = AmaranthBus(ctx), random.Random(n + 1)
        for payload, offset, length in fetches(1000, items):
            await recv(bus, StreamPort.amaranth(dut.tx.o_fetch), 1, rng=r, stall=STALL)
            await send_packets(bus, StreamPort.amaranth(dut.tx.i_payload),
                               [payload[offset:offset + length]], n, rng=r, idle=IDLE)

    async def places(ctx):
        got["places"] = await recv(AmaranthBus(ctx), StreamPort.amaranth(dut.rx.o_place),
                                   len(placed), rng=random.Random(n + 2), stall=STALL)

    async def data(ctx):
        got["data"] = await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.rx.o_data),
                                         len(placed), n, rng=random.Random(n + 3), stall=STALL)

    run(dut, source, answer, places, data, name=f"ddp_loopback_w{n}")
    assert [(p["addr"], bytes(d)) for p, d in zip(got["places"], got["data"])] == placed
    assert len(placed) >= len(items) // 2


@pytest.mark.parametrize("n", [1, 8, 64])
def test_terminate(n):
    """A Terminate requested while messages are going out is framed between two segments (as
    the model's Framer frames the model's Terminate there), and nothing follows it."""
    from iwarp_model.wire.rdmap import Opcode, Segment
    from iwarp_model.wire.terminate import ErrorCode, Terminate

    rng = random.Random(130 + n)
    items = messages(rng, 12, 600)
    offending = items[0][2][0]
    terminate = Segment(Opcode.TERMINATE, msn=1, header=Terminate.for_error(
        ErrorCode.DDP_TAGGED_INVALID_STAG, offending)).encode()
    dut = StreamSender(n)
    got = {}

    async def source(ctx):
        ctx.set(dut.max_ulpdu, 600)
        ctx.set(dut.crc, 1)
        ctx.set(dut.markers, 1)
        bus = AmaranthBus(ctx)
        await send(bus, StreamPort.amaranth(dut.i_message), [msg for msg, _, _ in items[:6]],
                   rng=random.Random(n), idle=IDLE)
        layer, etype, ecode = ErrorCode.DDP_TAGGED_INVALID_STAG.value
        await send(bus, StreamPort.amaranth(dut.i_terminate), [{
            "layer": layer, "etype": etype, "ecode": ecode, "msn": 1,
            "offending": int.from_bytes(offending[:46].ljust(46, b"\0"), "little"),
            "offending_length": len(offending)}])
        await send(bus, StreamPort.amaranth(dut.i_message), [msg for msg, _, _ in items[6:]],
                   rng=random.Random(n), idle=IDLE, timeout=1 << 30)

    async def answer(ctx):
        bus, rng = AmaranthBus(ctx), random.Random(n + 1)
        for payload, offset, length in fetches(600, items):
            await recv(bus, StreamPort.amaranth(dut.o_fetch), 1, rng=rng, stall=STALL,
                       timeout=1 << 30)
            await send_packets(bus, StreamPort.amaranth(dut.i_payload),
                               [payload[offset:offset + length]], n, rng=rng, idle=IDLE)

    async def control(ctx):
        await until_quiet(ctx, [dut.o, dut.o_fetch], 2000)

    run(dut, control, monitors=[source, answer, collector(
        got, "fpdus", dut.o, data_bytes=n, rng=random.Random(n + 2), stall=STALL)],
        name=f"ddp_send_terminate_w{n}")
    ulpdus = [u for _, _, us in items for u in us]
    sent = [bytes(f) for f in got["fpdus"]]
    k = len(sent) - 1
    framer = Framer(crc=True, markers=True)
    wanted = [framer.frame(u) for u in ulpdus[:k]] + [framer.frame(terminate)]
    assert sent == wanted and k >= len([u for _, _, us in items[:1] for u in us])


@pytest.mark.parametrize("n", [1, 8, 64])
def test_connections(n):
    """Four connections' messages, interleaved message by message, through one
    ``StreamSender(conns=4)``, each connection with its own MULPDU, CRC and markers: each
    connection's FPDUs (its beats told apart by ``conn``) are its model Framer's frames of its
    segments, its markers placed by its own stream position. A Terminate for connection 1,
    requested after some of its messages, is framed between two of its segments; nothing of
    connection 1 follows it (its later segments are dropped), and the other connections'
    FPDUs all go. ``o_header`` gives each FPDU's connection and length, in ``o``'s order."""
    from iwarp_model.wire.rdmap import Opcode, Segment
    from iwarp_model.wire.terminate import ErrorCode, Terminate

    rng = random.Random(150 + n)
    settings = [(600, 1, 1), (1000, 1, 0), (300, 0, 1), (1460, 0, 0)]
    count = 4 if n == 1 else 10
    items = [messages(rng, count, mulpdu) for mulpdu, _, _ in settings]
    order = [c for c in range(4) for _ in range(count)]
    rng.shuffle(order)
    cut = [k for k, c in enumerate(order) if c == 1][count // 2]     # the Terminate goes here
    offending = items[1][0][2][0]
    terminate = Segment(Opcode.TERMINATE, msn=1, header=Terminate.for_error(
        ErrorCode.DDP_TAGGED_INVALID_STAG, offending)).encode()
    sequence, taken = [], [0] * 4       # (conn, message item) in the order sent
    for c in order:
        sequence.append((c, items[c][taken[c]]))
        taken[c] += 1
    dut = StreamSender(n, conns=4)
    got = {}

    async def source(ctx):
        bus = AmaranthBus(ctx)
        await send(bus, StreamPort.amaranth(dut.i_open), [
            {"conn": c, "max_ulpdu": mulpdu, "crc": crc, "markers": markers}
            for c, (mulpdu, crc, markers) in enumerate(settings)])
        port = StreamPort.amaranth(dut.i_message)
        whole = StreamPort(port.valid, port.ready, {"bits": dut.i_message.payload.as_value()})

        def bits(c, msg):
            return {"bits": Message.const(msg).as_bits() | c << Message.size}
        await send(bus, whole, [bits(c, msg) for c, (msg, _, _) in sequence[:cut]],
                   rng=random.Random(n), idle=IDLE)
        layer, etype, ecode = ErrorCode.DDP_TAGGED_INVALID_STAG.value
        await send(bus, StreamPort.amaranth(dut.i_terminate), [{
            "layer": layer, "etype": etype, "ecode": ecode, "msn": 1, "conn": 1,
            "offending": int.from_bytes(offending[:46].ljust(46, b"\0"), "little"),
            "offending_length": len(offending)}])
        await send(bus, whole, [bits(c, msg) for c, (msg, _, _) in sequence[cut:]],
                   rng=random.Random(n), idle=IDLE, timeout=1 << 30)

    async def answer(ctx):
        bus, r = AmaranthBus(ctx), random.Random(n + 1)
        for c, item in sequence:
            for payload, offset, length in fetches(settings[c][0], [item]):
                fetch = (await recv(bus, StreamPort.amaranth(dut.o_fetch), 1, rng=r,
                                    stall=STALL, timeout=1 << 30))[0]
                assert (fetch["offset"], fetch["length"]) == (offset, length)
                await send_packets(bus, StreamPort.amaranth(dut.i_payload),
                                   [payload[offset:offset + length]], n, rng=r, idle=IDLE)

    async def fpdus(ctx):
        bus, r, beats = AmaranthBus(ctx), random.Random(n + 2), [[] for _ in settings]
        got["fpdus"], got["order"] = [[] for _ in settings], []
        while True:
            (t,) = await recv(bus, StreamPort.amaranth(dut.o), 1, rng=r, stall=STALL,
                              timeout=1 << 30)
            beats[t["conn"]].append(Beat(t["data"], t["keep"], t["last"], t["err"]))
            if t["last"]:
                (fpdu,) = [bytes(p) for p in from_beats(beats[t["conn"]], n)]
                got["fpdus"][t["conn"]].append(fpdu)
                got["order"].append({"conn": t["conn"], "length": len(fpdu)})
                beats[t["conn"]] = []

    async def headers(ctx):
        bus, r = AmaranthBus(ctx), random.Random(n + 3)
        got["headers"] = []
        while True:
            got["headers"] += await recv(bus, StreamPort.amaranth(dut.o_header), 1, rng=r,
                                         stall=STALL, timeout=1 << 30)

    async def control(ctx):
        await until_quiet(ctx, [dut.o, dut.o_fetch], 2000)

    run(dut, control, monitors=[source, answer, fpdus, headers], name=f"ddp_send_c4_w{n}")
    assert got["headers"] == got["order"]
    for c, (_, crc, markers) in enumerate(settings):
        framer = Framer(crc=bool(crc), markers=bool(markers))
        ulpdus = [u for _, _, us in items[c] for u in us]
        sent = got["fpdus"][c]
        if c != 1:
            assert sent == [framer.frame(u) for u in ulpdus], c
            continue
        k = len(sent) - 1
        before = sum(len(us) for _, _, us in items[1][:count // 2])
        assert sent == [framer.frame(u) for u in ulpdus[:k]] + [framer.frame(terminate)]
        assert k <= before
