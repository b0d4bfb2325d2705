"""A verbs API in rdma-core's vocabulary over the model's RDMA engine (RFC 5040 section 5 and
section 6 for the work requests and completions, RFC 7306 sections 5 and 6 for atomics and
Immediate Data, RFC 5042 section 5 for protection domains and STags).

Constants keep rdma-core's names and values (``<infiniband/verbs.h>``): ``IBV_WR_*`` send
opcodes, ``IBV_WC_*`` completion statuses and opcodes, ``IBV_SEND_*`` flags, ``IBV_ACCESS_*``
(the values of :class:`~iwarp_model.mr.Access`) and ``IBV_QPS_*`` states. What rdma-core lacks
gets this project's own values, outside rdma-core's ranges (0x40 and up):
``IBV_WR_MASKED_ATOMIC_CMP_AND_SWP``, ``IBV_WR_MASKED_ATOMIC_FETCH_AND_ADD``, ``IBV_WR_REG_MR``
and the matching ``IBV_WC_*`` opcodes.

iWARP mapping of the send opcodes:

* ``RDMA_WRITE_WITH_IMM`` is an RDMA Write followed by an RFC 7306 Immediate Data message; the
  peer's receive completes with ``IBV_WC_RECV_RDMA_WITH_IMM``.
* ``SEND_WITH_IMM`` has no payload on iWARP (RFC 7306 defines no Send with Immediate): it sends
  one Immediate Data message, which consumes a receive like a Send. A payload is refused.
* ``imm_data`` is the 8 bytes of RFC 7306 Immediate Data as an unsigned 64-bit integer (sent
  big-endian); rdma-core's 32-bit immediate fits in it.
* ``BIND_MW`` is named for completeness; memory windows are not modelled and it is refused.

Atomic operands in host memory are 64-bit little-endian (the byte order of the hosts the NIC
serves), 8-byte aligned.

Errors of the Python API (bad arguments, exhausted limits, full queues, wrong QP state) raise
:class:`VerbsError` subclasses at the call; errors found while the NIC works on a request are
reported as completions with an ``IBV_WC_*`` status, as in rdma-core.
"""

import asyncio
import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .mr import Access, MemoryRegion, MrTable, ProtectionDomain

__all__ = [
    "WrOpcode", "WcStatus", "WcOpcode", "QpState", "SendFlags", "WcFlags", "Access",
    "SGE", "SendWR", "RecvWR", "WC", "DeviceAttr", "Device", "CQ", "SRQ",
    "VerbsError", "InvalidWorkRequest", "QueueFullError", "QpStateError", "ResourceLimitError",
    "UnsupportedOperation",
]


class WrOpcode(enum.IntEnum):
    """``enum ibv_wr_opcode`` plus this project's masked atomics and fast registration."""

    RDMA_WRITE = 0
    RDMA_WRITE_WITH_IMM = 1
    SEND = 2
    SEND_WITH_IMM = 3
    RDMA_READ = 4
    ATOMIC_CMP_AND_SWP = 5
    ATOMIC_FETCH_AND_ADD = 6
    LOCAL_INV = 7
    BIND_MW = 8
    SEND_WITH_INV = 9
    MASKED_ATOMIC_CMP_AND_SWP = 0x40
    MASKED_ATOMIC_FETCH_AND_ADD = 0x41
    REG_MR = 0x42


class WcStatus(enum.IntEnum):
    """``enum ibv_wc_status``."""

    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_QP_OP_ERR = 2
    LOC_EEC_OP_ERR = 3
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    MW_BIND_ERR = 6
    BAD_RESP_ERR = 7
    LOC_ACCESS_ERR = 8
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13
    LOC_RDD_VIOL_ERR = 14
    REM_INV_RD_REQ_ERR = 15
    REM_ABORT_ERR = 16
    INV_EECN_ERR = 17
    INV_EEC_STATE_ERR = 18
    FATAL_ERR = 19
    RESP_TIMEOUT_ERR = 20
    GENERAL_ERR = 21


class WcOpcode(enum.IntEnum):
    """``enum ibv_wc_opcode`` plus this project's masked atomics and fast registration."""

    SEND = 0
    RDMA_WRITE = 1
    RDMA_READ = 2
    COMP_SWAP = 3
    FETCH_ADD = 4
    BIND_MW = 5
    LOCAL_INV = 6
    MASKED_COMP_SWAP = 0x40
    MASKED_FETCH_ADD = 0x41
    REG_MR = 0x42
    RECV = 128
    RECV_RDMA_WITH_IMM = 129


