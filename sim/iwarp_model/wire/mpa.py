"""MPA Startup Phase: Request/Reply frames, RFC 5044 section 7.1 with RFC 6581 sections 6 and 9.

Frame layout (RFC 5044 figure 8, RFC 6581 figure 2)::

    0      16-byte key: "MPA ID Req Frame" or "MPA ID Rep Frame"
    16     M C R S Res(4) | Rev (8) | PD_Length (16)
    20     private data, PD_Length bytes (at most 512)

* M: the sender requires markers in the FPDUs its peer sends (per direction, see
  :func:`negotiate`). C: the sender prefers CRCs; CRCs are used when either side sets it.
  R: in a Reply, the responder rejects the connection (ignored in a Request).
* S (RFC 6581 "enhanced"; Linux siw calls it ``MPA_RR_FLAG_ENHANCED``): the private data begins
  with the 4-byte :class:`EnhancedData` (IRD, ORD, peer-to-peer and RTR flags). S needs Rev 2.
* Rev: 1 for RFC 5044, 2 for RFC 6581. Both are accepted; others are an error.
* The other Res bits are sent as zero and not checked (RFC 5044 7.1.1).

:class:`MpaFrameReader` assembles one frame from TCP pieces and says how many more bytes it needs.
"""

import struct
from dataclasses import dataclass

from .errors import BadFieldError, BadKeyError, BadVersionError, OversizeError, TruncatedError

__all__ = [
    "KEY_REQUEST",
    "KEY_REPLY",
    "HEADER_SIZE",
    "MAX_PRIVATE_DATA",
    "EnhancedData",
    "MpaFrame",
    "MpaFrameReader",
    "Negotiated",
    "negotiate",
    "reject",
]

KEY_REQUEST = b"MPA ID Req Frame"
KEY_REPLY = b"MPA ID Rep Frame"
HEADER_SIZE = 20
MAX_PRIVATE_DATA = 512  # RFC 5044 7.1.1, including RFC 6581's 4 bytes (RFC 6581 section 7)
REVISIONS = (1, 2)

_FLAG_M, _FLAG_C, _FLAG_R, _FLAG_S = 0x80, 0x40, 0x20, 0x10
_HEADER = struct.Struct("!16sBBH")

_IRD_ORD_MAX = 0x3FFF
_FLAG_P2P = 0x8000  # A, in the IRD half-word
_FLAG_RTR_SEND = 0x4000  # B, in the IRD half-word
_FLAG_RTR_WRITE = 0x8000  # C, in the ORD half-word
_FLAG_RTR_READ = 0x4000  # D, in the ORD half-word
_ENHANCED = struct.Struct("!HH")


@dataclass(frozen=True)
class EnhancedData:
    """RFC 6581 section 9: the 32 bits at the start of the private data when S is set.

    ``|A|B| IRD (14) |C|D| ORD (14) |``: A peer-to-peer model; B, C, D offer (initiator) or accept
    (responder) a zero-length Send, RDMA Write or RDMA Read as the RTR indication.
    """

    ird: int
    ord: int
    peer_to_peer: bool = False
    rtr_send: bool = False
    rtr_write: bool = False
    rtr_read: bool = False

    SIZE = 4

    def __post_init__(self):
        for name in ("ird", "ord"):
            value = getattr(self, name)
            if not 0 <= value <= _IRD_ORD_MAX:
                raise BadFieldError(name.upper(), value, "a 14-bit count")
        if not self.peer_to_peer and (self.rtr_send or self.rtr_write or self.rtr_read):
            raise BadFieldError("A", 0, "RTR flags need the peer-to-peer flag (RFC 6581 9.2)")

    def encode(self) -> bytes:
        ird = self.ird | (_FLAG_P2P if self.peer_to_peer else 0)
        ird |= _FLAG_RTR_SEND if self.rtr_send else 0
        ord_ = self.ord | (_FLAG_RTR_WRITE if self.rtr_write else 0)
        ord_ |= _FLAG_RTR_READ if self.rtr_read else 0
        return _ENHANCED.pack(ird, ord_)

    @classmethod
    def decode(cls, data: bytes) -> "EnhancedData":
        """From the first 4 bytes of ``data``; with A clear, B, C, D are ignored (RFC 6581 9.2)."""
        if len(data) < cls.SIZE:
            raise TruncatedError("RFC 6581 enhanced data", cls.SIZE, len(data))
        ird, ord_ = _ENHANCED.unpack_from(data)
        p2p = bool(ird & _FLAG_P2P)
        return cls(
            ird=ird & _IRD_ORD_MAX,
            ord=ord_ & _IRD_ORD_MAX,
            peer_to_peer=p2p,
            rtr_send=p2p and bool(ird & _FLAG_RTR_SEND),
            rtr_write=p2p and bool(ord_ & _FLAG_RTR_WRITE),
            rtr_read=p2p and bool(ord_ & _FLAG_RTR_READ),
        )


