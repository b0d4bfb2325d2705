"""MPA (RFC 5044): the FPDU framer of the transmit side, the deframer of the receive side, the
reader and writer of the startup frames."""

from .deframer import ErrorKind, FpduDeframer
from .framer import FpduFramer, FpduRequest
from .startup import StartupError, StartupFrame, StartupReader, StartupWriter

__all__ = ["FpduFramer", "FpduRequest", "FpduDeframer", "ErrorKind", "StartupReader",
           "StartupWriter", "StartupFrame", "StartupError"]
