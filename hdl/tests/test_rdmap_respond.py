# amaranth: UnusedElaboratable=no
"""RequestResponder, behind a SegmentParser, at 8 bytes (the responder sees headers, not
beats).

Read Requests alone against the model's checks (``_check_ird``, ``_on_read_request``, with the
table's answers from ``MrTable.check``): every size from 0, regions with and without Remote
Read, of another PD, out of bounds, wrapping source or sink TOs, wrong keys, wrong MSNs; and
the IRD, used up when no response is released, given back by ``done`` when each is. Each good
request must give the model's Read Response (sink STag, TO, size) with the host address of its
source; the first bad one the engine's Terminate code, and nothing after it.

Atomic Requests (FetchAdd, CmpSwap, every kind of mask) mixed with Read Requests, against the
model's engine itself (a ``Connection`` given the same requests): the responder, with an
``AtomicExecutor`` on a copy of the host memory, must give the engine's Atomic Responses
(octet for octet once encoded) and Read Responses (the payload their source holds when they
are sent) in order, leave the engine's memory, and send its Terminate for each atomic
violation (rights, PD, bounds, alignment, key, MSN) and for an IRD that Reads and atomics use
up together.
"""
import random
from dataclasses import dataclass

import pytest
from amaranth import Module
from amaranth.back import verilog
from amaranth.lib import wiring

from iwarp_model import verbs
from iwarp_model.engine import _SOURCE_CODES, Connection, _code_of
from iwarp_model.mr import Access, AccessError
from iwarp_model.transport.memory import MemoryPair
from iwarp_model.wire.fpdu import Deframer
from iwarp_model.wire.rdmap import (
    AtomicOp,
    AtomicRequest,
    AtomicResponse,
    Opcode,
    ReadRequest,
    Segment,
    decode_segment,
)
from iwarp_model.wire.terminate import ErrorCode
from iwarp_nic.ddp.segment import SegmentParser
from iwarp_nic.errors import OFFENDING_BYTES, TerminateCode
from iwarp_nic.rdmap import AtomicExecutor, RequestResponder
from iwarp_tb import toolchain
from iwarp_tb.amsim import run
from iwarp_tb.beats import Packet
from iwarp_tb.lint import lint
from iwarp_tb.stags import HostTable
from iwarp_tb.streams import AmaranthBus, StreamPort, StreamTimeout, recv, send, send_packets

N = 8
STALL = 0.25
U64 = 1 << 64


class Chain(wiring.Component):
    """The parser, the responder and an atomic executor (memory ports left to the test), for
    one stream or ``conns`` connections."""

    def __init__(self, conns=None):
        self.parser = SegmentParser(N, conns=conns)
        self.responder = RequestResponder(conns=conns)
        self.executor = AtomicExecutor()
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.parser, m.submodules.responder = self.parser, self.responder
        m.submodules.executor = self.executor
        wiring.connect(m, self.parser.o_header, self.responder.i_request)
        wiring.connect(m, self.responder.o_atomic, self.executor.i_atomic)
        wiring.connect(m, self.executor.o_original, self.responder.i_original)
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
    path.write_text(verilog.convert(RequestResponder(), name="read_responder"))
    assert lint(path) == ""