@dataclass(frozen=True)
class MpaFrame:
    """An MPA Request (``reply=False``) or Reply (``reply=True``) frame.

    ``enhanced`` is the RFC 6581 data (the S bit is set exactly when it is given);
    ``private_data`` is the ULP's private data that follows it.
    """

    reply: bool
    markers: bool = False
    crc: bool = False
    reject: bool = False
    revision: int = 2
    enhanced: EnhancedData | None = None
    private_data: bytes = b""

    def __post_init__(self):
        if self.revision not in REVISIONS:
            raise BadVersionError("Rev", self.revision, "MPA revision 1 or 2")
        if self.enhanced is not None and self.revision < 2:
            raise BadFieldError("S", 1, "enhanced connection setup needs Rev 2 (RFC 6581 6)")
        if self.reject and not self.reply:
            raise BadFieldError("R", 1, "only a Reply rejects")
        if self.pd_length > MAX_PRIVATE_DATA:
            raise OversizeError("PD_Length", self.pd_length, f"at most {MAX_PRIVATE_DATA}")

    @property
    def pd_length(self) -> int:
        """PD_Length: the whole private data, the RFC 6581 data included."""
        return len(self.private_data) + (EnhancedData.SIZE if self.enhanced else 0)

    def encode(self) -> bytes:
        flags = (_FLAG_M if self.markers else 0) | (_FLAG_C if self.crc else 0)
        flags |= (_FLAG_R if self.reject else 0) | (_FLAG_S if self.enhanced else 0)
        key = KEY_REPLY if self.reply else KEY_REQUEST
        head = _HEADER.pack(key, flags, self.revision, self.pd_length)
        return head + (self.enhanced.encode() if self.enhanced else b"") + self.private_data

    @classmethod
    def decode(cls, data: bytes, *, reply: bool | None = None) -> "MpaFrame":
        """Decode exactly one frame. ``reply`` (if not None) is the frame kind expected."""
        if len(data) < HEADER_SIZE:
            raise TruncatedError("MPA frame header", HEADER_SIZE, len(data))
        key, flags, revision, pd_length = _HEADER.unpack_from(data)
        is_reply = _check_key(key, reply)
        if revision not in REVISIONS:
            raise BadVersionError("Rev", revision, "MPA revision 1 or 2")
        if pd_length > MAX_PRIVATE_DATA:
            raise OversizeError("PD_Length", pd_length, f"at most {MAX_PRIVATE_DATA}")
        if len(data) < HEADER_SIZE + pd_length:
            raise TruncatedError("MPA frame private data", HEADER_SIZE + pd_length, len(data))
        if len(data) > HEADER_SIZE + pd_length:
            raise BadFieldError("PD_Length", pd_length, f"frame has {len(data) - HEADER_SIZE}")
        private = bytes(data[HEADER_SIZE:])
        enhanced = None
        if flags & _FLAG_S:
            if revision < 2:
                raise BadFieldError("S", 1, "enhanced connection setup needs Rev 2")
            if pd_length < EnhancedData.SIZE:
                raise BadFieldError("PD_Length", pd_length, "S set, no room for IRD/ORD")
            enhanced = EnhancedData.decode(private)
            private = private[EnhancedData.SIZE:]
        return cls(
            reply=is_reply,
            markers=bool(flags & _FLAG_M),
            crc=bool(flags & _FLAG_C),
            reject=is_reply and bool(flags & _FLAG_R),
            revision=revision,
            enhanced=enhanced,
            private_data=private,
        )


def _check_key(key: bytes, reply: bool | None) -> bool:
    """True for a Reply key, False for a Request key; :class:`BadKeyError` otherwise."""
    allowed = {None: (KEY_REQUEST, KEY_REPLY), False: (KEY_REQUEST,), True: (KEY_REPLY,)}[reply]
    if bytes(key) not in allowed:
        raise BadKeyError("Key", bytes(key), f"expected {' or '.join(map(repr, allowed))}")
    return bytes(key) == KEY_REPLY


