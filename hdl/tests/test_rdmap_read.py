# amaranth: UnusedElaboratable=no
"""ReadResponder, behind a SegmentParser, against the model's engine (``_check_ird`` and
``_on_read_request``) at 8 bytes (the responder sees headers, not beats).

The STag table is the model's (a testbench answers the lookups with ``MrTable.check``). Read
Requests of every size from 0, into regions with and without Remote Read, of another PD, out of
bounds, with wrapping source or sink TOs, under wrong keys, with wrong MSNs; and the IRD: used
up when no response is released, given back by ``done`` when each is. Each good request must
give the model's Read Response (sink STag, TO, size) with the host address of its source; the
first bad one the engine's Terminate code, and nothing after it.
"""

import random

import pytest
from amaranth import Module
from amaranth.back import verilog
from amaranth.lib import wiring

from iwarp_model.engine import _SOURCE_CODES, _code_of
from iwarp_model.mr import Access, AccessError
from iwarp_model.wire.rdmap import Opcode, ReadRequest, Segment
from iwarp_model.wire.terminate import ErrorCode
from iwarp_nic.ddp.segment import SegmentParser
from iwarp_nic.errors import TerminateCode
from iwarp_nic.rdmap import ReadResponder
from iwarp_tb import toolchain
from iwarp_tb.amsim import run
from iwarp_tb.beats import Packet
from iwarp_tb.lint import lint
from iwarp_tb.stags import HostTable
from iwarp_tb.streams import AmaranthBus, StreamPort, recv, send, send_packets

N = 8
STALL = 0.25
U64 = 1 << 64


class Chain(wiring.Component):
    def __init__(self):
        self.parser, self.responder = SegmentParser(N), ReadResponder()
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.parser, m.submodules.responder = self.parser, self.responder
        wiring.connect(m, self.parser.o_header, self.responder.i_request)
        m.d.comb += self.parser.o_payload.ready.eq(1)
        return m


class Table(HostTable):
    def __init__(self, rng):
        super().__init__(rng, 64, pds=2)
        self.pd, other = self.pds
        self.regions = [self.table.reg_mr(self.pd, bytearray(size), access,
                                          iova=rng.choice([rng.getrandbits(40), U64 - size]))
                        for size, access in ((4096, Access.REMOTE_READ),
                                             (300, Access.REMOTE_READ | Access.REMOTE_WRITE),
                                             (64, Access.REMOTE_WRITE))]
        self.regions.append(self.table.reg_mr(other, bytearray(64), Access.REMOTE_READ))


def request(rng, table, msn, kind="good"):
    region = table.regions[rng.randrange(2)] if kind == "good" else rng.choice(table.regions)
    size = rng.choice([0, 1, 8, rng.randrange(region.length + 1)])
    src_to = region.iova + rng.randrange(region.length - size + 1)
    sink_to = rng.getrandbits(64) if rng.random() < 0.8 else U64 - max(size, 1)
    stag = region.stag
    if kind != "good":
        size = max(size, 1)                 # an empty Read checks nothing
        src_to = min(src_to, region.iova + region.length - size)
    if kind == "stag":
        stag ^= 0x20
    elif kind == "bounds":
        size = max(size, 1)
        src_to = (region.iova + region.length - size + 1) % U64
    elif kind == "sink wrap":
        size, sink_to = max(size, 2), U64 - 1
    return Segment(Opcode.READ_REQUEST, msn=msn, header=ReadRequest(
        rng.getrandbits(32), sink_to, size, stag, src_to)).encode()


def model(table, ird, ulpdus, *, released):
    """The engine's Read Responses and first fault: ``(responses, fault)``."""
    expected, used, out = 1, 0, []
    for ulpdu in ulpdus:
        msn = int.from_bytes(ulpdu[10:14], "big")
        req = ReadRequest.decode(ulpdu[18:])
        if msn != expected or used >= ird:
            return out, (ErrorCode.DDP_UNTAGGED_INVALID_MSN_RANGE, ulpdu)
        expected = (msn + 1) % (1 << 32)
        source = 0
        if req.size:
            try:
                table.table.check(req.src_stag, req.src_to, req.size, Access.REMOTE_READ,
                                  table.pd)
            except AccessError as error:
                return out, (_code_of(_SOURCE_CODES, error), ulpdu)
            if req.sink_to + req.size > U64:
                return out, (ErrorCode.RDMAP_TO_WRAP, ulpdu)
            source = table.check(req.src_stag, req.src_to, req.size, Access.REMOTE_READ,
                                 table.pd.handle)[1]
        used += 0 if released else 1
        out.append((req.sink_stag, req.sink_to, req.size, source))
    return out, None


