"""The RDMAP/DDP/MPA engine of one connection, sans-IO.

Implements, over bytes a transport carries:

* RFC 5044 section 7 with RFC 6581 sections 6 to 10: MPA Request/Reply as initiator or
  responder, revisions 1 and 2, CRC used when either side sets C, markers per direction when
  asked (section 7.1.1), private data both ways, reject with a reason, RFC 6581 IRD/ORD
  exchange (as Linux siw: rev 2 always carries the 4 bytes) and the peer-to-peer model with a
  zero-length Send, Write or Read as the ready-to-receive (RTR) message.
* RFC 5044 sections 4 to 6 and 8: FPDU framing sized to the EMSS (:class:`~.wire.fpdu.Framer`)
  and deframing with CRC and marker checks (:class:`~.wire.fpdu.Deframer`).
* RFC 5041 sections 5 to 7: segmentation into tagged and untagged DDP segments, per-queue MSNs
  (starting at 1) and MOs, every DDP check before placement, and the DDP error codes.
* RFC 5040 sections 5 to 8 and RFC 7306 sections 5 to 6: Send (with Solicited Event and/or
  Invalidate), RDMA Write, RDMA Read with IRD credits at the responder (a Read or atomic
  beyond the IRD is the DDP error "MSN range is not valid", 1/2/3, as siw sends) and ORD
  queueing at the requester, Read Responses interleaved one segment at a time with the send
  queue, atomics (FetchAdd, CmpSwap, masked forms) executed as a read-modify-write of 64-bit
  little-endian host memory, Immediate Data, Terminate with the offending headers, and the
  stream/QP error rules: on a protocol violation the Terminate goes out, the QP enters ERR
  and every outstanding request is flushed; a Terminate received does the same without reply.
* RFC 5042 section 5: STag, key, PD, rights, bounds and wrap checked by
  :meth:`~.mr.MrTable.check` before any byte is placed or read.

Choices where the RFCs leave room (all documented at the code that makes them):

* Over TCP a message's segments arrive in order, so a segment must carry the MSN of the
  message being received and the MO that continues it: another MSN is "MSN range is not
  valid" (1/2/3), a new message with no receive posted "no buffer available" (1/2/2), another
  MO "Invalid MO" (1/2/4), more data than the receive holds "Message too long" (1/2/5).
* Zero-length tagged segments and zero-length Read Requests are not checked (RFC 6581 uses
  them, with STag 0, as RTR messages).
* Errors on Sends with Invalidate follow siw: an STag of another PD or one that cannot be
  invalidated is 0/1/9, an unknown or already invalid STag 0/2/9.
* A misaligned atomic is an RDMAP Remote Operation error, unspecified (0/2/0xFF).
* Send-type requests complete when their last segment is handed to the transport (RFC 5040
  5.2: the buffer may then be reused); Reads and atomics when their response arrives.
* A local error while starting a request (bad lkey) completes it with ``IBV_WC_LOC_PROT_ERR``,
  sends the RDMAP Local Catastrophic Terminate (0/0/0) and flushes; a failed local operation
  (fast registration, local invalidate) only puts the QP in SQE.
* Non peer-to-peer: the responder sends no FPDU before the initiator's first one (RFC 5044
  7.1.2); in peer-to-peer mode it waits for the RTR, and anything else first is "No matching
  RTR" (2/0/7).

Driving it (no sockets, no clock): :meth:`Connection.start`, then repeatedly hand TCP bytes in
with :meth:`Connection.receive` (any chunking) and send what :meth:`Connection.transmit`
returns; once :attr:`Connection.wants_close` is true and ``transmit()`` returns nothing, close
the TCP connection; when TCP closes under it, call :meth:`Connection.connection_lost`.
"""

import enum
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from .mr import (
    Access,
    AccessError,
    AccessRightsViolation,
    BaseBoundsViolation,
    InvalidStag,
    StagNotAssociated,
    TaggedOffsetWrap,
    make_stag,
    stag_index,
)
from .qp import QP, Work
from .verbs import QpState, SendFlags, WcStatus, WrOpcode
from .wire import mpa
from .wire.ddp import TAGGED_HEADER_SIZE, UNTAGGED_HEADER_SIZE
from .wire.errors import WireError
from .wire.fpdu import MAX_ULPDU, Deframer, Framer
from .wire.rdmap import (
    AtomicOp,
    AtomicRequest,
    AtomicResponse,
    ImmediateData,
    Opcode,
    Queue,
    ReadRequest,
    Segment,
    decode_segment,
)
from .wire.terminate import ErrorCode, Layer, Terminate, error_code_for

__all__ = ["Connection", "ConnState", "Rtr", "EngineError", "DEFAULT_EMSS"]

DEFAULT_EMSS = 1460
_U64 = (1 << 64) - 1
_U32 = (1 << 32) - 1
_SE_OPCODES = frozenset({Opcode.SEND_SE, Opcode.SEND_SE_INVALIDATE, Opcode.IMMEDIATE_DATA_SE})
_INVALIDATE_OPCODES = frozenset({Opcode.SEND_INVALIDATE, Opcode.SEND_SE_INVALIDATE})
_ATOMIC_WRS = frozenset({WrOpcode.ATOMIC_CMP_AND_SWP, WrOpcode.ATOMIC_FETCH_AND_ADD,
                         WrOpcode.MASKED_ATOMIC_CMP_AND_SWP,
                         WrOpcode.MASKED_ATOMIC_FETCH_AND_ADD})

# Tagged (DDP) placement faults; access rights have no DDP code and are RDMAP's (RFC 5040 7.1).
_TAGGED_CODES = {
    InvalidStag: ErrorCode.DDP_TAGGED_INVALID_STAG,
    BaseBoundsViolation: ErrorCode.DDP_TAGGED_BASE_BOUNDS,
    StagNotAssociated: ErrorCode.DDP_TAGGED_STAG_NOT_ASSOCIATED,
    TaggedOffsetWrap: ErrorCode.DDP_TAGGED_TO_WRAP,
    AccessRightsViolation: ErrorCode.RDMAP_ACCESS_RIGHTS,
}
# Faults of the Data Source of a Read, or the target of an atomic: RDMAP remote protection.
_SOURCE_CODES = {
    InvalidStag: ErrorCode.RDMAP_INVALID_STAG,
    BaseBoundsViolation: ErrorCode.RDMAP_BASE_BOUNDS,
    AccessRightsViolation: ErrorCode.RDMAP_ACCESS_RIGHTS,
    StagNotAssociated: ErrorCode.RDMAP_STAG_NOT_ASSOCIATED,
    TaggedOffsetWrap: ErrorCode.RDMAP_TO_WRAP,
}


