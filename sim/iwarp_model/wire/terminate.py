"""The RDMAP Terminate header, RFC 5040 section 4.8, and the error registry of RFC 6580 section 3.

Terminate header (RFC 5040 figures 7 and 8), after an untagged DDP header on queue 2::

    Layer (4) | EType (4) | Error Code (8) | M | D | R | Reserved (13)
    DDP Segment Length (16)        present when D (or M) is set; valid when M is set
    Terminated DDP Header          14 or 18 bytes (its T bit tells which), when D is set
    Terminated RDMA Header         28 bytes, a copy of an RDMA Read Request header, when R is set

The copies are kept as bytes: they are whatever arrived, possibly malformed (the error may be in
them), and :class:`~.ddp.TaggedHeader`/:class:`~.rdmap.ReadRequest` decode them when wanted.
RFC 5040 4.8 sends the RDMA header back only for RDMA Read Requests; Linux siw also sets R for
protection errors on Sends with Invalidate but attaches no RDMA header, so a decoder given R with
a terminated DDP header of any other opcode reads no RDMA header.

:class:`ErrorCode` lists every Layer/EType/Error Code of the RFC 6580 registries (from RFC 5040
figure 9, RFC 5041 7.2 and RFC 5044 section 8) plus the three MPA codes of RFC 6581 section 8.
:func:`error_code_for` picks the code for a decoder's :class:`~.errors.WireError`.
"""

import enum
import struct
from dataclasses import dataclass

from .ddp import TAGGED_HEADER_SIZE, UNTAGGED_HEADER_SIZE
from .errors import (
    BadFieldError,
    BadKeyError,
    BadVersionError,
    CrcError,
    MarkerError,
    TruncatedError,
    WireError,
)

__all__ = [
    "Layer",
    "ErrorCode",
    "Terminate",
    "error_code_for",
    "TERMINATED_RDMA_HEADER_SIZE",
]

TERMINATED_RDMA_HEADER_SIZE = 28  # an RDMA Read Request header
_READ_REQUEST_OPCODE = 0x1
_CONTROL = struct.Struct("!I")
_SEGMENT_LENGTH = struct.Struct("!H")
_M, _D, _R = 1 << 15, 1 << 14, 1 << 13


class Layer(enum.IntEnum):
    RDMAP = 0
    DDP = 1
    LLP = 2  # MPA over TCP


class ErrorCode(enum.Enum):
    """(layer, error type, error code) of each registered error.

    RDMAP Local Catastrophic Error has no code in the registry ("ALL": any value); it is sent
    with 0 and :meth:`lookup` maps any code of that type to it.
    """

    RDMAP_LOCAL_CATASTROPHIC = (0, 0, 0x00)
    RDMAP_INVALID_STAG = (0, 1, 0x00)
    RDMAP_BASE_BOUNDS = (0, 1, 0x01)
    RDMAP_ACCESS_RIGHTS = (0, 1, 0x02)
    RDMAP_STAG_NOT_ASSOCIATED = (0, 1, 0x03)
    RDMAP_TO_WRAP = (0, 1, 0x04)
    RDMAP_PROTECTION_CANNOT_INVALIDATE = (0, 1, 0x09)
    RDMAP_PROTECTION_UNSPECIFIED = (0, 1, 0xFF)
    RDMAP_INVALID_VERSION = (0, 2, 0x05)
    RDMAP_UNEXPECTED_OPCODE = (0, 2, 0x06)
    RDMAP_CATASTROPHIC_STREAM = (0, 2, 0x07)
    RDMAP_CATASTROPHIC_GLOBAL = (0, 2, 0x08)
    RDMAP_OPERATION_CANNOT_INVALIDATE = (0, 2, 0x09)
    RDMAP_OPERATION_UNSPECIFIED = (0, 2, 0xFF)
    DDP_LOCAL_CATASTROPHIC = (1, 0, 0x00)
    DDP_TAGGED_INVALID_STAG = (1, 1, 0x00)
    DDP_TAGGED_BASE_BOUNDS = (1, 1, 0x01)
    DDP_TAGGED_STAG_NOT_ASSOCIATED = (1, 1, 0x02)
    DDP_TAGGED_TO_WRAP = (1, 1, 0x03)
    DDP_TAGGED_INVALID_VERSION = (1, 1, 0x04)
    DDP_UNTAGGED_INVALID_QN = (1, 2, 0x01)
    DDP_UNTAGGED_INVALID_MSN_NO_BUFFER = (1, 2, 0x02)
    DDP_UNTAGGED_INVALID_MSN_RANGE = (1, 2, 0x03)
    DDP_UNTAGGED_INVALID_MO = (1, 2, 0x04)
    DDP_UNTAGGED_MESSAGE_TOO_LONG = (1, 2, 0x05)
    DDP_UNTAGGED_INVALID_VERSION = (1, 2, 0x06)
    MPA_TCP_CLOSED = (2, 0, 0x01)
    MPA_CRC = (2, 0, 0x02)
    MPA_MARKER = (2, 0, 0x03)
    MPA_INVALID_FRAME = (2, 0, 0x04)
    MPA_LOCAL_CATASTROPHIC = (2, 0, 0x05)  # RFC 6581
    MPA_INSUFFICIENT_IRD = (2, 0, 0x06)  # RFC 6581
    MPA_NO_MATCHING_RTR = (2, 0, 0x07)  # RFC 6581

    @property
    def layer(self) -> Layer:
        return Layer(self.value[0])

    @property
    def etype(self) -> int:
        return self.value[1]

    @property
    def ecode(self) -> int:
        return self.value[2]

    @classmethod
    def lookup(cls, layer: int, etype: int, ecode: int) -> "ErrorCode | None":
        """The registered error, or None (unassigned, including DDP's LLP-reserved type 3)."""
        if (layer, etype) == (Layer.RDMAP, 0):
            return cls.RDMAP_LOCAL_CATASTROPHIC
        try:
            return cls((layer, etype, ecode))
        except ValueError:
            return None


