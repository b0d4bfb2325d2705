"""RDMAP messages on DDP segments, RFC 5040 section 4 and RFC 7306 sections 4 to 6.

RDMAP control field, the first RsvdULP octet of every DDP header (RFC 5040 4.1)::

    RV (2) = 1 | Rsv (2) = 0 | Opcode (4)

RV 01b is RFC 5040 (00b, the RDMA Consortium's version, is not spoken here and is rejected).
Rsv is sent as zero and ignored. In untagged segments the next 32 RsvdULP bits carry the
Invalidate STag of the Send with Invalidate variants; other opcodes send zero there and the
receiver ignores it.

Opcodes (RFC 5040 figure 4, RFC 7306 figure 2 and section 10), their tagged flag and queue:

    ==  ============================  ======  ==  ===============================
    op  message                       tagged  QN  RDMAP header after the DDP one
    ==  ============================  ======  ==  ===============================
    0   RDMA Write                    1           none, payload
    1   RDMA Read Request             0       1   Read Request (28 bytes)
    2   RDMA Read Response            1           none, payload
    3   Send                          0       0   none, payload
    4   Send with Invalidate          0       0   none, payload
    5   Send with SE                  0       0   none, payload
    6   Send with SE and Invalidate   0       0   none, payload
    7   Terminate                     0       2   Terminate (:mod:`.terminate`)
    8   Immediate Data                0       0   8 bytes of immediate data
    9   Immediate Data with SE        0       0   8 bytes of immediate data
    10  Atomic Request                0       1   Atomic Request (52 bytes)
    11  Atomic Response               0       3   Atomic Response (12 bytes)
    ==  ============================  ======  ==  ===============================

Opcodes 12 to 15 are unassigned (15 reserved for experiments, RFC 6580 3.4). RFC 7306 has no
"Write with Immediate" opcode: that operation is an RDMA Write followed by an Immediate Data
message (RFC 7306 section 6). Atomic Requests share queue 1 with Read Requests (RFC 7306 5.2);
Atomic Responses use the new queue 3. Messages with an RDMAP header carry no ULP payload.

RFC 7306 4 calls the Atomic Response header 32 bytes long, but its figure 6 (and appendix A.2)
lays out 12: Original Request Identifier (32 bits) and Original Remote Data Value (64 bits);
the figure is followed here.
"""

import enum
import struct
from dataclasses import dataclass

from .ddp import TaggedHeader, UntaggedHeader, decode_header
from .errors import BadFieldError, BadOpcodeError, BadVersionError, TruncatedError
from .terminate import Terminate

__all__ = [
    "RDMAP_VERSION",
    "Opcode",
    "Queue",
    "AtomicOp",
    "TAGGED_OPCODES",
    "QUEUE_OF",
    "control_field",
    "ReadRequest",
    "AtomicRequest",
    "AtomicResponse",
    "ImmediateData",
    "Segment",
    "encode_segment",
    "decode_segment",
]

RDMAP_VERSION = 1
ALL_ONES = 0xFFFF_FFFF_FFFF_FFFF


class Opcode(enum.IntEnum):
    WRITE = 0
    READ_REQUEST = 1
    READ_RESPONSE = 2
    SEND = 3
    SEND_INVALIDATE = 4
    SEND_SE = 5
    SEND_SE_INVALIDATE = 6
    TERMINATE = 7
    IMMEDIATE_DATA = 8
    IMMEDIATE_DATA_SE = 9
    ATOMIC_REQUEST = 10
    ATOMIC_RESPONSE = 11


class Queue(enum.IntEnum):
    """DDP queue numbers of RDMAP (RFC 7306 10.2)."""

    SEND = 0
    READ_REQUEST = 1
    TERMINATE = 2
    ATOMIC_RESPONSE = 3


class AtomicOp(enum.IntEnum):
    """RFC 7306 atomic operation subcodes (AOpCode, 10.1). The masks make both "masked"."""

    FETCH_ADD = 0
    CMP_SWAP = 2


TAGGED_OPCODES = frozenset({Opcode.WRITE, Opcode.READ_RESPONSE})
INVALIDATE_OPCODES = frozenset({Opcode.SEND_INVALIDATE, Opcode.SEND_SE_INVALIDATE})
QUEUE_OF = {
    Opcode.READ_REQUEST: Queue.READ_REQUEST,
    Opcode.SEND: Queue.SEND,
    Opcode.SEND_INVALIDATE: Queue.SEND,
    Opcode.SEND_SE: Queue.SEND,
    Opcode.SEND_SE_INVALIDATE: Queue.SEND,
    Opcode.TERMINATE: Queue.TERMINATE,
    Opcode.IMMEDIATE_DATA: Queue.SEND,
    Opcode.IMMEDIATE_DATA_SE: Queue.SEND,
    Opcode.ATOMIC_REQUEST: Queue.READ_REQUEST,
    Opcode.ATOMIC_RESPONSE: Queue.ATOMIC_RESPONSE,
}


def control_field(opcode: Opcode) -> int:
    """The RDMAP control octet for ``opcode``."""
    return RDMAP_VERSION << 6 | Opcode(opcode)


