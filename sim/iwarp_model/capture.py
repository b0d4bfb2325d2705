"""Packet captures of byte-stream transports (the kernel's TCP, the in-memory pair).

A socket hands the model a byte stream, not packets, so :class:`StreamCapture` synthesises the
Ethernet/IPv4/TCP framing (RFC 791, RFC 9293) around the real bytes: a three-way handshake with
MSS and window-scale options when the capture starts, one segment of at most ``mss`` bytes per
piece of data in either direction, each acknowledging everything the other side sent, and a
FIN exchange when it closes. Every checksum is correct, so Wireshark decodes the iWARP inside
(its MPA dissector needs the MPA Request and Reply, each at the start of a segment: write them
through their own :meth:`StreamCapture.sent` / :meth:`received` calls).

Timestamps are the caller's clock (nanoseconds).
"""

from .pcap import PcapWriter
from .wire.net import (
    ACK,
    ETHERTYPE_IPV4,
    FIN,
    PROTO_TCP,
    PSH,
    SYN,
    EthernetFrame,
    IPv4Packet,
    TcpSegment,
    ipv4,
    mac,
)

__all__ = ["StreamCapture"]

_WINDOW = 0xFFFF


class _Side:
    def __init__(self, mac_addr, ip, port, isn):
        self.mac, self.ip, self.port = mac(mac_addr), ipv4(ip), port
        self.seq = isn  # next sequence number this side sends
        self.ident = 0


class StreamCapture:
    """Record one TCP connection's byte stream to ``path`` as a pcap of synthetic frames.

    ``local`` and ``remote`` are ``(ip, port)`` pairs; the local side is the one that calls
    :meth:`sent`. ``active`` says which side opened the connection (its SYN comes first).
    """

    def __init__(self, path, local, remote, *, active=True, mss=1460, clock_ns=None,
                 local_mac="02:00:00:00:00:01", remote_mac="02:00:00:00:00:02"):
        if not 1 <= mss <= 65495:
            raise ValueError(f"MSS {mss} out of range")
        self.mss = mss
        self._writer = PcapWriter(path)
        self._clock = clock_ns
        self._time = 0
        self._local = _Side(local_mac, local[0], local[1], 0x10000000)
        self._remote = _Side(remote_mac, remote[0], remote[1], 0x20000000)
        first, second = (self._local, self._remote) if active else (self._remote, self._local)
        self._segment(first, second, SYN, b"", options=True)
        self._segment(second, first, SYN | ACK, b"", options=True)
        self._segment(first, second, ACK, b"")
        self.closed = False

    @property
    def frames(self) -> int:
        return self._writer.frames

    def sent(self, data: bytes) -> None:
        """Bytes the local side wrote to the stream."""
        self._data(self._local, self._remote, data)

    def received(self, data: bytes) -> None:
        """Bytes the local side read from the stream."""
        self._data(self._remote, self._local, data)

    def close(self) -> None:
        """Both FINs and the last ACK, then close the file."""
        if self.closed:
            return
        self._segment(self._local, self._remote, FIN | ACK, b"")
        self._segment(self._remote, self._local, FIN | ACK, b"")
        self._segment(self._local, self._remote, ACK, b"")
        self._writer.close()
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _data(self, src, dst, data):
        if self.closed:
            raise ValueError("the capture is closed")
        for start in range(0, len(data), self.mss):
            self._segment(src, dst, PSH | ACK, bytes(data[start:start + self.mss]))

    def _segment(self, src, dst, flags, payload, *, options=False):
        ack = dst.seq if flags & ACK else 0
        segment = TcpSegment(src.port, dst.port, src.seq, ack, flags, _WINDOW, payload,
                             mss=self.mss if options else None, wscale=0 if options else None)
        src.seq = (src.seq + len(payload) + (1 if flags & (SYN | FIN) else 0)) & 0xFFFFFFFF
        packet = IPv4Packet(src.ip, dst.ip, PROTO_TCP, segment.encode(src.ip, dst.ip),
                            ident=src.ident)
        src.ident = (src.ident + 1) & 0xFFFF
        frame = EthernetFrame(dst.mac, src.mac, ETHERTYPE_IPV4, packet.encode()).encode()
        self._time = self._clock() if self._clock else self._time + 1000
        self._writer.write(frame, self._time)
