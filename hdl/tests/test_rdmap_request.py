# amaranth: UnusedElaboratable=no
"""The transmit path from work requests to FPDUs (RequestIssuer, SendScheduler, StreamSender)
against the model's engine, at 1, 8 and 64 bytes.

Work requests of every kind the send queue carries (Send, with SE, with Invalidate, with
Immediate Data; RDMA Write, with Immediate Data; RDMA Read; FetchAdd and CmpSwap, masked or
not) are posted on a model QP whose connection is established, and given to the gateware as
the host's send queue engine will give them (the test plays the driver: payload addresses
from the STag table, the RDMAP header of each Read and Atomic Request and the 8 octets of
Immediate Data written beside the work request). The octets the gateware sends must be the
model's, the Reads and atomics it keeps outstanding the model's (sink, size, Request
Identifier), in order; with a small ORD it must stop where the model stops and go on as
credits come back; with an ORD of 0 a Read is refused and nothing after it is sent.
"""

import random

import pytest
from amaranth import Module
from amaranth.lib import wiring

from iwarp_model import verbs
from iwarp_model.engine import Connection
from iwarp_model.mr import Access
from iwarp_model.transport.memory import MemoryPair
from iwarp_model.verbs import SGE, SendFlags, SendWR, WrOpcode
from iwarp_model.wire.rdmap import (
    AtomicResponse,
    Opcode,
    Segment,
)
from iwarp_nic.ddp import OutstandingTable
from iwarp_nic.ddp.send import StreamSender
from iwarp_nic.rdmap import RequestIssuer, SendScheduler, WorkRequest
from iwarp_tb.amsim import run
from iwarp_tb.beats import Beat, from_beats
from iwarp_tb.stags import HostTable
from iwarp_tb.streams import (
    AmaranthBus,
    StreamPort,
    collector,
    recv,
    send,
    send_packets,
    until_quiet,
)
from iwarp_tb.work import Headers, Requester, send_queue_engine, sent_ids

IDLE = STALL = 0.2
U64 = (1 << 64) - 1


class TxPath(wiring.Component):
    """Issuer, scheduler and sender of one stream (host reads and outstanding to the test)."""

    def __init__(self, n):
        self.issuer, self.scheduler, self.sender = RequestIssuer(), SendScheduler(n), \
            StreamSender(n)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.issuer = self.issuer
        wiring.connect(m, self.issuer.o_send, transmit_chain(m, self.scheduler, self.sender))
        return m


def transmit_chain(m, scheduler, sender, name=""):
    """``scheduler`` feeding ``sender`` (no responses) in ``m``: the scheduler's send input."""
    m.submodules[f"scheduler{name}"], m.submodules[f"sender{name}"] = scheduler, sender
    wiring.connect(m, scheduler.o_message, sender.i_message)
    wiring.connect(m, sender.o_fetch, scheduler.i_fetch)
    wiring.connect(m, scheduler.o_payload, sender.i_payload)
    m.d.comb += scheduler.i_response.valid.eq(0)
    return scheduler.i_send


