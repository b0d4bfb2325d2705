# amaranth: UnusedElaboratable=no
"""The StreamReceiver's queue 0 (Send, its SE and Invalidate variants, Immediate Data, posted
receives, remote invalidation) and its Read and Atomic Response placement (outstanding Reads
and atomics) against the model's engine, at 1, 8 and 64 bytes.

The oracle is a model ``Connection`` established with a model peer: the same ULPDUs are
delivered to it (framed by the peer) and, framed by the model's ``Framer`` with CRC and markers
on or off, to the gateware; both get the same receives and the same outstanding Reads and
FetchAdds (posted on the model's QP, their requests left unsent to the peer: the test writes
the answers). The gateware's STag table is loaded from the model device's table. After the
stream, the model's memory must equal the gateware's placements applied to the same regions
(and no placement may fall outside them), its receive completions (all but the flushed ones)
the gateware's, in order and in every field, its Read and atomic completions the gateware's
ends of them, and its Terminate (code, offending ULPDU) the gateware's Terminate request. Each
violation of queue 0 and of Read and Atomic Responses gets its own case.
"""

import random

import pytest

from iwarp_model import verbs
from iwarp_model.engine import Connection, ConnState, Rtr
from iwarp_model.mr import Access
from iwarp_model.transport.memory import MemoryPair
from iwarp_model.wire.fpdu import Framer
from iwarp_model.wire.mpa import MpaFrame
from iwarp_model.wire.rdmap import AtomicResponse, ImmediateData, Opcode, ReadRequest, Segment
from iwarp_model.wire.terminate import ErrorCode
from iwarp_nic.ddp.placement import CompletionStatus
from iwarp_nic.ddp.receive import ConnectionsPlacer, ConnectionsReceiver, StreamReceiver
from iwarp_nic.errors import OFFENDING_BYTES, TerminateCode
from iwarp_nic.mpa import ErrorKind, GatherOp
from iwarp_nic.mpa import Rtr as HwRtr
from iwarp_tb.amsim import run
from iwarp_tb.beats import to_beats
from iwarp_tb.receive import configure, receive_answers
from iwarp_tb.stags import HostTable, load_table
from iwarp_tb.streams import (
    AmaranthBus,
    StreamPort,
    collector,
    recv,
    recv_packets,
    send,
    send_packets,
    tcp_chunks,
    until_quiet,
)

IDLE = STALL = 0.2
RW = Access.LOCAL_WRITE | Access.REMOTE_WRITE


def _end(name, dev=None):
    """A QP with its own PD and CQ, on ``dev`` (a new device by default)."""
    dev = dev or verbs.Device(name)
    pd = dev.alloc_pd()
    cq = dev.create_cq(4096)
    qp = dev.create_qp(pd, cq, cq, max_recv_wr=1024, max_recv_sge=1, max_send_wr=1024,
                       max_rd_atomic=32, max_dest_rd_atomic=32)
    return dev, pd, cq, qp


