"""Ethernet II, ARP, IPv4, ICMP echo and TCP codecs, and the internet checksum.

Implements:

* Ethernet II framing (IEEE 802.3 clause 3.2.6 type interpretation): destination, source, type.
* RFC 826: the Ethernet/IPv4 ARP packet (hardware type 1, protocol type 0x0800).
* RFC 791 section 3.1: the IPv4 header. Options are never emitted and are skipped on receive.
* RFC 1071 / RFC 791: the internet checksum (ones' complement sum of 16-bit words).
* RFC 792: ICMP echo request and echo reply.
* RFC 9293 section 3.1 and 3.2: the TCP header, the pseudo-header checksum, and the options
  End of Option List, No-Operation and Maximum Segment Size; RFC 7323 section 2: Window Scale;
  RFC 2018 section 2: SACK-permitted. Other options (SACK blocks, timestamps, ...) are skipped
  on receive.

Addresses are ``bytes`` (6 for a MAC, 4 for an IPv4 address); :func:`mac` and :func:`ipv4`
convert the usual text forms. Every codec is a frozen dataclass with ``encode()`` and a
``decode()`` classmethod. Decoders raise a :class:`~.errors.WireError` subclass on bad input:
:class:`~.errors.TruncatedError` (too few bytes), :class:`ChecksumError` (a checksum does not
verify) or :class:`~.errors.BadFieldError` (a field holds a value this codec does not accept).
Constructors raise BadFieldError for out-of-range fields, so an object that exists encodes.
"""

import ipaddress
import struct
from dataclasses import dataclass

from .errors import BadFieldError, TruncatedError, WireError

__all__ = [
    "WireError", "TruncatedError", "ChecksumError", "BadFieldError",
    "mac", "mac_str", "ipv4", "ipv4_str", "BROADCAST_MAC",
    "internet_checksum", "pseudo_header",
    "ETHERTYPE_IPV4", "ETHERTYPE_ARP", "EthernetFrame", "ETH_MIN_FRAME",
    "ARP_REQUEST", "ARP_REPLY", "ArpPacket",
    "PROTO_ICMP", "PROTO_TCP", "IPv4Packet",
    "ICMP_ECHO_REQUEST", "ICMP_ECHO_REPLY", "IcmpEcho",
    "FIN", "SYN", "RST", "PSH", "ACK", "URG", "ECE", "CWR", "TcpSegment",
]


class ChecksumError(WireError):
    """An internet checksum (IPv4 header, ICMP, TCP with pseudo-header) does not verify."""

    def __init__(self, what: str):
        super().__init__(f"{what} does not verify")
        self.what = what


BROADCAST_MAC = b"\xff" * 6
ETHERTYPE_IPV4 = 0x0800
ETHERTYPE_ARP = 0x0806
ETH_HEADER = 14
ETH_MIN_FRAME = 60  # without the FCS
ARP_REQUEST = 1
ARP_REPLY = 2
PROTO_ICMP = 1
PROTO_TCP = 6
ICMP_ECHO_REPLY = 0
ICMP_ECHO_REQUEST = 8
FIN, SYN, RST, PSH, ACK, URG, ECE, CWR = (1 << i for i in range(8))

_OPT_EOL, _OPT_NOP, _OPT_MSS, _OPT_WSCALE, _OPT_SACK_OK = 0, 1, 2, 3, 4


def mac(value) -> bytes:
    """A MAC address as 6 bytes, from bytes or ``"02:00:00:00:00:01"`` text.

    BadFieldError if ``value`` is neither."""
    if isinstance(value, str):
        parts = value.replace("-", ":").split(":")
        try:
            value = bytes(int(p, 16) for p in parts)
        except ValueError:
            raise BadFieldError("MAC address", value, "not hex octets") from None
    value = bytes(value)
    if len(value) != 6:
        raise BadFieldError("MAC address", value, "not 6 bytes")
    return value


def mac_str(value: bytes) -> str:
    return ":".join(f"{b:02x}" for b in value)


def ipv4(value) -> bytes:
    """An IPv4 address as 4 bytes, from bytes or dotted-quad text (BadFieldError if bad)."""
    if isinstance(value, str):
        try:
            return ipaddress.IPv4Address(value).packed
        except ValueError:
            raise BadFieldError("IPv4 address", value, "not a dotted quad") from None
    value = bytes(value)
    if len(value) != 4:
        raise BadFieldError("IPv4 address", value, "not 4 bytes")
    return value


