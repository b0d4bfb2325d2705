"""MPA (RFC 5044): the FPDU framer of the transmit side."""

from .framer import FpduFramer, FpduRequest

__all__ = ["FpduFramer", "FpduRequest"]
