"""The RDMAP/DDP/MPA engine, model to model over the in-memory pair: every opcode, sizes, MPA
options, P2P RTR, SRQ, ORD/IRD, and each error path with its exact Terminate on the wire, the
completion statuses on both sides and no placement."""

import hashlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iwarp_model.engine import Connection, ConnState, EngineError, Rtr
from iwarp_model.mr import Access, make_stag, stag_index
from iwarp_model.transport.memory import MemoryPair
from iwarp_model.verbs import (
    SGE,
    WC,
    Device,
    DeviceAttr,
    QpState,
    RecvWR,
    SendFlags,
    SendWR,
    WcFlags,
    WcOpcode,
    WcStatus,
    WrOpcode,
)
from iwarp_model.wire import fpdu, mpa
from iwarp_model.wire.rdmap import AtomicRequest, Opcode, ReadRequest, Segment
from iwarp_model.wire.terminate import ErrorCode

ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
BASE = 0x7F00_0000_0000
GUARD = 4096
FILL = 0xEE
SIG = SendFlags.SIGNALED


class Host:
    """One side: a device, PD, CQ, QP and a registered arena between two guard regions."""

    def __init__(self, name, *, size=1 << 18, ird=16, ord=16, srq=False, attr=None):
        self.dev = Device(name, attr)
        self.pd = self.dev.alloc_pd()
        self.cq = self.dev.create_cq(1 << 14)
        self.srq = self.dev.create_srq(self.pd, 256) if srq else None
        self.arena = bytearray([FILL]) * (size + 2 * GUARD)
        self.mem = memoryview(self.arena)[GUARD:GUARD + size]
        self.mem[:] = bytes(size)
        self.mr = self.dev.reg_mr(self.pd, self.mem, ALL, iova=BASE)
        self.qp = self.dev.create_qp(self.pd, self.cq, self.cq, max_send_wr=512,
                                     max_recv_wr=512, max_inline_data=64, max_rd_atomic=ord,
                                     max_dest_rd_atomic=ird, srq=self.srq)
        self.qp.modify(QpState.INIT)  # as rdma_cm's rdma_create_qp leaves it
        self.conn = None

    def sge(self, offset, length, lkey=None):
        return SGE(BASE + offset, length, self.mr.lkey if lkey is None else lkey)

    def recv(self, wr_id, offset, length):
        wr = RecvWR(wr_id, [self.sge(offset, length)])
        (self.qp.post_recv if self.srq is None else self.srq.post_srq_recv)(wr)

    def poll(self) -> list[WC]:
        return self.cq.poll_cq(1 << 14)

    def guard_ok(self) -> bool:
        return (self.arena[:GUARD] == bytes([FILL]) * GUARD
                and self.arena[-GUARD:] == bytes([FILL]) * GUARD)


def connect(*, a=None, b=None, rng=None, host_a=None, host_b=None, **common):
    """Two hosts, connected: A the initiator, B the responder."""
    A = host_a or Host("a")
    B = host_b or Host("b")
    A.conn = Connection(A.qp, active=True, **common, **(a or {}))
    B.conn = Connection(B.qp, active=False, **common, **(b or {}))
    pair = MemoryPair(A.conn, B.conn, rng=rng)
    pair.start()
    return A, B, pair


def statuses(wcs):
    return {wc.wr_id: wc.status for wc in wcs}


def inject(A, B, ulpdu: bytes):
    """Deliver a crafted ULPDU to B as A's next FPDU."""
    B.conn.receive(A.conn._framer.frame(ulpdu))


def assert_terminated(A, B, pair, code: ErrorCode):
    """B sent the Terminate for ``code``, A decoded the same one from the wire, both QPs are in
    ERR and B's memory and guards are untouched."""
    pair.pump()
    assert B.conn.terminate_sent is not None, B.conn.reason
    assert B.conn.terminate_sent.code == code, (B.conn.terminate_sent, B.conn.reason)
    assert A.conn.terminate_received == B.conn.terminate_sent
    assert A.conn.state == B.conn.state == ConnState.TERMINATED
    assert A.qp.state == B.qp.state == QpState.ERR
    assert B.guard_ok() and A.guard_ok()


# -- connection set-up ------------------------------------------------------------------------

@pytest.mark.parametrize("revision", [1, 2])
@pytest.mark.parametrize("crc", [False, True])
@pytest.mark.parametrize("markers", [False, True])
def test_mpa_options_carry_every_kind_of_message(revision, crc, markers):
    A, B, pair = connect(revision=revision, a={"crc": crc, "private_data": b"hello"},
                         b={"markers": markers, "private_data": b"welcome"},
                         rng=random.Random(revision * 4 + crc * 2 + markers))
    assert A.conn.state == B.conn.state == ConnState.ESTABLISHED
    assert A.qp.state == B.qp.state == QpState.RTS
    assert A.conn.negotiated.crc == B.conn.negotiated.crc == crc
    assert A.conn.negotiated.revision == revision
    assert A.conn._framer.markers == markers and B.conn._deframer.markers == markers
    assert B.conn.peer_private_data == b"hello" and A.conn.peer_private_data == b"welcome"
    data = random.Random(7).randbytes(3000)
    A.mem[:3000] = data
    B.recv(1, 0, 4096)
    A.qp.post_send([SendWR(1, WrOpcode.SEND, [A.sge(0, 3000)], SIG),
                    SendWR(2, WrOpcode.RDMA_WRITE, [A.sge(0, 3000)], SIG,
                           remote_addr=BASE + 8192, rkey=B.mr.rkey),
                    SendWR(3, WrOpcode.RDMA_READ, [A.sge(16384, 3000)], SIG,
                           remote_addr=BASE + 8192, rkey=B.mr.rkey)])
    pair.pump()
    if revision == 1:
        assert A.conn.ord == 16  # no RFC 6581 exchange: the QP's own ORD
    assert statuses(A.poll()) == {1: WcStatus.SUCCESS, 2: WcStatus.SUCCESS, 3: WcStatus.SUCCESS}
    [wc] = B.poll()
    assert (wc.wr_id, wc.status, wc.byte_len, wc.opcode) == (1, WcStatus.SUCCESS, 3000,
                                                            WcOpcode.RECV)
    assert bytes(B.mem[:3000]) == bytes(B.mem[8192:11192]) == data
    assert bytes(A.mem[16384:19384]) == data


