"""MPA (RFC 5044): the FPDU framer of the transmit side, the deframer of the receive side."""

from .deframer import ErrorKind, FpduDeframer
from .framer import FpduFramer, FpduRequest

__all__ = ["FpduFramer", "FpduRequest", "FpduDeframer", "ErrorKind"]