class Driver:
    """A model connection (established) and the gateware's view of the same work: payload
    addresses, headers written beside the work, the Request Identifiers the engine uses."""

    def __init__(self, rng, *, ord_=16, crc=True, markers=False):
        self.rng = rng
        dev = verbs.Device("a")
        pd = dev.alloc_pd()
        cq = dev.create_cq(256)
        qp = dev.create_qp(pd, cq, cq, max_send_wr=256, max_rd_atomic=ord_)
        self.pd, self.qp = pd, qp
        self.memory = bytearray(rng.randbytes(1 << 15))
        self.region = dev.reg_mr(pd, self.memory, Access.LOCAL_WRITE, iova=rng.getrandbits(40))
        self.host = HostTable(rng, table=dev.mr_table, pds=0)
        self.host.by_handle[pd.handle] = pd
        peer_dev = verbs.Device("b")
        peer_pd = peer_dev.alloc_pd()
        peer_cq = peer_dev.create_cq(16)
        peer_qp = peer_dev.create_qp(peer_pd, peer_cq, peer_cq)
        self.conn = Connection(qp, active=True, crc=crc, markers=markers)
        self.peer = Connection(peer_qp, active=False, crc=crc, markers=markers)
        MemoryPair(self.conn, self.peer).start()
        self.crc, self.markers = crc, markers
        self.max_ulpdu = self.conn._framer.max_ulpdu
        self.headers = Headers()
        self.requester = Requester(self._source, self.headers)
        self.work = []              # the gateware's work requests

    def sge(self, length):
        return SGE(self.region.iova + self.rng.randrange(len(self.memory) - length + 1),
                   length, self.region.lkey)

    def _source(self, sge):
        return self.host.check(sge.lkey, sge.addr, sge.length, 0, self.pd.handle)[1]

    def post(self, wr):
        """Post ``wr`` on the model's QP, and its work request(s) for the gateware."""
        self.qp.post_send(wr)
        self.work += self.requester.work_of(wr)

    def random_wr(self, wr_id):
        rng = self.rng
        op = rng.choice([WrOpcode.SEND, WrOpcode.SEND_WITH_INV, WrOpcode.SEND_WITH_IMM,
                         WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM, WrOpcode.RDMA_READ,
                         WrOpcode.ATOMIC_FETCH_AND_ADD, WrOpcode.ATOMIC_CMP_AND_SWP,
                         WrOpcode.MASKED_ATOMIC_FETCH_AND_ADD,
                         WrOpcode.MASKED_ATOMIC_CMP_AND_SWP])
        atomic = op in (WrOpcode.ATOMIC_FETCH_AND_ADD, WrOpcode.ATOMIC_CMP_AND_SWP,
                        WrOpcode.MASKED_ATOMIC_FETCH_AND_ADD,
                        WrOpcode.MASKED_ATOMIC_CMP_AND_SWP)
        length = 8 if atomic else 0 if op == WrOpcode.SEND_WITH_IMM else rng.choice(
            [0, 1, 100, 1500, rng.randrange(5000)])
        solicitable = op in (WrOpcode.SEND, WrOpcode.SEND_WITH_INV, WrOpcode.SEND_WITH_IMM,
                             WrOpcode.RDMA_WRITE_WITH_IMM)
        flags = SendFlags.SIGNALED | (SendFlags.SOLICITED if solicitable and rng.random() < 0.3
                                      else 0)
        return SendWR(wr_id, op, [self.sge(length)] if length or atomic else [], flags,
                      imm_data=rng.getrandbits(32), invalidate_rkey=rng.getrandbits(32),
                      remote_addr=rng.getrandbits(61) * 8, rkey=rng.getrandbits(32),
                      compare_add=rng.getrandbits(64), swap=rng.getrandbits(64),
                      compare_add_mask=rng.getrandbits(64), swap_mask=rng.getrandbits(64))

    def read_host(self, addr, length):
        if addr in self.headers.octets:
            assert length == len(self.headers.octets[addr])
            return self.headers.octets[addr]
        base = self.host.host_addr(self.region.stag)
        offset = addr - base
        assert 0 <= offset and offset + length <= len(self.memory), hex(addr)
        return bytes(self.memory[offset:offset + length])

    def answer_oldest(self):
        """Complete the engine's oldest Read or atomic (its response, framed by the peer):
        the octets the engine sends then. The answer is what its sink holds already, so the
        memory the gateware reads its payloads from stays the memory the engine sent from."""
        head = self.conn._outstanding[0]
        sink = self.memory[head.sink_to - self.region.iova:][:head.size]
        if head.request_id is None:
            room = 1024                 # octets per segment, under any MULPDU used here
            segments = [Segment(Opcode.READ_RESPONSE, bytes(sink[at:at + room]),
                                last=at + room >= head.size, stag=head.sink_stag,
                                to=head.sink_to + at) for at in range(0, head.size or 1, room)]
        else:
            segments = [Segment(Opcode.ATOMIC_RESPONSE, msn=self.peer._tx_msn[3],
                                header=AtomicResponse(head.request_id,
                                                      int.from_bytes(sink, "little")))]
            self.peer._tx_msn[3] += 1
        for segment in segments:
            self.conn.receive(self.peer._framer.frame(segment.encode()))
        return self.conn.transmit()

    def outstanding(self):
        """The engine's Reads and atomics outstanding: the gateware's entries."""
        return [{"atomic": int(o.request_id is not None), "complete": 1,
                 "id": o.work.wr.wr_id & 0xFFFF, "stag": o.sink_stag, "to": o.sink_to,
                 "size": o.size, "request_id": o.request_id or 0}
                for o in self.conn._outstanding]


