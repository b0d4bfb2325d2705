"""The verbs API: rdma-core's constants, device limits, work request validation, the QP state
machine, CQs (polling, notification, asyncio wait, overrun) and SRQs."""

import asyncio

import pytest

from iwarp_model import verbs
from iwarp_model.mr import Access
from iwarp_model.verbs import (
    SGE,
    WC,
    Device,
    DeviceAttr,
    InvalidWorkRequest,
    QpState,
    QpStateError,
    QueueFullError,
    RecvWR,
    ResourceLimitError,
    SendFlags,
    SendWR,
    UnsupportedOperation,
    VerbsError,
    WcOpcode,
    WcStatus,
    WrOpcode,
)


def test_rdma_core_values():
    assert [verbs.IBV_WR_RDMA_WRITE, verbs.IBV_WR_RDMA_WRITE_WITH_IMM, verbs.IBV_WR_SEND,
            verbs.IBV_WR_SEND_WITH_IMM, verbs.IBV_WR_RDMA_READ, verbs.IBV_WR_ATOMIC_CMP_AND_SWP,
            verbs.IBV_WR_ATOMIC_FETCH_AND_ADD, verbs.IBV_WR_LOCAL_INV, verbs.IBV_WR_BIND_MW,
            verbs.IBV_WR_SEND_WITH_INV] == list(range(10))
    assert min(verbs.IBV_WR_MASKED_ATOMIC_CMP_AND_SWP, verbs.IBV_WR_MASKED_ATOMIC_FETCH_AND_ADD,
               verbs.IBV_WR_REG_MR) >= 0x40
    assert (verbs.IBV_WC_SUCCESS, verbs.IBV_WC_WR_FLUSH_ERR, verbs.IBV_WC_REM_ACCESS_ERR,
            verbs.IBV_WC_GENERAL_ERR) == (0, 5, 10, 21)
    assert (verbs.IBV_WC_SEND, verbs.IBV_WC_RDMA_WRITE, verbs.IBV_WC_RDMA_READ,
            verbs.IBV_WC_COMP_SWAP, verbs.IBV_WC_FETCH_ADD, verbs.IBV_WC_BIND_MW,
            verbs.IBV_WC_LOCAL_INV, verbs.IBV_WC_RECV,
            verbs.IBV_WC_RECV_RDMA_WITH_IMM) == (0, 1, 2, 3, 4, 5, 6, 128, 129)
    assert (verbs.IBV_SEND_FENCE, verbs.IBV_SEND_SIGNALED, verbs.IBV_SEND_SOLICITED,
            verbs.IBV_SEND_INLINE) == (1, 2, 4, 8)
    assert (verbs.IBV_ACCESS_LOCAL_WRITE, verbs.IBV_ACCESS_REMOTE_WRITE,
            verbs.IBV_ACCESS_REMOTE_READ, verbs.IBV_ACCESS_REMOTE_ATOMIC) == (1, 2, 4, 8)
    assert (verbs.IBV_QPS_RESET, verbs.IBV_QPS_RTS, verbs.IBV_QPS_SQE,
            verbs.IBV_QPS_ERR) == (0, 3, 5, 6)
    assert (verbs.IBV_WC_WITH_IMM, verbs.IBV_WC_WITH_INV) == (2, 8)


@pytest.fixture
def dev():
    return Device("t", DeviceAttr(max_qp=2, max_cq=3, max_mr=3, max_pd=2, max_srq=1))


@pytest.fixture
def rts(dev):
    pd = dev.alloc_pd()
    cq = dev.create_cq(4)
    qp = dev.create_qp(pd, cq, cq, max_send_wr=2, max_recv_wr=2, max_send_sge=2,
                       max_inline_data=4)
    mr = dev.reg_mr(pd, bytearray(64), Access.LOCAL_WRITE)
    for state in (QpState.INIT, QpState.RTR, QpState.RTS):
        qp.modify(state)
    return qp, mr, cq