def _code_of(table: dict, error: AccessError) -> ErrorCode:
    return next(table[kind] for kind in type(error).__mro__ if kind in table)


class EngineError(Exception):
    """The API was used out of turn (start twice, accept without a request, a QP in the wrong
    state or already attached to another connection)."""


class ConnState(enum.Enum):
    IDLE = "idle"  # constructed, start() not called
    MPA_REQUEST_SENT = "mpa-request-sent"  # initiator, waiting for the Reply
    MPA_AWAIT_REQUEST = "mpa-await-request"  # responder, waiting for the Request
    MPA_REQUEST_RECEIVED = "mpa-request-received"  # responder, waiting for accept()/reject()
    AWAIT_RTR = "await-rtr"  # peer-to-peer responder, waiting for the RTR message
    ESTABLISHED = "established"
    CLOSED = "closed"  # rejected, closed by either side, or the MPA exchange failed
    TERMINATED = "terminated"  # a Terminate was sent or received


class Rtr(enum.Enum):
    """The zero-length message that signals ready-to-receive (RFC 6581 section 7)."""

    SEND = "send"
    WRITE = "write"
    READ = "read"


@dataclass(eq=False)
class _Outstanding:
    """A Read or atomic this end asked for (``work`` None: the RTR Read)."""

    work: Work | None
    msn: int
    sink_stag: int = 0
    sink_to: int = 0
    size: int = 0
    received: int = 0
    request_id: int | None = None


@dataclass(eq=False)
class _Receive:
    """The untagged message being received on queue 0."""

    wr: object
    regions: list  # (region, addr, length) per SGE, checked
    capacity: int
    received: int = 0