class Responder:
    """The model's engine answering Read and Atomic Requests: a device with a region for
    atomics (and Reads), one for Reads only and one of another PD, connected to a model peer
    that frames the test's requests; the same table as the gateware sees it. With ``shared``
    (another Responder) the device and table are that one's: another connection, its QP of
    another PD, whose requests the gateware takes beside the other's."""

    def __init__(self, rng, *, ird=32, shared=None):
        self.rng = rng
        self.dev = dev = verbs.Device("b") if shared is None else shared.dev
        pd, other = dev.alloc_pd(), dev.alloc_pd()
        cq = dev.create_cq(64)
        qp = dev.create_qp(pd, cq, cq, max_dest_rd_atomic=ird)
        self.pd, self.memory = pd, {}
        both = Access.LOCAL_WRITE | Access.REMOTE_ATOMIC | Access.REMOTE_READ
        self.atomic = self._reg(dev, pd, 256, both)
        self.read_only = self._reg(dev, pd, 128, Access.REMOTE_READ)
        self.foreign = self._reg(dev, other, 64, both)
        self.host = HostTable(rng, table=dev.mr_table, pds=0) if shared is None else shared.host
        self.host.by_handle.update({p.handle: p for p in (pd, other)})
        peer_qp = dev.create_qp(dev.alloc_pd(), cq, cq)
        self.conn = Connection(qp, active=True)
        self.peer = Connection(peer_qp, active=False)
        MemoryPair(self.conn, self.peer).start()
        self.deframer = Deframer(crc=False, markers=False)
        self.msn = 1

    def _reg(self, dev, pd, size, access):
        memory = bytearray(self.rng.randbytes(size))
        region = dev.reg_mr(pd, memory, access, iova=self.rng.getrandbits(40) & ~7)
        self.memory[region.stag] = memory
        return region

    def atomic_request(self, *, region=None, offset=None, stag=None, msn=None):
        """An Atomic Request (FetchAdd or CmpSwap, random masks) on ``region`` (the atomic
        one) at ``offset`` (an aligned one by default)."""
        region = region or self.atomic
        if offset is None:
            offset = 8 * self.rng.randrange(region.length // 8)
        if msn is None:
            msn, self.msn = self.msn, self.msn + 1
        rng = self.rng
        op = rng.choice([AtomicOp.FETCH_ADD, AtomicOp.CMP_SWAP])
        compare_mask = rng.choice([U64 - 1, rng.getrandbits(64), 0xFF])
        original = int.from_bytes(self.memory[region.stag][offset:offset + 8], "little")
        compare = original if rng.random() < 0.5 else rng.getrandbits(64)
        return Segment(Opcode.ATOMIC_REQUEST, msn=msn, header=AtomicRequest(
            op, rng.getrandbits(32), region.stag if stag is None else stag,
            region.iova + offset, rng.getrandbits(64),
            rng.choice([0, U64 - 1, rng.getrandbits(64)]), compare, compare_mask)).encode()

    def read_request(self, *, region=None, msn=None):
        """A Read Request of ``region``, by default most often of much of the atomic one."""
        if msn is None:
            msn, self.msn = self.msn, self.msn + 1
        region = region or self.rng.choice([self.atomic, self.atomic, self.read_only])
        size = self.rng.choice([0, 8, region.length, self.rng.randrange(region.length + 1)])
        return Segment(Opcode.READ_REQUEST, msn=msn, header=ReadRequest(
            self.rng.getrandbits(32), self.rng.getrandbits(40), size, region.stag,
            region.iova + self.rng.randrange(region.length - size + 1))).encode()

    def answer(self, ulpdus, *, release):
        """The engine's responses (each Read Response's message as (opcode, sink STag, sink
        TO, payload), each Atomic Response's ULPDU) and its Terminate. With ``release`` each
        request's response is sent before the next request arrives (its credit back)."""
        out, payload = [], b""
        for ulpdu in ulpdus:
            self.conn.receive(self.peer._framer.frame(ulpdu))
            if release:
                out += self.deframer.feed(self.conn.transmit())
        out += self.deframer.feed(self.conn.transmit())
        responses = []
        for ulpdu in out:
            segment = decode_segment(ulpdu)
            if segment.opcode == Opcode.READ_RESPONSE:
                payload += segment.payload
                if segment.last:
                    responses.append((2, segment.stag, segment.to - len(payload) +
                                      len(segment.payload), payload))
                    payload = b""
            elif segment.opcode == Opcode.ATOMIC_RESPONSE:
                responses.append((11, ulpdu))
        return responses, self.conn.terminate_sent


@dataclass(eq=False)
class Stream:
    """One stream of requests for :func:`simulate_engine`: the ``scene`` answering them, the
    requests (``ulpdus``), the connection whose slot it takes (with ``conns``), and when each
    response's ``done`` is given: a while after it is taken (``release`` True), never
    (False), or once ``release(got)`` is true. Its expected responses and Terminate are the
    engine's (with credits back before each request unless ``release`` is False)."""
    scene: Responder
    ulpdus: list
    conn: int = 0
    release: object = True


def simulate_engine(streams, steps=None, *, seed, conns=None):
    """The gateware (parser, responder, executor on a copy of the host memory) against the
    engine, for one stream or, with ``conns``, for each stream on its connection: the same
    responses (a Read Response's source holding the engine's payload), the same memory after,
    the same Terminate. ``steps`` (by default each stream opened, then its requests) are
    what the test does in turn: open a stream's slot (a :class:`Stream`), send one of its
    requests (``(stream, ulpdu)``), wait until a function of ``got`` is true or wait so many
    cycles (an int). The lookups,
    the memory's answers and the outputs' ``ready`` come at random times. Returns ``got``:
    each connection's responses handed over (``done`` given) and faults, and the responses
    taken but not handed over (``offered``)."""
    tagged = conns is not None
    scene = streams[0].scene
    host = {scene.host.host_addr(stag): bytearray(memory)
            for s in streams for stag, memory in s.scene.memory.items()}
    for s in streams:
        s.expected, s.terminate = s.scene.answer(s.ulpdus, release=s.release is not False)
    if steps is None:
        steps = [step for s in streams for step in [s] + [(s, u) for u in s.ulpdus]]
    dut = Chain(conns)
    rsp, ex = dut.responder, dut.executor
    got = {"responses": {}, "faults": {}, "offered": []}
    state = {"done": False}

    def locate(addr, length):
        (base,) = [b for b, m in host.items() if b <= addr and addr + length <= b + len(m)]
        return host[base], addr - base

    async def source(ctx):
        bus = AmaranthBus(ctx)
        for step in steps:
            if isinstance(step, Stream) and tagged:
                await send(bus, StreamPort.amaranth(rsp.i_open),
                           [{"conn": step.conn, "ird": step.scene.conn.ird,
                             "pd": step.scene.pd.handle}])
            elif isinstance(step, Stream):
                ctx.set(rsp.ird, step.scene.conn.ird)
                ctx.set(rsp.pd, step.scene.pd.handle)
            elif callable(step):
                for _ in range(20_000):
                    if step(got):
                        break
                    await ctx.tick()
                else:
                    raise StreamTimeout(f"waited 20000 cycles for {got}")
            elif isinstance(step, int):
                for _ in range(step):
                    await ctx.tick()
            else:
                stream, ulpdu = step
                if tagged:
                    ctx.set(dut.parser.i.payload.conn, stream.conn)
                await send_packets(bus, StreamPort.amaranth(dut.parser.i),
                                   [Packet(len(ulpdu).to_bytes(2, "big") + ulpdu)], N,
                                   rng=random.Random(seed + len(ulpdu)), idle=0.3)
        for _ in range(400):
            await ctx.tick()
        state["done"] = True

    async def lookups(ctx):
        bus, rng = AmaranthBus(ctx), random.Random(seed + 2)
        while True:
            (r,) = await recv(bus, StreamPort.amaranth(rsp.o_lookup), 1, rng=rng, stall=STALL,
                              timeout=1 << 30)
            kind, addr = scene.host.check(r["stag"], r["to"], r["length"], r["access"].value,
                                          r["pd"])
            for _ in range(rng.randrange(4)):
                await ctx.tick()
            await send(bus, StreamPort.amaranth(rsp.i_lookup),
                       [{"fault": kind.value, "addr": addr}])

    async def memory(ctx):
        bus, rng = AmaranthBus(ctx), random.Random(seed)
        while True:
            (read,) = await recv(bus, StreamPort.amaranth(ex.o_read), 1, timeout=1 << 30)
            words, at = locate(read["data"], 8)
            for _ in range(rng.randrange(4)):
                await ctx.tick()
            await send(bus, StreamPort.amaranth(ex.i_read),
                       [{"data": int.from_bytes(words[at:at + 8], "little")}])
            (write,) = await recv(bus, StreamPort.amaranth(ex.o_write), 1, rng=rng, stall=0.3,
                                  timeout=1 << 30)
            words, at = locate(write["addr"], 8)
            words[at:at + 8] = write["data"].to_bytes(8, "little")

    async def answers(ctx):
        """Take each response, for ``dones`` to hand over."""
        bus, rng = AmaranthBus(ctx), random.Random(seed + 1)
        while True:
            (r,) = await recv(bus, StreamPort.amaranth(rsp.o_response), 1, rng=rng,
                              stall=STALL, timeout=1 << 30)
            got["offered"].append(r)

    def release(r):
        """Whether response ``r`` may be handed over now. Its stream: its connection's
        streams in turn, each ended by its Terminate."""
        ours = [s for s in streams if s.conn == r.get("conn", 0)]
        allowed = ours[min(len(got["faults"].get(r.get("conn", 0), [])), len(ours) - 1)].release
        return allowed is True or (callable(allowed) and allowed(got))

    async def dones(ctx):
        """Hand over the responses taken, each connection's in order, each a while after it is
        taken and once its stream's ``release`` allows, with its ``done``: a Read Response's
        payload is what its source holds then (the atomics after it must wait)."""
        rng = random.Random(seed + 3)
        while True:
            heads = {}
            for r in got["offered"]:
                heads.setdefault(r.get("conn", 0), r)
            ready = [r for r in heads.values() if release(r)]
            if not ready:
                await ctx.tick()
                continue
            r = ready[0]
            for _ in range(rng.randrange(30)):
                await ctx.tick()
            got["offered"].remove(r)
            conn = r.get("conn", 0)
            length = r["message"]["length"]
            if not r["inline"] and length:
                octets, at = locate(r["source"], length)
                r["payload"] = bytes(octets[at:at + length])
            got["responses"].setdefault(conn, []).append(r)
            ctx.set(rsp.done, 1)
            ctx.set(rsp.done_inline, r["inline"])
            if tagged:
                ctx.set(rsp.done_conn, conn)
            await ctx.tick()
            ctx.set(rsp.done, 0)

    async def faults(ctx):
        bus, rng = AmaranthBus(ctx), random.Random(seed + 4)
        while True:
            (f,) = await recv(bus, StreamPort.amaranth(rsp.o_fault), 1, rng=rng, stall=STALL,
                              timeout=1 << 30)
            got["faults"].setdefault(f.get("conn", 0), []).append(f)

    run(dut, source, monitors=[lookups, memory, answers, dones, faults],
        name="rdmap_respond_engine")
    for conn in {s.conn for s in streams}:
        ours = [s for s in streams if s.conn == conn]
        check_answers(ours, got["responses"].get(conn, []) +
                      [r for r in got["offered"] if r.get("conn", 0) == conn],
                      got["faults"].get(conn, []))
    for stag, memory in ((stag, m) for s in streams for stag, m in s.scene.memory.items()):
        assert host[scene.host.host_addr(stag)] == memory, f"region {stag:#x}"
    return got


def check_answers(streams, offered, faults):
    """One connection's responses (those handed over, then any not handed over) and faults,
    its ``streams`` in turn: each released stream's responses the engine's, each Terminate the
    engine's (code, offending length and the headers it copies)."""
    responses = []
    for r in offered:
        msg = r["message"]
        if msg["opcode"] == 11:
            assert r["inline"] and msg["length"] == AtomicResponse.SIZE
            header = r["data"].to_bytes(16, "little")[:AtomicResponse.SIZE]
            responses.append((11, Segment(Opcode.ATOMIC_RESPONSE, msn=msg["msn"],
                                          header=AtomicResponse.decode(header)).encode()))
        else:
            assert msg["opcode"] == 2 and not r["inline"]
            responses.append((2, msg["stag"], msg["to"], r.get("payload", b"")))
    for stream in streams:
        if stream.release is False:
            # The engine sends nothing before its Terminate then (it drops what it queued):
            # what it answered is counted by the caller.
            assert not stream.expected and stream is streams[-1]
            stream.answered, responses = responses, []
        else:
            assert responses[:len(stream.expected)] == stream.expected
            responses = responses[len(stream.expected):]
        if stream.terminate is not None:
            assert faults, "no Terminate"
            fault, *faults = faults
            layer, etype, ecode = stream.terminate.code.value
            assert TerminateCode(fault["code"]).value == layer << 12 | etype << 8 | ecode
            assert fault["offending_length"] == stream.terminate.ddp_segment_length
            copied = stream.terminate.ddp_header + stream.terminate.rdma_header
            assert fault["offending"].to_bytes(OFFENDING_BYTES, "little").startswith(copied)
    assert not responses and not faults


def test_atomics_and_reads():
    """FetchAdd and CmpSwap of every mask between Read Requests: the engine's Atomic Responses
    (queue 3 MSN, Request Identifier, original value) and Read Responses in order, and the
    engine's memory after."""
    rng = random.Random(10)
    scene = Responder(rng)
    ulpdus = [scene.atomic_request() if rng.random() < 0.6 else scene.read_request()
              for _ in range(60)]
    (stream,) = streams = [Stream(scene, ulpdus)]
    got = simulate_engine(streams, seed=10)
    assert stream.terminate is None
    assert sum(r["inline"] for r in got["responses"][0]) > 20


@pytest.mark.parametrize("kind", ["rights", "foreign", "bounds", "misaligned", "stag", "msn"])
def test_atomic_faults(kind):
    """Each atomic violation after good requests: the engine's Terminate, nothing after."""
    rng = random.Random(20 + len(kind))
    scene = Responder(rng)
    ulpdus = [scene.atomic_request() for _ in range(3)]
    bad = {
        "rights": lambda: scene.atomic_request(region=scene.read_only),
        "foreign": lambda: scene.atomic_request(region=scene.foreign),
        "bounds": lambda: scene.atomic_request(offset=scene.atomic.length - 4),
        "misaligned": lambda: scene.atomic_request(offset=8 * rng.randrange(8) + 3),
        "stag": lambda: scene.atomic_request(stag=scene.atomic.stag ^ 0x1),
        "msn": lambda: scene.atomic_request(msn=9),
    }[kind]()
    ulpdus += [bad, scene.atomic_request(), scene.read_request()]
    (stream,) = streams = [Stream(scene, ulpdus)]
    got = simulate_engine(streams, seed=20)
    assert stream.terminate is not None and len(got["responses"][0]) == 3


def test_ird_shared():
    """Reads and atomics share the IRD: with three credits never given back, the fourth
    request of either kind is beyond it (the engine's Terminate)."""
    rng = random.Random(30)
    scene = Responder(rng, ird=3)
    ulpdus = [scene.atomic_request(), scene.atomic_request(), scene.read_request(),
              scene.atomic_request(), scene.read_request()]
    (stream,) = streams = [Stream(scene, ulpdus, release=False)]
    simulate_engine(streams, seed=30)
    assert len(stream.answered) == 3
    assert stream.terminate.code == ErrorCode.DDP_UNTAGGED_INVALID_MSN_RANGE


def mixed(rng, scene, count):
    """``count`` good requests of ``scene``, atomics and Reads."""
    return [scene.atomic_request() if rng.random() < 0.5 else scene.read_request()
            for _ in range(count)]


def scenes(rng, irds):
    """A scene per IRD of ``irds``, all on one device (one STag table), each of its own PD."""
    first = Responder(rng, ird=irds[0])
    return [first] + [Responder(rng, ird=ird, shared=first) for ird in irds[1:]]


def interleaved(rng, streams):
    """The requests of ``streams`` merged at random, each stream's in order."""
    queues, steps = [[(s, u) for u in s.ulpdus] for s in streams], []
    while any(queues):
        steps.append(rng.choice([q for q in queues if q]).pop(0))
    return steps


def of(got, conn, key="responses"):
    return len(got[key].get(conn, []))


def test_connections():
    """Five connections of sixteen, their requests interleaved at random, each with its own IRD
    and PD and its own engine: each connection's responses and Terminate are its engine's.
    Three fail on different violations (an MSN not the next, a Read of another connection's
    region, an atomic not aligned); the other two run to their end."""
    rng = random.Random(40)
    conn_of = [0, 5, 9, 14, 15]
    scene = scenes(rng, [rng.randrange(3, 33) for _ in conn_of])
    ulpdus = [mixed(rng, scene[0], 14),
              mixed(rng, scene[1], 6) + [scene[1].atomic_request(msn=90)],
              mixed(rng, scene[2], 4) + [scene[2].read_request(region=scene[3].atomic)],
              mixed(rng, scene[3], 8) + [scene[3].atomic_request(
                  offset=8 * rng.randrange(8) + 5)],
              mixed(rng, scene[4], 14)]
    for k in (1, 2, 3):
        ulpdus[k] += mixed(rng, scene[k], 4)      # dropped after the fault
    streams = [Stream(s, u, conn) for s, u, conn in zip(scene, ulpdus, conn_of)]
    got = simulate_engine(streams, streams + interleaved(rng, streams), seed=40, conns=16)
    codes = [s.terminate and s.terminate.code for s in streams]
    assert codes == [None, ErrorCode.DDP_UNTAGGED_INVALID_MSN_RANGE,
                     ErrorCode.RDMAP_STAG_NOT_ASSOCIATED, ErrorCode.RDMAP_OPERATION_UNSPECIFIED,
                     None]
    assert [of(got, conn) for conn in conn_of] == [14, 6, 4, 8, 14]
    assert sum(r["inline"] for rs in got["responses"].values() for r in rs) > 15


def test_connections_ird():
    """Each connection's IRD is its own. Connection 2 (IRD 2) holds both its credits (two Read
    Responses not handed over) while connection 0 (IRD 1) is answered request by request, its
    credit given back by each ``done`` (with ``done_conn`` 0) before its next request;
    connection 2's come back only then, and its next requests are answered. Connection 3 (IRD
    3), none given back, is answered three times and refused the fourth."""
    rng = random.Random(41)
    held, single, spent = scenes(rng, [2, 1, 3])
    first = [held.read_request(), held.read_request()]
    a = Stream(single, mixed(rng, single, 8), 0)
    b = Stream(held, first + mixed(rng, held, 4), 2,
               release=lambda got: of(got, 0) == len(a.ulpdus))
    c = Stream(spent, [spent.read_request() for _ in range(5)], 3, release=False)
    steps = [a, b, c, (b, first[0]), (b, first[1]),
             lambda got: sum(r["conn"] == 2 for r in got["offered"]) == 2]
    for k, ulpdu in enumerate(a.ulpdus):
        steps += [lambda got, k=k: of(got, 0) == k, (a, ulpdu)]
        if k < len(c.ulpdus):
            steps.append((c, c.ulpdus[k]))
    steps.append(lambda got: of(got, 2) == 2)
    steps += [(b, u) for u in b.ulpdus[2:]]
    got = simulate_engine([a, b, c], steps, seed=41, conns=4)
    assert a.terminate is None and b.terminate is None and of(got, 2) == len(b.ulpdus)
    assert len(c.answered) == 3
    assert c.terminate.code == ErrorCode.DDP_UNTAGGED_INVALID_MSN_RANGE


def test_connections_reopened():
    """Slots opened afresh after their streams failed: connection 1's new stream (another PD,
    atomics on its own regions) starts again at MSN 1 and is answered by its engine;
    connection 2's, of IRD 1 where the old one had 8, is refused its second request.
    Connection 0 runs throughout."""
    rng = random.Random(42)
    scene = scenes(rng, [16, 4, 8, 6, 1])
    base, old_1, old_2, new_1, new_2 = scene
    s0 = Stream(base, mixed(rng, base, 20), 0)
    x = Stream(old_1, mixed(rng, old_1, 3) + [old_1.read_request(msn=7)] +
               mixed(rng, old_1, 2), 1)
    w = Stream(old_2, mixed(rng, old_2, 2) +
               [old_2.atomic_request(stag=old_2.atomic.stag ^ 1)] + mixed(rng, old_2, 3), 2)
    y = Stream(new_1, mixed(rng, new_1, 8), 1)
    z = Stream(new_2, [new_2.read_request(), new_2.atomic_request()], 2, release=False)
    half = [(s0, u) for u in s0.ulpdus[:10]], [(s0, u) for u in s0.ulpdus[10:]]
    steps = [s0, x, w, *interleaved(rng, [x, w]), *half[0],
             lambda got: of(got, 1, "faults") and of(got, 2, "faults") and
             not any(r["conn"] in (1, 2) for r in got["offered"]),
             200, y, z, *half[1], *interleaved(rng, [y, z])]
    got = simulate_engine([s0, x, w, y, z], steps, seed=42, conns=4)
    assert s0.terminate is None and y.terminate is None
    assert x.terminate.code == ErrorCode.DDP_UNTAGGED_INVALID_MSN_RANGE
    assert w.terminate.code == ErrorCode.RDMAP_INVALID_STAG
    assert of(got, 1) == 3 + 8 and of(got, 2) == 2
    assert len(z.answered) == 1
    assert z.terminate.code == ErrorCode.DDP_UNTAGGED_INVALID_MSN_RANGE


def test_lint_connections(tmp_path):
    toolchain.setup()
    path = tmp_path / "request_responder_c16.v"
    path.write_text(verilog.convert(RequestResponder(conns=16), name=path.stem))
    assert lint(path) == ""
