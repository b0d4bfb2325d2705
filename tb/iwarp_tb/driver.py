"""A verbs driver for :class:`~iwarp_nic.core.NicCore`, in the model's vocabulary
(:mod:`iwarp_model.verbs`: the same ``SendWR``, ``RecvWR``, ``SGE``, ``WC`` and constants), so
one test drives the model or the NIC.

The driver is the host software of RFC 5040 section 5 (the verbs' work requests and
completions) and of RFC 5044 section 7 (the MPA startup exchange, which the NIC leaves to the
host), over the interface :mod:`iwarp_nic.host.nicmap` describes: its registers through an
AXI4-Lite manager, its rings and buffers in host memory that the NIC reaches as an AXI4
manager. Both are a native :class:`~iwarp_tb.harness.Harness`'s (``h.registers()``,
``h.memory()``); each register access runs the clock until it is answered.

* :class:`NicDevice`: one NIC. Addresses and keys set; protection domains, memory
  regions (``MR_WRITE``), completion queues (``CQ_OPEN``), shared receive queues
  (``SRQ_OPEN``) and queue pairs (``QP_OPEN``);
  host memory handed out from a heap; the events read and acted on (:meth:`service`).
* :class:`NicQp`: a queue pair (one of the NIC's connections). :meth:`NicQp.listen` and
  :meth:`NicQp.connect` open it (TCP, then the MPA exchange: the startup frames are sent
  with ``FRAME`` and read from ``startup_data``; what they settle opens the engine's context
  with ``ENGINE_OPEN`` and the receive side with ``GATHER``); :meth:`NicQp.post_send` and
  :meth:`NicQp.post_recv` write entries into the rings and ring the doorbells.
* :class:`NicSrq`: a shared receive queue, :meth:`NicSrq.post_srq_recv` its receives; the
  queue pairs made with it take their receives from it, in the order posted.
* :class:`NicCq`: a completion queue; :meth:`NicCq.poll_cq` reads new entries (owner bit)
  and makes each a ``WC`` from the work request posted, dropping the completions of
  unsignaled requests (the NIC writes one for every entry).
* :func:`run_until`: service every device and run the clock until a condition holds.

Errors at the call raise the model's :class:`~iwarp_model.verbs.VerbsError` subclasses; a
protocol error on a connection (a Terminate sent or received, a bad startup frame, the TCP
connection lost) moves its queue pair to ``ERR`` with the reason in :attr:`NicQp.reason`.
"""

import asyncio
import random
from collections import deque
from dataclasses import dataclass

from iwarp_model.mr import Access, make_stag, stag_index
from iwarp_model.verbs import (
    WC,
    WC_OPCODE_OF,
    InvalidWorkRequest,
    QpState,
    QpStateError,
    QueueFullError,
    ResourceLimitError,
    SendFlags,
    WcFlags,
    WcOpcode,
    WcStatus,
    WrOpcode,
)
from iwarp_model.wire import mpa
from iwarp_model.wire.errors import WireError
from iwarp_model.wire.fpdu import mulpdu
from iwarp_nic.host.formats import (
    CQE_BYTES,
    RQ_WQE_BYTES,
    SQ_INLINE_OFFSET,
    SQ_WQE_BYTES,
    Cqe,
    CqeFlags,
    CqeKind,
    RqWqe,
    SqFlags,
    SqWqe,
)
from iwarp_nic.host.nicmap import (
    COUNTERS,
    MAGIC,
    MAILBOX_WORDS,
    CommandOp,
    NicEvent,
    NicEventKind,
    command_layouts,
    nic_map,
)
from iwarp_nic.mpa import GatherOp, Rtr
from iwarp_nic.mpa.gather import ReleaseKind
from iwarp_nic.tcp.layouts import CommandOp as TcpOp
from iwarp_nic.tcp.layouts import EventKind

from .harness import pack, unpack
from .work import Headers, Requester

__all__ = ["NicDevice", "NicQp", "NicCq", "NicMr", "NicRq", "NicSrq", "HostBytes", "run_until",
           "NicError", "TCP_MSS"]

