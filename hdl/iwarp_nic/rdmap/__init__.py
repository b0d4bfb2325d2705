"""RDMAP (RFC 5040, RFC 7306): the Terminate message, sent and received; the responder's side
of RDMA Read and of the atomics, and the atomic operation on host memory; the requester's side
(work requests to messages, Reads and atomics outstanding under the ORD); the choice of what a
stream sends next."""

from .atomic import AtomicExecutor, HostAtomic, HostWord
from .request import Refused, RequestIssuer, WorkRequest
from .respond import OpenResponder, OutboundMessage, RequestResponder
from .schedule import HostRead, SendScheduler, Sent
from .terminate import TerminateEmitter, TerminateHeader, TerminateParser, TerminateRequest

__all__ = ["TerminateEmitter", "TerminateRequest", "TerminateParser", "TerminateHeader",
           "RequestResponder", "OpenResponder", "OutboundMessage", "SendScheduler", "HostRead",
           "Sent", "AtomicExecutor", "HostAtomic", "HostWord", "RequestIssuer", "Refused",
           "WorkRequest"]
