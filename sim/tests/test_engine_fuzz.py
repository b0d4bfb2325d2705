"""Fuzzing the receive path: over 100 000 mutated MPA frames and FPDUs. Each is processed, or
answered with a Terminate or a close; no exception escapes; nothing outside the registered
region is ever written; and a healthy connection in the same process keeps working."""

import random

from iwarp_model.engine import Connection, ConnState
from iwarp_model.mr import Access
from iwarp_model.transport.memory import MemoryPair
from iwarp_model.verbs import SGE, Device, QpState, RecvWR, SendFlags, SendWR, WcStatus, WrOpcode
from iwarp_model.wire import fpdu, mpa
from iwarp_model.wire.rdmap import (
    AtomicRequest,
    AtomicResponse,
    ImmediateData,
    Opcode,
    ReadRequest,
    Segment,
)
from iwarp_model.wire.terminate import ErrorCode, Terminate

ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
BASE = 0x10000
SIZE = 4096
GUARD = 1024
FILL = 0xA5
ITERATIONS = 100_000


class Target:
    """A device whose registered region sits between two guard regions; its QPs share an SRQ
    of receives inside the region."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.dev = Device("fuzz")
        self.pd = self.dev.alloc_pd()
        self.cq = self.dev.create_cq(1 << 16)
        self.srq = self.dev.create_srq(self.pd, 64)
        self.arena = bytearray([FILL]) * (SIZE + 2 * GUARD)
        self.mr = self.dev.reg_mr(self.pd, memoryview(self.arena)[GUARD:GUARD + SIZE], ALL,
                                  iova=BASE)
        self.fmr = self.dev.alloc_mr(self.pd)
        self.dev.mr_table.fast_reg(self.fmr.stag, memoryview(self.arena)[GUARD:GUARD + 64],
                                   ALL, iova=BASE)
        self.guard = bytes([FILL]) * GUARD
        self.conn = None
        self.connections = 0

    def guard_ok(self) -> bool:
        return self.arena[:GUARD] == self.guard and self.arena[-GUARD:] == self.guard

    def refill(self):
        while len(self.srq) < 32:
            offset = self.rng.randrange(0, SIZE - 256)
            self.srq.post_srq_recv(RecvWR(0, [SGE(BASE + offset, self.rng.randrange(0, 256),
                                                  self.mr.lkey)]))
        self.cq.poll_cq(1 << 16)

    def fresh(self, *, crc: bool, markers: bool) -> Connection:
        """An established responder whose peer is played by the fuzzer."""
        if self.conn is not None:
            self.dev.destroy_qp(self.conn.qp)
        qp = self.dev.create_qp(self.pd, self.cq, self.cq, srq=self.srq, max_dest_rd_atomic=4)
        self.conn = Connection(qp, active=False)
        self.conn.start()
        request = mpa.MpaFrame(reply=False, crc=crc, markers=markers,
                               enhanced=mpa.EnhancedData(ird=4, ord=4))
        self.conn.receive(request.encode())
        self.conn.transmit()
        self.framer = fpdu.Framer(crc=crc, markers=markers)
        self.connections += 1
        if self.fmr.valid is False:
            self.dev.mr_table.fast_reg(self.fmr.stag, memoryview(self.arena)[GUARD:GUARD + 64],
                                       ALL, iova=BASE)
        return self.conn


def valid_ulpdus(target: Target) -> list[bytes]:
    stag = target.mr.rkey
    return [
        Segment(Opcode.SEND, b"hello").encode(),
        Segment(Opcode.SEND_SE, b"x" * 100, last=False).encode(),
        Segment(Opcode.SEND_INVALIDATE, b"inv", inv_stag=target.fmr.rkey).encode(),
        Segment(Opcode.WRITE, b"w" * 64, stag=stag, to=BASE + 128).encode(),
        Segment(Opcode.READ_REQUEST, header=ReadRequest(0x1234, 0, 64, stag, BASE)).encode(),
        Segment(Opcode.ATOMIC_REQUEST,
                header=AtomicRequest.fetch_add(1, stag, BASE + 8, 3)).encode(),
        Segment(Opcode.ATOMIC_REQUEST,
                header=AtomicRequest.cmp_swap(2, stag, BASE + 16, 0, 9, 0xFF, 0xF0)).encode(),
        Segment(Opcode.IMMEDIATE_DATA_SE, header=ImmediateData(bytes(8))).encode(),
        Segment(Opcode.TERMINATE,
                header=Terminate.for_error(ErrorCode.RDMAP_INVALID_STAG)).encode(),
        Segment(Opcode.READ_RESPONSE, b"r" * 8, stag=stag, to=BASE).encode(),
        Segment(Opcode.ATOMIC_RESPONSE, header=AtomicResponse(1, 5)).encode(),
    ]


def mutate(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    kind = rng.randrange(6)
    if kind == 0 or not data:  # bit flips
        for _ in range(rng.randint(1, 4)):
            if data:
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == 1:  # truncation
        del data[rng.randrange(len(data)):]
    elif kind == 2:  # a header field overwritten with random bytes
        start = rng.randrange(min(len(data), 40))
        width = rng.choice((1, 2, 4, 8))
        data[start:start + width] = rng.randbytes(width)
    elif kind == 3:  # random bytes appended
        data += rng.randbytes(rng.randint(1, 64))
    elif kind == 4:  # an interesting value in a 32-bit field
        start = rng.randrange(0, max(1, min(len(data) - 4, 40)))
        data[start:start + 4] = rng.choice((0, 1, 2, 0xFFFFFFFF, 0x80000000)).to_bytes(4, "big")
    else:  # random bytes
        data = bytearray(rng.randbytes(rng.randint(0, 80)))
    return bytes(data)


def deliver(rng: random.Random, conn: Connection, data: bytes) -> None:
    offset = 0
    while offset < len(data):
        step = rng.randint(1, len(data) - offset)
        conn.receive(data[offset:offset + step])
        offset += step


def mpa_outcome(conn: Connection, outcomes: dict) -> None:
    """A mutated MPA frame either closes the connection or still makes a valid one."""
    if conn.state in (ConnState.CLOSED, ConnState.TERMINATED):
        assert conn.wants_close
        outcomes["mpa-close"] += 1
    elif conn.state in (ConnState.ESTABLISHED, ConnState.AWAIT_RTR):
        outcomes["mpa-established"] += 1
    else:
        assert conn.state in (ConnState.MPA_AWAIT_REQUEST, ConnState.MPA_REQUEST_SENT)


def healthy_pair():
    sides = []
    for name in ("ha", "hb"):
        dev = Device(name)
        pd = dev.alloc_pd()
        cq = dev.create_cq(1 << 12)
        qp = dev.create_qp(pd, cq, cq)
        mem = bytearray(1 << 12)
        mr = dev.reg_mr(pd, mem, ALL)
        sides.append((qp, cq, mem, mr))
    a, b = Connection(sides[0][0], active=True, crc=True), Connection(sides[1][0], active=False)
    pair = MemoryPair(a, b, rng=random.Random(9))
    pair.start()
    return pair, sides


def check_healthy(pair, sides, round_: int) -> None:
    (qa, cqa, ma, mra), (qb, cqb, mb, mrb) = sides
    payload = round_.to_bytes(8, "big") * 16
    ma[:128] = payload
    qb.post_recv(RecvWR(round_, [SGE(0, 128, mrb.lkey)]))
    qa.post_send([SendWR(1, WrOpcode.SEND, [SGE(0, 128, mra.lkey)], SendFlags.SIGNALED),
                  SendWR(2, WrOpcode.RDMA_WRITE, [SGE(0, 128, mra.lkey)], SendFlags.SIGNALED,
                         remote_addr=1024, rkey=mrb.rkey)])
    pair.pump()
    assert [wc.status for wc in cqa.poll_cq(8)] == [WcStatus.SUCCESS] * 2
    [wc] = cqb.poll_cq(8)
    assert wc.status == WcStatus.SUCCESS and wc.wr_id == round_
    assert mb[:128] == payload and mb[1024:1152] == payload


def test_fuzz_receive_path():
    rng = random.Random(20240601)
    target = Target(rng)
    pair, sides = healthy_pair()
    bases = valid_ulpdus(target)
    request = mpa.MpaFrame(reply=False, crc=True, enhanced=mpa.EnhancedData(4, 4),
                           private_data=b"pd").encode()
    reply = mpa.MpaFrame(reply=True, markers=True, enhanced=mpa.EnhancedData(4, 4, True, False,
                                                                            True)).encode()
    outcomes = {"terminate": 0, "processed": 0, "incomplete": 0, "mpa-close": 0,
                "mpa-established": 0}
    conn = None
    for i in range(ITERATIONS):
        kind = rng.random()
        if kind < 0.15:  # a mutated MPA Request to a fresh responder
            qp = target.dev.create_qp(target.pd, target.cq, target.cq, srq=target.srq)
            mpa_conn = Connection(qp, active=False, p2p=rng.random() < 0.5)
            mpa_conn.start()
            deliver(rng, mpa_conn, mutate(rng, request) + rng.randbytes(rng.randrange(3)))
            mpa_conn.transmit()
            mpa_outcome(mpa_conn, outcomes)
            target.dev.destroy_qp(qp)
        elif kind < 0.25:  # a mutated MPA Reply to a fresh initiator
            qp = target.dev.create_qp(target.pd, target.cq, target.cq, srq=target.srq)
            mpa_conn = Connection(qp, active=True, p2p=rng.random() < 0.5)
            mpa_conn.start()
            mpa_conn.transmit()
            deliver(rng, mpa_conn, mutate(rng, reply))
            mpa_conn.transmit()
            mpa_outcome(mpa_conn, outcomes)
            target.dev.destroy_qp(qp)
        else:  # mutated FPDUs to an established responder
            if conn is None or conn.state != ConnState.ESTABLISHED:
                conn = target.fresh(crc=rng.random() < 0.5, markers=rng.random() < 0.3)
            target.refill()
            base = rng.choice(bases)
            if rng.random() < 0.7:
                data = target.framer.frame(mutate(rng, base))
            else:
                data = mutate(rng, target.framer.frame(base))
            deliver(rng, conn, data)
            out = conn.transmit()
            if conn.terminate_sent is not None:
                assert out and conn.qp.state == QpState.ERR and conn.wants_close
                outcomes["terminate"] += 1
            elif conn.rx_pending:
                outcomes["incomplete"] += 1  # waits for the rest of an FPDU: start afresh
                conn = None
            else:
                outcomes["processed"] += 1
        assert target.guard_ok(), f"iteration {i} wrote outside the registered region"
        if i % 5000 == 0:
            check_healthy(pair, sides, i)
    check_healthy(pair, sides, ITERATIONS)
    assert outcomes["terminate"] > 10_000 and outcomes["processed"] > 1000, outcomes
    assert outcomes["mpa-close"] > 1000 and outcomes["mpa-established"] > 100, outcomes
    assert target.connections > 1000
