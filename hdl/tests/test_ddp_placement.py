# amaranth: UnusedElaboratable=no
"""SegmentPlacer's RDMA Writes, behind a SegmentParser, against the model at 1, 8 and 64
bytes (queue 0 and Read Responses are test_ddp_engine's).

The STag table is the model's ``MrTable`` (a testbench answers the placer's lookups with
``MrTable.check``, after random delays): regions of two protection domains with every
combination of rights, fast-registered ones and invalidated ones. The segments are RDMA Writes
inside and at the edges of regions, past their bounds, wrapping the TO, under wrong keys,
invalidated or foreign STags, without the Remote Write right, of zero length, plus other
opcodes and malformed segments. What must come out is what the model's engine does with the
same stream: each Write placed at the region's host address (``host_addr + to - iova``) with
its payload until the first violation, which gets the engine's Terminate code and the
offending segment's first octets, and nothing placed or forwarded after it; the other good
segments forwarded with their payloads.
"""

import random

import pytest
from amaranth import Module
from amaranth.back import verilog
from amaranth.lib import wiring

from iwarp_model.mr import Access
from iwarp_model.wire.rdmap import AtomicRequest, Opcode, ReadRequest, Segment
from iwarp_nic.ddp.placement import SegmentPlacer
from iwarp_nic.ddp.segment import SegmentParser
from iwarp_nic.errors import OFFENDING_BYTES, TerminateCode
from iwarp_tb import toolchain
from iwarp_tb.amsim import run
from iwarp_tb.beats import Packet
from iwarp_tb.lint import lint
from iwarp_tb.stags import HostTable
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, recv_packets, send, send_packets