def simulate(n, driver, *, seed, ord_, credits_after=None):
    """The gateware's octets for ``driver.work``, the outstanding entries it offered, and the
    ids refused. With ``credits_after``, the test completes the oldest outstanding entry once
    the path goes quiet, that many times."""
    dut = TxPath(n)
    got = {"taken": []}

    async def host(ctx):
        """The send queue engine: every work request, waiting as long as the path holds it."""
        bus = AmaranthBus(ctx)
        port = dut.issuer.i_work
        whole = StreamPort(port.valid, port.ready, {"bits": port.payload.as_value()})
        await send(bus, whole, [{"bits": WorkRequest.const(w).as_bits()} for w in driver.work],
                   rng=random.Random(seed), idle=IDLE, timeout=1 << 30)

    async def control(ctx):
        """Let the path run until it goes quiet; then give back credits one at a time."""
        snd = dut.sender
        ctx.set(snd.max_ulpdu, driver.max_ulpdu)
        ctx.set(snd.crc, driver.crc)
        ctx.set(snd.markers, driver.markers)
        ctx.set(dut.issuer.ord, ord_)
        quiet = [dut.sender.o, dut.scheduler.o_read]
        await until_quiet(ctx, quiet, 300)
        got["after"] = [len(got["fpdus"])]
        for _ in range(credits_after or 0):
            (entry,) = await recv(AmaranthBus(ctx), StreamPort.amaranth(
                dut.issuer.o_outstanding), 1)
            got["taken"].append(entry)
            await until_quiet(ctx, quiet, 300)
            got["after"].append(len(got["fpdus"]))

    async def reads(ctx):
        bus, rng = AmaranthBus(ctx), random.Random(seed + 1)
        while True:
            (read,) = await recv(bus, StreamPort.amaranth(dut.scheduler.o_read), 1, rng=rng,
                                 stall=STALL, timeout=1 << 30)
            await send_packets(bus, StreamPort.amaranth(dut.scheduler.i_host),
                               [driver.read_host(read["addr"], read["length"])], n, rng=rng,
                               idle=IDLE)

    run(dut, control, monitors=[
        host, reads,
        collector(got, "fpdus", dut.sender.o, data_bytes=n, rng=random.Random(seed + 2),
                  stall=STALL),
        collector(got, "refused", dut.issuer.o_refused),
        collector(got, "sent", dut.scheduler.o_sent)], name=f"rdmap_request_w{n}")
    return got



@pytest.mark.parametrize("n", [1, 8, 64])
@pytest.mark.parametrize("crc, markers", [(True, False), (False, True)])
def test_against_model(n, crc, markers):
    """Work requests of every kind: the model's octets, and its Reads and atomics outstanding
    (read out at the end, oldest first)."""
    rng = random.Random(n * 2 + crc)
    driver = Driver(rng, crc=crc, markers=markers)
    for k in range(10 if n == 1 else 24):
        driver.post(driver.random_wr(k))
    wanted = driver.conn.transmit()
    expected = driver.outstanding()
    got = simulate(n, driver, seed=n, ord_=driver.conn.ord, credits_after=len(expected))
    assert b"".join(bytes(f) for f in got["fpdus"]) == wanted
    assert got["taken"] == expected and not got["refused"]
    assert sorted(e["id"] for e in got["sent"]) == sent_ids(driver.work)


ORD_OPS = [WrOpcode.RDMA_READ, WrOpcode.SEND, WrOpcode.ATOMIC_FETCH_AND_ADD,
           WrOpcode.RDMA_READ, WrOpcode.SEND, WrOpcode.RDMA_READ, WrOpcode.RDMA_WRITE]


def post_ops(driver, ops, *, fence_at=None):
    """Post one work request of each opcode in ``ops`` (random otherwise)."""
    for k, op in enumerate(ops):
        wr = driver.random_wr(k)
        wr.opcode, wr.send_flags = op, SendFlags.SIGNALED
        atomic = op == WrOpcode.ATOMIC_FETCH_AND_ADD
        wr.sg_list = [driver.sge(8 if atomic else 16)]
        if k == fence_at:
            wr.send_flags |= SendFlags.FENCE
        driver.post(wr)


def test_ord():
    """ORD 2 and a fenced Send: the gateware stops where the engine stops, and each Read or
    atomic completed lets it send what the engine sends then."""
    driver = Driver(random.Random(5), ord_=2)
    post_ops(driver, ORD_OPS, fence_at=4)
    steps = [driver.conn.transmit()]
    expected = driver.outstanding()
    while driver.conn._outstanding:
        expected += [e for e in driver.outstanding() if e not in expected]
        steps.append(driver.answer_oldest())
    got = simulate(8, driver, seed=5, ord_=driver.conn.ord, credits_after=len(steps) - 1)
    octets = b"".join(bytes(f) for f in got["fpdus"])
    assert octets == b"".join(steps)
    assert [len(b"".join(bytes(f) for f in got["fpdus"][:k])) for k in got["after"]] == [
        len(b"".join(steps[:k + 1])) for k in range(len(steps))]
    assert got["taken"] == expected and len(steps) > 3