def simulate(table, ird, ulpdus, *, seed, released, one_at_a_time=False):
    dut = Chain()
    rsp = dut.responder
    responses, fault = model(table, ird, ulpdus, released=released)
    got = {"extra": []}
    state = {"done": False, "answered": 0}

    async def source(ctx):
        ctx.set(rsp.ird, ird)
        ctx.set(rsp.pd, table.pd.handle)
        bus = AmaranthBus(ctx)
        for k, ulpdu in enumerate(ulpdus):
            while one_at_a_time and state["answered"] < min(k, len(responses)):
                await ctx.tick()
            await send_packets(bus, StreamPort.amaranth(dut.parser.i),
                               [Packet(len(ulpdu).to_bytes(2, "big") + ulpdu)], N)
        for _ in range(300):
            await ctx.tick()
        state["done"] = True

    async def lookups(ctx):
        bus, rng = AmaranthBus(ctx), random.Random(seed)
        req = rsp.o_lookup.payload
        while not state["done"]:
            bus.set(rsp.o_lookup.ready, 1)
            valid, stag, to, length, access, pd = await bus.edge(
                rsp.o_lookup.valid, req.stag, req.to, req.length, req.access, req.pd)
            if valid:
                bus.set(rsp.o_lookup.ready, 0)
                for _ in range(rng.randrange(4)):
                    await bus.edge()
                kind, addr = table.check(stag, to, length, access.value, pd)
                await send(bus, StreamPort.amaranth(rsp.i_lookup),
                           [{"fault": kind.value, "addr": addr}])

    async def answers(ctx):
        bus, rng = AmaranthBus(ctx), random.Random(seed + 1)
        got["responses"] = []
        for _ in responses:
            (r,) = await recv(bus, StreamPort.amaranth(rsp.o_response), 1, rng=rng,
                              stall=STALL)
            msg = r["message"]
            got["responses"].append((msg["opcode"], msg["stag"], msg["to"], msg["length"],
                                     r["source"]))
            if released:
                for _ in range(rng.randrange(3)):
                    await ctx.tick()
                ctx.set(rsp.done, 1)
                await ctx.tick()
                ctx.set(rsp.done, 0)
            state["answered"] += 1
        ctx.set(rsp.o_response.ready, 1)
        while not state["done"]:
            await ctx.tick()
            if ctx.get(rsp.o_response.valid):
                got["extra"].append("response")

    async def faults(ctx):
        got["faults"] = await recv(AmaranthBus(ctx), StreamPort.amaranth(rsp.o_fault),
                                   int(fault is not None), rng=random.Random(seed + 2),
                                   stall=STALL)
        ctx.set(rsp.o_fault.ready, 1)
        while not state["done"]:
            await ctx.tick()
            if ctx.get(rsp.o_fault.valid):
                got["extra"].append("fault")

    run(dut, source, lookups, answers, faults, name="rdmap_read")
    assert got["responses"] == [(2, *r) for r in responses]
    if fault is not None:
        code, ulpdu = fault
        layer, etype, ecode = code.value
        (f,) = got["faults"]
        assert TerminateCode(f["code"]).value == layer << 12 | etype << 8 | ecode
        assert f["offending_length"] == len(ulpdu)
    assert not got["extra"]
    return responses, fault


def test_good_requests():
    rng = random.Random(1)
    table = Table(rng)
    ulpdus = [request(rng, table, msn) for msn in range(1, 30)]
    responses, fault = simulate(table, 255, ulpdus, seed=1, released=True)
    assert fault is None and sum(r[2] > 0 for r in responses) > 10


@pytest.mark.parametrize("kind", ["stag", "bounds", "sink wrap", "msn", "foreign", "rights"])
def test_each_fault(kind):
    rng = random.Random(sum(map(ord, kind)))
    table = Table(rng)
    good = [request(rng, table, msn) for msn in range(1, 5)]
    if kind == "msn":
        bad = request(rng, table, 9)
    elif kind in ("foreign", "rights"):
        region = table.regions[3 if kind == "foreign" else 2]
        bad = Segment(Opcode.READ_REQUEST, msn=5, header=ReadRequest(
            1, 2, 8, region.stag, region.iova)).encode()
    else:
        bad = request(rng, table, 5, kind)
    ulpdus = good + [bad] + [request(rng, table, msn) for msn in range(6, 9)]
    _, fault = simulate(table, 255, ulpdus, seed=2, released=True)
    assert fault is not None and fault[1] == bad


def test_ird_used_up():
    """Three credits, none released: the fourth request is beyond the IRD."""
    rng = random.Random(3)
    table = Table(rng)
    ulpdus = [request(rng, table, msn) for msn in range(1, 7)]
    responses, fault = simulate(table, 3, ulpdus, seed=3, released=False)
    assert len(responses) == 3 and fault[1] == ulpdus[3]


def test_ird_given_back():
    """One credit, released after each response before the next request: all answered."""
    rng = random.Random(4)
    table = Table(rng)
    ulpdus = [request(rng, table, msn) for msn in range(1, 8)]
    responses, fault = simulate(table, 1, ulpdus, seed=4, released=True, one_at_a_time=True)
    assert fault is None and len(responses) == 7


def test_lint(tmp_path):
    toolchain.setup()
    path = tmp_path / "read_responder.v"
    path.write_text(verilog.convert(ReadResponder(), name="read_responder"))
    assert lint(path) == ""