def test_ird_ord_exchange_like_siw():
    A, B, pair = connect(host_a=Host("a", ird=3, ord=16), host_b=Host("b", ird=2, ord=8))
    assert A.conn.request.enhanced == mpa.EnhancedData(ird=3, ord=16)
    assert B.conn.reply.enhanced == mpa.EnhancedData(ird=2, ord=3)
    assert (A.conn.ord, A.conn.ird, B.conn.ord, B.conn.ird) == (2, 3, 3, 2)


@pytest.mark.parametrize("rtr", list(Rtr))
def test_p2p_rtr_lets_the_responder_send_first(rtr):
    A, B, pair = connect(p2p=True, a={"rtr": list(Rtr)}, b={"rtr": [rtr]},
                         rng=random.Random(3))
    assert A.conn.rtr == B.conn.rtr == rtr
    assert A.conn.state == B.conn.state == ConnState.ESTABLISHED
    A.recv(5, 0, 64)
    B.mem[:4] = b"ping"
    B.qp.post_send(SendWR(9, WrOpcode.SEND, [B.sge(0, 4)], SIG))
    pair.pump()
    assert statuses(B.poll()) == {9: WcStatus.SUCCESS}
    [wc] = A.poll()
    assert (wc.wr_id, wc.byte_len, bytes(A.mem[:4])) == (5, 4, b"ping")
    assert not A.conn._outstanding  # the RTR Read got its zero-length response


def test_p2p_without_common_rtr_is_rejected_with_a_reason():
    A, B, pair = connect(p2p=True, a={"rtr": [Rtr.SEND]}, b={"rtr": [Rtr.READ]})
    assert A.conn.state == B.conn.state == ConnState.CLOSED
    assert A.conn.reject_reason == b"no matching RTR type"
    assert A.qp.state == QpState.ERR


def test_consumer_rejects_and_accepts():
    rejected = []
    A, B = Host("a"), Host("b")
    A.recv(1, 0, 16)
    A.conn = Connection(A.qp, active=True, private_data=b"let me in")
    B.conn = Connection(B.qp, active=False, auto_accept=False)
    A.conn.on_rejected = lambda conn, reason: rejected.append(reason)
    pair = MemoryPair(A.conn, B.conn)
    pair.start()
    assert B.conn.state == ConnState.MPA_REQUEST_RECEIVED
    assert B.conn.peer_private_data == b"let me in"
    B.conn.reject(b"busy")
    pair.pump()
    assert rejected == [b"busy"] and A.conn.state == ConnState.CLOSED
    assert statuses(A.poll()) == {1: WcStatus.WR_FLUSH_ERR}
    with pytest.raises(EngineError):
        B.conn.accept()

    A, B = Host("a"), Host("b")
    A.conn = Connection(A.qp, active=True)
    B.conn = Connection(B.qp, active=False, auto_accept=False)
    pair = MemoryPair(A.conn, B.conn)
    pair.start()
    B.conn.accept(b"ok")
    pair.pump()
    assert A.conn.state == ConnState.ESTABLISHED and A.conn.peer_private_data == b"ok"


def test_responder_waits_for_the_first_fpdu_without_p2p():
    A, B, pair = connect()
    A.recv(1, 0, 16)
    B.qp.post_send(SendWR(1, WrOpcode.SEND, [], SIG))
    pair.pump()
    assert A.poll() == [] and B.poll() == []  # RFC 5044 7.1.2: the initiator speaks first
    B.recv(2, 0, 16)
    A.qp.post_send(SendWR(2, WrOpcode.SEND, [], SIG))
    pair.pump()
    assert statuses(A.poll()) == {1: WcStatus.SUCCESS, 2: WcStatus.SUCCESS}
    assert statuses(B.poll()) == {1: WcStatus.SUCCESS, 2: WcStatus.SUCCESS}


# -- every opcode -----------------------------------------------------------------------------

@pytest.mark.parametrize("solicited", [False, True])
def test_send_and_solicited_events(solicited):
    A, B, pair = connect()
    B.recv(1, 0, 100)
    B.recv(2, 100, 100)
    B.cq.req_notify_cq(solicited_only=True)
    A.mem[:10] = b"0123456789"
    A.qp.post_send(SendWR(1, WrOpcode.SEND, [A.sge(0, 4)], SIG))
    pair.pump()
    assert B.cq.events == 0  # an unsolicited completion does not fire a solicited-only arm
    flags = SendFlags.SOLICITED if solicited else SendFlags(0)
    A.qp.post_send(SendWR(2, WrOpcode.SEND, [A.sge(4, 6)], SIG | flags))
    pair.pump()
    assert B.cq.events == int(solicited)
    wcs = B.poll()
    assert [(wc.wr_id, wc.byte_len, wc.opcode) for wc in wcs] == [(1, 4, WcOpcode.RECV),
                                                                  (2, 6, WcOpcode.RECV)]
    assert bytes(B.mem[:4]) == b"0123" and bytes(B.mem[100:106]) == b"456789"


@pytest.mark.parametrize("solicited", [False, True])
def test_send_with_invalidate(solicited):
    A, B, pair = connect()
    fmr = B.dev.alloc_mr(B.pd)
    target = bytearray(64)
    B.qp.post_send(SendWR(1, WrOpcode.REG_MR, mr=fmr, key=0x33, access=ALL, memory=target,
                          iova=0x9000))
    pair.pump()
    assert fmr.valid and fmr.rkey & 0xFF == 0x33
    B.recv(7, 0, 16)
    B.cq.req_notify_cq(solicited_only=True)
    flags = SIG | (SendFlags.SOLICITED if solicited else SendFlags(0))
    A.qp.post_send(SendWR(1, WrOpcode.SEND_WITH_INV, [A.sge(0, 8)], flags,
                          invalidate_rkey=fmr.rkey))
    pair.pump()
    [wc] = B.poll()
    assert wc.wc_flags == WcFlags.WITH_INV and wc.invalidated_rkey == fmr.rkey
    assert not fmr.valid and B.cq.events == int(solicited)
    # the invalidated STag is refused now: 1/1/0, nothing placed
    A.mem[:8] = b"12345678"
    A.qp.post_send(SendWR(2, WrOpcode.RDMA_WRITE, [A.sge(0, 8)], SIG, remote_addr=0x9000,
                          rkey=fmr.rkey))
    assert_terminated(A, B, pair, ErrorCode.DDP_TAGGED_INVALID_STAG)
    assert target == bytearray(64)