class Scene:
    """The receiving end: a model device with a buffer region (Local and Remote Write), one
    only for Remote Read, fast-registered regions of its PD and one of another PD, connected
    to a model peer; and the same regions as the gateware's table sees them. Several scenes
    can share one device (``dev``) and the gateware's view of its table (``host``), each its
    QP being one connection."""

    def __init__(self, rng, *, crc, markers, rtr=None, dev=None, host=None):
        self.rng = rng
        self.dev, self.pd, self.cq, self.qp = _end("b", dev)
        other = self.dev.alloc_pd()
        self.memory = {}
        self.buffer = self._reg(self.pd, 1 << 16, RW)
        self.no_local = self._reg(self.pd, 4096, Access.REMOTE_READ)
        self.fmrs = [self._fast(self.pd, 512) for _ in range(3)]
        self.foreign = self._fast(other, 64)
        self.regions = [self.buffer, self.no_local, *self.fmrs, self.foreign]
        self.host = host or HostTable(rng, table=self.dev.mr_table, pds=0)
        peer_qp = _end("a")[3]
        if rtr is None:
            # This end is the initiator, free to send its Read Requests at once (RFC 5044
            # 7.1.2).
            self.conn = Connection(self.qp, active=True, crc=crc, markers=markers)
            self.peer = Connection(peer_qp, active=False, crc=crc, markers=markers)
            MemoryPair(self.conn, self.peer).start()
        else:
            # A peer-to-peer Responder awaiting the RTR ``rtr``: the peer's own RTR is held
            # back, the test sends the first FPDU.
            options = {"crc": crc, "markers": markers, "p2p": True, "rtr": (rtr,)}
            self.conn = Connection(self.qp, active=False, **options)
            self.peer = Connection(peer_qp, active=True, **options)
            self.conn.start()
            self.peer.start()
            self.conn.receive(self.peer.transmit())
            self.peer.receive(self.conn.transmit())
            assert self.peer.transmit() and self.conn.state == ConnState.AWAIT_RTR
            # The peer's framer as it was before its RTR (markers count from the stream's
            # first FPDU).
            agreed = self.peer.negotiated
            self.peer._framer = Framer(crc=agreed.crc, markers=agreed.tx_markers(initiator=True),
                                       emss=self.peer.emss)
        self.delivered = 0          # the leading ULPDUs of its stream the model has had
        self.receives = []          # the gateware's PostedReceive of each receive posted
        self.outstanding = []       # the gateware's OutstandingRead of each Read posted
        self.msn = self.msn_3 = 1
        self.request_id = 0
        # Completions as the engine pushes them, with their solicited flag.
        self.pushed = []
        push = self.cq.push

        def recording(wc, *, solicited=False):
            self.pushed.append((wc, solicited))
            push(wc, solicited=solicited)
        self.cq.push = recording

    def _reg(self, pd, size, access):
        memory = bytearray(self.rng.randbytes(size))
        region = self.dev.reg_mr(pd, memory, access, iova=self.rng.getrandbits(40))
        self.memory[region.stag] = memory
        return region

    def _fast(self, pd, size):
        memory = bytearray(self.rng.randbytes(size))
        region = self.dev.alloc_mr(pd)
        self.dev.mr_table.fast_reg(region.stag, memory, RW, iova=self.rng.getrandbits(40))
        self.memory[region.stag] = memory
        return region

    def post(self, length=None, *, region=None, offset=None, sges=1):
        """Post a receive of ``length`` octets (random by default) in ``region`` (the buffer)."""
        region = region or self.buffer
        if length is None:
            length = self.rng.choice([0, 1, 64, 1000, self.rng.randrange(4000)])
        if offset is None:
            offset = self.rng.randrange(region.length - length + 1) if length <= \
                region.length else 0
        wr_id = len(self.receives)
        sge = verbs.SGE(region.iova + offset, length, region.lkey)
        wr = verbs.RecvWR(wr_id, [sge] if sges else [])
        self.qp.post_recv(wr)
        self.receives.append({"id": wr_id, "sges": sges, "lkey": sge.lkey, "addr": sge.addr,
                              "length": sge.length})

    def message(self, opcode, length, *, cut=None, inv_stag=0, msn=None, mo=0):
        """The segments of one queue 0 message of ``length`` payload octets, cut into pieces
        of at most ``cut`` octets (random sizes by default)."""
        if msn is None:
            msn, self.msn = self.msn, self.msn + 1
        payload = self.rng.randbytes(length)
        if opcode in (Opcode.IMMEDIATE_DATA, Opcode.IMMEDIATE_DATA_SE):
            return [Segment(opcode, msn=msn, header=ImmediateData(self.rng.randbytes(8))
                            ).encode()]
        out, at = [], 0
        while True:
            size = cut or self.rng.choice([1, 7, 100, 1400])
            chunk = payload[at:at + size]
            last = at + len(chunk) >= length
            out.append(Segment(opcode, chunk, last, msn=msn, mo=mo + at,
                               inv_stag=inv_stag).encode())
            at += len(chunk)
            if last:
                return out

    def read(self, length=None, region=None):
        """Post an RDMA Read of ``length`` octets (random by default) into ``region`` (the
        buffer) and let the model send its request (which goes nowhere): its sink."""
        region = region or self.buffer
        if length is None:
            length = self.rng.choice([0, 1, 100, self.rng.randrange(3000)])
        sge = verbs.SGE(region.iova + self.rng.randrange(region.length - length + 1), length,
                  region.lkey)
        wr_id = 1000 + len(self.outstanding)
        self.qp.post_send(verbs.SendWR(wr_id, verbs.WrOpcode.RDMA_READ, [sge],
                                       verbs.SendFlags.SIGNALED,
                                       remote_addr=self.rng.getrandbits(40), rkey=0x1234))
        self.conn.transmit()
        sink = {"atomic": 0, "complete": 1, "id": wr_id, "stag": sge.lkey, "to": sge.addr,
                "size": length, "request_id": 0}
        self.outstanding.append(sink)
        return sink

    def atomic(self, region=None):
        """Post a FetchAdd whose original value lands in ``region`` (the buffer) and let the
        model send its request: its sink (the engine numbers requests from 1)."""
        region = region or self.buffer
        sge = verbs.SGE(region.iova + self.rng.randrange(region.length - 7), 8, region.lkey)
        wr_id = 1000 + len(self.outstanding)
        self.qp.post_send(verbs.SendWR(wr_id, verbs.WrOpcode.ATOMIC_FETCH_AND_ADD, [sge],
                                       verbs.SendFlags.SIGNALED, remote_addr=8 * wr_id,
                                       rkey=0x1234, compare_add=1))
        self.conn.transmit()
        self.request_id += 1
        sink = {"atomic": 1, "complete": 1, "id": wr_id, "stag": sge.lkey, "to": sge.addr,
                "size": 8, "request_id": self.request_id}
        self.outstanding.append(sink)
        return sink

    def atomic_response(self, sink, *, request_id=None, msn=None):
        """The Atomic Response to ``sink``: the next MSN of queue 3, a random value."""
        if msn is None:
            msn, self.msn_3 = self.msn_3, self.msn_3 + 1
        request_id = sink["request_id"] if request_id is None else request_id
        return Segment(Opcode.ATOMIC_RESPONSE, msn=msn, header=AtomicResponse(
            request_id, self.rng.getrandbits(64))).encode()

    def response(self, sink, *, cut=None, length=None, skip=0):
        """The segments of the Read Response to ``sink``: ``length`` octets (its size by
        default) from ``skip`` octets on, cut as :meth:`message` cuts."""
        length = sink["size"] if length is None else length
        payload = self.rng.randbytes(length)
        out, at = [], 0
        while True:
            size = cut or self.rng.choice([1, 7, 100, 1400])
            chunk = payload[at:at + size]
            last = at + len(chunk) >= length
            out.append(Segment(Opcode.READ_RESPONSE, chunk, last, stag=sink["stag"],
                               to=sink["to"] + skip + at).encode())
            at += len(chunk)
            if last:
                return out

    def write(self, length, region=None):
        region = region or self.buffer
        to = region.iova + self.rng.randrange(region.length - length + 1)
        return Segment(Opcode.WRITE, self.rng.randbytes(length), stag=region.stag,
                       to=to).encode()

    def model(self, ulpdus):
        """Deliver ``ulpdus`` to the model: its completions with their solicited flags (flushed
        ones left out; receives and Reads) and its Terminate (or None)."""
        framer = self.peer._framer
        for ulpdu in ulpdus:
            self.conn.receive(framer.frame(ulpdu))
        self.cq.poll_cq(4096)
        wcs = [(wc, s) for wc, s in self.pushed if wc.status != verbs.WcStatus.WR_FLUSH_ERR]
        self.pushed.clear()
        return wcs, self.conn.terminate_sent


