# amaranth: UnusedElaboratable=no
"""HostControl under the Amaranth simulator, driven over AXI4-Lite by the manager model of
:mod:`iwarp_tb.axil` with random timing, against the map of :mod:`iwarp_nic.host.nicmap`:

* identity, addresses and keys;
* every command: random mailbox contents come out of the command's port bit for bit (QP_OPEN
  as its three transfers), each port stalling at random; an unknown command is ignored;
* frames: octets written four at a time leave as one chunk of the length asked, at 1, 8 and
  64 bytes per beat;
* doorbells name their queue (a shared receive queue's after the queue pairs' receive queues);
* events of every kind queued, read back through event0/event1 in order, a startup piece's
  octets through startup_data, and the interrupt raised and cleared.
"""

import random

import pytest

from iwarp_nic.host.control import HostControl
from iwarp_nic.host.nicmap import COUNTERS, MAGIC, VERSION, CommandOp, NicEventKind
from iwarp_tb.amsim import run
from iwarp_tb.axil import OKAY, AxiLiteManager, AxiLitePort
from iwarp_tb.beats import Packet
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, recv_packets, send, send_packets

CONNS, CQS, SRQS = 16, 8, 3
#: The port each command comes out of (QP_OPEN: three).
PORTS = {CommandOp.MR_WRITE: ["o_stag_write"], CommandOp.CQ_OPEN: ["o_cq"],
         CommandOp.QP_OPEN: ["o_qp_cqs", "o_sq_ring", "o_rq_ring"],
         CommandOp.ENGINE_OPEN: ["o_engine_open"], CommandOp.GATHER: ["o_gather"],
         CommandOp.TCP: ["o_tcp"], CommandOp.SRQ_OPEN: ["o_srq_ring"]}


def whole(port):
    return StreamPort(port.valid, port.ready, {"bits": port.payload.as_value()})


class Host:
    """The driver's register accesses, one at a time."""

    def __init__(self, ctx, dut, rng):
        self.dut = dut
        self.bus = AxiLiteManager(AmaranthBus(ctx), AxiLitePort.amaranth(dut.s_axil), rng=rng,
                                  idle=0.3, stall=0.3, timeout=1 << 16)
        self.map = dut.regmap

    async def write(self, name, value, index=0):
        assert await self.bus.write(self.map.offset(name, index), value) == OKAY, name

    async def read(self, name, index=0):
        data, resp = await self.bus.read(self.map.offset(name, index))
        assert resp == OKAY, name
        return data

    async def read64(self, name):
        return await self.read(f"{name}_lo") | await self.read(f"{name}_hi") << 32

    async def command(self, op, value):
        for k in range(16):
            await self.write("cmd_args", value >> 32 * k & 0xFFFF_FFFF, k)
        await self.write("command", op)


def test_registers_and_commands():
    rng = random.Random(1)
    dut = HostControl(8, conns=CONNS, cqs=CQS, srqs=SRQS, ird_max=5, ord_max=17)
    got = {name: [] for names in PORTS.values() for name in names}
    wanted = {name: [] for name in got}
    layouts = dut.commands

    async def host(ctx):
        h = Host(ctx, dut, rng)
        assert (await h.read("id"), await h.read("version")) == (MAGIC, VERSION)
        features = h.map["features"].decode(await h.read("features"))
        assert features == {"conns": CONNS, "cqs": CQS, "data_bytes": 8}
        limits = h.map["limits"].decode(await h.read("limits"))
        assert limits == {"ird": 5, "ord": 17, "srqs": SRQS}
        await h.write("mac_lo", 0x5566_7788)
        await h.write("mac_hi", 0x1122)
        await h.write("ip", 0xC000_0201)
        await h.write("isn_key_hi_hi", 0xDEAD_BEEF)
        assert ctx.get(dut.mac) == 0x1122_5566_7788 and ctx.get(dut.ip) == 0xC000_0201
        assert ctx.get(dut.isn_key) >> 96 == 0xDEAD_BEEF
        for _ in range(30):
            op = rng.choice(list(PORTS))
            value = rng.getrandbits(layouts[op].size)
            for name in PORTS[op]:
                wanted[name].append(value)
            await h.command(op, value)
        await h.command(0x55, rng.getrandbits(512))        # unknown: ignored
        for _ in range(50):
            await ctx.tick()

    def taker(name):
        async def bench(ctx):
            bus, r = AmaranthBus(ctx), random.Random(name)
            while True:
                (t,) = await recv(bus, whole(getattr(dut, name)), 1, rng=r, stall=0.7,
                                  timeout=1 << 30)
                got[name].append(t["bits"])
        return bench

    run(dut, host, monitors=[taker(name) for name in got], name="host_control_commands")
    qp = layouts[CommandOp.QP_OPEN]
    for name, values in wanted.items():
        part = {"o_qp_cqs": "cqs", "o_sq_ring": "sq", "o_rq_ring": "rq"}.get(name)
        if part:
            values = [_qp_part(qp, v, part) for v in values]
        assert got[name] == values, name
    assert sum(map(len, got.values())) > 20


