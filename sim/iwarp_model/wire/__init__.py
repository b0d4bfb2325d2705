"""Wire codecs: bytes <-> dataclasses for every header and frame the stack puts on the wire.

Network byte order throughout (``struct`` formats with ``!``). A decoder given bad bytes raises
a specific exception naming what is wrong; it never returns a half-parsed object.
"""

from . import ddp, errors, fpdu, mpa, rdmap, terminate
from .ddp import TaggedHeader, UntaggedHeader, decode_header
from .errors import (
    BadFieldError,
    BadKeyError,
    BadOpcodeError,
    BadVersionError,
    CrcError,
    MarkerError,
    OversizeError,
    TruncatedError,
    WireError,
)
from .fpdu import Deframer, Framer, mulpdu
from .mpa import EnhancedData, MpaFrame, MpaFrameReader, Negotiated, negotiate
from .rdmap import Opcode, Segment, decode_segment, encode_segment
from .terminate import ErrorCode, Terminate, error_code_for

__all__ = [
    "ddp", "errors", "fpdu", "mpa", "rdmap", "terminate",
    "TaggedHeader", "UntaggedHeader", "decode_header",
    "WireError", "TruncatedError", "BadFieldError", "BadVersionError", "BadOpcodeError",
    "BadKeyError", "OversizeError", "CrcError", "MarkerError",
    "Framer", "Deframer", "mulpdu",
    "MpaFrame", "MpaFrameReader", "EnhancedData", "Negotiated", "negotiate",
    "Opcode", "Segment", "encode_segment", "decode_segment",
    "Terminate", "ErrorCode", "error_code_for",
]
