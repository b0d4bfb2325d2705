"""DDP segment headers, RFC 5041 section 4.

Both start with the DDP control field ``T | L | Rsvd (4) | DV (2)`` (4.1):

* tagged (4.2, T=1), 14 bytes: control, RsvdULP (8 bits), STag (32), TO (64);
* untagged (4.3, T=0), 18 bytes: control, RsvdULP (40 bits), QN (32), MSN (32), MO (32).

RsvdULP belongs to the ULP: RDMAP puts its control field in the first 8 bits and, in untagged
segments, the Invalidate STag in the other 32 (see :mod:`.rdmap`). DV must be 1 (4.1); a decoder
raises :class:`~.errors.BadVersionError` otherwise. The Rsvd bits are sent as zero and, as 4.1
says, not checked on receive.
"""

import struct
from dataclasses import dataclass

from .errors import BadFieldError, BadVersionError, TruncatedError

__all__ = [
    "DDP_VERSION",
    "TAGGED_HEADER_SIZE",
    "UNTAGGED_HEADER_SIZE",
    "TaggedHeader",
    "UntaggedHeader",
    "decode_header",
]

DDP_VERSION = 1
TAGGED_HEADER_SIZE = 14
UNTAGGED_HEADER_SIZE = 18

_T, _L, _DV = 0x80, 0x40, 0x03
_TAGGED = struct.Struct("!BBIQ")
_UNTAGGED = struct.Struct("!BBIIII")


def _check(name: str, value: int, bits: int) -> None:
    if not 0 <= value < 1 << bits:
        raise BadFieldError(name, value, f"a {bits}-bit field")


def _control(data: bytes, tagged: bool, size: int) -> int:
    if len(data) < size:
        raise TruncatedError("tagged DDP header" if tagged else "untagged DDP header",
                             size, len(data))
    control = data[0]
    if bool(control & _T) != tagged:
        raise BadFieldError("T", int(not tagged), tagged=not tagged)
    if control & _DV != DDP_VERSION:
        raise BadVersionError("DV", control & _DV, f"DDP version {DDP_VERSION}", tagged=tagged)
    return control


@dataclass(frozen=True)
class TaggedHeader:
    """Tagged buffer model header: payload goes to ``to`` in the buffer named by ``stag``."""

    stag: int
    to: int
    last: bool = True
    rsvd_ulp: int = 0

    SIZE = TAGGED_HEADER_SIZE
    tagged = True

    def __post_init__(self):
        _check("STag", self.stag, 32)
        _check("TO", self.to, 64)
        _check("RsvdULP", self.rsvd_ulp, 8)

    def encode(self) -> bytes:
        control = _T | (_L if self.last else 0) | DDP_VERSION
        return _TAGGED.pack(control, self.rsvd_ulp, self.stag, self.to)

    @classmethod
    def decode(cls, data: bytes) -> "TaggedHeader":
        """From the first 14 bytes of ``data`` (the payload may follow)."""
        control = _control(data, True, cls.SIZE)
        _control_byte, rsvd_ulp, stag, to = _TAGGED.unpack_from(data)
        return cls(stag=stag, to=to, last=bool(control & _L), rsvd_ulp=rsvd_ulp)


@dataclass(frozen=True)
class UntaggedHeader:
    """Untagged buffer model header: payload goes at offset ``mo`` of message ``msn`` on ``qn``."""

    qn: int
    msn: int
    mo: int = 0
    last: bool = True
    rsvd_ulp: int = 0

    SIZE = UNTAGGED_HEADER_SIZE
    tagged = False

    def __post_init__(self):
        _check("QN", self.qn, 32)
        _check("MSN", self.msn, 32)
        _check("MO", self.mo, 32)
        _check("RsvdULP", self.rsvd_ulp, 40)

    def encode(self) -> bytes:
        control = (_L if self.last else 0) | DDP_VERSION
        return _UNTAGGED.pack(control, self.rsvd_ulp >> 32, self.rsvd_ulp & 0xFFFF_FFFF,
                              self.qn, self.msn, self.mo)

    @classmethod
    def decode(cls, data: bytes) -> "UntaggedHeader":
        """From the first 18 bytes of ``data`` (the payload may follow)."""
        control = _control(data, False, cls.SIZE)
        _control_byte, ulp_high, ulp_low, qn, msn, mo = _UNTAGGED.unpack_from(data)
        return cls(qn=qn, msn=msn, mo=mo, last=bool(control & _L),
                   rsvd_ulp=ulp_high << 32 | ulp_low)


def decode_header(data: bytes) -> TaggedHeader | UntaggedHeader:
    """The header at the start of a DDP segment, tagged or untagged as its T bit says."""
    if not data:
        raise TruncatedError("DDP header", 1, 0)
    return (TaggedHeader if data[0] & _T else UntaggedHeader).decode(data)