class Connection:
    """One iWARP connection (MPA, DDP and RDMAP) carrying the work of ``qp``.

    Options: ``active`` (initiator) or not; ``revision`` (1 or 2; the responder answers with
    the lower of its own and the Request's); ``crc`` (ask for CRCs; they are used when either
    side asks); ``markers`` (ask the peer to insert markers in what it sends); ``p2p`` with
    ``rtr`` (initiator: the RTR types offered; responder: those accepted, in preference order;
    needs revision 2); ``private_data`` (initiator: in the Request; responder: in the Reply);
    ``emss`` (FPDUs are sized so one fits a TCP segment of this payload); ``auto_accept``
    (responder: False to stop in :attr:`ConnState.MPA_REQUEST_RECEIVED` for :meth:`accept` or
    :meth:`reject`); ``max_rx_ulpdu`` (the longest ULPDU this end takes in: an implementation's
    buffer limit; a longer ULPDU_Length is a catastrophic error of the stream as soon as it is
    read, RFC 5040 section 7.1; the NIC's is its gather ring's: one FPDU beside a TCP
    chunk). IRD and ORD come from the QP (``max_dest_rd_atomic``, ``max_rd_atomic``).

    Callbacks (attributes, each optional): ``on_request(conn)``, ``on_established(conn)``,
    ``on_rejected(conn, reason)``, ``on_terminated(conn, terminate, local)``,
    ``on_closed(conn)``, ``on_output(conn)`` (new bytes may be ready for :meth:`transmit`).
    """

    def __init__(self, qp: QP, *, active: bool, revision: int = 2, crc: bool = False,
                 markers: bool = False, p2p: bool = False,
                 rtr: Iterable[Rtr] = (Rtr.WRITE,), private_data: bytes = b"",
                 emss: int = DEFAULT_EMSS, auto_accept: bool = True,
                 max_rx_ulpdu: int = MAX_ULPDU):
        if revision not in mpa.REVISIONS:
            raise ValueError(f"MPA revision {revision}: 1 or 2")
        if p2p and revision < 2:
            raise ValueError("the peer-to-peer model needs MPA revision 2 (RFC 6581)")
        rtr = tuple(Rtr(kind) for kind in rtr)
        if p2p and not rtr:
            raise ValueError("the peer-to-peer model needs at least one RTR type")
        reserved = mpa.EnhancedData.SIZE if revision == 2 else 0
        if len(private_data) > mpa.MAX_PRIVATE_DATA - reserved:
            raise ValueError(f"private data of {len(private_data)} bytes: at most "
                             f"{mpa.MAX_PRIVATE_DATA - reserved}")
        if emss < 64:
            raise ValueError(f"EMSS {emss} is too small")
        if qp.state not in (QpState.RESET, QpState.INIT):
            raise EngineError(f"{qp!r}: a connection needs a QP in RESET or INIT")
        if qp.on_post is not None:
            raise EngineError(f"{qp!r} already belongs to a connection")
        if qp.state == QpState.RESET:
            qp.modify(QpState.INIT)
        self.qp, self.active = qp, active
        self.revision, self.crc, self.markers, self.p2p = revision, crc, markers, p2p
        self.rtr_types, self.private_data, self.emss = rtr, bytes(private_data), emss
        self.auto_accept, self.max_rx_ulpdu = auto_accept, max_rx_ulpdu
        qp.on_post = self._on_post
        self._table = qp.device.mr_table
        self.state = ConnState.IDLE
        #: After the exchange: the peer's private data, what was negotiated, the RTR chosen.
        self.peer_private_data = b""
        self.request: mpa.MpaFrame | None = None
        self.reply: mpa.MpaFrame | None = None
        self.negotiated: mpa.Negotiated | None = None
        self.rtr: Rtr | None = None
        #: The IRD this end enforces and the ORD it keeps to, once established.
        self.ird = qp.max_dest_rd_atomic
        self.ord = qp.max_rd_atomic
        self.reject_reason: bytes | None = None
        self.terminate_sent: Terminate | None = None
        self.terminate_received: Terminate | None = None
        #: Why the connection ended, in words.
        self.reason: str | None = None
        self.wants_close = False
        self.on_request: Callable | None = None
        self.on_established: Callable | None = None
        self.on_rejected: Callable | None = None
        self.on_terminated: Callable | None = None
        self.on_closed: Callable | None = None
        self.on_output: Callable | None = None
        self._out = bytearray()  # raw bytes ready (MPA frames)
        self._reader: mpa.MpaFrameReader | None = None
        self._held_rx = bytearray()  # FPDUs that came before the responder accepted
        self._framer: Framer | None = None
        self._deframer: Deframer | None = None
        self._tx_held = False
        self._tx_msn = [1, 1, 1, 1]  # per RDMAP queue (RFC 5041: MSNs start at 1)
        self._rx_msn = [1, 1, 1, 1]
        self._terminate_ulpdu: bytes | None = None
        self._sq_gen: Iterator[bytes] | None = None
        self._responses: deque[Iterator[bytes]] = deque()
        self._turn = False
        self._ird_used = 0
        self._outstanding: deque[_Outstanding] = deque()
        self._next_request_id = 1
        self._rx: _Receive | None = None
        self.stats = {"fpdus_tx": 0, "fpdus_rx": 0, "bytes_tx": 0, "bytes_rx": 0}

    def __repr__(self):
        role = "initiator" if self.active else "responder"
        return f"<Connection {role} QP {self.qp.qp_num} {self.state.value}>"

    # -- connection setup ---------------------------------------------------------------------

    def start(self) -> None:
        """Begin: the initiator queues its MPA Request, the responder waits for one."""
        if self.state != ConnState.IDLE:
            raise EngineError(f"{self!r}: start() was already called")
        if self.active:
            self.request = mpa.MpaFrame(reply=False, markers=self.markers, crc=self.crc,
                                        revision=self.revision, enhanced=self._enhanced(),
                                        private_data=self.private_data)
            self._out += self.request.encode()
            self._reader = mpa.MpaFrameReader(reply=True)
            self.state = ConnState.MPA_REQUEST_SENT
        else:
            self._reader = mpa.MpaFrameReader(reply=False)
            self.state = ConnState.MPA_AWAIT_REQUEST
        self._notify_output()

    def _enhanced(self, ord_: int | None = None, rtr: Rtr | None = None
                  ) -> mpa.EnhancedData | None:
        if self.revision < 2:
            return None
        offered = (rtr,) if rtr is not None else (self.rtr_types if self.p2p else ())
        return mpa.EnhancedData(
            ird=min(self.ird, 0x3FFF), ord=min(self.ord if ord_ is None else ord_, 0x3FFF),
            peer_to_peer=self.p2p, rtr_send=Rtr.SEND in offered,
            rtr_write=Rtr.WRITE in offered, rtr_read=Rtr.READ in offered)

    def accept(self, private_data: bytes | None = None) -> None:
        """Responder: accept the Request now held (``auto_accept=False``), optionally with
        other private data for the Reply."""
        if self.state != ConnState.MPA_REQUEST_RECEIVED:
            raise EngineError(f"{self!r}: no MPA Request waits for accept()")
        if private_data is not None:
            room = mpa.MAX_PRIVATE_DATA - (mpa.EnhancedData.SIZE if self.revision == 2 else 0)
            if len(private_data) > room:
                raise ValueError(f"private data of {len(private_data)} bytes: at most {room}")
            self.private_data = bytes(private_data)
        self._send_reply()

    def reject(self, reason: bytes = b"") -> None:
        """Responder: refuse the Request now held, ``reason`` as the Reply's private data."""
        if self.state != ConnState.MPA_REQUEST_RECEIVED:
            raise EngineError(f"{self!r}: no MPA Request waits for reject()")
        self._reject(reason)

    def _reject(self, reason: bytes) -> None:
        self.reply = mpa.reject(self.request, reason, ird=min(self.ird, 0x3FFF),
                                ord=min(self.ord, 0x3FFF))
        self._out += self.reply.encode()
        self.reject_reason = bytes(reason)
        self._end(ConnState.CLOSED, f"rejected the MPA Request: {reason!r}")

    def _receive_mpa(self, data: bytes) -> bytes:
        """Feed the MPA frame being received; the bytes after it are returned."""
        try:
            frame = self._reader.feed(data)
        except WireError as error:
            self._end(ConnState.CLOSED, f"bad MPA frame: {error}")
            return b""
        if frame is None:
            return b""
        if self.active:
            self._on_reply(frame)
        else:
            self._on_request(frame)
        return self._reader.leftover

    def _on_request(self, request: mpa.MpaFrame) -> None:
        self.request, self.peer_private_data = request, request.private_data
        self.revision = min(self.revision, request.revision)
        asked = request.enhanced
        if asked is not None:
            self.ord = min(self.ord, asked.ird)
        if self.revision < 2:
            self.p2p = False
        self.p2p = bool(self.p2p and asked is not None and asked.peer_to_peer)
        if self.p2p:
            offered = {Rtr.SEND: asked.rtr_send, Rtr.WRITE: asked.rtr_write,
                       Rtr.READ: asked.rtr_read}
            self.rtr = next((kind for kind in self.rtr_types if offered[kind]), None)
            if self.rtr is None:
                self._reject(b"no matching RTR type")
                return
        self.state = ConnState.MPA_REQUEST_RECEIVED
        if self.on_request is not None:
            self.on_request(self)
        if self.auto_accept and self.state == ConnState.MPA_REQUEST_RECEIVED:
            self._send_reply()

    def _send_reply(self) -> None:
        request = self.request
        enhanced = None
        if self.revision == 2 and request.enhanced is not None:
            enhanced = mpa.EnhancedData(
                ird=min(self.ird, 0x3FFF), ord=min(self.ord, 0x3FFF), peer_to_peer=self.p2p,
                rtr_send=self.rtr == Rtr.SEND, rtr_write=self.rtr == Rtr.WRITE,
                rtr_read=self.rtr == Rtr.READ)
        self.reply = mpa.MpaFrame(reply=True, markers=self.markers, crc=self.crc or request.crc,
                                  revision=self.revision, enhanced=enhanced,
                                  private_data=self.private_data)
        self._out += self.reply.encode()
        self._full_operation()
        self._tx_held = True  # until the initiator's first FPDU, or its RTR
        self.qp.modify(QpState.RTS)
        if self.p2p:
            self.state = ConnState.AWAIT_RTR
        else:
            self._established()
        if self._held_rx:
            held, self._held_rx = bytes(self._held_rx), bytearray()
            self._dispatch(held)
        self._notify_output()

    def _on_reply(self, reply: mpa.MpaFrame) -> None:
        self.reply, self.peer_private_data = reply, reply.private_data
        if reply.reject:
            self.reject_reason = reply.private_data
            self._end(ConnState.CLOSED, f"the peer rejected the connection: "
                                        f"{reply.private_data!r}")
            if self.on_rejected is not None:
                self.on_rejected(self, reply.private_data)
            return
        if reply.revision > self.revision:
            self._end(ConnState.CLOSED, f"MPA Reply of revision {reply.revision} to a "
                                        f"Request of revision {self.revision}")
            return
        self.revision = reply.revision
        if reply.enhanced is not None:
            self.ord = min(self.ord, reply.enhanced.ird)
        self._full_operation()
        self.qp.modify(QpState.RTS)
        if self.p2p:
            chosen = [kind for kind, flag in ((Rtr.SEND, self.negotiated.rtr_send),
                                              (Rtr.WRITE, self.negotiated.rtr_write),
                                              (Rtr.READ, self.negotiated.rtr_read)) if flag]
            if not self.negotiated.peer_to_peer or len(chosen) != 1:
                self._protocol_error(ErrorCode.MPA_NO_MATCHING_RTR, None,
                                     f"the Reply chose RTR types {chosen}, not exactly one "
                                     "of those offered")
                return
            self.rtr = chosen[0]
            self._send_rtr()
        self._established()

    def _full_operation(self) -> None:
        self.negotiated = mpa.negotiate(self.request, self.reply)
        tx = self.negotiated.tx_markers(initiator=self.active)
        rx = self.negotiated.rx_markers(initiator=self.active)
        self._framer = Framer(crc=self.negotiated.crc, markers=tx, emss=self.emss)
        self._deframer = Deframer(crc=self.negotiated.crc, markers=rx,
                                  max_ulpdu=self.max_rx_ulpdu)
        self._max_untagged = self._framer.max_ulpdu - UNTAGGED_HEADER_SIZE
        self._max_tagged = self._framer.max_ulpdu - TAGGED_HEADER_SIZE

    def _send_rtr(self) -> None:
        """RFC 6581 section 7: the initiator's zero-length RTR message, the first FPDU."""
        if self.rtr == Rtr.WRITE:
            segment = Segment(Opcode.WRITE, b"")
        elif self.rtr == Rtr.SEND:
            segment = Segment(Opcode.SEND, b"", msn=self._take_msn(Queue.SEND))
        else:
            msn = self._take_msn(Queue.READ_REQUEST)
            segment = Segment(Opcode.READ_REQUEST, msn=msn, header=ReadRequest(0, 0, 0, 0, 0))
            self._outstanding.append(_Outstanding(None, msn))
        self._emit(segment.encode())

    def _established(self) -> None:
        self.state = ConnState.ESTABLISHED
        if self.on_established is not None:
            self.on_established(self)

    # -- driving ------------------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """TCP bytes from the peer, in any pieces. Errors in them are handled by the protocol
        (a Terminate, a close); bytes that come after the connection ended are dropped."""
        if self.state == ConnState.IDLE:
            raise EngineError(f"{self!r}: receive() before start()")
        self.stats["bytes_rx"] += len(data)
        self._dispatch(bytes(data))
        self._notify_output()

    def _dispatch(self, data: bytes) -> None:
        if not data or self._ended:
            return
        if self.state in (ConnState.MPA_REQUEST_SENT, ConnState.MPA_AWAIT_REQUEST):
            self._dispatch(self._receive_mpa(data))
        elif self.state == ConnState.MPA_REQUEST_RECEIVED:
            self._held_rx += data
        else:
            self._receive_fpdus(data)

    def _receive_fpdus(self, data: bytes) -> None:
        try:
            ulpdus = self._deframer.feed(data)
        except WireError as error:
            for ulpdu in error.delivered:
                self._on_ulpdu(ulpdu)
                if self._ended:
                    return
            self._protocol_error(error_code_for(error), None, f"bad FPDU: {error}")
            return
        for ulpdu in ulpdus:
            self._on_ulpdu(ulpdu)
            if self._ended:
                return

    @property
    def rx_pending(self) -> int:
        """Bytes received but not yet part of a complete MPA frame or FPDU."""
        if self._deframer is not None:
            return self._deframer.buffered
        return len(self._held_rx)

    @property
    def _ended(self) -> bool:
        return self.state in (ConnState.CLOSED, ConnState.TERMINATED)

    def transmit(self, max_bytes: int | None = None) -> bytes:
        """The bytes ready for TCP: pending MPA frames, then FPDUs until at least ``max_bytes``
        (whole FPDUs; None: everything ready). Read Responses and the send queue take turns
        one segment at a time; a Terminate goes before anything else."""
        out, self._out = self._out, bytearray()
        while max_bytes is None or len(out) < max_bytes:
            ulpdu = self._next_ulpdu()
            if ulpdu is None:
                break
            out += self._framer.frame(ulpdu)
            self.stats["fpdus_tx"] += 1
        self.stats["bytes_tx"] += len(out)
        return bytes(out)

    def close(self) -> None:
        """The consumer ends the connection (``rdma_disconnect``): the QP enters ERR (work
        outstanding is flushed) and the transport should close TCP once ``transmit()`` is
        drained."""
        if self._ended:
            return
        self._end(ConnState.CLOSED, "closed by the consumer")

    def connection_lost(self) -> None:
        """The transport reports TCP closed or reset (by the peer or by an error): the QP
        enters ERR and work outstanding is flushed (RFC 5040 section 6)."""
        if self._ended:
            return
        self._end(ConnState.CLOSED, "the LLP connection closed")

    def _end(self, state: ConnState, reason: str) -> None:
        self.state, self.reason, self.wants_close = state, reason, True
        self.qp.to_error(reason)
        self._sq_gen = None
        self._responses.clear()
        if state == ConnState.CLOSED and self.on_closed is not None:
            self.on_closed(self)

    def _on_post(self, _qp: QP) -> None:
        self._notify_output()

    def _notify_output(self) -> None:
        if self.on_output is not None:
            self.on_output(self)

    # -- transmit side ------------------------------------------------------------------------

    def _emit(self, ulpdu: bytes) -> None:
        """Frame a ULPDU at once (the RTR, which must precede everything)."""
        self._out += self._framer.frame(ulpdu)
        self.stats["fpdus_tx"] += 1

    def _take_msn(self, queue: Queue) -> int:
        msn = self._tx_msn[queue]
        self._tx_msn[queue] = (msn + 1) & _U32
        return msn

    def _next_ulpdu(self) -> bytes | None:
        """The next ULPDU to frame: a Terminate first (also one decided while looking for
        data, after a local error), then data."""
        if self._terminate_ulpdu is None:
            ulpdu = self._next_data()
            if ulpdu is not None or self._terminate_ulpdu is None:
                return ulpdu
        ulpdu, self._terminate_ulpdu = self._terminate_ulpdu, None
        return ulpdu

    def _next_data(self) -> bytes | None:
        if self.state not in (ConnState.ESTABLISHED, ConnState.AWAIT_RTR):
            return None
        if self._tx_held:
            return self._next_request()  # runs local operations only
        self._turn = not self._turn
        if self._turn:
            return self._next_response() or self._next_request()
        return self._next_request() or self._next_response()

    def _next_response(self) -> bytes | None:
        while self._responses:
            ulpdu = next(self._responses[0], None)
            if ulpdu is not None:
                return ulpdu
            self._responses.popleft()
        return None

    def _next_request(self) -> bytes | None:
        while not self._ended:
            if self._sq_gen is not None:
                ulpdu = next(self._sq_gen, None)
                if ulpdu is not None:
                    return ulpdu
                self._sq_gen = None
            work = self.qp.peek_send()
            if work is None:
                return None
            op = WrOpcode(work.wr.opcode)
            if self._tx_held and op not in (WrOpcode.LOCAL_INV, WrOpcode.REG_MR):
                return None
            needs_credit = op == WrOpcode.RDMA_READ or op in _ATOMIC_WRS
            if needs_credit and self.ord == 0:
                self.qp.start_send()
                self._local_sq_error(work, WcStatus.LOC_QP_OP_ERR,
                                     f"wr_id {work.wr.wr_id}: the negotiated ORD is 0")
                continue
            if needs_credit and len(self._outstanding) >= self.ord:
                return None  # ORD: wait for a response to free a credit
            if work.wr.send_flags & SendFlags.FENCE and self._outstanding:
                return None  # fence: wait for every Read and atomic before it
            self.qp.start_send()
            self._sq_gen = self._start(work, op)
        return None

    def _start(self, work: Work, op: WrOpcode) -> Iterator[bytes] | None:
        """Begin a send work request: local operations happen here; others return the
        generator of their ULPDUs."""
        wr = work.wr
        what = f"wr_id {wr.wr_id} ({op.name})"
        if op == WrOpcode.LOCAL_INV:
            try:
                self._table.invalidate(wr.invalidate_rkey, self.qp.pd)
            except AccessError as error:
                self._local_sq_error(work, WcStatus.LOC_PROT_ERR, f"{what}: {error}")
                return None
            self.qp.finish(work)
            return None
        if op == WrOpcode.REG_MR:
            stag = make_stag(stag_index(wr.mr.stag), wr.key)
            try:
                self._table.fast_reg(stag, wr.memory, Access(wr.access), iova=wr.iova)
            except ValueError as error:
                self._local_sq_error(work, WcStatus.LOC_QP_OP_ERR, f"{what}: {error}")
                return None
            self.qp.finish(work)
            return None
        if work.inline is not None:
            payload = work.inline
        elif op in (WrOpcode.SEND, WrOpcode.SEND_WITH_INV, WrOpcode.RDMA_WRITE,
                    WrOpcode.RDMA_WRITE_WITH_IMM):
            try:
                payload = self._gather(wr.sg_list)
            except AccessError as error:
                self._local_error(work, f"{what}: {error}")
                return None
        else:
            payload = b""
        if op in (WrOpcode.RDMA_READ, *_ATOMIC_WRS):
            return self._start_request(work, op, what)
        solicited = bool(wr.send_flags & SendFlags.SOLICITED)
        if op == WrOpcode.SEND:
            opcode = Opcode.SEND_SE if solicited else Opcode.SEND
            return self._untagged(opcode, payload, work=work)
        if op == WrOpcode.SEND_WITH_INV:
            opcode = Opcode.SEND_SE_INVALIDATE if solicited else Opcode.SEND_INVALIDATE
            return self._untagged(opcode, payload, inv_stag=wr.invalidate_rkey, work=work)
        if op == WrOpcode.SEND_WITH_IMM:
            return self._immediate(wr.imm_data, solicited, work=work)
        if op == WrOpcode.RDMA_WRITE:
            return self._tagged(Opcode.WRITE, wr.rkey, wr.remote_addr, payload, work=work)
        return self._write_with_imm(work, payload, solicited)

    def _gather(self, sg_list) -> bytes:
        parts = []
        for sge in sg_list:
            region = self._table.check(sge.lkey, sge.addr, sge.length, Access(0), self.qp.pd)
            parts.append(region.view(sge.addr, sge.length))
        return b"".join(parts)

    def _start_request(self, work: Work, op: WrOpcode, what: str) -> Iterator[bytes] | None:
        wr = work.wr
        sge = wr.sg_list[0] if wr.sg_list else None
        if sge is not None and sge.length:
            try:
                self._table.check(sge.lkey, sge.addr, sge.length, Access.LOCAL_WRITE,
                                  self.qp.pd)
            except AccessError as error:
                self._local_error(work, f"{what}: {error}")
                return None
        msn = self._take_msn(Queue.READ_REQUEST)
        if op == WrOpcode.RDMA_READ:
            size = sge.length if sge else 0
            sink_stag, sink_to = (sge.lkey, sge.addr) if sge else (0, 0)
            header = ReadRequest(sink_stag, sink_to, size, wr.rkey, wr.remote_addr)
            self._outstanding.append(_Outstanding(work, msn, sink_stag, sink_to, size))
            segment = Segment(Opcode.READ_REQUEST, msn=msn, header=header)
        else:
            request_id = self._next_request_id
            self._next_request_id = (request_id + 1) & _U32
            if op == WrOpcode.ATOMIC_FETCH_AND_ADD:
                header = AtomicRequest.fetch_add(request_id, wr.rkey, wr.remote_addr,
                                                 wr.compare_add)
            elif op == WrOpcode.MASKED_ATOMIC_FETCH_AND_ADD:
                header = AtomicRequest.fetch_add(request_id, wr.rkey, wr.remote_addr,
                                                 wr.compare_add, wr.compare_add_mask)
            elif op == WrOpcode.ATOMIC_CMP_AND_SWP:
                header = AtomicRequest.cmp_swap(request_id, wr.rkey, wr.remote_addr,
                                                wr.compare_add, wr.swap)
            else:
                header = AtomicRequest.cmp_swap(request_id, wr.rkey, wr.remote_addr,
                                                wr.compare_add, wr.swap, wr.compare_add_mask,
                                                wr.swap_mask)
            self._outstanding.append(_Outstanding(work, msn, sge.lkey, sge.addr, 8,
                                                  request_id=request_id))
            segment = Segment(Opcode.ATOMIC_REQUEST, msn=msn, header=header)
        return iter((segment.encode(),))

    def _untagged(self, opcode: Opcode, payload: bytes, *, inv_stag: int = 0,
                  work: Work | None = None) -> Iterator[bytes]:
        """The segments of an untagged message on queue 0; ``work`` completes as the last
        one is handed over."""
        msn = self._take_msn(Queue.SEND)
        step, total, offset = self._max_untagged, len(payload), 0
        while True:
            chunk = payload[offset:offset + step]
            last = offset + len(chunk) >= total
            segment = Segment(opcode, chunk, last, msn=msn, mo=offset, inv_stag=inv_stag)
            if last and work is not None:
                self.qp.finish(work)
            yield segment.encode()
            offset += len(chunk)
            if last:
                return

    def _tagged(self, opcode: Opcode, stag: int, to: int, payload: bytes, *,
                work: Work | None = None, done: Callable[[], None] | None = None
                ) -> Iterator[bytes]:
        """The segments of a Write or Read Response; ``work`` completes, ``done`` runs, as
        the last one is handed over."""
        step, total, offset = self._max_tagged, len(payload), 0
        while True:
            chunk = payload[offset:offset + step]
            last = offset + len(chunk) >= total
            segment = Segment(opcode, chunk, last, stag=stag, to=(to + offset) & _U64)
            if last:
                if work is not None:
                    self.qp.finish(work)
                if done is not None:
                    done()
            yield segment.encode()
            offset += len(chunk)
            if last:
                return

    def _immediate(self, imm_data: int, solicited: bool, *, work: Work) -> Iterator[bytes]:
        opcode = Opcode.IMMEDIATE_DATA_SE if solicited else Opcode.IMMEDIATE_DATA
        segment = Segment(opcode, msn=self._take_msn(Queue.SEND),
                          header=ImmediateData(imm_data.to_bytes(8, "big")))
        self.qp.finish(work)
        yield segment.encode()

    def _write_with_imm(self, work: Work, payload: bytes, solicited: bool) -> Iterator[bytes]:
        """RFC 7306 section 6: an RDMA Write, then Immediate Data."""
        wr = work.wr
        yield from self._tagged(Opcode.WRITE, wr.rkey, wr.remote_addr, payload)
        yield from self._immediate(wr.imm_data, solicited, work=work)

    def _local_error(self, work: Work, reason: str) -> None:
        """A request's own local buffer is bad: it fails, the stream ends with a Terminate."""
        self.qp.finish(work, WcStatus.LOC_PROT_ERR)
        self._protocol_error(ErrorCode.RDMAP_LOCAL_CATASTROPHIC, None, reason)

    def _local_sq_error(self, work: Work, status: WcStatus, reason: str) -> None:
        self.qp.finish(work, status)
        self.qp.to_sq_error(reason)

    # -- receive side -------------------------------------------------------------------------

    def _on_ulpdu(self, ulpdu: bytes) -> None:
        self.stats["fpdus_rx"] += 1
        if self.state == ConnState.AWAIT_RTR:
            self._on_rtr(ulpdu)
            return
        self._tx_held = False  # the initiator spoke first (RFC 5044 7.1.2)
        try:
            segment = decode_segment(ulpdu)
        except WireError as error:
            self._protocol_error(error_code_for(error), ulpdu, f"bad DDP segment: {error}")
            return
        handler = {
            Opcode.WRITE: self._on_write,
            Opcode.READ_RESPONSE: self._on_read_response,
            Opcode.READ_REQUEST: self._on_read_request,
            Opcode.ATOMIC_REQUEST: self._on_atomic_request,
            Opcode.ATOMIC_RESPONSE: self._on_atomic_response,
            Opcode.TERMINATE: self._on_terminate,
        }.get(segment.opcode, self._on_untagged)
        handler(segment, ulpdu)

    def _on_rtr(self, ulpdu: bytes) -> None:
        """RFC 6581 section 7: the first FPDU must be the RTR message agreed on."""
        try:
            segment = decode_segment(ulpdu)
        except WireError:
            segment = None
        expected = {Rtr.SEND: Opcode.SEND, Rtr.WRITE: Opcode.WRITE,
                    Rtr.READ: Opcode.READ_REQUEST}[self.rtr]
        if segment is None or segment.opcode != expected or segment.payload or (
                expected == Opcode.READ_REQUEST and segment.header.size) or (
                expected != Opcode.WRITE and segment.msn != 1):
            self._protocol_error(ErrorCode.MPA_NO_MATCHING_RTR, ulpdu,
                                 f"expected a zero-length {self.rtr.value} as the RTR")
            return
        if expected == Opcode.SEND:
            self._rx_msn[Queue.SEND] += 1
        elif expected == Opcode.READ_REQUEST:
            self._rx_msn[Queue.READ_REQUEST] += 1
            header = segment.header
            self._responses.append(self._tagged(Opcode.READ_RESPONSE, header.sink_stag,
                                                header.sink_to, b""))
        self._tx_held = False
        self._established()

    def _on_write(self, segment: Segment, ulpdu: bytes) -> None:
        payload = segment.payload
        if not payload:
            return  # zero length: nothing to check or place
        try:
            region = self._table.check(segment.stag, segment.to, len(payload),
                                       Access.REMOTE_WRITE, self.qp.pd)
        except AccessError as error:
            self._protocol_error(_code_of(_TAGGED_CODES, error), ulpdu, f"RDMA Write: {error}")
            return
        region.view(segment.to, len(payload))[:] = payload

    def _on_read_response(self, segment: Segment, ulpdu: bytes) -> None:
        head = self._outstanding[0] if self._outstanding else None
        if head is None or head.request_id is not None:
            self._protocol_error(ErrorCode.RDMAP_UNEXPECTED_OPCODE, ulpdu,
                                 "RDMA Read Response without a Read outstanding")
            return
        payload = segment.payload
        if payload:
            n = len(payload)
            if segment.stag != head.sink_stag:
                self._protocol_error(ErrorCode.DDP_TAGGED_INVALID_STAG, ulpdu,
                                     f"Read Response to STag {segment.stag:#x}, the Read "
                                     f"named {head.sink_stag:#x}")
                return
            if segment.to != head.sink_to + head.received or head.received + n > head.size:
                self._protocol_error(ErrorCode.DDP_TAGGED_BASE_BOUNDS, ulpdu,
                                     f"Read Response at TO {segment.to:#x}+{n} outside the "
                                     f"sink {head.sink_to:#x}+{head.size} (or out of order)")
                return
            try:
                region = self._table.check(segment.stag, segment.to, n, Access.LOCAL_WRITE,
                                           self.qp.pd)
            except AccessError as error:
                if head.work is not None:
                    self.qp.finish(head.work, WcStatus.LOC_PROT_ERR)
                self._protocol_error(_code_of(_TAGGED_CODES, error), ulpdu,
                                     f"Read Response: {error}")
                return
            region.view(segment.to, n)[:] = payload
            head.received += n
        if not segment.last:
            return
        if head.received != head.size:
            self._protocol_error(ErrorCode.RDMAP_CATASTROPHIC_STREAM, ulpdu,
                                 f"Read Response of {head.received} bytes for {head.size}")
            return
        self._outstanding.popleft()
        if head.work is not None:
            self.qp.finish(head.work)

    def _check_queue(self, segment: Segment, ulpdu: bytes, queue: Queue) -> bool:
        """MSN of a single-segment message on ``queue``: must be the next one."""
        if segment.msn != self._rx_msn[queue]:
            self._protocol_error(ErrorCode.DDP_UNTAGGED_INVALID_MSN_RANGE, ulpdu,
                                 f"MSN {segment.msn} on queue {int(queue)}, expected "
                                 f"{self._rx_msn[queue]}")
            return False
        return True

    def _check_ird(self, segment: Segment, ulpdu: bytes) -> bool:
        if not self._check_queue(segment, ulpdu, Queue.READ_REQUEST):
            return False
        if self._ird_used >= self.ird:
            self._protocol_error(ErrorCode.DDP_UNTAGGED_INVALID_MSN_RANGE, ulpdu,
                                 f"{segment.opcode.name} beyond the IRD of {self.ird}")
            return False
        self._rx_msn[Queue.READ_REQUEST] = (segment.msn + 1) & _U32
        return True

    def _on_read_request(self, segment: Segment, ulpdu: bytes) -> None:
        if not self._check_ird(segment, ulpdu):
            return
        request: ReadRequest = segment.header
        data = b""
        if request.size:
            try:
                region = self._table.check(request.src_stag, request.src_to, request.size,
                                           Access.REMOTE_READ, self.qp.pd)
            except AccessError as error:
                self._protocol_error(_code_of(_SOURCE_CODES, error), ulpdu,
                                     f"RDMA Read Request: {error}")
                return
            if request.sink_to + request.size > _U64 + 1:
                self._protocol_error(ErrorCode.RDMAP_TO_WRAP, ulpdu,
                                     "RDMA Read Request: the sink TO wraps")
                return
            data = bytes(region.view(request.src_to, request.size))
        self._ird_used += 1
        self._responses.append(self._tagged(Opcode.READ_RESPONSE, request.sink_stag,
                                            request.sink_to, data, done=self._release_ird))

    def _release_ird(self) -> None:
        self._ird_used -= 1

    def _on_atomic_request(self, segment: Segment, ulpdu: bytes) -> None:
        if not self._check_ird(segment, ulpdu):
            return
        request: AtomicRequest = segment.header
        try:
            region = self._table.check(request.stag, request.to, 8, Access.REMOTE_ATOMIC,
                                       self.qp.pd)
        except AccessError as error:
            self._protocol_error(_code_of(_SOURCE_CODES, error), ulpdu,
                                 f"Atomic Request: {error}")
            return
        if request.to % 8:
            self._protocol_error(ErrorCode.RDMAP_OPERATION_UNSPECIFIED, ulpdu,
                                 f"Atomic Request: TO {request.to:#x} is not 8-byte aligned")
            return
        view = region.view(request.to, 8)
        original = int.from_bytes(view, "little")
        view[:] = _atomic_result(request, original).to_bytes(8, "little")
        response = Segment(Opcode.ATOMIC_RESPONSE, msn=self._take_msn(Queue.ATOMIC_RESPONSE),
                           header=AtomicResponse(request.request_id, original))
        self._ird_used += 1
        self._responses.append(self._single(response.encode(), self._release_ird))

    def _single(self, ulpdu: bytes, done: Callable[[], None]) -> Iterator[bytes]:
        done()
        yield ulpdu

    def _on_atomic_response(self, segment: Segment, ulpdu: bytes) -> None:
        if not self._check_queue(segment, ulpdu, Queue.ATOMIC_RESPONSE):
            return
        response: AtomicResponse = segment.header
        head = self._outstanding[0] if self._outstanding else None
        if head is None or head.request_id != response.request_id:
            self._protocol_error(ErrorCode.RDMAP_UNEXPECTED_OPCODE, ulpdu,
                                 f"Atomic Response to request {response.request_id}, "
                                 "not the one outstanding")
            return
        self._rx_msn[Queue.ATOMIC_RESPONSE] = (segment.msn + 1) & _U32
        try:
            region = self._table.check(head.sink_stag, head.sink_to, 8, Access.LOCAL_WRITE,
                                       self.qp.pd)
        except AccessError as error:
            self.qp.finish(head.work, WcStatus.LOC_PROT_ERR)
            self._protocol_error(ErrorCode.RDMAP_LOCAL_CATASTROPHIC, None,
                                 f"Atomic Response: {error}")
            return
        region.view(head.sink_to, 8)[:] = response.value.to_bytes(8, "little")
        self._outstanding.popleft()
        self.qp.finish(head.work)

    def _on_untagged(self, segment: Segment, ulpdu: bytes) -> None:
        """Send, Send with SE and/or Invalidate, Immediate Data: queue 0."""
        expected = self._rx_msn[Queue.SEND]
        if segment.msn != expected:
            self._protocol_error(ErrorCode.DDP_UNTAGGED_INVALID_MSN_RANGE, ulpdu,
                                 f"MSN {segment.msn} on queue 0, expected {expected}")
            return
        rx = self._rx
        if rx is None:
            if segment.mo:
                self._protocol_error(ErrorCode.DDP_UNTAGGED_INVALID_MO, ulpdu,
                                     f"MO {segment.mo} starts message {segment.msn}")
                return
            rx = self._begin_receive(segment, ulpdu)
            if rx is None:
                return
        elif segment.mo != rx.received:
            self._protocol_error(ErrorCode.DDP_UNTAGGED_INVALID_MO, ulpdu,
                                 f"MO {segment.mo}, expected {rx.received}")
            return
        if segment.opcode in (Opcode.IMMEDIATE_DATA, Opcode.IMMEDIATE_DATA_SE):
            imm = int.from_bytes(segment.header.data, "big")
            self._finish_receive(segment, imm_data=imm)
            return
        payload = segment.payload
        if rx.received + len(payload) > rx.capacity:
            self._rx = None
            self.qp.complete_recv(rx.wr, WcStatus.LOC_LEN_ERR, byte_len=rx.received)
            self._protocol_error(ErrorCode.DDP_UNTAGGED_MESSAGE_TOO_LONG, ulpdu,
                                 f"message of at least {rx.received + len(payload)} bytes "
                                 f"for a receive of {rx.capacity}")
            return
        _scatter(rx.regions, rx.received, payload)
        rx.received += len(payload)
        if segment.last:
            inv = segment.inv_stag if segment.opcode in _INVALIDATE_OPCODES else None
            self._finish_receive(segment, invalidated=inv)

    def _begin_receive(self, segment: Segment, ulpdu: bytes) -> _Receive | None:
        """The first segment of a message: a receive, its buffers and the STag to invalidate
        are all checked before anything is placed."""
        wr = self.qp.take_recv()
        if wr is None:
            self._protocol_error(ErrorCode.DDP_UNTAGGED_INVALID_MSN_NO_BUFFER, ulpdu,
                                 f"message {segment.msn} on queue 0, no receive posted")
            return None
        regions = []
        for sge in wr.sg_list:
            try:
                region = self._table.check(sge.lkey, sge.addr, sge.length, Access.LOCAL_WRITE,
                                           self.qp.pd)
            except AccessError as error:
                self.qp.complete_recv(wr, WcStatus.LOC_PROT_ERR)
                self._protocol_error(ErrorCode.RDMAP_LOCAL_CATASTROPHIC, None,
                                     f"receive wr_id {wr.wr_id}: {error}")
                return None
            regions.append((region, sge.addr, sge.length))
        if segment.opcode in _INVALIDATE_OPCODES:
            try:
                self._table.invalidate(segment.inv_stag, self.qp.pd)
            except AccessError as error:
                code = (ErrorCode.RDMAP_OPERATION_CANNOT_INVALIDATE
                        if isinstance(error, InvalidStag)
                        else ErrorCode.RDMAP_PROTECTION_CANNOT_INVALIDATE)
                self._protocol_error(code, ulpdu, f"Send with Invalidate: {error}")
                return None
        self._rx = _Receive(wr, regions, sum(length for _r, _a, length in regions))
        return self._rx

    def _finish_receive(self, segment: Segment, *, imm_data: int | None = None,
                        invalidated: int | None = None) -> None:
        rx, self._rx = self._rx, None
        self._rx_msn[Queue.SEND] = (segment.msn + 1) & _U32
        self.qp.complete_recv(rx.wr, WcStatus.SUCCESS, byte_len=rx.received,
                              imm_data=imm_data, invalidated=invalidated,
                              solicited=segment.opcode in _SE_OPCODES)

    def _on_terminate(self, segment: Segment, _ulpdu: bytes) -> None:
        """RFC 5040 5.5 and 6: the peer ended the stream. The Read or atomic it names fails
        with the remote status of the error; everything else is flushed."""
        terminate: Terminate = segment.header
        self.terminate_received = terminate
        header = terminate.ddp_header
        if len(header) == UNTAGGED_HEADER_SIZE and not header[0] & 0x80:
            qn, msn = int.from_bytes(header[6:10], "big"), int.from_bytes(header[10:14], "big")
            for entry in self._outstanding:
                if qn == Queue.READ_REQUEST and entry.msn == msn and entry.work is not None:
                    self.qp.finish(entry.work, _remote_status(terminate))
        self._end(ConnState.TERMINATED, f"the peer sent Terminate {terminate.layer}/"
                                        f"{terminate.etype}/{terminate.ecode:#04x}")
        if self.on_terminated is not None:
            self.on_terminated(self, terminate, False)

    def _protocol_error(self, code: ErrorCode, ulpdu: bytes | None, reason: str) -> None:
        """Send the Terminate for ``code`` about ``ulpdu``, enter ERR, flush (RFC 5040 7)."""
        terminate = Terminate.for_error(code, ulpdu)
        self.terminate_sent = terminate
        segment = Segment(Opcode.TERMINATE, msn=self._take_msn(Queue.TERMINATE),
                          header=terminate)
        self._terminate_ulpdu = segment.encode()
        self._end(ConnState.TERMINATED, reason)
        if self.on_terminated is not None:
            self.on_terminated(self, terminate, True)