def test_limits(dev):
    pd = dev.alloc_pd()
    dev.alloc_pd()
    with pytest.raises(ResourceLimitError):
        dev.alloc_pd()
    cq = dev.create_cq(1)
    with pytest.raises(ResourceLimitError):
        dev.create_cq(1 << 20)
    for _ in range(3):
        mr = dev.reg_mr(pd, bytearray(8), Access(0))
    with pytest.raises(ResourceLimitError):
        dev.alloc_mr(pd)
    dev.dereg_mr(mr)
    dev.alloc_mr(pd)
    fresh = Device()
    with pytest.raises(VerbsError, match="LOCAL_WRITE"):
        fresh.reg_mr(fresh.alloc_pd(), bytearray(8), Access.REMOTE_WRITE)
    with pytest.raises(ResourceLimitError, match="max_send_sge"):
        dev.create_qp(pd, cq, cq, max_send_sge=99)
    dev.create_qp(pd, cq, cq)
    qp = dev.create_qp(pd, cq, cq)
    with pytest.raises(ResourceLimitError):
        dev.create_qp(pd, cq, cq)
    dev.destroy_qp(qp)
    dev.create_qp(pd, cq, cq)
    with pytest.raises(VerbsError):
        dev.create_qp(Device().alloc_pd(), cq, cq)


def test_state_machine(dev):
    pd = dev.alloc_pd()
    cq = dev.create_cq(8)
    qp = dev.create_qp(pd, cq, cq)
    with pytest.raises(QpStateError):
        qp.modify(QpState.RTS)
    with pytest.raises(QpStateError):
        qp.post_recv(RecvWR(1))
    qp.modify(QpState.INIT)
    qp.post_recv(RecvWR(1))
    with pytest.raises(QpStateError, match="needs RTS"):
        qp.post_send(SendWR(1))
    qp.modify(QpState.ERR)
    assert [(wc.wr_id, wc.status) for wc in cq.poll_cq(8)] == [(1, WcStatus.WR_FLUSH_ERR)]
    with pytest.raises(QpStateError):
        qp.modify(QpState.RTS)
    qp.modify(QpState.RESET)
    assert qp.state == QpState.RESET and qp.error is None


@pytest.mark.parametrize("wr, error, match", [
    (SendWR(1, 99), InvalidWorkRequest, "unknown opcode"),
    (SendWR(1, WrOpcode.BIND_MW), UnsupportedOperation, "memory windows"),
    (SendWR(1, WrOpcode.SEND, [SGE(0, 1, 0)] * 3), InvalidWorkRequest, "at most 2"),
    (SendWR(1, WrOpcode.RDMA_READ, [SGE(0, 1, 0)] * 2), InvalidWorkRequest, "one sink"),
    (SendWR(1, WrOpcode.ATOMIC_FETCH_AND_ADD, [SGE(0, 4, 0)]), InvalidWorkRequest, "8-byte"),
    (SendWR(1, WrOpcode.ATOMIC_CMP_AND_SWP, [SGE(0, 8, 0)], remote_addr=4),
     InvalidWorkRequest, "aligned"),
    (SendWR(1, WrOpcode.SEND_WITH_IMM, [SGE(0, 8, 0)]), InvalidWorkRequest, "Immediate"),
    (SendWR(1, WrOpcode.SEND, [SGE(0, 8, 0)], SendFlags.INLINE), InvalidWorkRequest,
     "inline bytes"),
    (SendWR(1, WrOpcode.RDMA_WRITE, rkey=1 << 32), InvalidWorkRequest, "rkey"),
    (SendWR(1, WrOpcode.RDMA_WRITE, send_flags=SendFlags.SOLICITED), InvalidWorkRequest,
     "SOLICITED"),
    (SendWR(1, WrOpcode.REG_MR), InvalidWorkRequest, "alloc_mr"),
    (SendWR(1, WrOpcode.LOCAL_INV, [SGE(0, 1, 0)]), InvalidWorkRequest, "no SGEs"),
    ("not a wr", InvalidWorkRequest, "not a SendWR"),
])
def test_post_send_checks(rts, wr, error, match):
    qp, _mr, _cq = rts
    with pytest.raises(error, match=match):
        qp.post_send(wr)
    assert not qp.sq


def test_inline_bad_lkey_and_queue_full(rts):
    qp, mr, cq = rts
    with pytest.raises(InvalidWorkRequest, match="no region"):
        qp.post_send(SendWR(1, WrOpcode.SEND, [SGE(0, 2, mr.lkey ^ 1)], SendFlags.INLINE))
    qp.post_send([SendWR(1), SendWR(2)])
    with pytest.raises(QueueFullError):
        qp.post_send(SendWR(3))
    qp.post_recv([RecvWR(1), RecvWR(2)])
    with pytest.raises(QueueFullError):
        qp.post_recv(RecvWR(3))
    with pytest.raises(InvalidWorkRequest):
        qp.post_recv(RecvWR(4, [SGE(0, 1, 0)] * 9))