def test_write_with_immediate_and_immediate_data():
    A, B, pair = connect()
    for i in range(3):
        B.recv(i, 0, 0)
    A.mem[:5] = b"abcde"
    B.cq.req_notify_cq(solicited_only=True)
    A.qp.post_send([
        SendWR(1, WrOpcode.RDMA_WRITE_WITH_IMM, [A.sge(0, 5)], SIG, imm_data=0x1234,
               remote_addr=BASE + 40, rkey=B.mr.rkey),
        SendWR(2, WrOpcode.SEND_WITH_IMM, [], SIG, imm_data=(1 << 64) - 1),
    ])
    pair.pump()
    assert B.cq.events == 0
    A.qp.post_send(SendWR(3, WrOpcode.SEND_WITH_IMM, [], SIG | SendFlags.SOLICITED,
                          imm_data=7))
    pair.pump()
    assert B.cq.events == 1
    assert [wc.opcode for wc in A.poll()] == [WcOpcode.RDMA_WRITE, WcOpcode.SEND,
                                              WcOpcode.SEND]
    wcs = B.poll()
    assert [(wc.opcode, wc.imm_data, wc.wc_flags, wc.byte_len) for wc in wcs] == [
        (WcOpcode.RECV_RDMA_WITH_IMM, 0x1234, WcFlags.WITH_IMM, 0),
        (WcOpcode.RECV_RDMA_WITH_IMM, (1 << 64) - 1, WcFlags.WITH_IMM, 0),
        (WcOpcode.RECV_RDMA_WITH_IMM, 7, WcFlags.WITH_IMM, 0)]
    assert bytes(B.mem[40:45]) == b"abcde"


def _atomic(A, B, pair, wr):
    pair.pump()
    A.qp.post_send(wr)
    pair.pump()
    [wc] = A.poll()
    assert wc.status == WcStatus.SUCCESS
    return wc, int.from_bytes(A.mem[0:8], "little"), int.from_bytes(B.mem[64:72], "little")


def test_atomics():
    A, B, pair = connect()
    B.mem[64:72] = (100).to_bytes(8, "little")

    def wr(op, **kw):
        return SendWR(1, op, [A.sge(0, 8)], SIG, remote_addr=BASE + 64, rkey=B.mr.rkey, **kw)

    wc, old, new = _atomic(A, B, pair, wr(WrOpcode.ATOMIC_FETCH_AND_ADD, compare_add=5))
    assert (wc.opcode, wc.byte_len, old, new) == (WcOpcode.FETCH_ADD, 8, 100, 105)
    _, old, new = _atomic(A, B, pair, wr(WrOpcode.ATOMIC_FETCH_AND_ADD,
                                         compare_add=(1 << 64) - 105))
    assert (old, new) == (105, 0)  # wraps modulo 2**64
    _, old, new = _atomic(A, B, pair, wr(WrOpcode.ATOMIC_CMP_AND_SWP, compare_add=1, swap=9))
    assert (old, new) == (0, 0)  # no match, no swap
    wc, old, new = _atomic(A, B, pair, wr(WrOpcode.ATOMIC_CMP_AND_SWP, compare_add=0,
                                          swap=0xDEAD))
    assert (wc.opcode, old, new) == (WcOpcode.COMP_SWAP, 0, 0xDEAD)
    # masked CmpSwap: compare the low byte only, swap the high half only
    wc, old, new = _atomic(A, B, pair, wr(WrOpcode.MASKED_ATOMIC_CMP_AND_SWP,
                                          compare_add=0xFFAD, compare_add_mask=0xFF,
                                          swap=0x1111_2222_3333_4444,
                                          swap_mask=0xFFFF_FFFF_0000_0000))
    assert (wc.opcode, old, new) == (WcOpcode.MASKED_COMP_SWAP, 0xDEAD, 0x1111_2222_0000_DEAD)
    # masked FetchAdd: four 16-bit fields, carries stop at bits 15, 31, 47, 63
    B.mem[64:72] = (0xFFFF_0001_FFFF_0002).to_bytes(8, "little")
    wc, old, new = _atomic(A, B, pair, wr(WrOpcode.MASKED_ATOMIC_FETCH_AND_ADD,
                                          compare_add=0x0001_0001_0001_0001,
                                          compare_add_mask=0x8000_8000_8000_8000))
    assert (wc.opcode, old, new) == (WcOpcode.MASKED_FETCH_ADD, 0xFFFF_0001_FFFF_0002,
                                     0x0000_0002_0000_0003)