def test_ord_zero():
    """ORD 0: a Send goes, the Read after it is refused, and nothing after it is sent (the
    engine puts the send queue in error): the Send after it is taken and given back flushed."""
    rng = random.Random(7)
    driver = Driver(rng, ord_=0)
    for k, op in enumerate([WrOpcode.SEND, WrOpcode.RDMA_READ, WrOpcode.SEND]):
        wr = driver.random_wr(k)
        wr.opcode, wr.sg_list, wr.send_flags = op, [driver.sge(32)], SendFlags.SIGNALED
        driver.post(wr)
    wanted = driver.conn.transmit()
    got = simulate(8, driver, seed=7, ord_=0)
    assert b"".join(bytes(f) for f in got["fpdus"]) == wanted
    assert [(r["id"], r["flushed"]) for r in got["refused"]] == [(1, 0), (2, 1)]
    assert [e["id"] for e in got["sent"]] == [0]


@pytest.mark.tshark
def test_tshark(tmp_path):
    """tshark reads the path's stream (work of every kind, CRC on) as the engine's FPDUs, one
    per segment, with Good CRC32 and the opcodes the engine sent."""
    from iwarp_model.capture import StreamCapture
    from iwarp_model.wire.fpdu import Deframer
    from iwarp_model.wire.mpa import MpaFrame
    from iwarp_tb.tshark import check_fpdus

    driver = Driver(random.Random(40), crc=True, markers=False)
    for k in range(30):
        driver.post(driver.random_wr(k))
    wanted = driver.conn.transmit()
    got = simulate(8, driver, seed=40, ord_=driver.conn.ord)
    path = tmp_path / "rdmap_request.pcap"
    with StreamCapture(path, ("10.0.0.1", 40000), ("10.0.0.2", 5000)) as capture:
        capture.sent(MpaFrame(reply=False, crc=True, revision=1).encode())
        capture.received(MpaFrame(reply=True, crc=True, revision=1).encode())
        for fpdu in got["fpdus"]:
            capture.sent(bytes(fpdu))
    check_fpdus(path, Deframer(crc=True, markers=False).feed(wanted))


class ConnectionsTxPath(wiring.Component):
    """The transmit path of ``conns`` connections: issuer, scheduler and sender with
    ``conns``, and the OutstandingTable the issuer fills (host reads, the table's questions
    and retires to the test)."""

    def __init__(self, n, conns):
        self.issuer, self.table = RequestIssuer(conns=conns), OutstandingTable(conns)
        self.scheduler = SendScheduler(n, conns=conns)
        self.sender = StreamSender(n, conns=conns)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.issuer, m.submodules.table = iss, table = self.issuer, self.table
        wiring.connect(m, iss.o_outstanding, table.i_push)
        m.d.comb += [table.count_conn.eq(iss.outstanding_conn), iss.outstanding.eq(table.count)]
        wiring.connect(m, iss.o_send, transmit_chain(m, self.scheduler, self.sender))
        return m


