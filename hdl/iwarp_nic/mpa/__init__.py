"""MPA (RFC 5044, RFC 6581): the FPDU framer of the transmit side, the deframer of the receive
side, the reader and writer of the startup frames, the negotiator that runs the exchange, the
gather that turns every connection's received chunks into whole frames, and the receiver that
deframes them per connection."""

from .deframer import ErrorKind, FpduDeframer
from .framer import FpduFramer, FpduRequest
from .gather import FrameGather, GatherCommand, GatherOp, Release, ReleaseKind
from .negotiate import Decision, MpaNegotiator, Negotiated, NegotiationConfig, Outcome, Rtr
from .receive import MpaReceiver
from .startup import StartupError, StartupFrame, StartupReader, StartupWriter

__all__ = ["FpduFramer", "FpduRequest", "FpduDeframer", "ErrorKind", "StartupReader",
           "StartupWriter", "StartupFrame", "StartupError", "MpaNegotiator", "NegotiationConfig",
           "Decision", "Negotiated", "Outcome", "Rtr", "FrameGather", "GatherCommand", "GatherOp",
           "Release", "ReleaseKind", "MpaReceiver"]