def test_fast_registration_and_local_invalidate():
    A, B, pair = connect()
    fmr = B.dev.alloc_mr(B.pd)
    target = bytearray(32)
    B.qp.post_send([SendWR(1, WrOpcode.REG_MR, send_flags=SIG, mr=fmr, key=0x10,
                           access=Access.LOCAL_WRITE | Access.REMOTE_WRITE, memory=target,
                           iova=0x5000)])
    pair.pump()
    A.mem[:4] = b"fast"
    A.qp.post_send(SendWR(1, WrOpcode.RDMA_WRITE, [A.sge(0, 4)], SIG, remote_addr=0x5008,
                          rkey=fmr.rkey))
    pair.pump()
    assert target[8:12] == b"fast"
    B.qp.post_send(SendWR(2, WrOpcode.LOCAL_INV, send_flags=SIG, invalidate_rkey=fmr.rkey))
    pair.pump()
    assert [(wc.opcode, wc.status) for wc in B.poll()] == [
        (WcOpcode.REG_MR, WcStatus.SUCCESS), (WcOpcode.LOCAL_INV, WcStatus.SUCCESS)]
    # re-register under a new key; the old STag stays dead
    B.qp.post_send(SendWR(3, WrOpcode.REG_MR, send_flags=SIG, mr=fmr, key=0x11,
                          access=ALL, memory=target, iova=0x5000))
    pair.pump()
    assert B.poll()[0].status == WcStatus.SUCCESS
    A.qp.post_send(SendWR(2, WrOpcode.RDMA_WRITE, [A.sge(0, 4)], SIG, remote_addr=0x5000,
                          rkey=make_stag(stag_index(fmr.rkey), 0x10)))
    assert_terminated(A, B, pair, ErrorCode.DDP_TAGGED_INVALID_STAG)
    assert target[:8] == bytes(8)


def test_failed_local_operation_puts_only_the_send_queue_in_error():
    A, B, pair = connect()
    B.recv(1, 0, 16)
    A.qp.post_send([SendWR(1, WrOpcode.LOCAL_INV, send_flags=SIG,
                           invalidate_rkey=A.mr.rkey),  # reg_mr regions cannot be invalidated
                    SendWR(2, WrOpcode.SEND, [], SIG)])
    pair.pump()
    assert statuses(A.poll()) == {1: WcStatus.LOC_PROT_ERR, 2: WcStatus.WR_FLUSH_ERR}
    assert A.qp.state == QpState.SQE and A.conn.state == ConnState.ESTABLISHED
    A.qp.modify(QpState.RTS)
    A.qp.post_send(SendWR(3, WrOpcode.SEND, [], SIG))
    pair.pump()
    assert statuses(A.poll()) == {3: WcStatus.SUCCESS}
    assert statuses(B.poll()) == {1: WcStatus.SUCCESS}


def test_inline_and_unsignaled():
    A, B, pair = connect()
    B.recv(1, 0, 64)
    A.mem[:6] = b"inline"
    A.qp.post_send(SendWR(1, WrOpcode.SEND, [A.sge(0, 6)], SendFlags.INLINE))
    A.mem[:6] = b"change"  # inline data was copied at posting time
    A.qp.post_send(SendWR(2, WrOpcode.RDMA_WRITE, [A.sge(0, 6)], SIG, remote_addr=BASE + 100,
                          rkey=B.mr.rkey))
    pair.pump()
    assert [wc.wr_id for wc in A.poll()] == [2]  # the unsignaled Send completes silently
    assert bytes(B.mem[:6]) == b"inline" and bytes(B.mem[100:106]) == b"change"


# -- sizes ------------------------------------------------------------------------------------

def _sizes(emss, markers):
    mul = fpdu.mulpdu(emss, markers=markers)
    around = {mul - 18, mul - 14}
    return sorted({0, 1, 2, 3, 4} | {n + d for n in around for d in (-1, 0, 1)}
                  | {2 * (mul - 18) + 1, 3 * (mul - 14), 70001})


@pytest.mark.parametrize("crc, markers", [(False, False), (True, True)])
def test_message_sizes_around_the_mulpdu(crc, markers):
    A, B, pair = connect(a={"crc": crc, "markers": markers},
                         b={"markers": markers}, rng=random.Random(11))
    rng = random.Random(5)
    for size in _sizes(1460, markers):
        data = rng.randbytes(size)
        A.mem[:size] = data
        B.mem[:] = bytes(len(B.mem))
        B.recv(size, 0, 80000)
        A.qp.post_send([SendWR(1, WrOpcode.SEND, [A.sge(0, size)], SIG),
                        SendWR(2, WrOpcode.RDMA_WRITE, [A.sge(0, size)], SIG,
                               remote_addr=BASE + 100000, rkey=B.mr.rkey),
                        SendWR(3, WrOpcode.RDMA_READ, [A.sge(100000, size)], SIG,
                               remote_addr=BASE + 100000, rkey=B.mr.rkey)])
        pair.pump()
        assert statuses(A.poll()) == dict.fromkeys((1, 2, 3), WcStatus.SUCCESS)
        [wc] = B.poll()
        assert wc.byte_len == size
        assert bytes(B.mem[:size]) == bytes(B.mem[100000:100000 + size]) == data
        assert bytes(A.mem[100000:100000 + size]) == data
        assert B.mem[size] == 0 and B.mem[100000 + size] == 0


def test_16_mib_write_and_read_hash_compared():
    size = 16 << 20
    A, B, pair = connect(host_a=Host("a", size=2 * size), host_b=Host("b", size=size))
    A.mem[:size] = random.Random(1).randbytes(size)
    A.qp.post_send([SendWR(1, WrOpcode.RDMA_WRITE, [A.sge(0, size)], SIG, remote_addr=BASE,
                           rkey=B.mr.rkey),
                    SendWR(2, WrOpcode.RDMA_READ, [A.sge(size, size)], SIG, remote_addr=BASE,
                           rkey=B.mr.rkey)])
    pair.pump()
    assert statuses(A.poll()) == {1: WcStatus.SUCCESS, 2: WcStatus.SUCCESS}
    digest = hashlib.sha256(A.mem[:size]).digest()
    assert hashlib.sha256(B.mem).digest() == digest
    assert hashlib.sha256(A.mem[size:]).digest() == digest


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(0, 9000), min_size=1, max_size=6), st.integers(0, 2**32))
def test_random_chunking_keeps_messages_intact(sizes, seed):
    A, B, pair = connect(a={"crc": bool(seed & 1), "markers": bool(seed & 2)},
                         b={"markers": bool(seed & 4)}, rng=random.Random(seed))
    rng = random.Random(seed)
    offset = 0
    for i, size in enumerate(sizes):
        A.mem[offset:offset + size] = rng.randbytes(size)
        B.recv(i, offset, size)
        A.qp.post_send(SendWR(i, WrOpcode.SEND, [A.sge(offset, size)], SIG))
        offset += size
    pair.pump()
    assert [wc.byte_len for wc in B.poll()] == sizes
    assert bytes(B.mem[:offset]) == bytes(A.mem[:offset])