def simulate(n, scene, ulpdus, *, crc, markers, seed, late=False, rtr=HwRtr.NONE,
             forwarded=0):
    """Run ``ulpdus`` through the gateware and the model and compare. ``late``: the receives
    are offered one at a time with delays, ``receive_pending`` set meanwhile. ``rtr``: the
    RTR the gateware awaits; ``forwarded``: headers it must pass on (a Read RTR's). The
    gateware's ``started`` is returned too."""
    rng = random.Random(seed)
    framer = Framer(crc=crc, markers=markers)
    octets = b"".join(framer.frame(u) for u in ulpdus)
    before = {stag: bytes(memory) for stag, memory in scene.memory.items()}
    writes = [scene.host.write(r) for r in scene.regions]     # as they are before the stream
    wcs, terminate = scene.model(ulpdus)
    dut = StreamReceiver(n, stag_entries=64, fifo_bytes=8192)
    got = {}
    outputs = [dut.o_place, dut.o_data, dut.o_complete, dut.o_read_done, dut.o_fault,
               dut.o_header, dut.o_error]

    async def source(ctx):
        bus = AmaranthBus(ctx)
        ctx.set(dut.rtr, rtr)
        await configure(ctx, dut, writes, scene.pd.handle, crc=crc, markers=markers)
        await send_packets(bus, StreamPort.amaranth(dut.i), tcp_chunks(rng, octets), n,
                           rng=random.Random(seed + 1), idle=IDLE)
        await until_quiet(ctx, outputs, 500)     # every output quiet for a while
        got["started"] = ctx.get(dut.started)

    async def receives(ctx):
        bus, r = AmaranthBus(ctx), random.Random(seed + 9)
        port = StreamPort.amaranth(dut.i_receive)
        if not late:
            await send(bus, port, scene.receives, rng=r, timeout=1 << 30)
            return
        for receive in scene.receives:
            ctx.set(dut.receive_pending, 1)
            for _ in range(r.randrange(60)):
                await ctx.tick()
            await send(bus, port, [receive], timeout=1 << 30)
        ctx.set(dut.receive_pending, 0)

    def monitor(key, port, offset, packets=False):
        return collector(got, key, port, data_bytes=n if packets else None,
                         rng=random.Random(seed + offset), stall=STALL)

    async def outstanding(ctx):
        await send(AmaranthBus(ctx), StreamPort.amaranth(dut.i_outstanding), scene.outstanding,
                   timeout=1 << 30)

    monitors = [monitor("places", dut.o_place, 2), monitor("data", dut.o_data, 3, True),
                monitor("completions", dut.o_complete, 4), monitor("reads", dut.o_read_done, 8),
                monitor("faults", dut.o_fault, 5), monitor("headers", dut.o_header, 6),
                monitor("errors", dut.o_error, 7)]
    # The receives a stream that failed does not take are left on offer.
    run(dut, source, monitors=[receives, outstanding, *monitors], name=f"ddp_engine_w{n}")
    compare(scene, before, got, wcs, terminate, forwarded)
    return wcs, terminate, got["started"]


def compare(scene, before, got, wcs, terminate, forwarded):
    """The gateware did what the model did: memory, completions, Terminate."""
    compare_memory([scene], before, got)
    compare_events(scene, got, wcs, terminate, forwarded)


def compare_memory(scenes, before, got):
    """The placements, applied to the regions' host addresses as they were ``before``, give
    the model's memory of every scene; none falls outside the regions."""
    memory = {stag: octets for scene in scenes for stag, octets in scene.memory.items()}
    spans = {stag: (scenes[0].host.host_addr(stag), len(octets))
             for stag, octets in memory.items()}
    after = {stag: bytearray(octets) for stag, octets in before.items()}
    assert len(got["places"]) == len(got["data"])
    for place, data in zip(got["places"], got["data"]):
        assert place["length"] == len(data) > 0
        inside = [stag for stag, (base, size) in spans.items()
                  if base <= place["addr"] and place["addr"] + len(data) <= base + size]
        assert inside, f"placement at {place['addr']:#x}+{len(data)} outside every region"
        offset = place["addr"] - spans[inside[0]][0]
        after[inside[0]][offset:offset + len(data)] = bytes(data)
    for stag, octets in memory.items():
        assert after[stag] == octets, f"region {stag:#x} differs from the model's"


def compare_events(scene, got, wcs, terminate, forwarded):
    """The gateware's ends of Reads, receive completions and Terminate request are the
    model's ``wcs`` and ``terminate``; ``forwarded`` headers were passed on."""
    receives = (verbs.WcOpcode.RECV, verbs.WcOpcode.RECV_RDMA_WITH_IMM)
    reads = [wc for wc, _ in wcs if wc.opcode not in receives]     # Reads and atomics
    assert [(r["id"], r["status"]) for r in got["reads"]] == [
        (wc.wr_id, CompletionStatus(int(wc.status))) for wc in reads]
    wcs = [(wc, s) for wc, s in wcs if wc.opcode in receives]
    assert not got["errors"] and len(got["headers"]) == forwarded
    # Completions, in order, every field.
    expected = [{"id": wc.wr_id, "status": CompletionStatus(int(wc.status)),
                 "byte_len": wc.byte_len,
                 "with_imm": int(bool(wc.wc_flags & verbs.WcFlags.WITH_IMM)),
                 "imm_data": wc.imm_data,
                 "with_inv": int(bool(wc.wc_flags & verbs.WcFlags.WITH_INV)),
                 "invalidated": wc.invalidated_rkey, "solicited": int(solicited)}
                for wc, solicited in wcs]
    fields = ["id", "status", "byte_len", "with_imm", "imm_data", "with_inv", "invalidated",
              "solicited"]
    assert [{k: c[k] for k in fields} for c in got["completions"]] == expected
    # The Terminate.
    if terminate is None:
        assert not got["faults"]
        return
    (fault,) = got["faults"]
    layer, etype, ecode = terminate.code.value
    assert TerminateCode(fault["code"]).value == layer << 12 | etype << 8 | ecode
    if terminate.ddp_segment_length is not None:
        assert fault["offending_length"] == terminate.ddp_segment_length
        head = int.to_bytes(fault["offending"], OFFENDING_BYTES, "little")
        assert head[:len(terminate.ddp_header)] == terminate.ddp_header