@pytest.mark.parametrize("kept", [True, False])
def test_event_counters(kept):
    """The counter registers read what each block has counted (the low bits it gives, brought
    into a 32-bit total), or 0 when HostControl is built without ``event_counters``; the other
    registers answer as before either way."""
    dut = HostControl(8, conns=2, cqs=2, srqs=1, event_counters=kept)
    counts = {name: 1 + 7 * k for k, name in enumerate(COUNTERS)}
    got = {}

    async def host(ctx):
        for name, count in counts.items():
            ctx.set(dut.counters[name], count)
        for _ in range(2 * len(COUNTERS) + 100):        # the memory cleared, then visited
            await ctx.tick()
        h = Host(ctx, dut, random.Random(4))
        got["id"] = await h.read("id")
        got.update({name: await h.read(name) for name in COUNTERS})

    run(dut, host, name=f"host_control_counters_{kept}")
    assert got.pop("id") == MAGIC
    assert got == {name: count if kept else 0 for name, count in counts.items()}


def _qp_part(layout, value, part):
    """What a QP_OPEN mailbox ``value`` gives port ``part``: the CQs as they are, a ring with
    the queue pair's connection after it."""
    field = layout.members[part]
    cqs = layout.members["cqs"]
    bits = value >> layout["cqs"].offset & ((1 << cqs.size) - 1)
    if part == "cqs":
        return bits
    conn = bits & ((1 << cqs["conn"].width) - 1)
    ring = value >> layout[part].offset & ((1 << field.size) - 1)
    return ring | conn << field.size


@pytest.mark.parametrize("n", [1, 8, 64])
def test_frames(n):
    rng = random.Random(n)
    dut = HostControl(n, conns=CONNS, cqs=CQS)
    frames = [(rng.randrange(CONNS), rng.randbytes(rng.choice([1, 3, 4, 20, 37, 532])))
              for _ in range(5)]
    got = {"headers": [], "frames": []}

    async def host(ctx):
        h = Host(ctx, dut, rng)
        for conn, octets in frames:
            padded = octets + bytes(-len(octets) % 4)
            for k in range(0, len(padded), 4):
                await h.write("frame_data", int.from_bytes(padded[k:k + 4], "little"))
            await h.command(CommandOp.FRAME, conn | len(octets) << 4)
        while len(got["frames"]) < len(frames):
            await ctx.tick()

    async def headers(ctx):
        while True:
            got["headers"] += await recv(AmaranthBus(ctx), StreamPort.amaranth(
                dut.o_frame_header), 1, rng=rng, stall=0.3, timeout=1 << 30)

    async def octets(ctx):
        while True:
            got["frames"] += await recv_packets(AmaranthBus(ctx), StreamPort.amaranth(
                dut.o_frame), 1, n, rng=rng, stall=0.3, timeout=1 << 30)

    run(dut, host, monitors=[headers, octets], name=f"host_control_frames_w{n}")
    assert got["headers"] == [{"conn": c, "length": len(o)} for c, o in frames]
    assert got["frames"] == [Packet(o) for _, o in frames]


@pytest.mark.parametrize("n, sizes", [(1, (CONNS, CQS, SRQS)), (8, (CONNS, CQS, SRQS)),
                                      (1, (1, 1, 1))])