def test_multiple_sges_gather_and_scatter():
    A, B, pair = connect()
    A.mem[:10] = b"0123456789"
    B.qp.post_recv(RecvWR(1, [B.sge(0, 3), B.sge(100, 2), B.sge(200, 10)]))
    A.qp.post_send(SendWR(1, WrOpcode.SEND, [A.sge(5, 5), A.sge(0, 5)], SIG))
    pair.pump()
    assert bytes(B.mem[:3]) + bytes(B.mem[100:102]) + bytes(B.mem[200:205]) == b"5678901234"


# -- SRQ, ORD and IRD -------------------------------------------------------------------------

def test_srq_shared_by_two_qps():
    B = Host("b", srq=True)
    qp2 = B.dev.create_qp(B.pd, B.cq, B.cq, srq=B.srq)
    A1 = Host("a1")
    A2 = Host("a2")
    for i in range(4):
        B.recv(i, 100 * i, 100)
    A1.conn = Connection(A1.qp, active=True)
    c1 = Connection(B.qp, active=False)
    A2.conn = Connection(A2.qp, active=True)
    c2 = Connection(qp2, active=False)
    p1, p2 = MemoryPair(A1.conn, c1), MemoryPair(A2.conn, c2)
    p1.start()
    p2.start()
    A1.mem[:2] = b"x1"
    A2.mem[:2] = b"x2"
    A1.qp.post_send(SendWR(1, WrOpcode.SEND, [A1.sge(0, 2)]))
    p1.pump()
    A2.qp.post_send(SendWR(1, WrOpcode.SEND, [A2.sge(0, 2)]))
    p2.pump()
    A1.qp.post_send(SendWR(1, WrOpcode.SEND, [A1.sge(0, 2)]))
    p1.pump()
    assert [(wc.wr_id, wc.qp_num) for wc in B.poll()] == [(0, B.qp.qp_num), (1, qp2.qp_num),
                                                          (2, B.qp.qp_num)]
    assert bytes(B.mem[:2]) + bytes(B.mem[100:102]) + bytes(B.mem[200:202]) == b"x1x2x1"
    assert len(B.srq) == 1
    c1.close()
    p1.pump()
    assert len(B.srq) == 1  # the SRQ's receives are not flushed with the QP


def test_ord_queues_reads_beyond_the_peers_ird():
    A, B, pair = connect(host_a=Host("a", ord=16), host_b=Host("b", ird=2))
    assert A.conn.ord == 2
    B.mem[:64] = bytes(range(64))
    A.qp.post_send([SendWR(i, WrOpcode.RDMA_READ, [A.sge(1000 + 8 * i, 8)], SIG,
                           remote_addr=BASE + 8 * i, rkey=B.mr.rkey) for i in range(8)]
                   + [SendWR(8, WrOpcode.ATOMIC_FETCH_AND_ADD, [A.sge(0, 8)], SIG,
                             remote_addr=BASE + 64, rkey=B.mr.rkey, compare_add=1)])
    seen = 0
    while data := A.conn.transmit(100):
        seen = max(seen, len(A.conn._outstanding))
        B.conn.receive(data)
        A.conn.receive(B.conn.transmit())
    assert seen == 2
    assert statuses(A.poll()) == dict.fromkeys(range(9), WcStatus.SUCCESS)
    assert bytes(A.mem[1000:1064]) == bytes(range(64))


def test_reads_interleave_with_the_responders_sends():
    A, B, pair = connect(p2p=True)
    size = 200000
    B.mem[:size] = random.Random(2).randbytes(size)
    A.qp.post_send(SendWR(1, WrOpcode.RDMA_READ, [A.sge(0, size)], SIG, remote_addr=BASE,
                          rkey=B.mr.rkey))
    pair.pump(max_turns=1)  # B got the request
    for i in range(3):
        A.recv(i, 210000 + 100 * i, 100)
    B.qp.post_send([SendWR(i, WrOpcode.SEND, [B.sge(0, 10)], SIG) for i in range(3)])
    order = []
    A.cq.on_event = lambda cq: order.append(len(cq))
    wire = B.conn.transmit(1 << 16)
    A.conn.receive(wire)
    assert len(A.poll()) == 3  # all three Sends went out among the first 64 KiB
    pair.pump()
    assert bytes(A.mem[:size]) == bytes(B.mem[:size])
    assert statuses(A.poll()) == {1: WcStatus.SUCCESS}


def test_exceeding_the_ird_is_terminated():
    # Revision 1 has no IRD/ORD exchange: A trusts its own ORD of 4, B allows one Read.
    A, B, pair = connect(revision=1, host_a=Host("a", ord=4), host_b=Host("b", ird=1))
    B.recv(50, 0, 8)
    A.qp.post_send([SendWR(i, WrOpcode.RDMA_READ, [A.sge(8 * i, 8)], SIG,
                           remote_addr=BASE + 8 * i, rkey=B.mr.rkey) for i in range(1, 4)])
    assert_terminated(A, B, pair, ErrorCode.DDP_UNTAGGED_INVALID_MSN_RANGE)
    assert B.conn.terminate_sent.ddp_header[10:14] == (2).to_bytes(4, "big")  # the 2nd Read
    assert statuses(A.poll()) == {1: WcStatus.WR_FLUSH_ERR, 2: WcStatus.REM_INV_REQ_ERR,
                                  3: WcStatus.WR_FLUSH_ERR}
    assert statuses(B.poll()) == {50: WcStatus.WR_FLUSH_ERR}


# -- error paths ------------------------------------------------------------------------------

def _write(A, B, *, rkey=None, to=BASE + 128, length=16, wr_id=1):
    A.mem[:length] = b"\xAB" * length
    A.qp.post_send(SendWR(wr_id, WrOpcode.RDMA_WRITE, [A.sge(0, length)], SIG, remote_addr=to,
                          rkey=B.mr.rkey if rkey is None else rkey))