QUEUE_0 = [Opcode.SEND, Opcode.SEND_SE, Opcode.IMMEDIATE_DATA, Opcode.IMMEDIATE_DATA_SE]


def traffic(scene, count, longest=4000):
    """``count`` good messages, every queue 0 opcode in turn (a receive posted for each, some
    without a buffer), one Send with Invalidate and one with SE and Invalidate in the second
    half; RDMA Writes and Reads (one or two outstanding, then their Read Responses) between
    them."""
    rng, out = scene.rng, []
    invalidations = [Opcode.SEND_INVALIDATE, Opcode.SEND_SE_INVALIDATE]
    for k in range(count):
        while rng.random() < 0.4:
            out.append(scene.write(rng.choice([1, 9, rng.randrange(1, min(longest, 1400))])))
        if rng.random() < 0.5 and len(scene.outstanding) < 30:     # (within the ORD of 32)
            sinks = [scene.atomic() if rng.random() < 0.4 else
                     scene.read(rng.choice([0, 1, 8, rng.randrange(longest)]))
                     for _ in range(rng.randint(1, 2))]
            for sink in sinks:
                out += [scene.atomic_response(sink)] if sink["atomic"] else \
                    scene.response(sink)
        opcode, inv_stag = QUEUE_0[k % len(QUEUE_0)], 0
        if invalidations and k >= count // 2:
            opcode, inv_stag = invalidations.pop(), scene.fmrs[len(invalidations)].stag
        length = 0 if opcode in (Opcode.IMMEDIATE_DATA, Opcode.IMMEDIATE_DATA_SE) else \
            rng.choice([0, 1, 8, rng.randrange(longest)])
        if length or rng.random() < 0.5:
            scene.post(length + rng.choice([0, 0, 3, 500]))
        else:
            scene.post(sges=0)
        out += scene.message(opcode, length, inv_stag=inv_stag)
    return out


@pytest.mark.parametrize("n", [1, 8, 64])
@pytest.mark.parametrize("crc, markers", [(True, True), (False, False)])
def test_traffic(n, crc, markers):
    """Every queue 0 opcode, cut into segments of random sizes, between RDMA Writes: placed,
    completed and invalidated as the model does, with no Terminate."""
    scene = Scene(random.Random(n * 2 + crc), crc=crc, markers=markers)
    ulpdus = traffic(scene, 8, longest=600) if n == 1 else traffic(scene, 24)
    wcs, terminate, _ = simulate(n, scene, ulpdus, crc=crc, markers=markers, seed=n)
    assert terminate is None and len(wcs) == len(scene.receives) + len(scene.outstanding)
    assert {wc.wc_flags for wc, _ in wcs} >= {verbs.WcFlags.WITH_IMM, verbs.WcFlags.WITH_INV}
    assert scene.outstanding


@pytest.mark.parametrize("n", [1, 8, 64])
def test_receives_offered_late(n):
    """Receives still being fetched (``receive_pending``): each message waits for its own."""
    scene = Scene(random.Random(20 + n), crc=True, markers=False)
    ulpdus = traffic(scene, 6 if n == 1 else 12, longest=600)
    wcs, terminate, _ = simulate(n, scene, ulpdus, crc=True, markers=False, seed=n, late=True)
    assert terminate is None and len(wcs) == len(scene.receives) + len(scene.outstanding)


def _violation(kind, scene):
    """The segments of one queue 0 violation, and the code the model must send for it."""
    rng = scene.rng
    if kind == "msn":
        scene.post(100)
        return scene.message(Opcode.SEND, 10, msn=scene.msn + 1), \
            ErrorCode.DDP_UNTAGGED_INVALID_MSN_RANGE
    if kind == "mo_first":
        scene.post(100)
        return scene.message(Opcode.SEND, 10, mo=4), ErrorCode.DDP_UNTAGGED_INVALID_MO
    if kind == "mo_next":
        scene.post(100)
        first, second = scene.message(Opcode.SEND, 20, cut=10)
        gap = Segment(Opcode.SEND, b"x" * 10, True, msn=scene.msn - 1, mo=11).encode()
        del second
        return [first, gap], ErrorCode.DDP_UNTAGGED_INVALID_MO
    if kind == "no_buffer":
        return scene.message(Opcode.SEND, 10), ErrorCode.DDP_UNTAGGED_INVALID_MSN_NO_BUFFER
    if kind == "local_write":
        scene.post(100, region=scene.no_local)
        return scene.message(Opcode.SEND, 10), ErrorCode.RDMAP_LOCAL_CATASTROPHIC
    if kind == "lkey":
        scene.post(100)
        scene.receives[-1]["lkey"] ^= 1
        scene.qp.rq[-1].sg_list[0].lkey ^= 1
        return scene.message(Opcode.SEND, 10), ErrorCode.RDMAP_LOCAL_CATASTROPHIC
    if kind == "bounds":
        scene.post(100, offset=scene.buffer.length - 50)
        return scene.message(Opcode.SEND, 10), ErrorCode.RDMAP_LOCAL_CATASTROPHIC
    if kind == "invalidate_unknown":
        scene.post(100)
        return scene.message(Opcode.SEND_INVALIDATE, 10, inv_stag=scene.fmrs[0].stag ^ 1), \
            ErrorCode.RDMAP_OPERATION_CANNOT_INVALIDATE
    if kind == "invalidate_foreign":
        scene.post(100)
        return scene.message(Opcode.SEND_SE_INVALIDATE, 10, inv_stag=scene.foreign.stag), \
            ErrorCode.RDMAP_PROTECTION_CANNOT_INVALIDATE
    if kind == "invalidate_fixed":
        scene.post(100)
        return scene.message(Opcode.SEND_INVALIDATE, 0, inv_stag=scene.buffer.stag), \
            ErrorCode.RDMAP_PROTECTION_CANNOT_INVALIDATE
    if kind == "invalidated":
        # A Send with Invalidate, then a Write under the STag it invalidated.
        scene.post(100)
        stag = scene.fmrs[2].stag
        return (scene.message(Opcode.SEND_INVALIDATE, 5, inv_stag=stag)
                + [scene.write(rng.randrange(1, 100), scene.fmrs[2])]), \
            ErrorCode.DDP_TAGGED_INVALID_STAG
    if kind == "too_long":
        scene.post(100)
        return scene.message(Opcode.SEND, 101, cut=rng.choice([40, 101])), \
            ErrorCode.DDP_UNTAGGED_MESSAGE_TOO_LONG
    return _read_violation(kind, scene)


