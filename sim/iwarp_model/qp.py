"""Queue pairs: send and receive queues, the QP state machine and flushing (RFC 5040 sections
5.1 to 5.3 for the ordering and completion rules, section 6 and 8.1 for the stream and QP states).

A :class:`QP` holds work requests; the RDMA engine of its connection
(:class:`iwarp_model.engine.Connection`) carries them out. The split:

* :meth:`QP.post_send` and :meth:`QP.post_recv` check a request completely and queue it, or
  raise a :class:`~iwarp_model.verbs.VerbsError` subclass naming the fault (nothing is queued
  then). In ERR (and SQE, for sends) a posted request completes at once with
  ``IBV_WC_WR_FLUSH_ERR``, as the verbs specification asks.
* The engine takes requests with :meth:`QP.start_send` / :meth:`QP.take_recv` and reports the
  end of each with :meth:`QP.finish`; send completions reach the CQ in posting order (RFC 5040
  5.2), unsignaled successes produce none.
* :meth:`QP.to_error` moves the QP to ERR and flushes: every request not yet completed (posted,
  started or half received) completes with ``IBV_WC_WR_FLUSH_ERR``; the SRQ's are kept.

States (``IBV_QPS_*``): RESET -> INIT -> RTR -> RTS by :meth:`QP.modify` (a connection does
INIT -> RTS itself when it is established); SQE when a purely local send-queue operation failed
(fast registration, local invalidate): the send queue is flushed and stops, receives go on,
:meth:`QP.modify` to RTS resumes; ERR from any state on a connection error or on request.
"""

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .mr import Access, AccessError, MemoryRegion, ProtectionDomain
from .verbs import (
    CQ,
    SGE,
    SRQ,
    WC,
    WC_OPCODE_OF,
    InvalidWorkRequest,
    QpState,
    QpStateError,
    QueueFullError,
    RecvWR,
    SendFlags,
    SendWR,
    UnsupportedOperation,
    WcFlags,
    WcOpcode,
    WcStatus,
    WrOpcode,
    check_sg_list,
)

__all__ = ["QP", "Work"]

_U64 = (1 << 64) - 1
_ATOMICS = frozenset({WrOpcode.ATOMIC_CMP_AND_SWP, WrOpcode.ATOMIC_FETCH_AND_ADD,
                      WrOpcode.MASKED_ATOMIC_CMP_AND_SWP, WrOpcode.MASKED_ATOMIC_FETCH_AND_ADD})
_WITH_DATA = frozenset({WrOpcode.SEND, WrOpcode.SEND_WITH_INV, WrOpcode.RDMA_WRITE,
                        WrOpcode.RDMA_WRITE_WITH_IMM})
_TRANSITIONS = {
    QpState.RESET: {QpState.INIT},
    QpState.INIT: {QpState.INIT, QpState.RTR, QpState.RTS},
    QpState.RTR: {QpState.RTS},
    QpState.RTS: {QpState.RTS},
    QpState.SQE: {QpState.RTS},
    QpState.ERR: set(),
}


@dataclass(eq=False)
class Work:
    """A send work request the engine has started: ``status`` is None until it is finished.
    ``inline`` holds the data copied at posting time for ``IBV_SEND_INLINE``."""

    wr: SendWR
    byte_len: int
    inline: bytes | None = None
    status: WcStatus | None = None


def sg_length(sg_list: list[SGE]) -> int:
    return sum(sge.length for sge in sg_list)