def _check(name: str, value: int, bits: int) -> None:
    if not 0 <= value < 1 << bits:
        raise BadFieldError(name, value, f"a {bits}-bit field")


@dataclass(frozen=True)
class Terminate:
    """A Terminate header. ``ddp_segment_length`` is None when M is clear; ``ddp_header`` and
    ``rdma_header`` are the copied headers (empty when D, respectively R, is clear)."""

    layer: int
    etype: int
    ecode: int
    ddp_segment_length: int | None = None
    ddp_header: bytes = b""
    rdma_header: bytes = b""

    def __post_init__(self):
        _check("Layer", self.layer, 4)
        _check("EType", self.etype, 4)
        _check("Error Code", self.ecode, 8)
        if self.ddp_segment_length is not None:
            _check("DDP Segment Length", self.ddp_segment_length, 16)
        if self.ddp_header and len(self.ddp_header) != _copy_size(self.ddp_header):
            raise BadFieldError("Terminated DDP Header", self.ddp_header.hex(), "wrong length")
        if len(self.rdma_header) not in (0, TERMINATED_RDMA_HEADER_SIZE):
            raise BadFieldError("Terminated RDMA Header", self.rdma_header.hex(), "wrong length")

    @property
    def code(self) -> ErrorCode | None:
        return ErrorCode.lookup(self.layer, self.etype, self.ecode)

    @property
    def error_bits(self) -> int:
        """Layer, error type and error code as the Terminate Control's first 16 bits carry
        them (RFC 5040 section 7.2), assigned or not."""
        return self.layer << 12 | self.etype << 8 | self.ecode

    @classmethod
    def for_error(cls, code: ErrorCode, offending: bytes | None = None) -> "Terminate":
        """The Terminate reporting ``code`` about the DDP segment ``offending`` (if known).

        Follows RFC 5040 figure 10: RDMAP Local Catastrophic errors (of any layer) and LLP errors
        carry no copies; the others carry the DDP segment length (M) and the DDP header (D);
        Remote Protection errors on an RDMA Read Request also carry its header (R).
        """
        layer, etype, ecode = code.value
        if not offending or etype == 0 or layer == Layer.LLP:
            return cls(layer, etype, ecode)
        size = _copy_size(offending)
        if len(offending) < size:
            return cls(layer, etype, ecode)
        rdma = b""
        if (layer, etype) == (Layer.RDMAP, 1) and _is_read_request(offending):
            rdma = bytes(offending[size : size + TERMINATED_RDMA_HEADER_SIZE])
            if len(rdma) < TERMINATED_RDMA_HEADER_SIZE:
                rdma = b""
        return cls(layer, etype, ecode, len(offending), bytes(offending[:size]), rdma)

    def encode(self) -> bytes:
        m, d = self.ddp_segment_length is not None, bool(self.ddp_header)
        control = self.layer << 28 | self.etype << 24 | self.ecode << 16
        control |= (_M if m else 0) | (_D if d else 0) | (_R if self.rdma_header else 0)
        out = _CONTROL.pack(control)
        if m or d:
            out += _SEGMENT_LENGTH.pack(self.ddp_segment_length or 0)
        return out + self.ddp_header + self.rdma_header

    @classmethod
    def decode(cls, data: bytes) -> "Terminate":
        """Decode a whole Terminate header (the ULP payload of a Terminate DDP segment)."""
        if len(data) < _CONTROL.size:
            raise TruncatedError("Terminate control", _CONTROL.size, len(data))
        control = _CONTROL.unpack_from(data)[0]
        offset = _CONTROL.size
        length = None
        if control & (_M | _D):
            if len(data) < offset + _SEGMENT_LENGTH.size:
                raise TruncatedError("Terminate DDP Segment Length", offset + 2, len(data))
            if control & _M:
                length = _SEGMENT_LENGTH.unpack_from(data, offset)[0]
            offset += _SEGMENT_LENGTH.size
        ddp = b""
        if control & _D:
            if len(data) <= offset:
                raise TruncatedError("Terminated DDP Header", offset + 1, len(data))
            size = _copy_size(data[offset:])
            if len(data) < offset + size:
                raise TruncatedError("Terminated DDP Header", offset + size, len(data))
            ddp = bytes(data[offset : offset + size])
            offset += size
        rdma = b""
        if control & _R and (not ddp or _is_read_request(ddp)):
            end = offset + TERMINATED_RDMA_HEADER_SIZE
            if len(data) < end:
                raise TruncatedError("Terminated RDMA Header", end, len(data))
            rdma = bytes(data[offset:end])
            offset = end
        if len(data) != offset:
            raise BadFieldError("Terminate", len(data), f"{len(data) - offset} trailing bytes")
        return cls(control >> 28, control >> 24 & 0xF, control >> 16 & 0xFF, length, ddp, rdma)