def _untouched(B, start=0, end=None):
    return bytes(B.mem[start:end]) == bytes(len(B.mem[start:end]))


@pytest.mark.parametrize("case, code", [
    ("bad stag", ErrorCode.DDP_TAGGED_INVALID_STAG),
    ("bad key", ErrorCode.DDP_TAGGED_INVALID_STAG),
    ("out of bounds", ErrorCode.DDP_TAGGED_BASE_BOUNDS),
    ("to wrap", ErrorCode.DDP_TAGGED_TO_WRAP),
    ("read only", ErrorCode.RDMAP_ACCESS_RIGHTS),
    ("wrong pd", ErrorCode.DDP_TAGGED_STAG_NOT_ASSOCIATED),
])
def test_bad_writes(case, code):
    A, B, pair = connect()
    B.recv(9, 0, 16)
    other = bytearray(64)
    if case == "bad stag":
        _write(A, B, rkey=make_stag(77, 0))
    elif case == "bad key":
        _write(A, B, rkey=B.mr.rkey ^ 0x01)
    elif case == "out of bounds":
        _write(A, B, to=BASE + len(B.mem) - 8)
    elif case == "to wrap":
        _write(A, B, to=(1 << 64) - 8)
    elif case == "read only":
        ro = B.dev.reg_mr(B.pd, other, Access.REMOTE_READ, iova=0x1000)
        _write(A, B, rkey=ro.rkey, to=0x1000)
    else:
        foreign = B.dev.reg_mr(B.dev.alloc_pd(), other, ALL, iova=0x1000)
        _write(A, B, rkey=foreign.rkey, to=0x1000)
    A.qp.post_send(SendWR(2, WrOpcode.SEND, [], SIG))
    assert_terminated(A, B, pair, code)
    assert _untouched(B) and other == bytearray(64)
    term = B.conn.terminate_sent
    assert term.ddp_header[0] & 0x80 and term.ddp_segment_length == 14 + 16 and not term.rdma_header
    # both were handed to TCP before the Terminate came back: complete (RFC 5040 5.2)
    assert statuses(A.poll()) == {1: WcStatus.SUCCESS, 2: WcStatus.SUCCESS}
    assert statuses(B.poll()) == {9: WcStatus.WR_FLUSH_ERR}


@pytest.mark.parametrize("case, code", [
    ("no remote read", ErrorCode.RDMAP_ACCESS_RIGHTS),
    ("bad stag", ErrorCode.RDMAP_INVALID_STAG),
    ("out of bounds", ErrorCode.RDMAP_BASE_BOUNDS),
    ("wrong pd", ErrorCode.RDMAP_STAG_NOT_ASSOCIATED),
    ("to wrap", ErrorCode.RDMAP_TO_WRAP),
])
def test_bad_reads(case, code):
    A, B, pair = connect()
    rkey, to = B.mr.rkey, BASE
    if case == "no remote read":
        rkey = B.dev.reg_mr(B.pd, bytearray(64), Access.REMOTE_WRITE | Access.LOCAL_WRITE).rkey
        to = 0
    elif case == "bad stag":
        rkey = make_stag(99, 1)
    elif case == "out of bounds":
        to = BASE + len(B.mem) - 4
    elif case == "wrong pd":
        rkey = B.dev.reg_mr(B.dev.alloc_pd(), bytearray(64), ALL).rkey
        to = 0
    else:
        to = (1 << 64) - 8
    A.qp.post_send(SendWR(1, WrOpcode.RDMA_READ, [A.sge(0, 16)], SIG, remote_addr=to,
                          rkey=rkey))
    assert_terminated(A, B, pair, code)
    term = B.conn.terminate_sent
    request = ReadRequest.decode(term.rdma_header)  # RFC 5040 4.8: the Read header comes back
    assert (request.src_stag, request.src_to, request.size) == (rkey, to, 16)
    assert statuses(A.poll()) == {1: WcStatus.REM_ACCESS_ERR}
    assert _untouched(A)


@pytest.mark.parametrize("case, code", [
    ("no atomic rights", ErrorCode.RDMAP_ACCESS_RIGHTS),
    ("misaligned", ErrorCode.RDMAP_OPERATION_UNSPECIFIED),
])
def test_bad_atomics(case, code):
    A, B, pair = connect()
    B.mem[:16] = bytes(range(16))
    if case == "no atomic rights":
        rw = B.dev.reg_mr(B.pd, B.mem[:64], Access.LOCAL_WRITE | Access.REMOTE_WRITE, iova=0)
        A.qp.post_send(SendWR(1, WrOpcode.ATOMIC_FETCH_AND_ADD, [A.sge(0, 8)], SIG,
                              remote_addr=0, rkey=rw.rkey, compare_add=1))
        assert_terminated(A, B, pair, code)
        assert statuses(A.poll()) == {1: WcStatus.REM_ACCESS_ERR}
    else:
        request = AtomicRequest.fetch_add(1, B.mr.rkey, BASE + 4, 1)
        inject(A, B, Segment(Opcode.ATOMIC_REQUEST, msn=1, header=request).encode())
        assert_terminated(A, B, pair, code)
    assert bytes(B.mem[:16]) == bytes(range(16))


def test_send_without_receive_and_message_too_long():
    A, B, pair = connect()
    A.qp.post_send(SendWR(1, WrOpcode.SEND, [A.sge(0, 8)], SIG))
    assert_terminated(A, B, pair, ErrorCode.DDP_UNTAGGED_INVALID_MSN_NO_BUFFER)

    A, B, pair = connect()
    B.recv(1, 0, 10)
    B.recv(2, 100, 10)
    A.mem[:3000] = b"\x55" * 3000
    A.qp.post_send(SendWR(1, WrOpcode.SEND, [A.sge(0, 3000)], SIG))
    assert_terminated(A, B, pair, ErrorCode.DDP_UNTAGGED_MESSAGE_TOO_LONG)
    assert statuses(B.poll()) == {1: WcStatus.LOC_LEN_ERR, 2: WcStatus.WR_FLUSH_ERR}
    assert _untouched(B)
    assert B.conn.terminate_sent.ddp_header[10:14] == (1).to_bytes(4, "big")


