"""Protocol headers as wire-order tables, read and written by one generic parser and emitter.

Each header is described once, as a table of fields in the order of the RFC's diagram:

* Ethernet II: destination, source, EtherType (IEEE 802.3 clause 3.2, 14 bytes, no 802.1Q tag);
* IPv4: RFC 791 section 3.1, with the TOS octet split as RFC 2474 section 3 (DSCP) and
  RFC 3168 section 5 (ECN); the 20-byte header without options;
* TCP: RFC 9293 section 3.1, whose control bits are CWR, ECE, URG, ACK, PSH, RST, SYN, FIN from
  the MSB of byte 13 (a single ``flags`` field here); the 20-byte header without options;
* ARP: RFC 826 "Packet format", for Ethernet hardware and IPv4 protocol addresses (28 bytes);
* ICMP echo: RFC 792 "Echo or Echo Reply Message", the 8 bytes before the echoed data;
* DDP tagged and untagged headers, RFC 5041 sections 4.2 and 4.3, with the RDMAP control field
  of RFC 5040 section 4.1 in their first RsvdULP octet and, untagged, the Invalidate STag in the
  other 32 bits (RFC 5040 4.3); the reserved bits are gaps (sent as zero, not checked);
* the RDMAP headers that follow an untagged DDP header: Read Request (RFC 5040 4.4), Atomic
  Request and Atomic Response (RFC 7306 5.2.1 and 5.2.2, figure 6's 12-byte response).

A :class:`Field` is placed as in the RFC diagrams: ``offset`` is the byte offset in the header,
``bit`` the bit within that byte counted from the most significant one (bit 0 is the first on the
wire) and ``width`` its size in bits. Fields wider than a byte are big-endian (network order).

:class:`HeaderFormat` checks a table and derives the header's length and a ``data.StructLayout``
of host-order fields; :meth:`HeaderFormat.unpack` and :meth:`HeaderFormat.pack` convert between
that layout and the wire bytes. A ``Struct`` is never laid over wire bytes: Structs pack from the
least significant bit, the wire is big-endian from the first byte.
"""

from typing import NamedTuple

from amaranth import Cat, Const, Value
from amaranth.lib import data

__all__ = ["Field", "Gap", "HeaderFormat", "ETHERNET", "IPV4", "TCP", "ARP", "ICMP_ECHO",
           "DDP_TAGGED", "DDP_UNTAGGED", "READ_REQUEST", "ATOMIC_REQUEST", "ATOMIC_RESPONSE"]


class Field(NamedTuple):
    """A named header field: ``width`` bits from bit ``bit`` (MSB = 0) of byte ``offset``."""

    name: str
    offset: int
    bit: int
    width: int


class Gap(NamedTuple):
    """Bits a format leaves out of its fields: sent as zeros, ignored when parsed."""

    offset: int
    bit: int
    width: int


def _byte_swap(value, length):
    """Reverse the order of the ``length`` bytes of ``value``.

    On the wire side, byte ``i`` of a header sits in bits ``[8*i, 8*i+8)`` (lane order); swapped,
    the header reads as one big-endian number whose most significant bit is the first on the wire.
    """
    return Cat(*(value.word_select(i, 8) for i in reversed(range(length))))


class HeaderFormat:
    """A header layout: its fields in wire order, the gaps between them, and derived shapes.

    The fields and gaps must cover the header from its first bit to the end of a whole byte, with
    no overlap; anything else raises ``ValueError``.

    Attributes
    ----------
    name : str
    fields : tuple of Field
        In wire order.
    length : int
        Header length in bytes.
    layout : data.StructLayout
        One unsigned member per field, by name, in host order (the value, not the wire bits).
    """

    def __init__(self, name, fields, *, gaps=()):
        self.name = name
        self.fields = tuple(Field(*f) for f in fields)
        gaps = tuple(Gap(*g) for g in gaps)
        if not self.fields:
            raise ValueError(f"{name}: a header needs at least one field")
        names = [f.name for f in self.fields]
        for field in self.fields:
            if not field.name.isidentifier():
                raise ValueError(f"{name}: field name {field.name!r} is not an identifier")
            if names.count(field.name) > 1:
                raise ValueError(f"{name}: field {field.name!r} appears twice")
        for part in self.fields + gaps:
            if part.offset < 0 or not 0 <= part.bit < 8 or part.width < 1:
                raise ValueError(f"{name}: {part} needs offset >= 0, 0 <= bit < 8, width >= 1")
        # Walk every part in wire order: each must start where the previous one ended.
        parts = sorted(self.fields + gaps, key=lambda p: (8 * p.offset + p.bit))
        end = 0
        for part in parts:
            start = 8 * part.offset + part.bit
            if start != end:
                what = "overlaps the field before it" if start < end else "leaves an undeclared gap"
                raise ValueError(f"{name}: {part} {what} (previous part ends at bit {end})")
            end = start + part.width
        if end % 8:
            raise ValueError(f"{name}: the header ends at bit {end}, not on a byte boundary")
        if [p for p in parts if isinstance(p, Field)] != list(self.fields):
            raise ValueError(f"{name}: fields must be listed in wire order")
        self._parts = tuple(parts)
        self.length = end // 8
        self.layout = data.StructLayout({f.name: f.width for f in self.fields})

    def __repr__(self):
        return f"HeaderFormat({self.name!r}, {self.length} bytes)"

    def _span(self, part):
        """``(lo, hi)``: the bits of ``part`` in the header read as a big-endian number."""
        start = 8 * part.offset + part.bit
        return 8 * self.length - start - part.width, 8 * self.length - start

    def unpack(self, wire):
        """The fields of the header in ``wire`` (``8 * length`` bits, byte ``i`` of the header in
        bits ``[8*i, 8*i+8)``), as a view of :attr:`layout`. Pure wiring, no logic."""
        number = _byte_swap(Value.cast(wire), self.length)
        values = {f.name: number[slice(*self._span(f))] for f in self.fields}
        return self.layout(Cat(*(values[name] for name, _ in self.layout)))

    def pack(self, fields):
        """The wire bytes (``8 * length`` bits, byte ``i`` in bits ``[8*i, 8*i+8)``) of a header
        with these field values (a view of :attr:`layout`); gaps are zero. Pure wiring."""
        # Cat starts at the least significant bit, that is at the end of the header.
        number = Cat(*(Const(0, p.width) if isinstance(p, Gap) else fields[p.name]
                       for p in reversed(self._parts)))
        return _byte_swap(number, self.length)