def _copy_size(header: bytes) -> int:
    """Size of the DDP header starting ``header``, from its T bit."""
    return TAGGED_HEADER_SIZE if header[0] & 0x80 else UNTAGGED_HEADER_SIZE


def _is_read_request(header: bytes) -> bool:
    """Whether this DDP header (its RsvdULP) is that of an RDMA Read Request."""
    return not header[0] & 0x80 and len(header) > 1 and header[1] & 0x0F == _READ_REQUEST_OPCODE


_FIELD_CODES = {
    "QN": ErrorCode.DDP_UNTAGGED_INVALID_QN,
    "MO": ErrorCode.DDP_UNTAGGED_INVALID_MO,
    "T": ErrorCode.RDMAP_UNEXPECTED_OPCODE,
    "Opcode": ErrorCode.RDMAP_UNEXPECTED_OPCODE,
    "AOpCode": ErrorCode.RDMAP_UNEXPECTED_OPCODE,
    "RV": ErrorCode.RDMAP_INVALID_VERSION,
}


def error_code_for(error: WireError) -> ErrorCode:
    """The Terminate code reporting a decoder's error.

    MPA: CRC (2/0/2), marker (2/0/3), anything wrong in a Request/Reply frame (2/0/4).
    DDP: bad DV is "Invalid DDP version" of the tagged or untagged type, a wrong QN "Invalid QN",
    a bad MO "Invalid MO". RDMAP: bad RV "Invalid RDMAP version", an unknown opcode or one sent
    with the wrong T flag "Unexpected OpCode". Anything else (a truncated or overlong segment)
    is "Catastrophic error, localized to RDMAP Stream".
    """
    if isinstance(error, CrcError):
        return ErrorCode.MPA_CRC
    if isinstance(error, MarkerError):
        return ErrorCode.MPA_MARKER
    if isinstance(error, BadKeyError) or (
        isinstance(error, BadFieldError) and error.field in ("Rev", "S", "PD_Length", "R")
    ):
        return ErrorCode.MPA_INVALID_FRAME
    if isinstance(error, BadVersionError) and error.field == "DV":
        return (ErrorCode.DDP_TAGGED_INVALID_VERSION if error.tagged
                else ErrorCode.DDP_UNTAGGED_INVALID_VERSION)
    if isinstance(error, BadFieldError) and error.field in _FIELD_CODES:
        return _FIELD_CODES[error.field]
    return ErrorCode.RDMAP_CATASTROPHIC_STREAM