@pytest.mark.parametrize("mutate, code", [
    (lambda s: s[:10] + (5).to_bytes(4, "big") + s[14:], ErrorCode.DDP_UNTAGGED_INVALID_MSN_RANGE),
    (lambda s: s[:6] + (5).to_bytes(4, "big") + s[10:], ErrorCode.DDP_UNTAGGED_INVALID_QN),
    (lambda s: s[:14] + (4).to_bytes(4, "big") + s[18:], ErrorCode.DDP_UNTAGGED_INVALID_MO),
    (lambda s: s[:1] + bytes([0x4C]) + s[2:], ErrorCode.RDMAP_UNEXPECTED_OPCODE),
    (lambda s: s[:1] + bytes([0x03]) + s[2:], ErrorCode.RDMAP_INVALID_VERSION),
    (lambda s: bytes([s[0] & 0xFC | 2]) + s[1:], ErrorCode.DDP_UNTAGGED_INVALID_VERSION),
    (lambda s: s[:1] + bytes([0x42]) + s[2:], ErrorCode.RDMAP_UNEXPECTED_OPCODE),  # T=0 Resp
], ids=["msn", "qn", "mo", "opcode", "rdmap-version", "ddp-version", "tagged-opcode-untagged"])
def test_bad_untagged_headers(mutate, code):
    A, B, pair = connect()
    B.recv(1, 0, 64)
    ulpdu = mutate(Segment(Opcode.SEND, b"payload!").encode())
    inject(A, B, ulpdu)
    assert_terminated(A, B, pair, code)
    term = B.conn.terminate_sent
    assert term.ddp_header == ulpdu[:18] and term.ddp_segment_length == len(ulpdu)
    assert statuses(B.poll()) == {1: WcStatus.WR_FLUSH_ERR}
    assert _untouched(B)


def test_bad_tagged_ddp_version():
    A, B, pair = connect()
    ulpdu = bytearray(Segment(Opcode.WRITE, b"12345678", stag=B.mr.rkey, to=BASE).encode())
    ulpdu[0] = ulpdu[0] & 0xFC | 0
    inject(A, B, bytes(ulpdu))
    assert_terminated(A, B, pair, ErrorCode.DDP_TAGGED_INVALID_VERSION)
    assert _untouched(B)


def test_bad_crc():
    A, B, pair = connect(a={"crc": True})
    B.recv(1, 0, 64)
    frame = bytearray(A.conn._framer.frame(Segment(Opcode.SEND, b"payload!").encode()))
    frame[-6] ^= 0x01
    B.conn.receive(bytes(frame))
    assert_terminated(A, B, pair, ErrorCode.MPA_CRC)
    assert B.conn.terminate_sent.ddp_header == b""  # LLP errors carry no copies
    assert _untouched(B)


def test_ulpdu_above_what_the_receiver_takes():
    """A ULPDU_Length above the receiver's ``max_rx_ulpdu`` ends the stream as soon as it is
    read, before the rest of the FPDU comes (RDMAP catastrophic, no copies)."""
    A, B, pair = connect(b={"max_rx_ulpdu": 200})
    B.recv(1, 0, 400)
    frame = A.conn._framer.frame(Segment(Opcode.SEND, b"x" * 300).encode())
    B.conn.receive(frame[:4])
    assert_terminated(A, B, pair, ErrorCode.RDMAP_CATASTROPHIC_STREAM)
    assert B.conn.terminate_sent.ddp_header == b""
    assert _untouched(B)


def test_bad_marker():
    A, B, pair = connect(b={"markers": True})
    B.recv(1, 0, 2000)
    frame = bytearray(A.conn._framer.frame(Segment(Opcode.SEND, b"x" * 1000).encode()))
    assert frame[:4] == bytes(4)  # the marker that opens the stream
    frame[515] ^= 0x10  # the FPDUPTR of the marker at stream offset 512
    B.conn.receive(bytes(frame))
    assert_terminated(A, B, pair, ErrorCode.MPA_MARKER)
    assert _untouched(B)


def test_rtr_mismatch():
    A, B = Host("a"), Host("b")
    A.conn = Connection(A.qp, active=True, p2p=True, rtr=[Rtr.WRITE])
    B.conn = Connection(B.qp, active=False, p2p=True, rtr=[Rtr.WRITE])
    B.recv(1, 0, 16)
    B.conn.start()
    A.conn.start()
    B.conn.receive(A.conn.transmit())
    A.conn.receive(B.conn.transmit())
    assert A.conn.transmit()  # the RTR (a zero-length Write), dropped here
    assert B.conn.state == ConnState.AWAIT_RTR
    framer = fpdu.Framer(crc=False, markers=False)
    B.conn.receive(framer.frame(Segment(Opcode.SEND, b"").encode()))
    assert B.conn.terminate_sent.code == ErrorCode.MPA_NO_MATCHING_RTR
    A.conn.receive(B.conn.transmit())
    assert A.conn.terminate_received.code == ErrorCode.MPA_NO_MATCHING_RTR
    assert A.qp.state == B.qp.state == QpState.ERR
    assert statuses(B.poll()) == {1: WcStatus.WR_FLUSH_ERR}


@pytest.mark.parametrize("case, code", [
    ("unknown", ErrorCode.RDMAP_OPERATION_CANNOT_INVALIDATE),
    ("not invalidatable", ErrorCode.RDMAP_PROTECTION_CANNOT_INVALIDATE),
    ("wrong pd", ErrorCode.RDMAP_PROTECTION_CANNOT_INVALIDATE),
])
def test_bad_send_with_invalidate(case, code):
    A, B, pair = connect()
    B.recv(1, 0, 16)
    if case == "unknown":
        stag = make_stag(55, 5)
    elif case == "not invalidatable":
        stag = B.mr.rkey
    else:
        fmr = B.dev.alloc_mr(B.dev.alloc_pd())
        B.dev.mr_table.fast_reg(fmr.stag, bytearray(8), ALL)
        stag = fmr.stag
    A.mem[:4] = b"data"
    A.qp.post_send(SendWR(1, WrOpcode.SEND_WITH_INV, [A.sge(0, 4)], SIG, invalidate_rkey=stag))
    assert_terminated(A, B, pair, code)
    assert statuses(B.poll()) == {1: WcStatus.WR_FLUSH_ERR}
    assert _untouched(B)