def _read_violation(kind, scene):
    """The segments of one Read or Atomic Response violation, and the model's code for it."""
    if kind == "response_unasked":
        sink = {"stag": scene.buffer.stag, "to": scene.buffer.iova, "size": 10}
        return scene.response(sink), ErrorCode.RDMAP_UNEXPECTED_OPCODE
    if kind == "response_to_atomic":
        return scene.response(dict(scene.atomic(), size=8)), ErrorCode.RDMAP_UNEXPECTED_OPCODE
    if kind == "atomic_msn":
        return [scene.atomic_response(scene.atomic(), msn=scene.msn_3 + 1)], \
            ErrorCode.DDP_UNTAGGED_INVALID_MSN_RANGE
    if kind == "atomic_request_id":
        atomic = scene.atomic()
        return [scene.atomic_response(atomic, request_id=atomic["request_id"] + 1)], \
            ErrorCode.RDMAP_UNEXPECTED_OPCODE
    if kind == "atomic_sink":
        fmr = scene.fmrs[2]
        atomic = scene.atomic(fmr)
        scene.post(0, sges=0)
        return scene.message(Opcode.SEND_INVALIDATE, 0, inv_stag=fmr.stag) + \
            [scene.atomic_response(atomic)], ErrorCode.RDMAP_LOCAL_CATASTROPHIC
    if kind == "response_sink":
        # The sink is invalidated (by a Send with Invalidate) before its Read Response comes.
        fmr = scene.fmrs[2]             # (traffic invalidates the others)
        sink = scene.read(100, fmr)
        scene.post(0, sges=0)
        return scene.message(Opcode.SEND_INVALIDATE, 0, inv_stag=fmr.stag) + \
            scene.response(sink), ErrorCode.DDP_TAGGED_INVALID_STAG
    sink = scene.read(200)
    if kind == "atomic_to_read":
        return [scene.atomic_response({"request_id": 1})], ErrorCode.RDMAP_UNEXPECTED_OPCODE
    if kind == "response_stag":
        return scene.response(dict(sink, stag=sink["stag"] ^ 0x100)), \
            ErrorCode.DDP_TAGGED_INVALID_STAG
    if kind == "response_to":
        return scene.response(sink, length=100, skip=1), ErrorCode.DDP_TAGGED_BASE_BOUNDS
    if kind == "response_long":
        return scene.response(sink, length=201, cut=100), ErrorCode.DDP_TAGGED_BASE_BOUNDS
    assert kind == "response_short"
    return scene.response(sink, length=199, cut=50), ErrorCode.RDMAP_CATASTROPHIC_STREAM


VIOLATIONS = ["msn", "mo_first", "mo_next", "no_buffer", "local_write", "lkey", "bounds",
              "invalidate_unknown", "invalidate_foreign", "invalidate_fixed", "invalidated",
              "too_long", "response_unasked", "response_stag", "response_to", "response_long",
              "response_short", "response_sink", "response_to_atomic", "atomic_to_read",
              "atomic_msn", "atomic_request_id", "atomic_sink"]


def _longest(n):
    """The longest message around a violation or an RTR case: shorter at one octet a beat,
    where each octet is a cycle and the checks are the same."""
    return 300 if n > 1 else 60


# Widths 1 and 8: at 64 these cases are width 8's (no markers, the same CRC choice), and
# the 64-octet datapath's own cases are test_traffic's and the blocks' tests'.
@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.parametrize("kind", VIOLATIONS)
def test_violation(n, kind):
    """Each queue 0 violation after good traffic: the model's Terminate and completions, and
    nothing placed after it (the Writes and Send that follow are dropped)."""
    rng = random.Random(VIOLATIONS.index(kind) * 3 + n)
    scene = Scene(rng, crc=True, markers=bool(n % 2))
    longest = _longest(n)
    ulpdus = traffic(scene, 3, longest=longest)
    bad, code = _violation(kind, scene)
    # After it, Writes and a Send (no receive posted: the queue must be empty for no_buffer).
    ulpdus += bad + [scene.write(rng.randrange(1, longest)) for _ in range(3)]
    ulpdus += scene.message(Opcode.SEND, 50)
    _, terminate, _ = simulate(n, scene, ulpdus, crc=True, markers=bool(n % 2), seed=n)
    assert terminate is not None and terminate.code == code



#: The gateware's Rtr of each of the model's (None: not peer-to-peer).
HW_RTR = {None: HwRtr.NONE, Rtr.WRITE: HwRtr.WRITE, Rtr.SEND: HwRtr.SEND, Rtr.READ: HwRtr.READ}

#: Each case of a peer-to-peer stream's first FPDU: the RTR awaited, and whether it matches.
RTR_CASES = {"write": (Rtr.WRITE, True), "send": (Rtr.SEND, True), "read": (Rtr.READ, True),
             "send_for_write": (Rtr.WRITE, False), "write_with_data": (Rtr.WRITE, False),
             "send_with_data": (Rtr.SEND, False), "send_msn_2": (Rtr.SEND, False),
             "read_sized": (Rtr.READ, False), "write_bad_version": (Rtr.WRITE, False)}