class QpState(enum.IntEnum):
    """``enum ibv_qp_state``."""

    RESET = 0
    INIT = 1
    RTR = 2
    RTS = 3
    SQD = 4
    SQE = 5
    ERR = 6


class SendFlags(enum.IntFlag):
    """``enum ibv_send_flags``."""

    FENCE = 1
    SIGNALED = 2
    SOLICITED = 4
    INLINE = 8


class WcFlags(enum.IntFlag):
    """``enum ibv_wc_flags`` (the ones iWARP can set)."""

    WITH_IMM = 2
    WITH_INV = 8


globals().update({f"IBV_WR_{op.name}": op for op in WrOpcode})
globals().update({f"IBV_WC_{status.name}": status for status in WcStatus})
globals().update({f"IBV_WC_{op.name}": op for op in WcOpcode})
globals().update({f"IBV_QPS_{state.name}": state for state in QpState})
globals().update({f"IBV_SEND_{flag.name}": flag for flag in SendFlags})
globals().update({f"IBV_WC_{flag.name}": flag for flag in WcFlags})
globals().update({f"IBV_ACCESS_{flag.name}": flag for flag in Access})
__all__ += [name for name in list(globals()) if name.startswith("IBV_")]

#: The completion opcode of each send opcode.
WC_OPCODE_OF = {
    WrOpcode.RDMA_WRITE: WcOpcode.RDMA_WRITE,
    WrOpcode.RDMA_WRITE_WITH_IMM: WcOpcode.RDMA_WRITE,
    WrOpcode.SEND: WcOpcode.SEND,
    WrOpcode.SEND_WITH_IMM: WcOpcode.SEND,
    WrOpcode.SEND_WITH_INV: WcOpcode.SEND,
    WrOpcode.RDMA_READ: WcOpcode.RDMA_READ,
    WrOpcode.ATOMIC_CMP_AND_SWP: WcOpcode.COMP_SWAP,
    WrOpcode.ATOMIC_FETCH_AND_ADD: WcOpcode.FETCH_ADD,
    WrOpcode.MASKED_ATOMIC_CMP_AND_SWP: WcOpcode.MASKED_COMP_SWAP,
    WrOpcode.MASKED_ATOMIC_FETCH_AND_ADD: WcOpcode.MASKED_FETCH_ADD,
    WrOpcode.LOCAL_INV: WcOpcode.LOCAL_INV,
    WrOpcode.BIND_MW: WcOpcode.BIND_MW,
    WrOpcode.REG_MR: WcOpcode.REG_MR,
}


class VerbsError(Exception):
    """Base class of the verbs API's exceptions."""


class InvalidWorkRequest(VerbsError, ValueError):
    """A work request the QP cannot take (bad opcode, SGE count, alignment, size ...)."""


class QueueFullError(VerbsError):
    """The send, receive or shared receive queue holds its maximum of work requests."""


class QpStateError(VerbsError):
    """The QP's state does not allow the call (or the state transition asked for)."""


class ResourceLimitError(VerbsError):
    """A device limit (QPs, CQs, MRs, queue depth, SGEs, ...) would be exceeded."""


class UnsupportedOperation(VerbsError):
    """Something rdma-core names that this device does not do (memory windows)."""


@dataclass
class SGE:
    """``struct ibv_sge``: ``length`` bytes at virtual address ``addr`` of the MR ``lkey``."""

    addr: int
    length: int
    lkey: int


@dataclass
class SendWR:
    """``struct ibv_send_wr``, flattened.

    * RDMA: ``remote_addr``, ``rkey``.
    * Atomics: ``remote_addr``, ``rkey``, ``compare_add`` (compare value for CmpSwap, addend for
      FetchAdd), ``swap``; the masked forms also ``compare_add_mask`` (the compare mask of
      CmpSwap, the field-boundary mask of FetchAdd, RFC 7306 5.2.1) and ``swap_mask``. The
      original value lands in the single 8-byte SGE.
    * ``imm_data`` for the ``*_WITH_IMM`` opcodes, ``invalidate_rkey`` for ``LOCAL_INV`` and
      ``SEND_WITH_INV``.
    * ``REG_MR`` (fast registration, RFC 5040 6.2): ``mr`` (from :meth:`Device.alloc_mr`),
      ``key`` (the new 8-bit key), ``access``, ``memory`` and ``iova``.
    """

    wr_id: int = 0
    opcode: WrOpcode = WrOpcode.SEND
    sg_list: list[SGE] = field(default_factory=list)
    send_flags: SendFlags = SendFlags(0)
    imm_data: int = 0
    invalidate_rkey: int = 0
    remote_addr: int = 0
    rkey: int = 0
    compare_add: int = 0
    swap: int = 0
    compare_add_mask: int = 0
    swap_mask: int = (1 << 64) - 1
    mr: MemoryRegion | None = None
    key: int = 0
    access: Access = Access(0)
    memory: bytearray | memoryview | None = None
    iova: int = 0