def _parse_control(control: int) -> Opcode:
    if control >> 6 != RDMAP_VERSION:
        raise BadVersionError("RV", control >> 6, f"RDMAP version {RDMAP_VERSION}")
    try:
        return Opcode(control & 0x0F)
    except ValueError:
        raise BadOpcodeError("Opcode", control & 0x0F, "reserved or unknown") from None


def _check(name: str, value: int, bits: int) -> None:
    if not 0 <= value < 1 << bits:
        raise BadFieldError(name, value, f"a {bits}-bit field")


@dataclass(frozen=True)
class ReadRequest:
    """RDMA Read Request header (RFC 5040 4.4): read ``size`` bytes from (src_stag, src_to)
    into (sink_stag, sink_to)."""

    sink_stag: int
    sink_to: int
    size: int
    src_stag: int
    src_to: int

    SIZE = 28
    _FORMAT = struct.Struct("!IQIIQ")

    def __post_init__(self):
        for name, bits in (("sink_stag", 32), ("sink_to", 64), ("size", 32),
                           ("src_stag", 32), ("src_to", 64)):
            _check(name, getattr(self, name), bits)

    def encode(self) -> bytes:
        return self._FORMAT.pack(self.sink_stag, self.sink_to, self.size,
                                 self.src_stag, self.src_to)

    @classmethod
    def decode(cls, data: bytes) -> "ReadRequest":
        if len(data) < cls.SIZE:
            raise TruncatedError("RDMA Read Request header", cls.SIZE, len(data))
        return cls(*cls._FORMAT.unpack_from(data))


@dataclass(frozen=True)
class AtomicRequest:
    """Atomic Operation Request header (RFC 7306 5.2.1).

    FetchAdd: ``add_swap_data`` is the addend, ``add_swap_mask`` the field boundaries (0: one
    64-bit add). CmpSwap: swap data and mask, compare data and mask (all ones: unmasked).
    Fields that do not apply are sent as the RFC says: compare data 0, masks all ones.
    """

    op: AtomicOp
    request_id: int
    stag: int
    to: int
    add_swap_data: int
    add_swap_mask: int = ALL_ONES
    compare_data: int = 0
    compare_mask: int = ALL_ONES

    SIZE = 52
    _FORMAT = struct.Struct("!IIIQQQQQ")

    def __post_init__(self):
        try:
            object.__setattr__(self, "op", AtomicOp(self.op))
        except ValueError:
            raise BadOpcodeError("AOpCode", self.op, "not an RFC 7306 atomic") from None
        for name, bits in (("request_id", 32), ("stag", 32), ("to", 64), ("add_swap_data", 64),
                           ("add_swap_mask", 64), ("compare_data", 64), ("compare_mask", 64)):
            _check(name, getattr(self, name), bits)

    @classmethod
    def fetch_add(cls, request_id, stag, to, add, mask=0) -> "AtomicRequest":
        return cls(AtomicOp.FETCH_ADD, request_id, stag, to, add, mask)

    @classmethod
    def cmp_swap(cls, request_id, stag, to, compare, swap,
                 compare_mask=ALL_ONES, swap_mask=ALL_ONES) -> "AtomicRequest":
        return cls(AtomicOp.CMP_SWAP, request_id, stag, to, swap, swap_mask, compare,
                   compare_mask)

    def encode(self) -> bytes:
        return self._FORMAT.pack(self.op, self.request_id, self.stag, self.to,
                                 self.add_swap_data, self.add_swap_mask,
                                 self.compare_data, self.compare_mask)

    @classmethod
    def decode(cls, data: bytes) -> "AtomicRequest":
        """The 28 reserved bits before AOpCode are ignored (RFC 7306 5.2.1)."""
        if len(data) < cls.SIZE:
            raise TruncatedError("Atomic Request header", cls.SIZE, len(data))
        word, *rest = cls._FORMAT.unpack_from(data)
        return cls(word & 0x0F, *rest)


@dataclass(frozen=True)
class AtomicResponse:
    """Atomic Operation Response header (RFC 7306 5.2.2): the value found before the operation."""

    request_id: int
    value: int

    SIZE = 12
    _FORMAT = struct.Struct("!IQ")

    def __post_init__(self):
        _check("request_id", self.request_id, 32)
        _check("value", self.value, 64)

    def encode(self) -> bytes:
        return self._FORMAT.pack(self.request_id, self.value)

    @classmethod
    def decode(cls, data: bytes) -> "AtomicResponse":
        if len(data) < cls.SIZE:
            raise TruncatedError("Atomic Response header", cls.SIZE, len(data))
        return cls(*cls._FORMAT.unpack_from(data))


@dataclass(frozen=True)
class ImmediateData:
    """The 8 bytes of an Immediate Data message (RFC 7306 6.2)."""

    data: bytes

    SIZE = 8

    def __post_init__(self):
        if len(self.data) != self.SIZE:
            raise BadFieldError("Immediate Data", self.data.hex(), "exactly 8 bytes")

    def encode(self) -> bytes:
        return bytes(self.data)

    @classmethod
    def decode(cls, data: bytes) -> "ImmediateData":
        return cls(bytes(data[: cls.SIZE]))