IDLE = STALL = 0.25
class Chain(wiring.Component):
    """The parser feeding the placer, as in the receive path."""

    def __init__(self, n):
        self.parser = SegmentParser(n)
        self.placer = SegmentPlacer(n, fifo_beats=max(64, 4200 // n))
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.parser, m.submodules.placer = self.parser, self.placer
        wiring.connect(m, self.parser.o_header, self.placer.i_header)
        wiring.connect(m, self.parser.o_payload, self.placer.i_payload)
        return m


class Memory(HostTable):
    """The model's table: regions of two protection domains with every combination of
    rights, fast-registered ones and an invalidated one; the stream's PD is the first."""

    def __init__(self, rng):
        super().__init__(rng, 64, pds=2)
        self.pd, other = self.pds
        self.regions = []
        for k in range(12):
            access = Access(rng.randrange(16))
            if k < 6:
                access |= Access.REMOTE_WRITE
            size = rng.choice([1, 8, 100, 4096])
            iova = rng.choice([0, rng.getrandbits(40), (1 << 64) - size])
            self.regions.append(self.table.reg_mr(self.pd if k < 10 else other,
                                                  bytearray(size), access, iova=iova))
        for _ in range(2):
            region = self.table.alloc_mr(self.pd)
            self.table.fast_reg(region.stag, bytearray(256), Access.REMOTE_WRITE,
                                iova=rng.getrandbits(32))
            self.regions.append(region)
        self.table.invalidate(self.regions[-1].stag, self.pd)

    def write_check(self, stag, to, length):
        return self.check(stag, to, length, Access.REMOTE_WRITE, self.pd.handle)


def writes(rng, memory):
    """RDMA Write segments of every kind the checks tell apart."""
    out = []
    for region in memory.regions:
        size = max(region.length, 1)
        for to, length in ((region.iova, size), (region.iova, 1),
                           (region.iova + size - 1, 1), (region.iova + size - 1, 2),
                           (region.iova - 1, 1), (region.iova + size, 1),
                           (region.iova + rng.randrange(size), rng.randint(1, size))):
            if 0 <= to < 1 << 64:
                out.append(Segment(Opcode.WRITE, rng.randbytes(length), stag=region.stag,
                                   to=to).encode())
        out.append(Segment(Opcode.WRITE, b"x", stag=region.stag ^ 1, to=region.iova).encode())
    wrap = memory.regions[0]
    out.append(Segment(Opcode.WRITE, b"ab", stag=wrap.stag, to=(1 << 64) - 1).encode())
    out.append(Segment(Opcode.WRITE, b"", stag=12345, to=0).encode())         # no lookup
    out.append(Segment(Opcode.WRITE, b"q", stag=63 << 8, to=0).encode())      # unused index
    return out


def others(rng):
    return [Segment(Opcode.ATOMIC_REQUEST, msn=2, header=AtomicRequest.fetch_add(
                        1, 2, 8 * rng.getrandbits(20), rng.getrandbits(64))).encode(),
            Segment(Opcode.READ_REQUEST, msn=1, header=ReadRequest(1, 2, 3, 4, 5)).encode()]


def model(memory, stream):
    return memory.receive(memory.pd.handle, stream)


def simulate(n, memory, stream, *, seed, idle=IDLE, stall=STALL):
    dut = Chain(n)
    placer = dut.placer
    placed, forwarded, fault = model(memory, stream)
    got = {"extra": []}
    state = {"sent": False, "done": False}

    async def source(ctx):
        ctx.set(placer.pd, memory.pd.handle)
        framed = [Packet(len(u).to_bytes(2, "big") + u) for u in stream]
        await send_packets(AmaranthBus(ctx), StreamPort.amaranth(dut.parser.i), framed, n,
                           rng=random.Random(seed), idle=idle)
        state["sent"] = True
        # The stream keeps going after a fault; nothing after it may come out.
        for _ in range(300):
            await ctx.tick()
        state["done"] = True

    async def table(ctx):
        rng = random.Random(seed + 1)
        bus = AmaranthBus(ctx)
        request = placer.o_lookup.payload
        while not state["done"]:
            bus.set(placer.o_lookup.ready, 1)
            valid, stag, to, length, access, pd = await bus.edge(
                placer.o_lookup.valid, request.stag, request.to, request.length,
                request.access, request.pd)
            if valid:
                assert access.value == Access.REMOTE_WRITE and pd == memory.pd.handle
                bus.set(placer.o_lookup.ready, 0)
                for _ in range(rng.randrange(4)):
                    await bus.edge()
                kind, addr = memory.write_check(stag, to, length)
                await send(bus, StreamPort.amaranth(placer.i_lookup),
                           [{"fault": kind.value, "addr": addr}])

    async def quiet(ctx, ports):
        """After the expected transfers: anything else on ``ports`` is a failure."""
        for port in ports:
            ctx.set(port.ready, 1)
        while not state["done"]:
            await ctx.tick()
            for port in ports:
                if ctx.get(port.valid):
                    got["extra"].append(port)

    def receiver(key, port, count, offset, packets=False):
        async def bench(ctx):
            bus, rng = AmaranthBus(ctx), random.Random(seed + offset)
            if packets:
                got[key] = await recv_packets(bus, StreamPort.amaranth(port), count, n, rng=rng,
                                              stall=stall)
            else:
                got[key] = await recv(bus, StreamPort.amaranth(port), count, rng=rng,
                                      stall=stall)
            await quiet(ctx, [port])
        return bench

    benches = [
        receiver("places", placer.o_place, len(placed), 2),
        receiver("data", placer.o_data, len(placed), 3, packets=True),
        receiver("headers", placer.o_header, len(forwarded), 4),
        receiver("payloads", placer.o_payload, sum(bool(p) for _, p in forwarded), 5,
                 packets=True),
        receiver("faults", placer.o_fault, int(fault is not None), 6),
        receiver("completions", placer.o_complete, 0, 7),
        receiver("reads", placer.o_read_done, 0, 8),
    ]
    run(dut, source, table, *benches, name=f"ddp_placement_w{n}")
    assert [(p["addr"], bytes(d)) for p, d in zip(got["places"], got["data"])] == placed
    assert [p["length"] for p in got["places"]] == [len(d) for _, d in placed]
    assert [h["opcode"] for h in got["headers"]] == [op for op, _ in forwarded]
    assert [bytes(p) for p in got["payloads"]] == [p for _, p in forwarded if p]
    if fault is not None:
        code, ulpdu = fault
        (f,) = got["faults"]
        layer, etype, ecode = code.value
        assert TerminateCode(f["code"]).value == layer << 12 | etype << 8 | ecode
        head = ulpdu[:OFFENDING_BYTES]
        assert f["offending"] == int.from_bytes(head + bytes(OFFENDING_BYTES - len(head)),
                                                "little")
        assert f["offending_length"] == len(ulpdu)
    assert not got["extra"]
    return placed, fault


@pytest.mark.parametrize("n", [1, 8, 64])
def test_every_check(n):
    """Each Write that breaks a check, after good traffic: its own Terminate, nothing more."""
    rng = random.Random(n)
    memory = Memory(rng)
    by_code = {}
    for bad in writes(rng, memory):
        fault = model(memory, [bad])[2]
        if fault is not None:
            by_code.setdefault(fault[0], []).append(bad)
    # Every code the table can give, twice where there are two cases of it.
    assert len(by_code) == 5
    good = [w for w in writes(rng, memory) if model(memory, [w])[2] is None]
    for k, bad in enumerate(b for cases in by_code.values() for b in cases[:2]):
        stream = rng.sample(good, 1) + others(rng) + [bad] + rng.sample(good, 1)
        simulate(n, memory, stream, seed=k)


@pytest.mark.parametrize("n", [1, 8, 64])
def test_good_traffic(n):
    """Only good Writes and other opcodes: everything placed or forwarded, in order."""
    rng = random.Random(10 + n)
    memory = Memory(rng)
    good = [w for w in writes(rng, memory) if model(memory, [w])[2] is None]
    stream = [rng.choice(good) if rng.random() < 0.7 else rng.choice(others(rng))
              for _ in range(40 if n > 1 else 15)]
    placed, fault = simulate(n, memory, stream, seed=n)
    assert fault is None and len(placed) > 5


@pytest.mark.parametrize("n", [1, 8, 64])
def test_parser_fault(n):
    """A segment the parser rejects stops placement the same way, with the parser's code."""
    rng = random.Random(30 + n)
    memory = Memory(rng)
    good = [w for w in writes(rng, memory) if model(memory, [w])[2] is None]
    bad = bytearray(good[0])
    bad[0] ^= 0x03                                              # DV 2
    simulate(n, memory, good[1:4] + [bytes(bad)] + good[4:6], seed=n)


def test_lint(tmp_path):
    toolchain.setup()
    path = tmp_path / "placer.v"
    path.write_text(verilog.convert(SegmentPlacer(8), name="placer"))
    assert lint(path) == ""
