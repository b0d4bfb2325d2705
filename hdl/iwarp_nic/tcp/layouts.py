"""The records passed between the blocks of the TCP offload engine and to the layer above it.

Implements the field sets of RFC 9293 section 3.1 (header), 3.2 (MSS option), RFC 7323
section 2.2 (window scale option) and RFC 2018 sections 2 and 3 (SACK-permitted, one SACK
block) as they travel inside the engine; no wire format here (the wire header is
:data:`iwarp_nic.headers.TCP`).

Every layout is a function of the engine's size parameters so that a connection id is exactly
``conn_bits`` wide. Values are host order. Sequence numbers are the 32-bit wire values; the
byte of sequence number ``s`` of connection ``c`` lives at ring offset ``s mod ring_bytes``.
"""

from amaranth.lib import data, enum

__all__ = ["FIN", "SYN", "RST", "PSH", "ACK", "URG", "ECE", "CWR",
           "conn_bits", "ConnRef", "with_conn", "without_conn", "ConnKey", "RxSegment", "TxSegment",
           "RingRequest", "ChunkHeader", "CommandOp", "Command", "EventKind", "Event"]

# RFC 9293 section 3.1 control bits, as the values of the header's ``flags`` byte.
FIN, SYN, RST, PSH, ACK, URG, ECE, CWR = (1 << b for b in range(8))


def conn_bits(conns):
    """Width of a connection id for ``conns`` connections (at least one bit)."""
    if not isinstance(conns, int) or conns < 1:
        raise ValueError(f"conns must be a positive integer, not {conns!r}")
    return max(1, (conns - 1).bit_length())


def ConnRef(conns):
    """A connection named alone: a question about it, a request for it, or what it finished."""
    return data.StructLayout({"conn": conn_bits(conns)})


def with_conn(layout, conns):
    """``layout`` (a struct layout) with a ``conn`` field of ``conns`` connections after its
    own fields, which keep their bit positions; ``layout`` itself when ``conns`` is None (one
    stream)."""
    if conns is None:
        return layout
    return data.StructLayout({**dict(layout.members), "conn": conn_bits(conns)})


def without_conn(view, layout):
    """The ``layout`` fields of ``view``, a value of ``with_conn(layout, conns)`` (or of
    ``layout`` itself), as a view of ``layout``."""
    return layout(view.as_value()[:layout.size])


#: What identifies a connection on the wire, our address aside (one local IP per engine).
ConnKey = data.StructLayout({"remote_ip": 32, "remote_port": 16, "local_port": 16})


#: A received segment that passed the checksum and header checks (``TcpRx`` → control).
#: ``length`` counts payload bytes only (not SYN/FIN); when it is non-zero the payload is one
#: packet in the receive buffer, committed before this record is offered.
RxSegment = data.StructLayout({
    "src_ip": 32, "src_port": 16, "dst_port": 16,
    "seq": 32, "ack": 32, "flags": 8, "window": 16,
    "mss": 16, "has_mss": 1,        # RFC 9293 3.2 MSS option, if present
    "ws": 4, "has_ws": 1,           # RFC 7323 2.2 shift count, clamped to 14, if present
    "sack_ok": 1,                   # RFC 2018 2 SACK-permitted option present
    "length": 16,
})


def TxSegment(conns):
    """A segment to send (control → ``TcpTx``): the header fields, and ``length`` payload bytes
    to take from the connection's send ring starting at sequence number ``seq``. With ``syn_opts``
    the header carries the MSS option (``mss``), with ``syn_ws`` the window-scale option (``ws``)
    and with ``syn_sack`` SACK-permitted (each left out, NOPs in its place, as a SYN-ACK to a
    SYN that offered none must). With ``sack`` (and not ``syn_opts``) it carries one SACK block,
    ``[sack_left, sack_right)``. Either way the segment has no payload (``length`` is ignored)."""
    return data.StructLayout({
        "conn": conn_bits(conns), "dst_ip": 32, "src_port": 16, "dst_port": 16,
        "seq": 32, "ack": 32, "flags": 8, "window": 16,
        "syn_opts": 1, "syn_ws": 1, "syn_sack": 1, "mss": 16, "ws": 4,
        "sack": 1, "sack_left": 32, "sack_right": 32,
        "length": 16,
    })


def RingRequest(conns):
    """``length`` bytes of a connection's send ring from sequence number ``seq`` on: a write
    (followed by exactly those bytes as one packet of beats) or a read (answered by them)."""
    return data.StructLayout({"conn": conn_bits(conns), "seq": 32, "length": 16})


def ChunkHeader(conns):
    """The header of one chunk of a connection's byte stream crossing the application boundary
    (``length`` >= 1 bytes follow as one packet of beats)."""
    return data.StructLayout({"conn": conn_bits(conns), "length": 16})


class CommandOp(enum.Enum, shape=2):
    LISTEN = 0   # make slot ``conn`` accept one connection to ``local_port``
    CONNECT = 1  # open slot ``conn`` to ``remote_ip:remote_port`` from ``local_port``
    CLOSE = 2    # send FIN after the queued data (orderly close)
    ABORT = 3    # send RST (if synchronised) and free the slot at once


def Command(conns):
    return data.StructLayout({"op": CommandOp, "conn": conn_bits(conns), "local_port": 16,
                              "remote_ip": 32, "remote_port": 16})


class EventKind(enum.Enum, shape=3):
    ESTABLISHED = 0  # handshake complete (either open); the address fields name the peer
    PEER_FIN = 1     # the peer closed its direction; every byte before its FIN was delivered
    CLOSED = 2       # orderly close complete; the slot is free
    RESET = 3        # the peer reset the connection (or refused it); the slot is free
    TIMEOUT = 4      # retransmissions exhausted; a RST was sent and the slot is free
    ABORTED = 5      # an ABORT command completed; the slot is free


def Event(conns):
    return data.StructLayout({"kind": EventKind, "conn": conn_bits(conns), "local_port": 16,
                              "remote_ip": 32, "remote_port": 16})
