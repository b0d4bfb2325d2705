"""The model's MPA startup frames as the gateware's :data:`~iwarp_nic.mpa.StartupFrame` tells
them: shared by the tests of the startup reader and writer and of the negotiator."""

from iwarp_model.wire.errors import BadFieldError, BadKeyError, BadVersionError, OversizeError
from iwarp_nic.mpa.startup import StartupError

__all__ = ["ERROR_OF", "fields"]

#: The gateware's error for each exception the model's ``MpaFrameReader`` raises.
ERROR_OF = {BadKeyError: StartupError.KEY, BadVersionError: StartupError.REVISION,
            OversizeError: StartupError.PD_LENGTH, BadFieldError: StartupError.FIELD}


def fields(frame):
    """The StartupFrame fields of the model's ``frame`` (an ``MpaFrame``)."""
    e = frame.enhanced
    return {"error": StartupError.NONE, "markers": frame.markers, "crc": frame.crc,
            "reject": frame.reject, "enhanced": e is not None, "revision": frame.revision,
            "pd_length": frame.pd_length, "private_length": len(frame.private_data),
            "ird": e.ird if e else 0, "ord": e.ord if e else 0,
            "p2p": bool(e and e.peer_to_peer), "rtr_send": bool(e and e.rtr_send),
            "rtr_write": bool(e and e.rtr_write), "rtr_read": bool(e and e.rtr_read)}