ETHERNET = HeaderFormat("ethernet", [
    Field("dst", 0, 0, 48),
    Field("src", 6, 0, 48),
    Field("ethertype", 12, 0, 16),
])

IPV4 = HeaderFormat("ipv4", [
    Field("version", 0, 0, 4),
    Field("ihl", 0, 4, 4),
    Field("dscp", 1, 0, 6),
    Field("ecn", 1, 6, 2),
    Field("total_length", 2, 0, 16),
    Field("identification", 4, 0, 16),
    Field("flags", 6, 0, 3),
    Field("fragment_offset", 6, 3, 13),
    Field("ttl", 8, 0, 8),
    Field("protocol", 9, 0, 8),
    Field("checksum", 10, 0, 16),
    Field("src", 12, 0, 32),
    Field("dst", 16, 0, 32),
])

TCP = HeaderFormat("tcp", [
    Field("src_port", 0, 0, 16),
    Field("dst_port", 2, 0, 16),
    Field("seq", 4, 0, 32),
    Field("ack", 8, 0, 32),
    Field("data_offset", 12, 0, 4),
    Field("reserved", 12, 4, 4),
    Field("flags", 13, 0, 8),
    Field("window", 14, 0, 16),
    Field("checksum", 16, 0, 16),
    Field("urgent_pointer", 18, 0, 16),
])

ARP = HeaderFormat("arp", [
    Field("hw_type", 0, 0, 16),
    Field("proto_type", 2, 0, 16),
    Field("hw_len", 4, 0, 8),
    Field("proto_len", 5, 0, 8),
    Field("op", 6, 0, 16),
    Field("sender_mac", 8, 0, 48),
    Field("sender_ip", 14, 0, 32),
    Field("target_mac", 18, 0, 48),
    Field("target_ip", 24, 0, 32),
])

ICMP_ECHO = HeaderFormat("icmp_echo", [
    Field("type", 0, 0, 8),
    Field("code", 1, 0, 8),
    Field("checksum", 2, 0, 16),
    Field("identifier", 4, 0, 16),
    Field("sequence", 6, 0, 16),
])

# DDP control (T, L, Rsvd, DV) and RDMAP control (RV, Rsv, Opcode): the first two octets of both.
_CONTROL = [Field("t", 0, 0, 1), Field("l", 0, 1, 1), Field("dv", 0, 6, 2),
            Field("rv", 1, 0, 2), Field("opcode", 1, 4, 4)]
_CONTROL_GAPS = [Gap(0, 2, 4), Gap(1, 2, 2)]

DDP_TAGGED = HeaderFormat("ddp_tagged", _CONTROL + [
    Field("stag", 2, 0, 32),
    Field("to", 6, 0, 64),
], gaps=_CONTROL_GAPS)

DDP_UNTAGGED = HeaderFormat("ddp_untagged", _CONTROL + [
    Field("inv_stag", 2, 0, 32),
    Field("qn", 6, 0, 32),
    Field("msn", 10, 0, 32),
    Field("mo", 14, 0, 32),
], gaps=_CONTROL_GAPS)

READ_REQUEST = HeaderFormat("read_request", [
    Field("sink_stag", 0, 0, 32),
    Field("sink_to", 4, 0, 64),
    Field("size", 12, 0, 32),
    Field("src_stag", 16, 0, 32),
    Field("src_to", 20, 0, 64),
])

ATOMIC_REQUEST = HeaderFormat("atomic_request", [
    Field("aopcode", 3, 4, 4),
    Field("request_id", 4, 0, 32),
    Field("stag", 8, 0, 32),
    Field("to", 12, 0, 64),
    Field("add_swap_data", 20, 0, 64),
    Field("add_swap_mask", 28, 0, 64),
    Field("compare_data", 36, 0, 64),
    Field("compare_mask", 44, 0, 64),
], gaps=[Gap(0, 0, 28)])

ATOMIC_RESPONSE = HeaderFormat("atomic_response", [
    Field("request_id", 0, 0, 32),
    Field("value", 4, 0, 64),
])