def _remote_status(terminate: Terminate) -> WcStatus:
    """The completion status of a request the peer refused with ``terminate``."""
    if terminate.etype == 1 and terminate.layer in (Layer.RDMAP, Layer.DDP):
        return WcStatus.REM_ACCESS_ERR
    if terminate.layer == Layer.DDP and terminate.etype == 2:
        return WcStatus.REM_INV_REQ_ERR
    return WcStatus.REM_OP_ERR


def _scatter(regions: list, offset: int, payload: bytes) -> None:
    """Place ``payload`` at message offset ``offset`` across the receive's SGEs."""
    done = 0
    for region, addr, length in regions:
        if offset >= length:
            offset -= length
            continue
        n = min(length - offset, len(payload) - done)
        region.view(addr + offset, n)[:] = payload[done:done + n]
        done += n
        offset = 0
        if done == len(payload):
            return


def _atomic_result(request: AtomicRequest, original: int) -> int:
    """The value an RFC 7306 atomic leaves in memory (section 5.2.1).

    FetchAdd adds field by field: a set bit of the add mask ends a field (no carry out of
    it), so a zero mask is one 64-bit add. CmpSwap swaps the bits of the swap mask when the
    bits of the compare mask match.
    """
    if request.op == AtomicOp.CMP_SWAP:
        if (original ^ request.compare_data) & request.compare_mask:
            return original
        mask = request.add_swap_mask
        return (original & ~mask & _U64) | (request.add_swap_data & mask)
    result, start, mask = 0, 0, request.add_swap_mask
    for bit in range(64):
        if mask >> bit & 1 or bit == 63:
            field = ((1 << (bit - start + 1)) - 1) << start
            result |= ((original & field) + (request.add_swap_data & field)) & field
            start = bit + 1
    return result