#: The TCP engine's MSS: the EMSS the FPDUs sent are sized for (RFC 5044 section 4.5).
TCP_MSS = 1460
_WORD = 4
_ENDED = (EventKind.CLOSED, EventKind.RESET, EventKind.TIMEOUT, EventKind.ABORTED)
#: RTR types in the order this end picks among those both offered (RFC 6581 section 9).
_RTR_PREFERENCE = (Rtr.WRITE, Rtr.SEND, Rtr.READ)


class NicError(Exception):
    """The NIC did not behave as its interface says (a wrong identity, a lost event)."""


@dataclass(eq=False)
class NicMr:
    """A registered region: ``length`` octets of host memory at ``addr``, tagged offsets
    from ``iova``."""

    pd: int
    stag: int
    addr: int
    iova: int
    length: int
    access: Access

    @property
    def lkey(self):
        return self.stag

    @property
    def rkey(self):
        return self.stag

    def host(self, to, length):
        """The host address of ``length`` octets at tagged offset ``to``, or None when they
        leave the region."""
        if self.iova <= to and to + length <= self.iova + self.length:
            return self.addr + to - self.iova
        return None


class HostBytes:
    """``length`` octets of host memory at ``addr`` (a harness memory's) as a bytearray-like
    object: ``bytes()``, ``len()``, indexing and slicing (read and written through), ``find``
    and ``==`` with bytes; for code written for the model's buffers, which are bytearrays."""

    def __init__(self, memory, addr, length):
        self.memory, self.addr, self.length = memory, addr, length

    def __len__(self):
        return self.length

    def __bytes__(self):
        return self.memory.read(self.addr, self.length)

    def __getitem__(self, key):
        return bytes(self)[key]

    def __setitem__(self, key, value):
        octets = bytearray(bytes(self))
        octets[key] = value
        if len(octets) != self.length:
            raise ValueError(f"an assignment that resizes {self.length} octets of host memory")
        self.memory.write(self.addr, bytes(octets))

    def find(self, *args):
        return bytes(self).find(*args)

    def __eq__(self, other):
        return bytes(self) == bytes(other)

    __hash__ = None