def simulate_connections(n, drivers, *, seed, retires):
    """``drivers``' work requests, one connection each, through :class:`ConnectionsTxPath`:
    each connection's octets once the path has gone quiet (``got["after"]``, a list of lists),
    then again after each of ``retires`` (connections whose oldest outstanding entry the test
    reads from the table and retires, in that order); the entries read; the refusals. The send
    queue engine offers a random connection's next work request each cycle it is not idle; a
    deferred one sends that connection back to it, offered again after a random wait."""
    conns = len(drivers)
    dut = ConnectionsTxPath(n, conns)
    got = {"taken": [], "deferred": [], "chunks": [], **{f"fpdus{c}": [] for c in range(conns)}}
    iss, sch, snd = dut.issuer, dut.scheduler, dut.sender

    async def host(ctx):
        while not got.get("opened"):
            await ctx.tick()
        await send_queue_engine(ctx, iss.i_work, iss.o_deferred,
                                {c: d.work for c, d in enumerate(drivers)},
                                random.Random(seed), idle=IDLE, deferrals=got["deferred"])

    def octets():
        return [b"".join(bytes(f) for f in got[f"fpdus{c}"]) for c in range(conns)]

    async def control(ctx):
        bus = AmaranthBus(ctx)
        await send(bus, StreamPort.amaranth(iss.i_open),
                   [{"conn": c, "ord": d.conn.ord} for c, d in enumerate(drivers)])
        await send(bus, StreamPort.amaranth(snd.i_open),
                   [{"conn": c, "max_ulpdu": d.max_ulpdu, "crc": d.crc, "markers": d.markers}
                    for c, d in enumerate(drivers)])
        got["opened"] = True
        quiet = [snd.o, sch.o_read]
        await until_quiet(ctx, quiet, 300)
        got["after"] = [octets()]
        for conn in retires:
            await send(bus, StreamPort.amaranth(dut.table.i_ask), [{"conn": conn}])
            (entry,) = await recv(bus, StreamPort.amaranth(dut.table.o_oldest), 1)
            got["taken"].append((conn, entry))
            await send(bus, StreamPort.amaranth(dut.table.i_retire), [{"conn": conn}])
            await until_quiet(ctx, quiet, 300)
            got["after"].append(octets())

    async def reads(ctx):
        bus, rng = AmaranthBus(ctx), random.Random(seed + 1)
        while True:
            (read,) = await recv(bus, StreamPort.amaranth(sch.o_read), 1, rng=rng,
                                 stall=STALL, timeout=1 << 30)
            await send_packets(bus, StreamPort.amaranth(sch.i_host),
                               [drivers[read["conn"]].read_host(read["addr"], read["length"])],
                               n, rng=rng, idle=IDLE)

    async def fpdus(ctx):
        """Each connection's FPDUs, its beats told apart by their ``conn``."""
        bus, rng, beats = AmaranthBus(ctx), random.Random(seed + 2), [[] for _ in drivers]
        while True:
            (t,) = await recv(bus, StreamPort.amaranth(snd.o), 1, rng=rng, stall=STALL,
                              timeout=1 << 30)
            beats[t["conn"]].append(Beat(t["data"], t["keep"], t["last"], t["err"]))
            if t["last"]:
                (fpdu,) = from_beats(beats[t["conn"]], n)
                got[f"fpdus{t['conn']}"].append(fpdu)
                got["chunks"].append({"conn": t["conn"], "length": len(fpdu)})
                beats[t["conn"]] = []

    run(dut, control, monitors=[host, reads, fpdus, collector(got, "refused", iss.o_refused),
                                collector(got, "sent", sch.o_sent),
                                collector(got, "headers", snd.o_header)],
        name=f"rdmap_request_c{conns}_w{n}")
    return got


@pytest.mark.parametrize("n", [1, 8, 64])
def test_connections(n):
    """Four connections' work requests interleaved at random, each connection against its own
    model engine: one with ORD 2 and a fence (its Reads deferred and offered again while the
    others go on), two with random work of every kind and their own CRC and marker settings
    (one of them with ORD 3), one with ORD 0 (its Read refused, the rest flushed). After the
    path goes quiet, the test completes outstanding entries (read from the table, then
    retired) of the connections in a random order: after each, every connection has sent what
    its engine has sent by then, and each entry read is its engine's oldest Read or atomic."""
    rng = random.Random(100 + n)
    drivers = [Driver(rng, ord_=2), Driver(rng, ord_=3, crc=True, markers=True),
               Driver(rng, crc=False, markers=True), Driver(rng, ord_=0)]
    post_ops(drivers[0], ORD_OPS, fence_at=4)
    for driver in drivers[1:3]:
        for k in range(6 if n == 1 else 16):
            driver.post(driver.random_wr(k))
    post_ops(drivers[3], [WrOpcode.SEND, WrOpcode.RDMA_READ, WrOpcode.SEND, WrOpcode.RDMA_WRITE])
    steps = [[d.conn.transmit()] for d in drivers]
    retires, expected = [], []             # every outstanding entry completed, interleaved
    while busy := [c for c, d in enumerate(drivers) if d.conn._outstanding]:
        conn = rng.choice(busy)
        retires.append(conn)
        expected.append((conn, dict(drivers[conn].outstanding()[0], present=1)))
        steps[conn].append(drivers[conn].answer_oldest())
    got = simulate_connections(n, drivers, seed=n, retires=retires)
    counts = [0] * len(drivers)
    for k, snapshot in enumerate(got["after"]):
        if k:
            counts[retires[k - 1]] += 1
        assert snapshot == [b"".join(s[:counts[c] + 1]) for c, s in enumerate(steps)], k
    assert got["taken"] == expected and retires.count(0) > 2
    assert 0 in {c for c, _ in got["deferred"]}
    assert [(r["conn"], r["id"], r["flushed"]) for r in got["refused"]] == [
        (3, 1, 0), (3, 2, 1), (3, 3, 1)]
    assert got["headers"] == got["chunks"]
    for conn, driver in enumerate(drivers):
        refused = [r["id"] for r in got["refused"] if r["conn"] == conn]
        assert sorted(e["id"] for e in got["sent"] if e["conn"] == conn) == \
            sent_ids(driver.work, refused), conn
