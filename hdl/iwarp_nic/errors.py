"""The error codes a Terminate message carries: the registry of RFC 6580 section 3 (RFC 5040
section 7, RFC 5041 section 7, RFC 5044 section 8 and RFC 6581 section 9).

A code is 16 bits, ``layer (4) | error type (4) | error code (8)`` from the most significant
end: the order of the first two octets of a Terminate header (RFC 5040 figure 7), so a code
splits into the :data:`~iwarp_nic.rdmap.TerminateRequest` fields with slices. Every block that
finds a protocol violation reports one of these; the names follow the registry's descriptions.
"""

from amaranth.lib import enum
from amaranth.lib.data import StructLayout

__all__ = ["TerminateCode", "OFFENDING_BYTES", "Violation"]

#: Octets of the offending segment a Terminate may copy: an untagged DDP header (18) and a Read
#: Request header (28), RFC 5040 4.8.
OFFENDING_BYTES = 18 + 28


def _code(layer, etype, ecode):
    return layer << 12 | etype << 8 | ecode


class TerminateCode(enum.Enum, shape=16):
    """RFC 6580 codes: layer 0 RDMAP, 1 DDP, 2 LLP (MPA). RDMAP Local Catastrophic has no
    registered code and is sent with 0."""

    RDMAP_LOCAL_CATASTROPHIC = _code(0, 0, 0x00)
    RDMAP_INVALID_STAG = _code(0, 1, 0x00)
    RDMAP_BASE_BOUNDS = _code(0, 1, 0x01)
    RDMAP_ACCESS_RIGHTS = _code(0, 1, 0x02)
    RDMAP_STAG_NOT_ASSOCIATED = _code(0, 1, 0x03)
    RDMAP_TO_WRAP = _code(0, 1, 0x04)
    RDMAP_PROTECTION_CANNOT_INVALIDATE = _code(0, 1, 0x09)
    RDMAP_PROTECTION_UNSPECIFIED = _code(0, 1, 0xFF)
    RDMAP_INVALID_VERSION = _code(0, 2, 0x05)
    RDMAP_UNEXPECTED_OPCODE = _code(0, 2, 0x06)
    RDMAP_CATASTROPHIC_STREAM = _code(0, 2, 0x07)
    RDMAP_CATASTROPHIC_GLOBAL = _code(0, 2, 0x08)
    RDMAP_OPERATION_CANNOT_INVALIDATE = _code(0, 2, 0x09)
    RDMAP_OPERATION_UNSPECIFIED = _code(0, 2, 0xFF)
    DDP_LOCAL_CATASTROPHIC = _code(1, 0, 0x00)
    DDP_TAGGED_INVALID_STAG = _code(1, 1, 0x00)
    DDP_TAGGED_BASE_BOUNDS = _code(1, 1, 0x01)
    DDP_TAGGED_STAG_NOT_ASSOCIATED = _code(1, 1, 0x02)
    DDP_TAGGED_TO_WRAP = _code(1, 1, 0x03)
    DDP_TAGGED_INVALID_VERSION = _code(1, 1, 0x04)
    DDP_UNTAGGED_INVALID_QN = _code(1, 2, 0x01)
    DDP_UNTAGGED_INVALID_MSN_NO_BUFFER = _code(1, 2, 0x02)
    DDP_UNTAGGED_INVALID_MSN_RANGE = _code(1, 2, 0x03)
    DDP_UNTAGGED_INVALID_MO = _code(1, 2, 0x04)
    DDP_UNTAGGED_MESSAGE_TOO_LONG = _code(1, 2, 0x05)
    DDP_UNTAGGED_INVALID_VERSION = _code(1, 2, 0x06)
    MPA_TCP_CLOSED = _code(2, 0, 0x01)
    MPA_CRC = _code(2, 0, 0x02)
    MPA_MARKER = _code(2, 0, 0x03)
    MPA_INVALID_FRAME = _code(2, 0, 0x04)
    MPA_LOCAL_CATASTROPHIC = _code(2, 0, 0x05)
    MPA_INSUFFICIENT_IRD = _code(2, 0, 0x06)
    MPA_NO_MATCHING_RTR = _code(2, 0, 0x07)


#: A protocol violation found on receipt, for a Terminate: the code, and the offending ULPDU's
#: length and first :data:`OFFENDING_BYTES` octets (lane 0 first, zero past its end): the fields
#: of :data:`~iwarp_nic.rdmap.TerminateRequest` other than the MSN.
Violation = StructLayout({"code": TerminateCode, "offending": 8 * OFFENDING_BYTES,
                          "offending_length": 16})
