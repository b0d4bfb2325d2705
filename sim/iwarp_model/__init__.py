"""The Python reference model of the iWARP stack (standard library only).

Every gateware block is checked against this model; it runs on its own as a software peer too.
"""

from .crc import crc32, crc32c
from .engine import Connection, ConnState
from .transport.sockets import LinkError, MpaRejected, TerminateReceived, TerminateSent

__all__ = ["crc32c", "crc32", "Connection", "ConnState", "LinkError", "MpaRejected",
           "TerminateReceived", "TerminateSent"]