RdmapHeader = ReadRequest | AtomicRequest | AtomicResponse | ImmediateData | Terminate
_HEADER_OF = {
    Opcode.READ_REQUEST: ReadRequest,
    Opcode.TERMINATE: Terminate,
    Opcode.IMMEDIATE_DATA: ImmediateData,
    Opcode.IMMEDIATE_DATA_SE: ImmediateData,
    Opcode.ATOMIC_REQUEST: AtomicRequest,
    Opcode.ATOMIC_RESPONSE: AtomicResponse,
}


@dataclass(frozen=True)
class Segment:
    """One DDP segment of an RDMAP message.

    Tagged opcodes use ``stag``/``to``; untagged ones ``qn`` (None: the opcode's queue, set by
    the constructor), ``msn`` and ``mo``. ``inv_stag`` only for the Send with Invalidate
    variants. ``header`` is the RDMAP header of the opcodes that have one (then ``payload`` is
    empty); ``payload`` the ULP data of the others.
    """

    opcode: Opcode
    payload: bytes = b""
    last: bool = True
    stag: int = 0
    to: int = 0
    qn: int | None = None
    msn: int = 1
    mo: int = 0
    inv_stag: int = 0
    header: RdmapHeader | None = None

    def __post_init__(self):
        op = Opcode(self.opcode)
        object.__setattr__(self, "opcode", op)
        tagged = op in TAGGED_OPCODES
        if tagged and (self.qn is not None or self.msn != 1 or self.mo):
            raise BadFieldError("QN", self.qn, f"{op.name} is tagged: no QN, MSN, MO")
        if not tagged and (self.stag or self.to):
            raise BadFieldError("STag", self.stag, f"{op.name} is untagged: no STag, TO")
        if not tagged and self.qn is None:
            object.__setattr__(self, "qn", int(QUEUE_OF[op]))
        if self.inv_stag and op not in INVALIDATE_OPCODES:
            raise BadFieldError("Invalidate STag", self.inv_stag, f"not used by {op.name}")
        _check("Invalidate STag", self.inv_stag, 32)
        wanted = _HEADER_OF.get(op)
        if wanted is None and self.header is not None:
            raise BadFieldError("header", self.header, f"{op.name} has no RDMAP header")
        if wanted is not None and not isinstance(self.header, wanted):
            raise BadFieldError("header", self.header, f"{op.name} needs a {wanted.__name__}")
        if wanted is not None and self.payload:
            raise BadFieldError("payload", len(self.payload), f"{op.name} carries none")
        self.ddp_header()  # checks the DDP field ranges

    def ddp_header(self) -> TaggedHeader | UntaggedHeader:
        control = control_field(self.opcode)
        if self.opcode in TAGGED_OPCODES:
            return TaggedHeader(self.stag, self.to, self.last, control)
        return UntaggedHeader(self.qn, self.msn, self.mo, self.last, control << 32 | self.inv_stag)

    def encode(self) -> bytes:
        body = self.header.encode() if self.header is not None else bytes(self.payload)
        return self.ddp_header().encode() + body


def encode_segment(segment: Segment) -> bytes:
    """DDP header, RDMAP header (if any) and payload: the ULPDU handed to MPA."""
    return segment.encode()


def decode_segment(data: bytes) -> Segment:
    """Decode a DDP segment carrying RDMAP (a ULPDU), checking DV, RV, the opcode, its tagged
    flag and queue number, and the size of its RDMAP header."""
    ddp = decode_header(data)
    control = ddp.rsvd_ulp if ddp.tagged else ddp.rsvd_ulp >> 32
    opcode = _parse_control(control)
    if (opcode in TAGGED_OPCODES) != ddp.tagged:
        raise BadFieldError("T", int(ddp.tagged), f"wrong for {opcode.name}", tagged=ddp.tagged)
    rest = bytes(data[ddp.SIZE:])
    if ddp.tagged:
        return Segment(opcode, rest, ddp.last, stag=ddp.stag, to=ddp.to)
    if ddp.qn != QUEUE_OF[opcode]:
        raise BadFieldError("QN", ddp.qn, f"{opcode.name} goes to queue {QUEUE_OF[opcode]}",
                            tagged=False)
    inv_stag = ddp.rsvd_ulp & 0xFFFF_FFFF if opcode in INVALIDATE_OPCODES else 0
    fields = dict(last=ddp.last, qn=ddp.qn, msn=ddp.msn, mo=ddp.mo, inv_stag=inv_stag)
    kind = _HEADER_OF.get(opcode)
    if kind is None:
        return Segment(opcode, rest, **fields)
    if not ddp.last or ddp.mo:
        raise BadFieldError("MO", ddp.mo, f"{opcode.name} is a single segment", tagged=False)
    if kind is not Terminate:
        if len(rest) < kind.SIZE:
            raise TruncatedError(f"{opcode.name} header", kind.SIZE, len(rest))
        if len(rest) > kind.SIZE:
            raise BadFieldError("DDP segment length", len(data), f"{opcode.name} too long")
    return Segment(opcode, header=kind.decode(rest), **fields)