class QP:
    """A reliable connected queue pair; create it with :meth:`Device.create_qp
    <iwarp_model.verbs.Device.create_qp>`."""

    def __init__(self, device, qp_num: int, pd: ProtectionDomain, send_cq: CQ, recv_cq: CQ, *,
                 srq: SRQ | None, max_send_wr: int, max_recv_wr: int, max_send_sge: int,
                 max_recv_sge: int, max_inline_data: int, max_rd_atomic: int,
                 max_dest_rd_atomic: int, sq_sig_all: bool):
        self.device, self.qp_num, self.pd = device, qp_num, pd
        self.send_cq, self.recv_cq, self.srq = send_cq, recv_cq, srq
        self.max_send_wr, self.max_recv_wr = max_send_wr, max_recv_wr
        self.max_send_sge, self.max_recv_sge = max_send_sge, max_recv_sge
        self.max_inline_data, self.sq_sig_all = max_inline_data, sq_sig_all
        #: ORD and IRD (RFC 6581): Reads/atomics outstanding as requester, answered as responder.
        self.max_rd_atomic, self.max_dest_rd_atomic = max_rd_atomic, max_dest_rd_atomic
        self.state = QpState.RESET
        #: Why the QP went to ERR (or SQE), for the ULP's diagnostics.
        self.error: str | None = None
        self.sq: deque[Work] = deque()  # posted, not started
        self.sq_active: deque[Work] = deque()  # started, completions pending in order
        self.rq: deque[RecvWR] = deque()
        #: The receive the engine is filling (a multi-segment message), flushed with the rest.
        self.rq_active: RecvWR | None = None
        #: Called after a successful post_send (the engine's doorbell).
        self.on_post: Callable[[QP], None] | None = None

    def __repr__(self):
        return f"<QP {self.qp_num} {self.state.name}>"

    # -- state machine ----------------------------------------------------------------------

    def modify(self, state: QpState) -> None:
        """Move to ``state`` (``ibv_modify_qp`` with ``IBV_QP_STATE``). ERR flushes, RESET
        empties both queues without completions; other moves follow the verbs state diagram
        and anything else raises :class:`QpStateError`."""
        state = QpState(state)
        if state == QpState.ERR:
            self.to_error("moved to ERR by the consumer")
        elif state == QpState.RESET:
            self.sq.clear()
            self.sq_active.clear()
            self.rq.clear()
            self.rq_active = None
            self.state, self.error = QpState.RESET, None
        elif state in _TRANSITIONS[self.state]:
            self.state = state
            if state == QpState.RTS and self.on_post is not None and self.sq:
                self.on_post(self)
        else:
            raise QpStateError(f"QP {self.qp_num}: no transition {self.state.name} -> "
                               f"{state.name}")

    def to_error(self, reason: str) -> None:
        """Enter ERR and flush every outstanding request (idempotent)."""
        if self.state == QpState.ERR:
            return
        self.state, self.error = QpState.ERR, reason
        self._flush_sq()
        pending = ([self.rq_active] if self.rq_active is not None else []) + list(self.rq)
        self.rq_active = None
        self.rq.clear()
        for wr in pending:
            self.recv_cq.push(WC(wr.wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, self.qp_num))

    def to_sq_error(self, reason: str) -> None:
        """Enter SQE (from RTS): the send queue is flushed and stops; receives continue."""
        if self.state != QpState.RTS:
            return
        self.state, self.error = QpState.SQE, reason
        self._flush_sq()

    def _flush_sq(self) -> None:
        for work in list(self.sq_active) + list(self.sq):
            if work.status is None:
                work.status = WcStatus.WR_FLUSH_ERR
            self._push_send(work)
        self.sq_active.clear()
        self.sq.clear()

    # -- posting ------------------------------------------------------------------------------

    def post_send(self, wr: SendWR | list[SendWR]) -> None:
        """Queue one or more send work requests (``ibv_post_send``); all are checked first."""
        wrs = [wr] if isinstance(wr, SendWR) else list(wr)
        if self.state in (QpState.RESET, QpState.INIT, QpState.RTR):
            raise QpStateError(f"QP {self.qp_num} is in {self.state.name}: post_send needs RTS")
        works = [self._check_send(one) for one in wrs]
        if self.state in (QpState.ERR, QpState.SQE):
            for work in works:
                work.status = WcStatus.WR_FLUSH_ERR
                self._push_send(work)
            return
        if len(self.sq) + len(self.sq_active) + len(works) > self.max_send_wr:
            raise QueueFullError(f"QP {self.qp_num}: send queue holds "
                                 f"{len(self.sq) + len(self.sq_active)} of {self.max_send_wr}")
        self.sq.extend(works)
        if self.on_post is not None:
            self.on_post(self)

    def _check_send(self, wr: SendWR) -> Work:
        if not isinstance(wr, SendWR):
            raise InvalidWorkRequest(f"{wr!r} is not a SendWR")
        try:
            op = WrOpcode(wr.opcode)
        except ValueError:
            raise InvalidWorkRequest(f"wr_id {wr.wr_id}: unknown opcode {wr.opcode!r}") from None
        if op == WrOpcode.BIND_MW:
            raise UnsupportedOperation("memory windows (IBV_WR_BIND_MW) are not supported")
        what = f"wr_id {wr.wr_id} ({op.name})"
        check_sg_list(wr.sg_list, self.max_send_sge, what)
        length = sg_length(wr.sg_list)
        for name, value, bits in (("remote_addr", wr.remote_addr, 64), ("rkey", wr.rkey, 32),
                                  ("imm_data", wr.imm_data, 64),
                                  ("invalidate_rkey", wr.invalidate_rkey, 32),
                                  ("compare_add", wr.compare_add, 64), ("swap", wr.swap, 64),
                                  ("compare_add_mask", wr.compare_add_mask, 64),
                                  ("swap_mask", wr.swap_mask, 64)):
            if not 0 <= value < 1 << bits:
                raise InvalidWorkRequest(f"{what}: {name}={value:#x} is not {bits}-bit")
        if length > self.device.attr.max_msg_sz:
            raise InvalidWorkRequest(f"{what}: {length} bytes, at most "
                                     f"{self.device.attr.max_msg_sz}")
        if op == WrOpcode.RDMA_READ and len(wr.sg_list) > 1:
            raise InvalidWorkRequest(f"{what}: an iWARP Read has one sink buffer, not "
                                     f"{len(wr.sg_list)} SGEs")
        if op in _ATOMICS:
            if len(wr.sg_list) != 1 or wr.sg_list[0].length != 8:
                raise InvalidWorkRequest(f"{what}: an atomic takes exactly one 8-byte SGE")
            if wr.remote_addr % 8:
                raise InvalidWorkRequest(f"{what}: remote_addr {wr.remote_addr:#x} is not "
                                         "8-byte aligned")
        if op == WrOpcode.SEND_WITH_IMM and length:
            raise InvalidWorkRequest(f"{what}: iWARP has no Send with Immediate; "
                                     "SEND_WITH_IMM sends Immediate Data only, without payload")
        if op in (WrOpcode.LOCAL_INV, WrOpcode.REG_MR) and wr.sg_list:
            raise InvalidWorkRequest(f"{what}: takes no SGEs")
        if op == WrOpcode.REG_MR:
            self._check_reg_mr(wr, what)
        inline = None
        if wr.send_flags & SendFlags.INLINE:
            if op not in _WITH_DATA:
                raise InvalidWorkRequest(f"{what}: IBV_SEND_INLINE applies to Sends and Writes")
            if length > self.max_inline_data:
                raise InvalidWorkRequest(f"{what}: {length} inline bytes, at most "
                                         f"{self.max_inline_data}")
            inline = self.gather(wr.sg_list, what)
        if wr.send_flags & SendFlags.SOLICITED and op not in (
                WrOpcode.SEND, WrOpcode.SEND_WITH_INV, WrOpcode.SEND_WITH_IMM,
                WrOpcode.RDMA_WRITE_WITH_IMM):
            raise InvalidWorkRequest(f"{what}: IBV_SEND_SOLICITED needs a Send or Immediate Data")
        return Work(wr, length, inline)

    def _check_reg_mr(self, wr: SendWR, what: str) -> None:
        if not isinstance(wr.mr, MemoryRegion) or not wr.mr.invalidatable:
            raise InvalidWorkRequest(f"{what}: mr must come from Device.alloc_mr")
        if wr.mr.pd is not self.pd:
            raise InvalidWorkRequest(f"{what}: the MR belongs to another PD than the QP")
        if wr.memory is None or memoryview(wr.memory).readonly:
            raise InvalidWorkRequest(f"{what}: memory must be a bytearray")
        if not 0 <= wr.key <= 0xFF:
            raise InvalidWorkRequest(f"{what}: key {wr.key} is not 8-bit")
        if not 0 <= wr.iova <= _U64 + 1 - len(memoryview(wr.memory).cast("B")):
            raise InvalidWorkRequest(f"{what}: iova {wr.iova:#x} wraps")
        if Access(wr.access) & (Access.REMOTE_WRITE | Access.REMOTE_ATOMIC) and not (
                Access(wr.access) & Access.LOCAL_WRITE):
            raise InvalidWorkRequest(f"{what}: remote write or atomic access needs local write")

    def gather(self, sg_list: list[SGE], what: str) -> bytes:
        """The bytes the SGEs name (local read: any valid lkey of this PD will do).
        Raises :class:`InvalidWorkRequest` for a bad lkey or range."""
        out = bytearray()
        for sge in sg_list:
            try:
                region = self.device.mr_table.check(sge.lkey, sge.addr, sge.length, Access(0),
                                                    self.pd)
            except AccessError as error:
                raise InvalidWorkRequest(f"{what}: {error}") from None
            out += region.view(sge.addr, sge.length)
        return bytes(out)

    def post_recv(self, wr: RecvWR | list[RecvWR]) -> None:
        """Queue one or more receives (``ibv_post_recv``); all are checked first."""
        wrs = [wr] if isinstance(wr, RecvWR) else list(wr)
        if self.srq is not None:
            raise QpStateError(f"QP {self.qp_num} takes its receives from an SRQ: post there")
        if self.state == QpState.RESET:
            raise QpStateError(f"QP {self.qp_num} is in RESET: post_recv needs INIT or later")
        for one in wrs:
            if not isinstance(one, RecvWR):
                raise InvalidWorkRequest(f"{one!r} is not a RecvWR")
            check_sg_list(one.sg_list, self.max_recv_sge, f"receive wr_id {one.wr_id}")
        if self.state == QpState.ERR:
            for one in wrs:
                self.recv_cq.push(WC(one.wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV,
                                     self.qp_num))
            return
        if len(self.rq) + len(wrs) > self.max_recv_wr:
            raise QueueFullError(f"QP {self.qp_num}: receive queue holds {len(self.rq)} of "
                                 f"{self.max_recv_wr}")
        self.rq.extend(wrs)

    # -- the engine's side --------------------------------------------------------------------

    def start_send(self) -> Work | None:
        """The next posted send request, moved to the started ones (None when there is none
        or the QP is not in RTS)."""
        if self.state != QpState.RTS or not self.sq:
            return None
        work = self.sq.popleft()
        self.sq_active.append(work)
        return work

    def peek_send(self) -> Work | None:
        return self.sq[0] if self.sq and self.state == QpState.RTS else None

    def take_recv(self) -> RecvWR | None:
        """The receive for the next untagged message (from the SRQ if there is one), made the
        active one; None when none is posted."""
        wr = self.srq.take() if self.srq is not None else (
            self.rq.popleft() if self.rq else None)
        self.rq_active = wr
        return wr

    def finish(self, work: Work, status: WcStatus = WcStatus.SUCCESS) -> None:
        """Mark a started request done; completions leave in posting order."""
        work.status = status
        while self.sq_active and self.sq_active[0].status is not None:
            self._push_send(self.sq_active.popleft())

    def _push_send(self, work: Work) -> None:
        """Its completion: always for an error, for a success only when signaled."""
        wr = work.wr
        signaled = self.sq_sig_all or wr.send_flags & SendFlags.SIGNALED
        if work.status == WcStatus.SUCCESS and not signaled:
            return
        self.send_cq.push(WC(wr.wr_id, work.status, WC_OPCODE_OF[WrOpcode(wr.opcode)],
                             self.qp_num, byte_len=work.byte_len))

    def complete_recv(self, wr: RecvWR, status: WcStatus, *, byte_len: int = 0,
                      imm_data: int | None = None, invalidated: int | None = None,
                      solicited: bool = False) -> None:
        """A receive is done (the engine's side); it stops being the active one."""
        if self.rq_active is wr:
            self.rq_active = None
        flags = WcFlags(0)
        if imm_data is not None:
            flags |= WcFlags.WITH_IMM
        if invalidated is not None:
            flags |= WcFlags.WITH_INV
        opcode = WcOpcode.RECV_RDMA_WITH_IMM if imm_data is not None else WcOpcode.RECV
        self.recv_cq.push(WC(wr.wr_id, status, opcode, self.qp_num, byte_len=byte_len,
                             imm_data=imm_data or 0, invalidated_rkey=invalidated or 0,
                             wc_flags=flags), solicited=solicited)
