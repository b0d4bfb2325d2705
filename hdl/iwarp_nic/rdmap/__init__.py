"""RDMAP (RFC 5040, RFC 7306): the Terminate message, sent and received; the responder's side
of RDMA Read; the choice of what a stream sends next."""

from .read import ReadResponder, ReadResponse
from .schedule import HostRead, SendScheduler
from .terminate import TerminateEmitter, TerminateHeader, TerminateParser, TerminateRequest

__all__ = ["TerminateEmitter", "TerminateRequest", "TerminateParser", "TerminateHeader",
           "ReadResponder", "ReadResponse", "SendScheduler", "HostRead"]