def test_doorbells_and_events(n, sizes):
    """Doorbells of every kind, and one report of each kind queued as events; also with one
    connection, one CQ and one SRQ (registers of one element, whose doorbells carry no
    index)."""
    rng = random.Random(10 + n + sum(sizes))
    conns, cqs, srqs = sizes
    dut = HostControl(n, conns=conns, cqs=cqs, srqs=srqs)
    got = {"sq": [], "rq": [], "cq": [], "events": [], "startup": []}
    sent = []

    async def host(ctx):
        h = Host(ctx, dut, rng)
        bells = []
        for _ in range(16):
            kind = rng.choice(["sq", "rq", "cq", "srq"])
            index = rng.randrange({"cq": cqs, "srq": srqs}.get(kind, conns))
            tail = rng.getrandbits(16)
            # A shared receive queue's doorbell comes out with the receive queues', after them.
            bells.append(("rq", {"conn": conns + index, "tail": tail}) if kind == "srq" else
                         (kind, {"conn": index, "tail": tail}))
            await h.write({"sq": "sq_doorbell", "rq": "rq_doorbell", "cq": "cq_head",
                           "srq": "srq_doorbell"}[kind], tail, index)
        for _ in range(20):
            await ctx.tick()
        for kind, bell in bells:
            assert got[kind].pop(0) == bell
        await h.write("irq_enable", 1)
        assert not ctx.get(dut.irq)
        await reporter(ctx)
        assert ctx.get(dut.irq)
        await h.write("irq_status", 1)
        await ctx.tick()
        assert not ctx.get(dut.irq)
        while True:
            event = await h.read64("event0") | await h.read64("event1") << 64
            if event & 0xF == NicEventKind.NONE:
                break
            got["events"].append(event)
            await h.write("event_pop", 0)
            if event & 0xF == NicEventKind.STARTUP:
                length = event >> 32 & 0xFFFF
                octets = b""
                for _ in range(-(-length // 4)):
                    octets += (await h.read("startup_data")).to_bytes(4, "little")
                    await h.write("startup_pop", 0)
                got["startup"].append(octets[:length])
        assert await h.read("startup_data") == 0

    async def reporter(ctx):
        """One report of each kind, one after the other."""
        bus = AmaranthBus(ctx)
        c = [k % conns for k in (3, 5, 9, 2)]      # the connections reported on
        cq = 6 % cqs
        tcp = {"kind": 4, "conn": c[0], "local_port": 7174, "remote_ip": 0xC0000202,
               "remote_port": 40000}
        await send(bus, StreamPort.amaranth(dut.i_tcp_event), [tcp])
        sent.append(NicEventKind.TCP | c[0] << 4 | 4 << 16 | (0xC0000202 | 40000 << 32
                                                             | 7174 << 48) << 32)
        frame = rng.randbytes(37)
        await send(bus, StreamPort.amaranth(dut.i_startup_header),
                   [{"conn": c[1], "length": 37, "kind": 0}])
        await send_packets(bus, StreamPort.amaranth(dut.i_startup), [frame], n)
        sent.append(NicEventKind.STARTUP | c[1] << 4 | 37 << 32)
        got["frame"] = frame
        await send(bus, StreamPort.amaranth(dut.i_fault), [{"conn": c[2], "code": 0x0102}])
        sent.append(NicEventKind.FAULT | c[2] << 4 | 0x0102 << 16)
        await send(bus, StreamPort.amaranth(dut.i_peer_terminate),
                   [{"conn": c[3], "layer": 1, "etype": 2, "ecode": 3}])
        sent.append(NicEventKind.TERMINATE | c[3] << 4 | 0x1203 << 16)
        await send(bus, StreamPort.amaranth(dut.i_cq_event), [{"cq": cq, "overflow": 1}])
        sent.append(NicEventKind.CQ | cq << 4 | 1 << 16)
        for _ in range(5):
            await ctx.tick()

    def bells(kind, port):
        async def bench(ctx):
            while True:
                got[kind] += await recv(AmaranthBus(ctx), StreamPort.amaranth(port), 1,
                                        rng=rng, stall=0.5, timeout=1 << 30)
        return bench

    run(dut, host, monitors=[bells("sq", dut.o_sq_doorbell), bells("rq", dut.o_rq_doorbell),
                             bells("cq", dut.o_cq_head)], name=f"host_control_events_w{n}_c{conns}")
    assert got["events"] == sent
    assert got["startup"] == [got["frame"]]