class NicCq:
    """Completion queue ``index`` of ``entries`` (a power of two) at host address ``base``."""

    def __init__(self, device, index, base, entries):
        self.device, self.index, self.base, self.entries = device, index, base, entries
        self.head = 0                   # free-running: the next entry to read
        self.dropped = 0                # completions of unsignaled work requests

    def __len__(self):
        """How many entries the NIC has written that are not read yet."""
        count = 0
        while count < self.entries and self._entry(self.head + count) is not None:
            count += 1
        return count

    def _entry(self, index):
        """Entry ``index`` (free-running) if the NIC has written it on that pass of the ring
        (its owner bit says so), else None."""
        slot = index % self.entries
        raw = self.device.memory.read(self.base + slot * CQE_BYTES, CQE_BYTES)
        cqe = unpack(Cqe, int.from_bytes(raw, "little"))
        return cqe if cqe["owner"] == 1 - (index // self.entries) % 2 else None

    async def wait(self, solicited_only=False):
        """Return once the CQ holds a completion (the model CQ's asyncio face; every
        completion counts, solicited or not). The simulation must be stepped by another
        task meanwhile: this only looks between its turns."""
        while self._entry(self.head) is None:
            await asyncio.sleep(0)

    def poll_cq(self, num_entries=1):
        """Up to ``num_entries`` work completions, oldest first."""
        wcs, read = [], 0
        while len(wcs) < num_entries and (cqe := self._entry(self.head)) is not None:
            self.head += 1
            read += 1
            wc = self.device.qps[cqe["qp"]].completion(cqe)
            if wc is None:
                self.dropped += 1
            else:
                wcs.append(wc)
        if read:
            self.device.write("cq_head", self.head & 0xFFFF, self.index)
        return wcs


@dataclass
class _Posted:
    """A send queue entry's work request, and whether its completion is reported."""

    wr: object
    report: bool


class NicRq:
    """A receive queue: its ring of ``entries`` (a power of two) in host memory at
    :attr:`base` and the receives posted on it, by entry index (:attr:`posted`). A queue
    pair's own (its doorbell ``rq_doorbell``) or a shared one (``srq_doorbell``), number
    ``index`` of its doorbell register."""

    def __init__(self, device, doorbell, index, entries):
        self.device, self.doorbell, self.index, self.entries = device, doorbell, index, entries
        self.base = device.alloc(entries * RQ_WQE_BYTES)
        self.tail = 0
        self.posted = {}

    def post(self, wrs, what):
        """Write receives ``wrs`` (each of one SGE or none) into the ring, then ring the
        doorbell; ``what`` names the queue in exceptions."""
        for wr in wrs:
            if len(wr.sg_list) > 1:
                raise InvalidWorkRequest(f"{what}: a receive takes one SGE, not "
                                         f"{len(wr.sg_list)}")
            if len(self.posted) >= self.entries:
                raise QueueFullError(f"{what}: the receive queue holds {self.entries}")
            sge = wr.sg_list[0] if wr.sg_list else None
            value = pack(RqWqe, addr=sge.addr if sge else 0, lkey=sge.lkey if sge else 0,
                         length=sge.length if sge else 0, sges=len(wr.sg_list))
            entry = self.base + (self.tail % self.entries) * RQ_WQE_BYTES
            self.device.memory.write(entry, value.to_bytes(RQ_WQE_BYTES, "little"))
            self.posted[self.tail % (1 << 16)] = wr
            self.tail += 1
        self.device.write(self.doorbell, self.tail & 0xFFFF, self.index)


class NicSrq(NicRq):
    """Shared receive queue ``index`` (an SRQ): receives any of its queue pairs takes, one
    per untagged message, in the order posted."""

    def __init__(self, device, index, pd, max_wr):
        super().__init__(device, "srq_doorbell", index, _power_of_two(max_wr))
        self.pd = pd

    def __repr__(self):
        return f"NicSrq({self.index})"

    def post_srq_recv(self, wrs):
        """Post receives (one or a list), each of one SGE or none."""
        self.post(wrs if isinstance(wrs, list) else [wrs], repr(self))


class NicQp:
    """Queue pair ``qp_num`` (the NIC's connection slot of that number), taking its receives
    from a receive queue of its own or from ``srq``."""

    def __init__(self, device, qp_num, pd, send_cq, recv_cq, *, max_send_wr, max_recv_wr,
                 max_rd_atomic, max_dest_rd_atomic, srq=None, sq_sig_all=False):
        self.device, self.qp_num, self.pd, self.srq = device, qp_num, pd, srq
        self.sq_sig_all = sq_sig_all    # every send work request completes with a WC
        self.send_cq, self.recv_cq = send_cq, recv_cq
        self.sq_entries = _power_of_two(max_send_wr)
        self.max_rd_atomic, self.max_dest_rd_atomic = max_rd_atomic, max_dest_rd_atomic
        self.sq = device.alloc(self.sq_entries * SQ_WQE_BYTES)
        #: Where its receives are posted: its own queue, or the SRQ.
        self.rq = srq or NicRq(device, "rq_doorbell", qp_num, _power_of_two(max_recv_wr))
        self.sq_tail = 0
        self.sq_posted = {}
        self.requester = Requester(self._source, Headers())
        self.state = QpState.INIT
        self.reason = None
        #: MPA: this end's role, its options, the frames exchanged, what they settled.
        self.active = None
        self.options = {}
        self.request = self.reply = self.negotiated = None
        self.rtr = Rtr.NONE
        self.terminate_sent = self.terminate_received = None
        self.tcp_events = []

    def __repr__(self):
        return f"NicQp({self.qp_num}, {self.state.name})"

    # Connection setup.

    def listen(self, port, **options):
        """Accept one connection to TCP ``port``, then its MPA Request (``options`` as
        :meth:`connect`'s)."""
        self._open(False, options)
        self.device.tcp(TcpOp.LISTEN, self.qp_num, local_port=port)

    def connect(self, ip, port, local_port, *, revision=2, crc=True, markers=False,
                p2p=False, rtr=(Rtr.WRITE,), private_data=b""):
        """Open a connection to ``ip:port`` from ``local_port`` and send the MPA Request:
        ``revision``, CRCs and markers asked for, the peer-to-peer model with the RTR types
        offered (RFC 6581), ``private_data``. The queue pair reaches RTS once the Reply is
        in (see :func:`run_until`)."""
        self._open(True, dict(revision=revision, crc=crc, markers=markers, p2p=p2p, rtr=rtr,
                              private_data=private_data))
        self.device.tcp(TcpOp.CONNECT, self.qp_num, local_port=local_port, remote_ip=ip,
                        remote_port=port)

    def _open(self, active, options):
        if self.state != QpState.INIT:
            raise QpStateError(f"{self!r}: a connection needs a queue pair in INIT")
        if options.get("p2p") and options.get("revision", 2) < 2:
            raise ValueError("the peer-to-peer model needs MPA revision 2 (RFC 6581)")
        self.active, self.options = active, {"revision": 2, "crc": True, "markers": False,
                                             "p2p": False, "rtr": (Rtr.WRITE,),
                                             "private_data": b"", **options}
        self.state = QpState.RTR
        self.device.command(CommandOp.GATHER, op=GatherOp.START, conn=self.qp_num)

    def _enhanced(self):
        o = self.options
        if o["revision"] < 2:
            return None
        offer = set(o["rtr"]) if o["p2p"] else set()
        return mpa.EnhancedData(ird=self.max_dest_rd_atomic, ord=self.max_rd_atomic,
                                peer_to_peer=o["p2p"], rtr_send=Rtr.SEND in offer,
                                rtr_write=Rtr.WRITE in offer, rtr_read=Rtr.READ in offer)

    def on_tcp(self, kind):
        self.tcp_events.append(kind)
        if kind == EventKind.ESTABLISHED and self.active:
            o = self.options
            self.request = mpa.MpaFrame(reply=False, markers=o["markers"], crc=o["crc"],
                                        revision=o["revision"], enhanced=self._enhanced(),
                                        private_data=o["private_data"])
            self.device.send_frame(self.qp_num, self.request.encode())
        elif kind in _ENDED or kind == EventKind.PEER_FIN:
            self.fail(f"TCP {kind.name}")

    def on_startup(self, octets):
        """The peer's startup frame: a Responder answers the Request and opens; an Initiator
        opens on the Reply. A frame that does not decode (a wrong key, a PD_Length over 512)
        fails the queue pair and closes the connection, as the model's end does."""
        try:
            frame = mpa.MpaFrame.decode(octets, reply=self.active)
        except WireError as error:
            self.fail(f"bad startup frame: {error}")
            self.disconnect()
            return
        if self.active:
            self.reply = frame
            if frame.reject:
                self.fail(f"MPA Request rejected: {frame.private_data!r}")
                return
        else:
            o = self.options
            self.request = frame
            revision = min(o["revision"], frame.revision)
            enhanced = self._enhanced() if revision == 2 and frame.enhanced else None
            self.reply = mpa.MpaFrame(reply=True, markers=o["markers"],
                                      crc=o["crc"] or frame.crc, revision=revision,
                                      enhanced=enhanced, private_data=o["private_data"])
        self.negotiated = mpa.negotiate(self.request, self.reply)
        self._start_engine(frame.enhanced)
        if not self.active:
            self.device.send_frame(self.qp_num, self.reply.encode())

    def _start_engine(self, peer):
        """``ENGINE_OPEN`` and ``GATHER FPDUS`` with what the exchange settled: the ORD is at
        most the peer's IRD (RFC 6581 section 9.1)."""
        n = self.negotiated
        if n.peer_to_peer:
            offered = {Rtr.SEND: n.rtr_send, Rtr.WRITE: n.rtr_write, Rtr.READ: n.rtr_read}
            self.rtr = next((r for r in _RTR_PREFERENCE if offered[r]), Rtr.NONE)
            if self.rtr == Rtr.NONE:
                self.fail("no RTR type both ends offered")
                return
        ord_ = self.max_rd_atomic if peer is None else min(self.max_rd_atomic, peer.ird)
        markers = n.tx_markers(initiator=self.active)
        self.device.command(CommandOp.ENGINE_OPEN, conn=self.qp_num, pd=self.pd,
                            ird=self.max_dest_rd_atomic, ord=ord_, initiator=int(self.active),
                            rtr=self.rtr, rtr_source=self.device.zeros,
                            max_ulpdu=mulpdu(TCP_MSS, markers=markers), crc=int(n.crc),
                            markers=int(markers))
        self.device.command(CommandOp.GATHER, op=GatherOp.FPDUS, conn=self.qp_num,
                            markers=int(n.rx_markers(initiator=self.active)), crc=int(n.crc))
        self.state = QpState.RTS

    def disconnect(self):
        """Close the connection in order: TCP sends its FIN after the data queued."""
        self.device.tcp(TcpOp.CLOSE, self.qp_num)

    def fail(self, reason):
        if self.state != QpState.ERR:
            self.state, self.reason = QpState.ERR, reason

    # Work requests.

    def _source(self, sge):
        """The host address of an SGE, checked against the queue pair's regions (none for
        an empty one)."""
        if not sge.length:
            return 0
        mr = self.device.mrs.get(stag_index(sge.lkey))
        addr = None if mr is None or mr.stag != sge.lkey or mr.pd != self.pd else \
            mr.host(sge.addr, sge.length)
        if addr is None:
            raise InvalidWorkRequest(f"{self!r}: SGE {sge} is not in a region of its PD")
        return addr

    def post_send(self, wrs):
        """Post send work requests (one or a list): each becomes one or two entries of the
        send queue (a Write with Immediate Data is a Write, then Immediate Data), written
        into the ring; then one doorbell."""
        wrs = wrs if isinstance(wrs, list) else [wrs]
        if self.state != QpState.RTS:
            raise QpStateError(f"{self!r}: post_send needs RTS")
        memory = self.device.memory
        for wr in wrs:
            _check_send(wr)
            headers = self.requester.headers = Headers()
            items = self.requester.work_of(wr)
            if self.sq_tail + len(items) - self._sq_head() > self.sq_entries:
                raise QueueFullError(f"{self!r}: the send queue holds {self.sq_entries}")
            signaled = self.sq_sig_all or bool(wr.send_flags & SendFlags.SIGNALED)
            for k, item in enumerate(items):
                index = self.sq_tail % (1 << 16)
                entry = self.sq + (self.sq_tail % self.sq_entries) * SQ_WQE_BYTES
                source = item["source"]
                if source in headers.octets:
                    memory.write(entry + SQ_INLINE_OFFSET, headers.octets[source])
                    source = entry + SQ_INLINE_OFFSET
                message = item["message"]
                flags = (SqFlags.FENCE if item["fence"] else 0) | \
                    (SqFlags.SIGNALED if signaled else 0)
                value = pack(SqWqe, opcode=message["opcode"], flags=flags,
                             length=message["length"], stag=message["stag"],
                             inv_stag=message["inv_stag"], to=message["to"], source=source,
                             sink_stag=item["sink_stag"], size=item["size"],
                             sink_to=item["sink_to"], request_id=item["request_id"])
                memory.write(entry, value.to_bytes(SqWqe.size // 8, "little"))
                self.sq_posted[index] = _Posted(wr, report=k == len(items) - 1)
                self.sq_tail += 1
        self.device.write("sq_doorbell", self.sq_tail & 0xFFFF, self.qp_num)

    def _sq_head(self):
        """The oldest send queue entry whose completion has not been read."""
        return self.sq_tail - len(self.sq_posted)

    def post_recv(self, wrs):
        """Post receives (one or a list), each of one SGE or none."""
        if self.srq is not None:
            raise QpStateError(f"{self!r} takes its receives from {self.srq!r}: post there")
        if self.state == QpState.ERR:
            raise QpStateError(f"{self!r}: post_recv in ERR")
        self.rq.post(wrs if isinstance(wrs, list) else [wrs], repr(self))

    def completion(self, cqe):
        """The ``WC`` of completion queue entry ``cqe`` (None for an unsignaled request's)."""
        status = WcStatus(cqe["status"])
        if cqe["kind"] == CqeKind.RECV:
            wr = self.rq.posted.pop(cqe["wqe"])
            flags = WcFlags(cqe["flags"] & (CqeFlags.WITH_IMM | CqeFlags.WITH_INV))
            opcode = WcOpcode.RECV_RDMA_WITH_IMM if flags & WcFlags.WITH_IMM else WcOpcode.RECV
            return WC(wr.wr_id, status, opcode, self.qp_num, byte_len=cqe["byte_len"],
                      imm_data=cqe["imm_data"] if flags & WcFlags.WITH_IMM else 0,
                      invalidated_rkey=cqe["invalidated"] if flags & WcFlags.WITH_INV else 0,
                      wc_flags=flags)
        posted = self.sq_posted.pop(cqe["wqe"])
        wr = posted.wr
        if status != WcStatus.SUCCESS:
            self.fail(f"send work request {wr.wr_id}: {status.name}")
        elif not posted.report or not (self.sq_sig_all or wr.send_flags & SendFlags.SIGNALED):
            return None
        return WC(wr.wr_id, status, WC_OPCODE_OF[WrOpcode(wr.opcode)], self.qp_num,
                  byte_len=sum(sge.length for sge in wr.sg_list))


def _check_send(wr):
    op = WrOpcode(wr.opcode)
    if op not in WC_OPCODE_OF or op in (WrOpcode.LOCAL_INV, WrOpcode.BIND_MW,
                                        WrOpcode.REG_MR):
        raise InvalidWorkRequest(f"wr_id {wr.wr_id}: {op.name} is not offloaded")
    if len(wr.sg_list) > 1:
        raise InvalidWorkRequest(f"wr_id {wr.wr_id}: the NIC takes one SGE per work request")
    if op == WrOpcode.SEND_WITH_IMM and wr.sg_list and wr.sg_list[0].length:
        raise InvalidWorkRequest(f"wr_id {wr.wr_id}: iWARP has no Send with Immediate; "
                                 "SEND_WITH_IMM sends Immediate Data only")


def _power_of_two(n):
    if n < 1 or n > 1 << 15:
        raise ResourceLimitError(f"a queue of {n} entries: 1 to 32768")
    return 1 << (n - 1).bit_length()


class NicDevice:
    """The NIC whose registers are ``h.registers(prefix + "s_axil")`` and host memory
    ``h.memory(prefix + "m_axi")``, with Ethernet address ``mac`` and IPv4 address ``ip``
    (integers) and TCP keys from ``seed``. Host memory from ``heap`` (base, size) is handed
    out by :meth:`alloc`. The NIC's sizes are read from its registers: :attr:`conns`,
    :attr:`cqs`, and the largest IRD and ORD a queue pair may have (:attr:`max_ird`,
    :attr:`max_ord`)."""

    def __init__(self, h, *, mac, ip, prefix="", seed=1, heap=(1 << 16, 1 << 23)):
        self.h, self.mac, self.ip = h, mac, ip
        self.regs = h.registers(f"{prefix}s_axil")
        self.memory = h.memory(f"{prefix}m_axi")
        self.map = nic_map(conns=1, cqs=1, srqs=1)  # identity registers are size-free
        if self.read("id") != MAGIC:
            raise NicError(f"no NIC at {prefix}s_axil: id {self.read('id'):#x}")
        features = self.map["features"].decode(self.read("features"))
        limits = self.map["limits"].decode(self.read("limits"))
        self.conns, self.cqs, self.srqs = features["conns"], features["cqs"], limits["srqs"]
        self.max_ird, self.max_ord = limits["ird"], limits["ord"]
        sizes = {"conns": self.conns, "cqs": self.cqs, "srqs": self.srqs}
        self.map = nic_map(**sizes)
        self.layouts = command_layouts(**sizes, pd_bits=16, stag_entries=4096)
        self.write("mac", mac)
        self.write("ip", ip)
        keys = random.Random(seed).getrandbits(160)     # RFC 6528: secret ISN and hash keys
        self.write("hash_key", keys & 0xFFFF_FFFF)
        self.write("isn_key_lo", keys >> 32 & (1 << 64) - 1)
        self.write("isn_key_hi", keys >> 96 & (1 << 64) - 1)
        self._heap, self._heap_end = heap[0], heap[0] + heap[1]
        self.pds = 0
        self.mrs = {}
        self.cq_list, self.srq_list, self.qps = [], [], {}
        self.events = deque()               # every event read, for tests to look at
        #: 28 zero octets: the header of an Initiator's zero-length Read RTR.
        self.zeros = self.alloc(64)

    # Registers.

    def write(self, name, value, index=0):
        """Write register ``name`` (element ``index``), a word at a time, low word first."""
        offset = self.map.offset(name, index)
        for k in range(0, self.map[name].width, 32):
            self.regs.write(offset + k // 8, value >> k & 0xFFFF_FFFF)

    def read(self, name, index=0):
        offset = self.map.offset(name, index)
        return sum(self.regs.read(offset + k // 8) << k
                   for k in range(0, self.map[name].width, 32))

    def counters(self):
        """``{name: value}`` of every counter register (:data:`~iwarp_nic.host.nicmap.
        COUNTERS`), in address order."""
        return {name: self.read(name) for name in COUNTERS}

    def command(self, code, /, **fields):
        """Write command ``code``'s fields into the mailbox, then ``code``."""
        value = pack(self.layouts[code], fields)
        for k in range(MAILBOX_WORDS):
            self.write("cmd_args", value >> 32 * k & 0xFFFF_FFFF, k)
        self.write("command", code)

    def tcp(self, op, conn, *, local_port=0, remote_ip=0, remote_port=0):
        self.command(CommandOp.TCP, op=op, conn=conn, local_port=local_port,
                     remote_ip=remote_ip, remote_port=remote_port)

    def send_frame(self, conn, octets):
        """Send ``octets`` on connection ``conn`` (its startup frame) through ``FRAME``."""
        padded = octets + bytes(-len(octets) % _WORD)
        for k in range(0, len(padded), _WORD):
            self.write("frame_data", int.from_bytes(padded[k:k + _WORD], "little"))
        self.command(CommandOp.FRAME, conn=conn, length=len(octets))

    # Host memory and resources.

    def alloc(self, n, align=64):
        """``n`` octets of host memory, zeroed."""
        addr = -(-self._heap // align) * align
        if addr + n > self._heap_end:
            raise ResourceLimitError(f"host memory heap: {n} octets do not fit")
        self._heap = addr + n
        self.memory.write(addr, bytes(n))
        return addr

    def alloc_pd(self):
        self.pds += 1
        return self.pds

    def reg_mr(self, pd, addr, length, access, *, iova=None):
        """Register ``length`` octets at host address ``addr`` (tagged offsets from ``iova``,
        by default the address) for ``access``. The memory checker lets the NIC write it when
        ``access`` has a write right."""
        iova = addr if iova is None else iova
        index = next((k for k in range(1, 4096) if k not in self.mrs), None)
        if index is None:
            raise ResourceLimitError("the STag table is full")
        mr = NicMr(pd, make_stag(index, 0x5A), addr, iova, length, Access(access))
        self.mrs[index] = mr
        self._write_stag(index, mr)
        writable = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC
        if mr.access & writable:
            self.memory.allow(addr, length)
        return mr

    def dereg_mr(self, mr):
        index = stag_index(mr.stag)
        del self.mrs[index]
        self._write_stag(index, None)
        self.memory.allow(mr.addr, mr.length, writable=False)

    def _write_stag(self, index, mr):
        entry = {} if mr is None else {
            "present": 1, "key": mr.stag & 0xFF, "valid": 1, "invalidatable": 0, "pd": mr.pd,
            "access": int(mr.access), "iova": mr.iova, "length": mr.length,
            "host_addr": mr.addr}
        self.command(CommandOp.MR_WRITE, index=index, entry=entry)

    def create_cq(self, cqe):
        if len(self.cq_list) >= self.cqs:
            raise ResourceLimitError(f"the NIC has {self.cqs} completion queues")
        entries = _power_of_two(cqe)
        cq = NicCq(self, len(self.cq_list), self.alloc(entries * CQE_BYTES), entries)
        self.memory.allow(cq.base, entries * CQE_BYTES)
        self.command(CommandOp.CQ_OPEN, conn=cq.index, base=cq.base,
                     log2_entries=entries.bit_length() - 1)
        self.cq_list.append(cq)
        return cq

    def create_srq(self, pd, max_wr, max_sge=1):
        """A shared receive queue of ``max_wr`` receives (rounded up to a power of two), of
        one SGE each."""
        if len(self.srq_list) >= self.srqs:
            raise ResourceLimitError(f"the NIC has {self.srqs} shared receive queues")
        if max_sge > 1:
            raise ResourceLimitError(f"a receive takes one SGE, not {max_sge}")
        srq = NicSrq(self, len(self.srq_list), pd, max_wr)
        self.command(CommandOp.SRQ_OPEN, conn=srq.index, base=srq.base,
                     log2_entries=srq.entries.bit_length() - 1)
        self.srq_list.append(srq)
        return srq

    def create_qp(self, pd, send_cq, recv_cq, *, max_send_wr=64, max_recv_wr=64,
                  max_rd_atomic=8, max_dest_rd_atomic=8, srq=None, sq_sig_all=False):
        qp_num = next((k for k in range(self.conns) if k not in self.qps), None)
        if qp_num is None:
            raise ResourceLimitError(f"the NIC has {self.conns} queue pairs")
        if max_dest_rd_atomic > self.max_ird or max_rd_atomic > self.max_ord:
            raise ResourceLimitError(
                f"max_dest_rd_atomic {max_dest_rd_atomic} and max_rd_atomic {max_rd_atomic}: "
                f"the NIC takes an IRD of at most {self.max_ird}, an ORD of at most "
                f"{self.max_ord}")
        if srq is not None and srq.device is not self:
            raise NicError(f"{srq!r} is another NIC's")
        qp = NicQp(self, qp_num, pd, send_cq, recv_cq, max_send_wr=max_send_wr,
                   max_recv_wr=max_recv_wr, max_rd_atomic=max_rd_atomic,
                   max_dest_rd_atomic=max_dest_rd_atomic, srq=srq, sq_sig_all=sq_sig_all)
        self.qps[qp_num] = qp
        self.command(CommandOp.QP_OPEN,
                     cqs={"conn": qp_num, "send_cq": send_cq.index, "recv_cq": recv_cq.index},
                     sq={"base": qp.sq, "log2_entries": qp.sq_entries.bit_length() - 1},
                     rq={"base": qp.rq.base, "log2_entries": qp.rq.entries.bit_length() - 1,
                         "srq": 0 if srq is None else srq.index + 1})
        return qp

    # Events.

    def service(self):
        """Read and act on every event queued; returns how many there were."""
        count = 0
        while True:
            value = self.read("event0") | self.read("event1") << 64
            event = unpack(NicEvent, value)
            kind = NicEventKind(event["kind"])
            if kind == NicEventKind.NONE:
                return count
            count += 1
            event["kind"] = kind
            if kind == NicEventKind.STARTUP:
                event["octets"] = self._startup_octets(event["data"])
            self.write("event_pop", 0)
            self.events.append(event)
            self._dispatch(event)

    def _startup_octets(self, length):
        octets = b""
        for _ in range(-(-length // _WORD)):
            octets += self.read("startup_data").to_bytes(_WORD, "little")
            self.write("startup_pop", 0)
        return octets[:length]

    def _dispatch(self, event):
        kind, qp = event["kind"], self.qps.get(event["conn"])
        if kind == NicEventKind.CQ:
            if event["code"]:
                raise NicError(f"completion queue {event['conn']}: "
                               f"{'overflow' if event['code'] & 1 else 'write failed'}")
            return
        if qp is None:
            raise NicError(f"an event for connection {event['conn']}, which has no queue "
                           f"pair: {event}")
        if kind == NicEventKind.TCP:
            qp.on_tcp(EventKind(event["code"]))
        elif kind == NicEventKind.STARTUP:
            if ReleaseKind(event["code"]) != ReleaseKind.STARTUP:
                qp.fail(f"octets after the startup frame before FPDU mode: {event}")
            else:
                qp.on_startup(event["octets"])
        elif kind == NicEventKind.FAULT:
            qp.terminate_sent = event["code"]
            qp.fail(f"Terminate sent: {event['code']:#06x}")
        elif kind == NicEventKind.TERMINATE:
            qp.terminate_received = event["code"]
            qp.fail(f"Terminate received: {event['code']:#06x}")


def run_until(h, devices, condition, *, timeout_cycles, slice_cycles=256):
    """Service ``devices`` and run the clock of harness ``h`` in slices until
    ``condition()``; :exc:`TimeoutError` after ``timeout_cycles``."""
    end = h.cycle + timeout_cycles
    while True:
        for device in devices:
            device.service()
        if condition():
            return
        if h.cycle > end:
            raise TimeoutError(f"not done after {timeout_cycles} cycles")
        h.run(slice_cycles)