@dataclass
class RecvWR:
    """``struct ibv_recv_wr``: a buffer for one untagged message (Send or Immediate Data)."""

    wr_id: int = 0
    sg_list: list[SGE] = field(default_factory=list)


@dataclass
class WC:
    """``struct ibv_wc``. ``byte_len`` is the received length (receives) or the length of the
    request (Reads, atomics); ``imm_data`` and ``invalidated_rkey`` are valid when ``wc_flags``
    holds ``WITH_IMM`` or ``WITH_INV``."""

    wr_id: int
    status: WcStatus
    opcode: WcOpcode
    qp_num: int
    byte_len: int = 0
    imm_data: int = 0
    invalidated_rkey: int = 0
    wc_flags: WcFlags = WcFlags(0)
    vendor_err: int = 0


@dataclass(frozen=True)
class DeviceAttr:
    """The limits of a device (the fields of ``struct ibv_device_attr`` the model enforces).
    ``max_qp_rd_atom`` bounds a QP's IRD, ``max_qp_init_rd_atom`` its ORD (RFC 6581: 14 bits)."""

    max_qp: int = 256
    max_qp_wr: int = 4096
    max_sge: int = 16
    max_cq: int = 256
    max_cqe: int = 1 << 16
    max_mr: int = 4095
    max_pd: int = 256
    max_qp_rd_atom: int = 32
    max_qp_init_rd_atom: int = 32
    max_srq: int = 64
    max_srq_wr: int = 4096
    max_srq_sge: int = 16
    max_inline_data: int = 256
    max_msg_sz: int = 1 << 31


class CQ:
    """A completion queue of ``cqe`` entries.

    :meth:`poll_cq` takes completions in order. :meth:`req_notify_cq` arms one notification:
    the next completion (with ``solicited_only``: the next solicited or error completion) calls
    ``on_event(cq)`` and wakes :meth:`wait`. A completion that finds the queue full is dropped
    and counted in ``overflows`` (the CQ overrun of the verbs specification).
    """

    def __init__(self, device: "Device", cqe: int):
        self.device, self.cqe = device, cqe
        self._entries: deque[WC] = deque()
        self.overflows = 0
        self._armed: bool | None = None  # None: not armed; else solicited_only
        self.events = 0
        self.on_event: Callable[[CQ], None] | None = None
        self._waiters: list[asyncio.Future] = []

    def __len__(self) -> int:
        return len(self._entries)

    def poll_cq(self, num_entries: int = 1) -> list[WC]:
        """Up to ``num_entries`` completions, oldest first (an empty list when none)."""
        if num_entries < 0:
            raise ValueError(f"num_entries {num_entries} must not be negative")
        count = min(num_entries, len(self._entries))
        return [self._entries.popleft() for _ in range(count)]

    def req_notify_cq(self, solicited_only: bool = False) -> None:
        """Arm the notification (``ibv_req_notify_cq``); it fires once."""
        self._armed = solicited_only if self._armed is None else self._armed and solicited_only

    async def wait(self, solicited_only: bool = False) -> None:
        """Return once the CQ holds a completion, or, with ``solicited_only``, once a
        solicited or error completion arrives. The asyncio face of a completion channel."""
        if self._entries and not solicited_only:
            return
        self.req_notify_cq(solicited_only)
        future = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        await future

    def push(self, wc: WC, *, solicited: bool = False) -> None:
        """Add a completion (the engine's side). ``solicited`` marks a receive of a message
        with the Solicited Event bit (RFC 5040 5.1)."""
        if len(self._entries) >= self.cqe:
            self.overflows += 1
            return
        self._entries.append(wc)
        if self._armed is None:
            return
        if self._armed and not (solicited or wc.status != WcStatus.SUCCESS):
            return
        self._armed = None
        self.events += 1
        if self.on_event is not None:
            self.on_event(self)
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)