def test_local_protection_error_terminates_the_stream():
    A, B, pair = connect()
    B.recv(1, 0, 16)
    A.qp.post_send([SendWR(1, WrOpcode.SEND, [A.sge(0, 8, lkey=make_stag(40, 0))], SIG),
                    SendWR(2, WrOpcode.SEND, [], SIG)])
    pair.pump()
    assert statuses(A.poll()) == {1: WcStatus.LOC_PROT_ERR, 2: WcStatus.WR_FLUSH_ERR}
    assert A.conn.terminate_sent.code == ErrorCode.RDMAP_LOCAL_CATASTROPHIC
    assert B.conn.terminate_received == A.conn.terminate_sent
    assert statuses(B.poll()) == {1: WcStatus.WR_FLUSH_ERR}


def test_flush_on_error_and_posting_in_error():
    A, B, pair = connect()
    for i in range(5):
        A.recv(100 + i, 0, 8)
        B.recv(200 + i, 0, 8)
    terminated = []
    A.conn.on_terminated = lambda conn, term, local: terminated.append((term.code, local))
    A.qp.post_send([SendWR(1, WrOpcode.RDMA_WRITE, [A.sge(0, 8)], SIG, remote_addr=0,
                           rkey=make_stag(3, 3))]
                   + [SendWR(i, WrOpcode.SEND, [], SIG) for i in range(2, 6)])
    pair.pump(max_turns=1)
    assert_terminated(A, B, pair, ErrorCode.DDP_TAGGED_INVALID_STAG)
    assert terminated == [(ErrorCode.DDP_TAGGED_INVALID_STAG, False)]
    a = statuses(A.poll())
    assert a[1] == WcStatus.SUCCESS
    assert all(a[i] == WcStatus.WR_FLUSH_ERR for i in range(100, 105))
    assert all(a[i] in (WcStatus.SUCCESS, WcStatus.WR_FLUSH_ERR) for i in range(2, 6))
    b = B.poll()
    assert {wc.wr_id for wc in b} == set(range(200, 205))
    assert all(wc.status == WcStatus.WR_FLUSH_ERR for wc in b)
    A.qp.post_send(SendWR(9, WrOpcode.SEND, []))
    A.qp.post_recv(RecvWR(10))
    assert statuses(A.poll()) == {9: WcStatus.WR_FLUSH_ERR, 10: WcStatus.WR_FLUSH_ERR}


def test_orderly_close_flushes_both_sides():
    A, B, pair = connect()
    A.recv(1, 0, 8)
    B.recv(2, 0, 8)
    closed = []
    B.conn.on_closed = closed.append
    A.conn.close()
    pair.pump()
    assert closed == [B.conn] and A.conn.state == B.conn.state == ConnState.CLOSED
    assert statuses(A.poll()) == {1: WcStatus.WR_FLUSH_ERR}
    assert statuses(B.poll()) == {2: WcStatus.WR_FLUSH_ERR}


def test_api_misuse():
    A = Host("a")
    conn = Connection(A.qp, active=True)
    with pytest.raises(EngineError):
        Connection(A.qp, active=False)  # already attached
    with pytest.raises(EngineError):
        conn.receive(b"x")
    conn.start()
    with pytest.raises(EngineError):
        conn.start()
    with pytest.raises(ValueError):
        Connection(Host("b").qp, active=True, p2p=True, revision=1)
    with pytest.raises(ValueError):
        Connection(Host("b").qp, active=True, private_data=bytes(509))


def test_garbage_instead_of_an_mpa_request_closes():
    B = Host("b")
    B.recv(1, 0, 8)
    B.conn = Connection(B.qp, active=False)
    B.conn.start()
    B.conn.receive(b"GET / HTTP/1.1\r\n\r\n")
    assert B.conn.state == ConnState.CLOSED and B.conn.wants_close
    assert B.conn.transmit() == b""
    assert statuses(B.poll()) == {1: WcStatus.WR_FLUSH_ERR}


def test_throughput_of_64k_writes(record_property):
    attr = DeviceAttr()
    A, B, pair = connect(host_a=Host("a", size=1 << 17, attr=attr), host_b=Host("b"))
    import time

    count, size = 64, 64 << 10
    start = time.perf_counter()
    for i in range(count):
        A.qp.post_send(SendWR(i, WrOpcode.RDMA_WRITE, [A.sge(0, size)], remote_addr=BASE,
                              rkey=B.mr.rkey))
        if i % 16 == 15:
            pair.pump()
    pair.pump()
    rate = count * size / (time.perf_counter() - start) / 1e6
    record_property("write_64k_MBps", round(rate, 1))
    assert A.qp.state == QpState.RTS and rate > 1


def test_fence_waits_for_reads_before_it():
    A, B, pair = connect()
    B.mem[:8] = b"readme!!"
    B.recv(1, 100, 16)
    A.qp.post_send([SendWR(1, WrOpcode.RDMA_READ, [A.sge(0, 8)], SIG, remote_addr=BASE,
                           rkey=B.mr.rkey),
                    SendWR(2, WrOpcode.SEND, [A.sge(0, 8)], SIG | SendFlags.FENCE)])
    first = A.conn.transmit()
    assert A.conn.transmit() == b""  # the fenced Send waits for the Read Response
    B.conn.receive(first)
    A.conn.receive(B.conn.transmit())
    pair.pump()
    assert bytes(B.mem[100:108]) == b"readme!!"  # the Send carried what the Read fetched
    assert statuses(A.poll()) == {1: WcStatus.SUCCESS, 2: WcStatus.SUCCESS}