def ipv4_str(value: bytes) -> str:
    return str(ipaddress.IPv4Address(value))


def _need(data, length, what):
    if len(data) < length:
        raise TruncatedError(what, length, len(data))


def _range(value, bits, what):
    if not 0 <= value < (1 << bits):
        raise BadFieldError(what, value, f"does not fit {bits} bits")


def internet_checksum(data: bytes) -> int:
    """The RFC 1071 checksum of ``data``: the complement of the ones' complement sum of its
    big-endian 16-bit words (an odd length is padded with a zero byte).

    Over bytes that include a correct checksum field the result is 0.
    """
    if len(data) % 2:
        data = bytes(data) + b"\0"
    value = int.from_bytes(data, "big")
    # 2**16 == 1 (mod 0xFFFF), so the ones' complement sum is the value mod 0xFFFF, except that
    # end-around carry never turns a nonzero sum into +0: it stays 0xFFFF (-0).
    total = value % 0xFFFF or (0xFFFF if value else 0)
    return ~total & 0xFFFF


def pseudo_header(src: bytes, dst: bytes, proto: int, length: int) -> bytes:
    """The RFC 9293 section 3.1 pseudo-header: source, destination, zero, protocol, length."""
    return src + dst + struct.pack("!BBH", 0, proto, length)


@dataclass(frozen=True)
class EthernetFrame:
    """An Ethernet II frame without preamble and FCS."""

    dst: bytes
    src: bytes
    ethertype: int
    payload: bytes = b""

    def __post_init__(self):
        mac(self.dst), mac(self.src)
        _range(self.ethertype, 16, "ethertype")

    def encode(self, *, min_size: int = 0) -> bytes:
        """The frame's bytes, zero-padded to ``min_size`` (``ETH_MIN_FRAME`` for the wire)."""
        frame = self.dst + self.src + struct.pack("!H", self.ethertype) + self.payload
        return frame + bytes(max(0, min_size - len(frame)))

    @classmethod
    def decode(cls, data: bytes) -> "EthernetFrame":
        """Split a frame (no FCS); padding stays in ``payload`` for the upper layer to trim."""
        _need(data, ETH_HEADER, "Ethernet header")
        (ethertype,) = struct.unpack_from("!H", data, 12)
        return cls(bytes(data[0:6]), bytes(data[6:12]), ethertype, bytes(data[ETH_HEADER:]))


@dataclass(frozen=True)
class ArpPacket:
    """An RFC 826 ARP packet for Ethernet (hardware type 1) and IPv4 (protocol type 0x0800)."""

    op: int
    sender_mac: bytes
    sender_ip: bytes
    target_mac: bytes
    target_ip: bytes

    _FORMAT = "!HHBBH6s4s6s4s"
    LENGTH = 28

    def __post_init__(self):
        _range(self.op, 16, "ARP opcode")
        mac(self.sender_mac), mac(self.target_mac), ipv4(self.sender_ip), ipv4(self.target_ip)

    def encode(self) -> bytes:
        return struct.pack(self._FORMAT, 1, ETHERTYPE_IPV4, 6, 4, self.op, self.sender_mac,
                           self.sender_ip, self.target_mac, self.target_ip)

    @classmethod
    def decode(cls, data: bytes) -> "ArpPacket":
        """Decode the first 28 bytes (trailing padding is ignored); BadFieldError for anything but
        Ethernet/IPv4 address types and lengths."""
        _need(data, cls.LENGTH, "ARP packet")
        htype, ptype, hlen, plen, op, sha, spa, tha, tpa = struct.unpack_from(cls._FORMAT, data)
        if (htype, ptype, hlen, plen) != (1, ETHERTYPE_IPV4, 6, 4):
            raise BadFieldError("htype/ptype/hlen/plen", (htype, ptype, hlen, plen),
                                "not Ethernet/IPv4")
        return cls(op, sha, spa, tha, tpa)