class SRQ:
    """A shared receive queue: receives any of its QPs may consume, in posting order."""

    def __init__(self, device: "Device", pd: ProtectionDomain, max_wr: int, max_sge: int):
        self.device, self.pd, self.max_wr, self.max_sge = device, pd, max_wr, max_sge
        self._queue: deque[RecvWR] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def post_srq_recv(self, wr: RecvWR | list[RecvWR]) -> None:
        """Post one or more receives (all checked first: on an exception none is posted)."""
        wrs = [wr] if isinstance(wr, RecvWR) else list(wr)
        if len(self._queue) + len(wrs) > self.max_wr:
            raise QueueFullError(f"SRQ holds {len(self._queue)} of {self.max_wr} receives")
        for one in wrs:
            check_sg_list(one.sg_list, self.max_sge, "SRQ receive")
        self._queue.extend(wrs)

    def take(self) -> RecvWR | None:
        """The oldest receive, removed (the engine's side), or None."""
        return self._queue.popleft() if self._queue else None


def check_sg_list(sg_list, max_sge: int, what: str) -> None:
    """Raise :class:`InvalidWorkRequest` unless ``sg_list`` is a list of at most ``max_sge``
    well-formed SGEs."""
    if len(sg_list) > max_sge:
        raise InvalidWorkRequest(f"{what}: {len(sg_list)} SGEs, at most {max_sge}")
    for sge in sg_list:
        if not isinstance(sge, SGE):
            raise InvalidWorkRequest(f"{what}: {sge!r} is not an SGE")
        if not 0 <= sge.length < 1 << 32 or not 0 <= sge.addr < 1 << 64:
            raise InvalidWorkRequest(f"{what}: SGE {sge} out of range")