def _first_fpdu(case, scene):
    """The first ULPDU of ``case``."""
    def read(size):
        return Segment(Opcode.READ_REQUEST, msn=1, header=ReadRequest(
            scene.buffer.stag, scene.buffer.iova, size, 0x1234, 0)).encode()
    return {
        "write": lambda: Segment(Opcode.WRITE, b"").encode(),
        "send": lambda: Segment(Opcode.SEND, b"", msn=1).encode(),
        "read": lambda: read(0),
        "send_for_write": lambda: Segment(Opcode.SEND, b"", msn=1).encode(),
        "write_with_data": lambda: scene.write(scene.rng.randrange(1, 300)),
        "send_with_data": lambda: Segment(Opcode.SEND, b"x" * 10, msn=1).encode(),
        "send_msn_2": lambda: Segment(Opcode.SEND, b"", msn=2).encode(),
        "read_sized": lambda: read(5),
        # DDP version 0 in a tagged segment's control octet (the model cannot decode it)
        "write_bad_version": lambda: bytes([0x80 | 0x40, 0]) + bytes(12),
    }[case]()


# Widths 1 and 8: at 64 these cases are width 8's (no markers, the same CRC choice), and
# the 64-octet datapath's own cases are test_traffic's and the blocks' tests'.
@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.parametrize("case", list(RTR_CASES))
def test_rtr(n, case):
    """A peer-to-peer Responder's first FPDU: the RTR agreed on lets the stream start (a Send
    RTR uses MSN 1 and no receive, a Read RTR is passed on to be answered); anything else is
    the model's "No matching RTR" Terminate, with nothing placed or completed after it."""
    rtr, matches = RTR_CASES[case]
    rng = random.Random(list(RTR_CASES).index(case) * 3 + n)
    scene = Scene(rng, crc=bool(n % 2), markers=True, rtr=rtr)
    first = _first_fpdu(case, scene)
    if case == "send":
        scene.msn = 2
    ulpdus = [first]
    longest = _longest(n)
    for _ in range(3):
        ulpdus.append(scene.write(rng.randrange(1, longest)))
        length = rng.randrange(2 * longest // 3)
        scene.post(length + 10)
        ulpdus += scene.message(Opcode.SEND, length)
    wcs, terminate, started = simulate(n, scene, ulpdus, crc=bool(n % 2), markers=True,
                                       seed=n, rtr=HW_RTR[rtr], forwarded=int(case == "read"))
    if matches:
        assert terminate is None and started and len(wcs) == 3
    else:
        assert terminate.code == ErrorCode.MPA_NO_MATCHING_RTR and not started and not wcs


def interleave(rng, streams):
    """The ULPDUs of each connection (``streams``: conn -> list), their order kept, taken one
    to three at a time from a random connection."""
    left = {conn: list(ulpdus) for conn, ulpdus in streams.items() if ulpdus}
    out = []
    while left:
        conn = rng.choice(sorted(left))
        for _ in range(rng.randint(1, 3)):
            if left[conn]:
                out.append((conn, left[conn].pop(0)))
        if not left[conn]:
            del left[conn]
    return out


def simulate_connections(n, phases, *, conns, seed):
    """Run ``phases`` through a :class:`ConnectionsPlacer` and compare each connection with its
    own model engine. A phase maps connections to (scene, ULPDUs, RTR awaited or None; the
    model has had the first ``scene.delivered`` ULPDUs already); each of its connections is
    opened afresh (``i_open``; its outstanding Reads cleared, then pushed as the requester
    would have as it sent them), then their segments go in interleaved, and the phase ends
    when every output has been quiet a while. All scenes share one device and table. Returns
    the models' results and the connections whose stream started (the ``o_started`` events,
    in order)."""
    rng = random.Random(seed)
    scenes = [scene for phase in phases for scene, _, _ in phase.values()]
    before = {stag: bytes(octets) for scene in scenes for stag, octets in scene.memory.items()}
    host = scenes[0].host
    writes = [host.write(r) for scene in scenes for r in scene.regions]
    models = [{conn: scene.model(ulpdus[scene.delivered:])
               for conn, (scene, ulpdus, _) in phase.items()}
              for phase in phases]
    dut = ConnectionsPlacer(n, conns=conns, fifo_beats=8192 // n, stag_entries=64)
    got, offers = {}, {}
    outputs = [dut.o_place, dut.o_data, dut.o_complete, dut.o_read_done, dut.o_fault,
               dut.o_header, dut.o_payload]

    async def source(ctx):
        bus = AmaranthBus(ctx)
        await load_table(ctx, dut.i_write, writes)
        for k, phase in enumerate(phases):
            for conn, (scene, _, _) in phase.items():
                offers[conn] = list(scene.receives)
            await send(bus, StreamPort.amaranth(dut.i_open),
                       [{"conn": conn, "pd": scene.pd.handle, "rtr": HW_RTR[rtr].value}
                        for conn, (scene, _, rtr) in phase.items()])
            await send(bus, StreamPort.amaranth(dut.i_push),
                       [{**read, "conn": conn} for conn, (scene, _, _) in phase.items()
                        for read in scene.outstanding])
            order = interleave(rng, {conn: ulpdus for conn, (_, ulpdus, _) in phase.items()})
            beats = ({**beat._asdict(), "conn": conn} for conn, ulpdu in order
                     for beat in to_beats(len(ulpdu).to_bytes(2, "big") + ulpdu, n, err=False))
            await send(bus, StreamPort.amaranth(dut.i), beats,
                       rng=random.Random(seed + k), idle=IDLE)
            await until_quiet(ctx, outputs, 500)
        got["done"] = True

    receives = receive_answers(dut, offers, rng)

    run(dut, source, monitors=[receives, *placer_monitors(got, dut, n, seed)],
        name=f"ddp_contexts_w{n}")
    assert got.get("done")
    compare_connections(scenes, before, phases, models, got)
    return models, [e["conn"] for e in got["started"]]


def placer_monitors(got, placer, n, seed):
    """Collectors of the several-connection placer's outputs (``placer``'s, or a receive
    path's that has the same) into ``got``."""
    def monitor(key, port, offset, packets=False):
        return collector(got, key, port, data_bytes=n if packets else None,
                         rng=random.Random(seed + offset), stall=STALL)

    return [monitor("places", placer.o_place, 2), monitor("data", placer.o_data, 3, True),
            monitor("completions", placer.o_complete, 4),
            monitor("reads", placer.o_read_done, 8), monitor("faults", placer.o_fault, 5),
            monitor("headers", placer.o_header, 6),
            monitor("payloads", placer.o_payload, 7, True),
            monitor("started", placer.o_started, 9)]


def compare_connections(scenes, before, phases, models, got):
    """Memory as the models left it, and each connection's events, phase after phase, its
    model's (:func:`compare_events`); no event the models do not have."""
    compare_memory(scenes, before, got)
    # Each phase's events of a connection are those after the phase's earlier ones.
    seen = {key: {} for key in ("completions", "reads", "faults", "headers")}
    for phase, results in zip(phases, models):
        for conn, (scene, _, _) in phase.items():
            mine = {}
            for key, taken in seen.items():
                events = [e for e in got[key] if e["conn"] == conn]
                start = taken.get(conn, 0)
                mine[key] = events[start:start + _count(key, *results[conn])]
                taken[conn] = start + len(mine[key])
            compare_events(scene, {**mine, "errors": []}, *results[conn], 0)
    for key, taken in seen.items():
        assert sum(taken.values()) == len(got[key]), f"{key}: events the model has not"


def _count(key, wcs, terminate):
    """How many events of ``key`` the model's results ``wcs``, ``terminate`` stand for."""
    receives = (verbs.WcOpcode.RECV, verbs.WcOpcode.RECV_RDMA_WITH_IMM)
    return {"completions": sum(wc.opcode in receives for wc, _ in wcs),
            "reads": sum(wc.opcode not in receives for wc, _ in wcs),
            "faults": int(terminate is not None), "headers": 0}[key]


@pytest.mark.parametrize("n", [1, 8, 64])
def test_connections(n):
    """Five connections' traffic interleaved segment by segment through the several-connection
    placer, each against its own model engine: two fail (a queue 0 and a Read Response
    violation) and the others carry on untouched, one of them a peer-to-peer Responder whose
    first FPDU is the Send RTR it awaits (MSN 1); a fifth is a peer-to-peer Responder whose
    first FPDU is not its RTR (a mismatch picked at random from the single-stream cases: "No
    matching RTR"). Each stream but that one is reported started. Then a failed connection's
    slot is opened afresh for a new stream, which must start from MSN 1 with nothing of the
    old one."""
    rng = random.Random(40 + n)
    dev = verbs.Device("b")
    host = HostTable(rng, table=dev.mr_table, pds=0)

    def scene(rtr=None):
        return Scene(rng, crc=True, markers=False, rtr=rtr, dev=dev, host=host)

    count, longest = (3, 200) if n == 1 else (8, 1500)      # one octet a beat: shorter
    first = {conn: scene() for conn in (0, 5, 9)}
    first[15] = scene(Rtr.SEND)
    send_rtr = Segment(Opcode.SEND, b"", msn=1).encode()
    first[15].model([send_rtr])         # before its Reads are posted (the model sends them)
    first[15].delivered, first[15].msn = 1, 2
    # A peer-to-peer Responder whose first FPDU is not the RTR it awaits.
    case = rng.choice([case for case, (_, matches) in RTR_CASES.items() if not matches])
    first[3] = scene(RTR_CASES[case][0])
    streams = {conn: traffic(s, count, longest=longest) for conn, s in first.items()}
    streams[15].insert(0, send_rtr)
    streams[3].insert(0, _first_fpdu(case, first[3]))
    awaited = {15: Rtr.SEND, 3: RTR_CASES[case][0]}
    for conn, kind in ((5, rng.choice(VIOLATIONS[:12])), (9, rng.choice(VIOLATIONS[12:]))):
        bad, _ = _violation(kind, first[conn])
        streams[conn] += bad + [first[conn].write(rng.randrange(1, 300))]
    again = scene()
    phases = [{conn: (s, streams[conn], awaited.get(conn)) for conn, s in first.items()},
              {5: (again, traffic(again, count, longest=longest), None)}]
    models, started = simulate_connections(n, phases, conns=16, seed=n)
    terminates = {conn: t for conn, (_, t) in models[0].items()}
    assert {conn for conn, t in terminates.items() if t is not None} == {3, 5, 9}
    assert terminates[3].code == ErrorCode.MPA_NO_MATCHING_RTR
    # Every stream but the one whose RTR did not match may send once its first FPDU is in.
    assert sorted(started) == [0, 5, 5, 9, 15] and started[-1] == 5
    assert len(models[0][15][0]) == len(first[15].receives) + len(first[15].outstanding)
    assert models[1][5][1] is None and len(models[1][5][0]) == len(again.receives) + len(
        again.outstanding)


def simulate_path(n, conns, streams, *, crc, markers, seed, corrupt=None):
    """Run each connection's stream (``streams``: conn -> (scene, ULPDUs)) through a
    :class:`ConnectionsReceiver` as the TCP engine would hand it over: the startup frame, then
    the FPDUs (CRC and markers as given per connection) in chunks of random sizes, the
    connections' chunks interleaved. The host starts each connection, waits for its startup
    frame, opens its context, pushes its outstanding Reads and gives ``FPDUS``. ``corrupt``:
    (conn, k), the CRC of that connection's FPDU ``k`` spoiled (in the model's stream too): the
    deframer's error event is then that connection's end, in place of the model's Terminate.
    Each connection is compared with its own model engine; returns the models' results and the
    deframer's error events."""
    rng = random.Random(seed)
    scenes = [scene for scene, _ in streams.values()]
    before = {stag: bytes(octets) for scene in scenes for stag, octets in scene.memory.items()}
    writes = [scenes[0].host.write(r) for scene in scenes for r in scene.regions]
    octets, models = {}, {}
    for conn, (scene, ulpdus) in streams.items():
        framer = Framer(crc=crc[conn], markers=markers[conn])
        frames = [bytearray(framer.frame(u)) for u in ulpdus]
        if corrupt and corrupt[0] == conn:
            k = corrupt[1]
            frames[k][-1] ^= 0x20
            wcs, _ = scene.model(ulpdus[:k])
            spoiled = bytearray(scene.peer._framer.frame(ulpdus[k]))
            spoiled[-1] ^= 0x20
            scene.conn.receive(bytes(spoiled))
            more, terminate = scene.model([])
            models[conn] = (wcs + more, terminate)
        else:
            models[conn] = scene.model(ulpdus)
        octets[conn] = b"".join(frames)
    startup = {conn: MpaFrame(reply=True, markers=markers[conn], crc=crc[conn]).encode()
               for conn in streams}
    dut = ConnectionsReceiver(n, conns=conns, stag_entries=64, ring_bytes=8192)
    got, offers = {"startups": {}}, {conn: list(s.receives) for conn, (s, _) in streams.items()}
    state = {"fpdus": False}
    outputs = [dut.o_place, dut.o_data, dut.o_complete, dut.o_read_done, dut.o_fault,
               dut.o_header, dut.o_payload, dut.o_error]

    async def chunk(bus, conn, octets):
        await send(bus, StreamPort.amaranth(dut.i_header), [{"conn": conn, "length": len(octets)}])
        await send_packets(bus, StreamPort.amaranth(dut.i), [octets], n, rng=rng, idle=IDLE)

    async def tcp(ctx):
        """The TCP engine: each startup frame, then (after FPDUS) the FPDU chunks."""
        bus = AmaranthBus(ctx)
        await load_table(ctx, dut.i_write, writes)
        await send(bus, StreamPort.amaranth(dut.i_cmd),
                   [{"op": GatherOp.START.value, "conn": conn, "markers": 0, "crc": 0}
                    for conn in streams])
        for conn in streams:
            await chunk(bus, conn, startup[conn])
        while not state["fpdus"]:
            await ctx.tick()
        plans = {conn: tcp_chunks(rng, bytes(o)) for conn, o in octets.items()}
        while plans:
            conn = rng.choice(sorted(plans))
            await chunk(bus, conn, plans[conn].pop(0))
            if not plans[conn]:
                del plans[conn]
        await until_quiet(ctx, outputs, 2000)
        got["done"] = True

    async def host(ctx):
        """The host: each startup frame taken; then the contexts opened, the outstanding
        Reads pushed and FPDUS given."""
        bus = AmaranthBus(ctx)
        while len(got["startups"]) < len(streams):
            [header] = await recv(bus, StreamPort.amaranth(dut.o_startup_header), 1,
                                  timeout=1 << 30)
            [frame] = await recv_packets(bus, StreamPort.amaranth(dut.o_startup), 1, n)
            got["startups"][header["conn"]] = bytes(frame)
        await send(bus, StreamPort.amaranth(dut.i_open),
                   [{"conn": conn, "pd": scene.pd.handle, "rtr": 0}
                    for conn, (scene, _) in streams.items()])
        await send(bus, StreamPort.amaranth(dut.i_push),
                   [{**read, "conn": conn} for conn, (scene, _) in streams.items()
                    for read in scene.outstanding])
        await send(bus, StreamPort.amaranth(dut.i_cmd),
                   [{"op": GatherOp.FPDUS.value, "conn": conn, "markers": int(markers[conn]),
                     "crc": int(crc[conn])} for conn in streams])
        state["fpdus"] = True

    monitors = [receive_answers(dut, offers, rng), *placer_monitors(got, dut, n, seed),
                collector(got, "errors", dut.o_error)]
    run(dut, tcp, host, monitors=monitors, name=f"ddp_path_w{n}")
    assert got.get("done")
    assert got["startups"] == startup
    phases = [{conn: (scene, ulpdus, False) for conn, (scene, ulpdus) in streams.items()}]
    failed = {event["conn"] for event in got["errors"]}
    # A connection the deframer failed has the event instead of the placer's Terminate.
    placer_view = {c: (wcs, None if c in failed else t) for c, (wcs, t) in models.items()}
    compare_connections(scenes, before, phases, [placer_view], got)
    return models, got["errors"]


@pytest.mark.parametrize("n", [1, 8, 64])
def test_receive_path(n):
    """Three connections' TCP chunks through ConnectionsReceiver (gather, deframer, parser,
    placer, STag table, outstanding Reads), each with its own CRC and marker settings, against
    four model engines: two run their traffic to the end, one fails on a placement
    violation, one on a bad CRC (the deframer's event naming it, nothing placed from the bad
    FPDU on)."""
    rng = random.Random(60 + n)
    dev = verbs.Device("b")
    host = HostTable(rng, table=dev.mr_table, pds=0)
    crc = {2: True, 7: True, 11: False, 13: True}
    markers = {2: True, 7: False, 11: False, 13: True}
    scenes = {conn: Scene(rng, crc=crc[conn], markers=markers[conn], dev=dev, host=host)
              for conn in crc}
    count, longest = (2, 300) if n == 1 else (6, 1200)      # one octet a beat: shorter
    streams = {conn: [scene, traffic(scene, count, longest=longest)]
               for conn, scene in scenes.items()}
    bad, code = _violation(rng.choice(VIOLATIONS), scenes[7])
    streams[7][1] += bad + [scenes[7].write(50)]
    bad_fpdu = len(streams[13][1]) // 2
    models, errors = simulate_path(n, 16, {c: tuple(v) for c, v in streams.items()}, crc=crc,
                                   markers=markers, seed=n, corrupt=(13, bad_fpdu))
    assert [(e["conn"], ErrorKind(e["kind"])) for e in errors] == [(13, ErrorKind.CRC)]
    assert models[13][1].code == ErrorCode.MPA_CRC
    assert models[7][1] is not None and models[7][1].code == code
    assert all(models[c][1] is None for c in (2, 11))