def test_reg_mr_checks(dev):
    pd, other = dev.alloc_pd(), dev.alloc_pd()
    cq = dev.create_cq(4)
    qp = dev.create_qp(pd, cq, cq)
    qp.modify(QpState.INIT)
    qp.modify(QpState.RTS)
    foreign = dev.alloc_mr(other)
    mine = dev.alloc_mr(pd)
    with pytest.raises(InvalidWorkRequest, match="another PD"):
        qp.post_send(SendWR(1, WrOpcode.REG_MR, mr=foreign, memory=bytearray(8)))
    with pytest.raises(InvalidWorkRequest, match="bytearray"):
        qp.post_send(SendWR(1, WrOpcode.REG_MR, mr=mine, memory=bytes(8)))
    with pytest.raises(InvalidWorkRequest, match="local write"):
        qp.post_send(SendWR(1, WrOpcode.REG_MR, mr=mine, memory=bytearray(8),
                            access=Access.REMOTE_WRITE))


def test_cq_poll_notify_and_overrun(dev):
    cq = dev.create_cq(2)
    fired = []
    cq.on_event = fired.append
    cq.req_notify_cq(solicited_only=True)
    cq.push(WC(1, WcStatus.SUCCESS, WcOpcode.RECV, 1))
    assert fired == []
    cq.push(WC(2, WcStatus.SUCCESS, WcOpcode.RECV, 1), solicited=True)
    assert fired == [cq] and cq.events == 1
    cq.push(WC(3, WcStatus.SUCCESS, WcOpcode.RECV, 1))
    assert cq.overflows == 1 and len(cq) == 2
    assert [wc.wr_id for wc in cq.poll_cq(1)] + [wc.wr_id for wc in cq.poll_cq(5)] == [1, 2]
    assert cq.poll_cq() == []
    cq.req_notify_cq(solicited_only=True)
    cq.push(WC(4, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, 1))  # errors always notify
    assert cq.events == 2
    with pytest.raises(ValueError):
        cq.poll_cq(-1)


def test_cq_asyncio_wait(dev):
    cq = dev.create_cq(4)

    async def main():
        waiter = asyncio.ensure_future(cq.wait())
        await asyncio.sleep(0)
        assert not waiter.done()
        asyncio.get_running_loop().call_soon(
            cq.push, WC(1, WcStatus.SUCCESS, WcOpcode.SEND, 1))
        await asyncio.wait_for(waiter, 1)
        await cq.wait()  # a completion is waiting: returns at once
        return cq.poll_cq(4)

    assert [wc.wr_id for wc in asyncio.run(main())] == [1]


def test_srq(dev):
    pd = dev.alloc_pd()
    srq = dev.create_srq(pd, 2, max_sge=1)
    with pytest.raises(ResourceLimitError):
        dev.create_srq(pd, 2)
    srq.post_srq_recv([RecvWR(1), RecvWR(2)])
    with pytest.raises(QueueFullError):
        srq.post_srq_recv(RecvWR(3))
    fresh = Device()
    with pytest.raises(InvalidWorkRequest):
        fresh.create_srq(fresh.alloc_pd(), 4).post_srq_recv(RecvWR(1, [SGE(0, 1, 0)] * 2))
    cq = dev.create_cq(4)
    qp = dev.create_qp(pd, cq, cq, srq=srq, max_recv_wr=0)
    qp.modify(QpState.INIT)
    with pytest.raises(QpStateError, match="SRQ"):
        qp.post_recv(RecvWR(9))
    assert qp.take_recv().wr_id == 1 and len(srq) == 1


def test_completions_in_posting_order_and_signaling(dev):
    pd = dev.alloc_pd()
    cq = dev.create_cq(8)
    qp = dev.create_qp(pd, cq, cq, sq_sig_all=False)
    qp.modify(QpState.INIT)
    qp.modify(QpState.RTS)
    qp.post_send([SendWR(1, send_flags=SendFlags.SIGNALED), SendWR(2),
                  SendWR(3, send_flags=SendFlags.SIGNALED)])
    works = [qp.start_send() for _ in range(3)]
    qp.finish(works[2])
    qp.finish(works[1])
    assert cq.poll_cq(8) == []  # the first is not done: nothing may overtake it
    qp.finish(works[0])
    assert [wc.wr_id for wc in cq.poll_cq(8)] == [1, 3]