class Device:
    """One RDMA device: its STag table, protection domains, CQs, QPs and SRQs, with limits.

    ``attr`` holds the limits; every ``create_*``/``alloc_*``/``reg_*`` past a limit raises
    :class:`ResourceLimitError`.
    """

    def __init__(self, name: str = "iwarp0", attr: DeviceAttr | None = None):
        self.name = name
        self.attr = attr or DeviceAttr()
        self.mr_table = MrTable(self.attr.max_mr + 1)
        self._pds: list[ProtectionDomain] = []
        self._mrs = 0
        self._cqs: list[CQ] = []
        self._qps: dict[int, object] = {}
        self._srqs: list[SRQ] = []
        self._next_qpn = 1

    def alloc_pd(self) -> ProtectionDomain:
        if len(self._pds) >= self.attr.max_pd:
            raise ResourceLimitError(f"{self.name}: all {self.attr.max_pd} PDs allocated")
        pd = self.mr_table.alloc_pd()
        self._pds.append(pd)
        return pd

    def _check_pd(self, pd: ProtectionDomain) -> None:
        if not any(pd is mine for mine in self._pds):
            raise VerbsError(f"{pd!r} was not allocated on {self.name}")

    def reg_mr(self, pd: ProtectionDomain, memory, access: Access, *, iova: int = 0,
               length: int | None = None) -> MemoryRegion:
        """Register ``memory`` (a bytearray) for ``access`` at virtual address ``iova``.
        Remote write or atomic access needs local write (as ``ibv_reg_mr`` demands)."""
        self._check_pd(pd)
        access = Access(access)
        if access & (Access.REMOTE_WRITE | Access.REMOTE_ATOMIC) and not (
                access & Access.LOCAL_WRITE):
            raise VerbsError("remote write or atomic access needs IBV_ACCESS_LOCAL_WRITE")
        if self._mrs >= self.attr.max_mr:
            raise ResourceLimitError(f"{self.name}: all {self.attr.max_mr} MRs registered")
        region = self.mr_table.reg_mr(pd, memory, access, iova=iova, length=length)
        self._mrs += 1
        return region

    def alloc_mr(self, pd: ProtectionDomain) -> MemoryRegion:
        """An invalid MR for fast registration (``ibv_alloc_mr``); see ``IBV_WR_REG_MR``."""
        self._check_pd(pd)
        if self._mrs >= self.attr.max_mr:
            raise ResourceLimitError(f"{self.name}: all {self.attr.max_mr} MRs registered")
        region = self.mr_table.alloc_mr(pd)
        self._mrs += 1
        return region

    def dereg_mr(self, region: MemoryRegion) -> None:
        self.mr_table.dereg_mr(region)
        self._mrs -= 1

    def create_cq(self, cqe: int) -> CQ:
        if not 1 <= cqe <= self.attr.max_cqe:
            raise ResourceLimitError(f"CQ of {cqe} entries: 1..{self.attr.max_cqe}")
        if len(self._cqs) >= self.attr.max_cq:
            raise ResourceLimitError(f"{self.name}: all {self.attr.max_cq} CQs created")
        cq = CQ(self, cqe)
        self._cqs.append(cq)
        return cq

    def create_srq(self, pd: ProtectionDomain, max_wr: int, max_sge: int = 1) -> SRQ:
        self._check_pd(pd)
        if len(self._srqs) >= self.attr.max_srq:
            raise ResourceLimitError(f"{self.name}: all {self.attr.max_srq} SRQs created")
        if not 1 <= max_wr <= self.attr.max_srq_wr or not 0 <= max_sge <= self.attr.max_srq_sge:
            raise ResourceLimitError(f"SRQ of {max_wr} receives of {max_sge} SGEs: limits are "
                                     f"{self.attr.max_srq_wr} and {self.attr.max_srq_sge}")
        srq = SRQ(self, pd, max_wr, max_sge)
        self._srqs.append(srq)
        return srq

    def create_qp(self, pd: ProtectionDomain, send_cq: CQ, recv_cq: CQ, *, max_send_wr: int = 64,
                  max_recv_wr: int = 64, max_send_sge: int = 4, max_recv_sge: int = 4,
                  max_inline_data: int = 0, max_rd_atomic: int = 16,
                  max_dest_rd_atomic: int = 16, srq: SRQ | None = None,
                  sq_sig_all: bool = False):
        """A reliable connected QP in RESET (``ibv_create_qp`` with ``IBV_QPT_RC``).

        ``max_rd_atomic`` is the ORD (Reads and atomics this QP may have outstanding),
        ``max_dest_rd_atomic`` the IRD (those it answers at once), as in ``ibv_qp_attr``.
        With ``srq`` the QP takes its receives from the SRQ and has no receive queue.
        """
        from .qp import QP

        self._check_pd(pd)
        for cq in (send_cq, recv_cq):
            if cq.device is not self:
                raise VerbsError(f"CQ of {cq.device.name} used on {self.name}")
        if srq is not None and srq.device is not self:
            raise VerbsError(f"SRQ of {srq.device.name} used on {self.name}")
        if len(self._qps) >= self.attr.max_qp:
            raise ResourceLimitError(f"{self.name}: all {self.attr.max_qp} QPs created")
        a = self.attr
        limits = (("max_send_wr", max_send_wr, 1, a.max_qp_wr),
                  ("max_recv_wr", max_recv_wr, 0 if srq else 1, a.max_qp_wr),
                  ("max_send_sge", max_send_sge, 1, a.max_sge),
                  ("max_recv_sge", max_recv_sge, 0, a.max_sge),
                  ("max_inline_data", max_inline_data, 0, a.max_inline_data),
                  ("max_rd_atomic", max_rd_atomic, 0, a.max_qp_init_rd_atom),
                  ("max_dest_rd_atomic", max_dest_rd_atomic, 0, a.max_qp_rd_atom))
        for name, value, low, high in limits:
            if not low <= value <= high:
                raise ResourceLimitError(f"{name}={value}: the device allows {low}..{high}")
        qp = QP(self, self._next_qpn, pd, send_cq, recv_cq, srq=srq, max_send_wr=max_send_wr,
                max_recv_wr=max_recv_wr, max_send_sge=max_send_sge, max_recv_sge=max_recv_sge,
                max_inline_data=max_inline_data, max_rd_atomic=max_rd_atomic,
                max_dest_rd_atomic=max_dest_rd_atomic, sq_sig_all=sq_sig_all)
        self._qps[qp.qp_num] = qp
        self._next_qpn += 1
        return qp

    def destroy_qp(self, qp) -> None:
        if self._qps.get(qp.qp_num) is not qp:
            raise VerbsError(f"QP {qp.qp_num} is not a QP of {self.name}")
        del self._qps[qp.qp_num]