class MpaFrameReader:
    """Assemble one MPA frame from the pieces TCP delivers.

    :meth:`feed` returns ``None`` until the frame is complete, then the frame; :attr:`needed`
    is the number of bytes still missing (20 minus what arrived until PD_Length is known).
    Bytes after the frame (the first FPDU may share its segment) are kept in :attr:`leftover`.
    The key, revision and PD_Length are checked as soon as they arrive.
    """

    def __init__(self, *, reply: bool):
        self.reply = reply
        self._key = KEY_REPLY if reply else KEY_REQUEST
        self._buf = bytearray()
        self._total: int | None = None
        self.frame: MpaFrame | None = None
        self.leftover = b""

    @property
    def needed(self) -> int:
        if self.frame is not None:
            return 0
        return (self._total if self._total is not None else HEADER_SIZE) - len(self._buf)

    def feed(self, data: bytes) -> MpaFrame | None:
        if self.frame is not None:
            raise ValueError("the MPA frame is already complete; pass further bytes on")
        self._buf += data
        head = bytes(self._buf[: len(self._key)])
        if not self._key.startswith(head):
            raise BadKeyError("Key", head, f"expected {self._key!r}")
        if self._total is None and len(self._buf) >= HEADER_SIZE:
            _key, _flags, revision, pd_length = _HEADER.unpack_from(self._buf)
            if revision not in REVISIONS:
                raise BadVersionError("Rev", revision, "MPA revision 1 or 2")
            if pd_length > MAX_PRIVATE_DATA:
                raise OversizeError("PD_Length", pd_length, f"at most {MAX_PRIVATE_DATA}")
            self._total = HEADER_SIZE + pd_length
        if self._total is None or len(self._buf) < self._total:
            return None
        self.frame = MpaFrame.decode(bytes(self._buf[: self._total]), reply=self.reply)
        self.leftover = bytes(self._buf[self._total:])
        self._buf.clear()
        return self.frame


@dataclass(frozen=True)
class Negotiated:
    """What a Request/Reply exchange settled (RFC 5044 7.1.1, RFC 6581 9).

    Markers are per direction: the M bit of the Request asks for markers in the FPDUs the
    responder sends, the M bit of the Reply for markers in those the initiator sends.
    ``rtr_*`` are the RTR indications both sides offered (peer-to-peer model only).
    """

    crc: bool
    markers_from_initiator: bool
    markers_from_responder: bool
    revision: int
    peer_to_peer: bool = False
    rtr_send: bool = False
    rtr_write: bool = False
    rtr_read: bool = False

    def tx_markers(self, *, initiator: bool) -> bool:
        """Whether the given end inserts markers in what it sends."""
        return self.markers_from_initiator if initiator else self.markers_from_responder

    def rx_markers(self, *, initiator: bool) -> bool:
        """Whether the given end finds markers in what it receives."""
        return self.markers_from_responder if initiator else self.markers_from_initiator


def negotiate(request: MpaFrame, reply: MpaFrame) -> Negotiated:
    """The connection parameters after ``request`` and ``reply`` (whose R bit is not looked at).

    CRC is used when either side sets C. The revision is the Reply's. The peer-to-peer model
    and RTR options need the RFC 6581 data in both frames (and A set in both).
    """
    if request.reply or not reply.reply:
        raise ValueError("negotiate() takes a Request and then a Reply")
    mine, theirs = request.enhanced, reply.enhanced
    p2p = bool(mine and theirs and mine.peer_to_peer and theirs.peer_to_peer)
    return Negotiated(
        crc=request.crc or reply.crc,
        markers_from_initiator=reply.markers,
        markers_from_responder=request.markers,
        revision=reply.revision,
        peer_to_peer=p2p,
        rtr_send=p2p and mine.rtr_send and theirs.rtr_send,
        rtr_write=p2p and mine.rtr_write and theirs.rtr_write,
        rtr_read=p2p and mine.rtr_read and theirs.rtr_read,
    )


def reject(request: MpaFrame, reason: bytes = b"", *, ird: int = 0, ord: int = 0) -> MpaFrame:
    """A Reply rejecting ``request``, carrying ``reason`` as private data.

    Same revision as the request; enhanced exactly when the request was (RFC 6581 section 10),
    then with ``ird``/``ord`` (e.g. the ORD the responder would need, RFC 6581 9.1) and the
    request's connection model and RTR flags mirrored.
    """
    enhanced = None
    if request.enhanced is not None:
        asked = request.enhanced
        enhanced = EnhancedData(
            ird=ird,
            ord=ord,
            peer_to_peer=asked.peer_to_peer,
            rtr_send=asked.rtr_send,
            rtr_write=asked.rtr_write,
            rtr_read=asked.rtr_read,
        )
    return MpaFrame(
        reply=True,
        crc=request.crc,
        reject=True,
        revision=request.revision,
        enhanced=enhanced,
        private_data=reason,
    )
