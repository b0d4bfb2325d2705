"""DDP (RFC 5041) with the RDMAP header decode it carries (RFC 5040, RFC 7306): segments parsed
and emitted, and the tagged-buffer checks of RFC 5041 and RFC 5042 before placement; each
connection's Reads and atomics outstanding, whose answers placement takes in order."""

from .emit import Fetch, Message, SegmentEmitter
from .outstanding import OutstandingTable
from .placement import (
    CompletionStatus,
    OutstandingRead,
    PlaceRequest,
    PostedReceive,
    ReadDone,
    ReceiveCompletion,
    SegmentPlacer,
)
from .receive import ConnectionsPlacer, ConnectionsReceiver, StreamReceiver
from .rtr import RtrCheck
from .segment import HEAD_BYTES, SegmentHeader, SegmentParser
from .send import StreamSender
from .stag import (
    Access,
    Entry,
    Fault,
    InvalidateRequest,
    LookupRequest,
    LookupResult,
    StagTable,
    StagWrite,
)

__all__ = ["StreamReceiver", "ConnectionsReceiver", "ConnectionsPlacer", "RtrCheck",
           "StreamSender", "SegmentEmitter", "Message", "Fetch",
           "SegmentParser", "SegmentHeader", "HEAD_BYTES", "SegmentPlacer", "PlaceRequest",
           "PostedReceive", "CompletionStatus", "ReceiveCompletion", "OutstandingRead", "ReadDone",
           "StagTable", "Access", "Fault", "Entry", "StagWrite", "LookupRequest",
           "LookupResult", "InvalidateRequest", "OutstandingTable"]