@dataclass(frozen=True)
class IPv4Packet:
    """An IPv4 datagram: RFC 791 header fields (no options) and the payload."""

    src: bytes
    dst: bytes
    proto: int
    payload: bytes = b""
    ttl: int = 64
    ident: int = 0
    tos: int = 0
    df: bool = True
    mf: bool = False
    frag_offset: int = 0

    HEADER = 20

    def __post_init__(self):
        ipv4(self.src), ipv4(self.dst)
        _range(self.proto, 8, "protocol")
        _range(self.ttl, 8, "TTL")
        _range(self.ident, 16, "identification")
        _range(self.tos, 8, "type of service")
        _range(self.frag_offset, 13, "fragment offset")
        _range(self.HEADER + len(self.payload), 16, "total length")

    @property
    def is_fragment(self) -> bool:
        return self.mf or self.frag_offset != 0

    def encode(self) -> bytes:
        flags = (0x4000 if self.df else 0) | (0x2000 if self.mf else 0) | self.frag_offset
        header = struct.pack("!BBHHHBBH4s4s", 0x45, self.tos, self.HEADER + len(self.payload),
                             self.ident, flags, self.ttl, self.proto, 0, self.src, self.dst)
        checksum = internet_checksum(header)
        return header[:10] + struct.pack("!H", checksum) + header[12:] + self.payload

    @classmethod
    def decode(cls, data: bytes, *, verify: bool = True) -> "IPv4Packet":
        """Decode a datagram; bytes past the total length (Ethernet padding) are dropped and
        options are skipped. BadFieldError for a version other than 4, a header length under 20
        or a total length shorter than the header; ChecksumError when ``verify`` and the
        header checksum is wrong; TruncatedError when the bytes end before the total length."""
        _need(data, cls.HEADER, "IPv4 header")
        vihl, tos, total, ident, flags, ttl, proto, _ck, src, dst = struct.unpack_from(
            "!BBHHHBBH4s4s", data)
        if vihl >> 4 != 4:
            raise BadFieldError("Version", vihl >> 4, "not IPv4")
        ihl = (vihl & 0xF) * 4
        if ihl < cls.HEADER:
            raise BadFieldError("IHL", ihl // 4, "under 5")
        if total < ihl:
            raise BadFieldError("Total Length", total, f"below the header length {ihl}")
        _need(data, total, "IPv4 datagram")
        if verify and internet_checksum(data[:ihl]) != 0:
            raise ChecksumError("IPv4 header checksum")
        return cls(src, dst, proto, bytes(data[ihl:total]), ttl, ident, tos,
                   bool(flags & 0x4000), bool(flags & 0x2000), flags & 0x1FFF)


@dataclass(frozen=True)
class IcmpEcho:
    """An RFC 792 echo request (type 8) or echo reply (type 0)."""

    type: int
    ident: int
    seq: int
    payload: bytes = b""
    code: int = 0

    def __post_init__(self):
        _range(self.type, 8, "ICMP type")
        _range(self.code, 8, "ICMP code")
        _range(self.ident, 16, "ICMP identifier")
        _range(self.seq, 16, "ICMP sequence number")

    def encode(self) -> bytes:
        body = struct.pack("!BBHHH", self.type, self.code, 0, self.ident, self.seq) + self.payload
        return body[:2] + struct.pack("!H", internet_checksum(body)) + body[4:]

    @classmethod
    def decode(cls, data: bytes, *, verify: bool = True) -> "IcmpEcho":
        """Decode an echo message; BadFieldError for other ICMP types, ChecksumError if bad."""
        _need(data, 8, "ICMP echo header")
        typ, code, _ck, ident, seq = struct.unpack_from("!BBHHH", data)
        if typ not in (ICMP_ECHO_REQUEST, ICMP_ECHO_REPLY):
            raise BadFieldError("Type", typ, "not an ICMP echo message")
        if verify and internet_checksum(data) != 0:
            raise ChecksumError("ICMP checksum")
        return cls(typ, ident, seq, bytes(data[8:]), code)


@dataclass(frozen=True)
class TcpSegment:
    """A TCP segment: header fields, MSS, window-scale and SACK-permitted options, the payload.

    ``window`` is the raw 16-bit field (unscaled); ``flags`` is the byte of CWR..FIN bits.
    The checksum needs the IPv4 addresses, so ``encode``/``decode`` take them.
    """

    sport: int
    dport: int
    seq: int
    ack: int
    flags: int
    window: int
    payload: bytes = b""
    urgent: int = 0
    mss: int | None = None
    wscale: int | None = None
    sack_permitted: bool = False

    HEADER = 20

    def __post_init__(self):
        for value, bits, what in ((self.sport, 16, "source port"), (self.dport, 16, "dest port"),
                                  (self.seq, 32, "sequence number"), (self.ack, 32, "ack number"),
                                  (self.flags, 8, "flags"), (self.window, 16, "window"),
                                  (self.urgent, 16, "urgent pointer")):
            _range(value, bits, what)
        if self.mss is not None:
            _range(self.mss, 16, "MSS")
        if self.wscale is not None:
            _range(self.wscale, 8, "window scale")

    @property
    def seg_len(self) -> int:
        """SEG.LEN (RFC 9293 section 3.4): the sequence numbers the segment takes, its payload
        octets plus one each for SYN and FIN; 0 for a bare acknowledgement or a RST."""
        return len(self.payload) + bool(self.flags & SYN) + bool(self.flags & FIN)

    def options(self) -> bytes:
        """The encoded options: MSS, then NOP + window scale, then NOP, NOP + SACK-permitted,
        padded with EOL to 4 bytes."""
        out = b""
        if self.mss is not None:
            out += struct.pack("!BBH", _OPT_MSS, 4, self.mss)
        if self.wscale is not None:
            out += struct.pack("!BBBB", _OPT_NOP, _OPT_WSCALE, 3, self.wscale)
        if self.sack_permitted:
            out += struct.pack("!BBBB", _OPT_NOP, _OPT_NOP, _OPT_SACK_OK, 2)
        return out + bytes(-len(out) % 4)

    def encode(self, src_ip: bytes, dst_ip: bytes) -> bytes:
        """The segment's bytes with the checksum over the pseudo-header of ``src_ip, dst_ip``."""
        opts = self.options()
        offset = (self.HEADER + len(opts)) // 4
        header = struct.pack("!HHIIBBHHH", self.sport, self.dport, self.seq, self.ack,
                             offset << 4, self.flags, self.window, 0, self.urgent)
        body = header + opts + self.payload
        checksum = internet_checksum(pseudo_header(src_ip, dst_ip, PROTO_TCP, len(body)) + body)
        return body[:16] + struct.pack("!H", checksum) + body[18:]

    @classmethod
    def decode(cls, data: bytes, src_ip: bytes, dst_ip: bytes, *,
               verify: bool = True) -> "TcpSegment":
        """Decode ``data`` (exactly the IPv4 payload). TruncatedError if shorter than the data
        offset; BadFieldError for a data offset under 5 or a malformed option length; ChecksumError
        when ``verify`` and the pseudo-header checksum fails. Unknown options are skipped."""
        _need(data, cls.HEADER, "TCP header")
        sport, dport, seq, ack, offset, flags, window, _ck, urgent = struct.unpack_from(
            "!HHIIBBHHH", data)
        hlen = (offset >> 4) * 4
        if hlen < cls.HEADER:
            raise BadFieldError("Data Offset", hlen // 4, "under 5")
        _need(data, hlen, "TCP header with options")
        if verify and internet_checksum(
                pseudo_header(src_ip, dst_ip, PROTO_TCP, len(data)) + data) != 0:
            raise ChecksumError("TCP checksum")
        mss = wscale = None
        sack_permitted = False
        opts, i = data[cls.HEADER:hlen], 0
        while i < len(opts):
            kind = opts[i]
            if kind == _OPT_EOL:
                break
            if kind == _OPT_NOP:
                i += 1
                continue
            if i + 2 > len(opts) or opts[i + 1] < 2 or i + opts[i + 1] > len(opts):
                raise BadFieldError("option length", kind, "runs past the header or under 2")
            length = opts[i + 1]
            if kind == _OPT_MSS:
                if length != 4:
                    raise BadFieldError("MSS option length", length, "not 4")
                (mss,) = struct.unpack_from("!H", opts, i + 2)
            elif kind == _OPT_WSCALE:
                if length != 3:
                    raise BadFieldError("window scale option length", length, "not 3")
                wscale = opts[i + 2]
            elif kind == _OPT_SACK_OK:
                if length != 2:
                    raise BadFieldError("SACK-permitted option length", length, "not 2")
                sack_permitted = True
            i += length
        return cls(sport, dport, seq, ack, flags, window, bytes(data[hlen:]), urgent, mss, wscale,
                   sack_permitted)
