"""Frame fuzzing below the RDMA layers: mutated Ethernet, ARP, IPv4, ICMP and TCP frames for a
NIC that carries traffic, each with the drop counters it must move.

The layers' rules, as the NIC implements them and its blocks document them (the first reason
that holds is the one counted):

* the MAC (IEEE 802.3 clause 3.2.8-3.2.9 and 4.2.4.2.2): a frame whose FCS is wrong, shorter
  than 64 octets or longer than 1518 (FCS included) is counted by its reason and passed up
  marked bad;
* Ethernet: a destination neither the NIC's MAC nor broadcast (``ip_eth_not_ours``), an
  EtherType neither ARP nor IPv4, or IPv4 sent to broadcast (``ip_eth_ethertype``);
* ARP (RFC 826): a packet shorter than 28 octets, not Ethernet/IPv4, or in a bad frame
  (``ip_arp_rx_bad``); a request for the NIC's address is answered (``ip_arp_tx_reply``),
  unless the previous reply still waits then (``ip_arp_reply_busy``, which depends on
  timing: :data:`ARP_REPLY_COUNTERS`);
* IPv4 (RFC 791, RFC 1122 section 3.2.1): shorter than 20 octets (``ip_rx_truncated``);
  version, IHL below 5 or Total Length below 20 (``ip_rx_bad_header``); options
  (``ip_rx_options``); header checksum; fragments; a destination not the NIC's; then a frame
  ending before Total Length (``ip_rx_truncated``) or bad (``ip_rx_frame_err``), whose
  datagram is still handed up to be discarded there; a protocol neither TCP nor ICMP
  (``ip_ip_protocol``);
* ICMP (RFC 792): an echo request (type 8, code 0) is answered (``ip_icmp_replies``), or
  found bad at its end (``ip_icmp_bad_checksum``), unless the NIC has no room for the reply
  then (``ip_icmp_busy``, which depends on timing: :data:`ECHO_COUNTERS`); other types and
  codes, messages under 8 octets, and a request of 8 octets with a bad checksum are dropped
  (``ip_icmp_dropped``);
* TCP (RFC 9293 section 3.1): a segment handed up bad (``tcp_rx_front_discarded``), Data
  Offset below 5 or past the segment (``tcp_rx_front_bad_header``), checksum
  (``tcp_rx_front_bad_checksum``); then, RFC 9293 section 3.10.7: no connection
  (``tcp_rx_no_conn``, answered by a RST unless it is one: ``tcp_tx_resets``); on the idle
  *target* connection, a segment outside the receive window (``tcp_rx_dropped``, RFC 9293
  3.10.7.4 "first"), and an RST or a SYN inside it but not an RST at its next octet
  (``tcp_rx_challenged``, RFC 5961 sections 3.2 and 4.2).

:func:`expected` applies these rules to one frame, independently of the NIC; :class:`Fuzzer`
makes the frames (:data:`STRATEGIES` applied to :data:`BASES`) and keeps the sum of what
:func:`expected` says of each, and :class:`Injector` puts them on a
:class:`~iwarp_tb.nicmodel.NicModelRig`'s wire a few per slice, beside the traffic. A frame
whose outcome these rules do not settle (a TCP segment that a connection would take, say) is
never sent: it is made again.
"""

import random
import struct
from collections import Counter
from dataclasses import dataclass

from iwarp_model.wire.net import (
    ACK,
    ARP_REQUEST,
    BROADCAST_MAC,
    ETH_HEADER,
    ETH_MIN_FRAME,
    ETHERTYPE_ARP,
    ETHERTYPE_IPV4,
    FIN,
    ICMP_ECHO_REQUEST,
    PROTO_ICMP,
    PROTO_TCP,
    PSH,
    RST,
    SYN,
    ArpPacket,
    EthernetFrame,
    IcmpEcho,
    IPv4Packet,
    TcpSegment,
    internet_checksum,
    pseudo_header,
)

__all__ = ["Target", "Unsettled", "expected", "Fuzzer", "Injector", "BASES", "STRATEGIES",
           "DROP_COUNTERS", "REPLY_COUNTERS", "ECHO_COUNTERS", "ARP_REPLY_COUNTERS"]

MIN_FCS_FRAME = 64          # octets with the FCS
MAX_FCS_FRAME = 1518
FCS = 4
#: RFC 9293 3.10.7.4: sequence numbers at least this far from RCV.NXT are outside any window
#: the NIC offers (its receive buffer is far smaller).
FAR = 1 << 24
#: An RST or SYN this close past RCV.NXT is inside the window.
NEAR = 1000

#: The counters every drop of a fuzzed frame moves (one per layer that sees it bad), checked
#: exactly against :func:`expected`'s sums; the traffic beside the fuzz moves none of them.
DROP_COUNTERS = (
    "mac_rx_bad_fcs", "mac_rx_runts", "mac_rx_oversize", "mac_rx_phy_errors",
    "mac_rx_overflows", "ip_eth_runt", "ip_eth_not_ours", "ip_eth_ethertype", "ip_ip_protocol",
    "ip_rx_bad_header", "ip_rx_options", "ip_rx_bad_checksum", "ip_rx_fragment",
    "ip_rx_not_ours", "ip_rx_truncated", "ip_rx_frame_err", "ip_arp_rx_bad", "ip_icmp_dropped",
    "tcp_rx_no_conn", "tcp_rx_dropped", "tcp_rx_challenged",
    "tcp_rx_front_bad_checksum", "tcp_rx_front_bad_header", "tcp_rx_front_discarded",
    "tcp_rx_no_buffer")
#: What the NIC answers fuzzed frames with, checked exactly as well.
REPLY_COUNTERS = ("tcp_tx_resets",)
#: The fates of an echo request: answered, or found bad, as :func:`expected` says, unless
#: refused for want of room for its reply (the last counter) whatever it was.
ECHO_COUNTERS = ("ip_icmp_replies", "ip_icmp_bad_checksum", "ip_icmp_busy")
#: The fates of an ARP request for the NIC: answered, unless the previous reply still waits.
ARP_REPLY_COUNTERS = ("ip_arp_tx_reply", "ip_arp_reply_busy")


class Unsettled(Exception):
    """A frame whose outcome :func:`expected` does not predict (it is not sent)."""


@dataclass
class Target:
    """Where the fuzz is aimed: the NIC's and the sender's addresses (``bytes``), the idle
    connection's ports (the sender's ``sport``, the NIC's ``dport``) and the next sequence
    number the NIC expects on it (``rcv_nxt``), and the ports on which a segment would reach
    a connection or a listener the fuzz must not touch (``busy``)."""

    nic_mac: bytes
    nic_ip: bytes
    src_mac: bytes
    src_ip: bytes
    sport: int
    dport: int
    rcv_nxt: int
    busy: frozenset


def expected(frame, target, *, bad_fcs=False):
    """The counters of :data:`DROP_COUNTERS`, :data:`REPLY_COUNTERS`, :data:`ECHO_COUNTERS` and
    :data:`ARP_REPLY_COUNTERS` the NIC moves for
    ``frame`` (as sent, padding included, without FCS; a corrupted FCS if ``bad_fcs``), as a
    :class:`~collections.Counter`. :exc:`Unsettled` if the rules do not decide."""
    out = Counter()
    size = len(frame) + FCS
    bad = True
    if size < MIN_FCS_FRAME:
        out["mac_rx_runts"] += 1
    elif size > MAX_FCS_FRAME:
        raise Unsettled("an oversize frame: how much of it goes up is the MAC's choice")
    elif bad_fcs:
        out["mac_rx_bad_fcs"] += 1
    else:
        bad = False
    if len(frame) < ETH_HEADER + 1:
        raise Unsettled("a frame of no payload")
    dst, (ethertype,) = frame[:6], struct.unpack_from("!H", frame, 12)
    if dst != target.nic_mac and dst != BROADCAST_MAC:
        out["ip_eth_not_ours"] += 1
    elif ethertype == ETHERTYPE_ARP:
        out += _arp(frame[ETH_HEADER:], target, bad)
    elif ethertype != ETHERTYPE_IPV4 or dst == BROADCAST_MAC:
        out["ip_eth_ethertype"] += 1
    else:
        out += _ipv4(frame[ETH_HEADER:], target, bad)
    return out


def _arp(packet, target, bad):
    if bad or len(packet) < ArpPacket.LENGTH or packet[:6] != bytes.fromhex("000108000604"):
        return Counter(["ip_arp_rx_bad"])
    arp = ArpPacket.decode(packet)
    if arp.sender_ip == target.src_ip and arp.sender_mac != target.src_mac:
        # It would give the peer's address another MAC: the traffic's frames would go astray.
        raise Unsettled("an ARP packet that moves the peer")
    if arp.op == ARP_REQUEST and arp.target_ip == target.nic_ip:
        return Counter(["ip_arp_tx_reply"])
    raise Unsettled("an ARP packet that is not a request for the NIC")


def _ipv4(ip, target, bad):
    if len(ip) < IPv4Packet.HEADER:
        return Counter(["ip_rx_truncated"])
    vihl, total = ip[0], struct.unpack_from("!H", ip, 2)[0]
    ihl = (vihl & 0xF) * 4
    flags_frag = struct.unpack_from("!H", ip, 6)[0]
    if vihl >> 4 != 4 or ihl < 20 or total < 20:
        return Counter(["ip_rx_bad_header"])
    if ihl > 20:
        return Counter(["ip_rx_options"])
    if internet_checksum(ip[:20]) != 0:
        return Counter(["ip_rx_bad_checksum"])
    if flags_frag & 0x3FFF:
        return Counter(["ip_rx_fragment"])
    if ip[16:20] != target.nic_ip:
        return Counter(["ip_rx_not_ours"])
    proto, body = ip[9], ip[20:total]
    short = len(ip) < total
    if len(ip) == 20:                   # nothing after the header: never handed up
        return Counter(["ip_rx_truncated"])
    if total == 20 and bad:
        return Counter(["ip_rx_frame_err"])
    out = Counter()
    if total > 20 and (short or bad):
        out["ip_rx_truncated" if short else "ip_rx_frame_err"] += 1
    if proto == PROTO_TCP:
        out += _tcp(body, ip, target, short or bad)
    elif proto == PROTO_ICMP:
        if short or bad:
            raise Unsettled("a bad frame carrying ICMP")
        out += _icmp(body)
    else:
        return out + Counter(["ip_ip_protocol"])
    return out


def _icmp(body):
    if len(body) < 8 or body[:2] != bytes([ICMP_ECHO_REQUEST, 0]):
        return Counter(["ip_icmp_dropped"])
    if internet_checksum(body) == 0:
        return Counter(["ip_icmp_replies"])
    if len(body) == 8:
        return Counter(["ip_icmp_dropped"])
    return Counter(["ip_icmp_bad_checksum"])


def _tcp(segment, ip, target, bad):
    if bad:
        return Counter(["tcp_rx_front_discarded"])
    offset = (segment[12] >> 4) * 4 if len(segment) > 12 else 0
    if len(segment) < 20 or offset < 20 or offset > len(segment):
        return Counter(["tcp_rx_front_bad_header"])
    if internet_checksum(pseudo_header(ip[12:16], ip[16:20], PROTO_TCP, len(segment))
                         + segment) != 0:
        return Counter(["tcp_rx_front_bad_checksum"])
    sport, dport, seq = struct.unpack_from("!HHI", segment)
    flags = segment[13]
    if (ip[12:16], sport, dport) == (target.src_ip, target.sport, target.dport):
        return _on_target(seq, flags, len(segment) - offset, target)
    if dport in target.busy:
        raise Unsettled(f"a segment to port {dport}, which is in use")
    if flags & RST:
        return Counter(["tcp_rx_no_conn"])
    return Counter(["tcp_rx_no_conn", "tcp_tx_resets"])


def _on_target(seq, flags, length, target):
    ahead = (seq - target.rcv_nxt) & 0xFFFF_FFFF
    if FAR <= ahead <= (1 << 32) - FAR - length - 2:
        return Counter(["tcp_rx_dropped"])
    if 0 < ahead <= NEAR and length == 0 and flags & (RST | SYN) and not flags & FIN:
        return Counter(["tcp_rx_challenged"])
    raise Unsettled("a segment the target connection might take")


# ---- the frames

def _eth(target, ethertype, payload, dst=None):
    return EthernetFrame(dst or target.nic_mac, target.src_mac, ethertype, payload).encode()


def _ip(target, proto, payload, **fields):
    return IPv4Packet(target.src_ip, target.nic_ip, proto, payload, **fields).encode()


def _tcp_frame(target, rng, sport, dport, seq, flags, payload):
    segment = TcpSegment(sport, dport, seq & 0xFFFF_FFFF, rng.getrandbits(32), flags,
                         rng.getrandbits(16), payload)
    return _eth(target, ETHERTYPE_IPV4,
                _ip(target, PROTO_TCP, segment.encode(target.src_ip, target.nic_ip),
                    ident=rng.getrandbits(16)))


def _payload(rng, most=1400):
    return rng.randbytes(rng.choice((0, 0, rng.randrange(1, 64), rng.randrange(most))))


def out_of_window(target, rng):
    """A segment on the target connection, any flags, outside its receive window."""
    ahead = rng.randrange(FAR, (1 << 32) - FAR - 2000)
    flags = rng.choice((ACK, ACK | PSH, RST, RST | ACK, FIN | ACK, SYN, SYN | ACK, 0))
    return _tcp_frame(target, rng, target.sport, target.dport, target.rcv_nxt + ahead, flags,
                      _payload(rng))


def in_window(target, rng):
    """An RST or SYN on the target connection, inside its window but past its next octet."""
    flags = rng.choice((RST, RST | ACK, SYN, SYN | ACK))
    return _tcp_frame(target, rng, target.sport, target.dport,
                      target.rcv_nxt + rng.randrange(1, NEAR + 1), flags, b"")


def no_connection(target, rng):
    """A segment to a port with no connection and no listener."""
    while True:
        dport = rng.randrange(1, 1 << 16)
        if dport not in target.busy and dport != target.dport:
            break
    flags = rng.choice((SYN, ACK, ACK | PSH, RST, FIN | ACK, SYN | ACK))
    return _tcp_frame(target, rng, rng.randrange(1024, 1 << 16), dport, rng.getrandbits(32),
                      flags, _payload(rng))


def echo_request(target, rng):
    """An ICMP echo request to the NIC."""
    echo = IcmpEcho(ICMP_ECHO_REQUEST, rng.getrandbits(16), rng.getrandbits(16),
                    _payload(rng, 1000))
    return _eth(target, ETHERTYPE_IPV4, _ip(target, PROTO_ICMP, echo.encode()))


def other_protocol(target, rng):
    """A datagram of a protocol the NIC does not serve (UDP, SCTP, ...)."""
    proto = rng.choice((17, 132, 41, 47, rng.randrange(256)))
    if proto in (PROTO_TCP, PROTO_ICMP):
        proto = 17
    return _eth(target, ETHERTYPE_IPV4, _ip(target, proto, _payload(rng)))


def arp_request(target, rng):
    """An ARP request for the NIC's address from the sender."""
    arp = ArpPacket(ARP_REQUEST, target.src_mac, target.src_ip, bytes(6), target.nic_ip)
    return _eth(target, ETHERTYPE_ARP, arp.encode(), dst=BROADCAST_MAC)


#: The well-formed frames the fuzz starts from, by name.
BASES = {f.__name__.replace("_", "-"): f for f in (
    out_of_window, in_window, no_connection, echo_request, other_protocol, arp_request)}


# ---- the mutations: each takes the frame's octets and returns (frame, bad_fcs, pad)

def _fix_checksums(frame):
    """Recompute the IPv4 header checksum, and the TCP or ICMP checksum, where the frame's
    headers still say where they are."""
    frame = bytearray(frame)
    if len(frame) < ETH_HEADER + 20 or frame[12:14] != b"\x08\x00":
        return bytes(frame)
    ip = ETH_HEADER
    ihl = (frame[ip] & 0xF) * 4
    if ihl < 20 or len(frame) < ip + ihl:
        return bytes(frame)
    frame[ip + 10:ip + 12] = b"\0\0"
    frame[ip + 10:ip + 12] = struct.pack("!H", internet_checksum(frame[ip:ip + ihl]))
    total = struct.unpack_from("!H", frame, ip + 2)[0]
    body = ip + ihl
    end = ip + total
    if total <= ihl or end > len(frame):
        return bytes(frame)
    if frame[ip + 9] == PROTO_TCP and end - body >= 20:
        frame[body + 16:body + 18] = b"\0\0"
        sum_ = internet_checksum(pseudo_header(bytes(frame[ip + 12:ip + 16]),
                                               bytes(frame[ip + 16:ip + 20]), PROTO_TCP,
                                               end - body) + frame[body:end])
        frame[body + 16:body + 18] = struct.pack("!H", sum_)
    elif frame[ip + 9] == PROTO_ICMP and end - body >= 8:
        frame[body + 2:body + 4] = b"\0\0"
        frame[body + 2:body + 4] = struct.pack("!H", internet_checksum(frame[body:end]))
    return bytes(frame)


def _pad(frame):
    return frame + bytes(max(0, ETH_MIN_FRAME - len(frame)))


def clean(frame, rng):
    """The frame as made."""
    return _pad(frame), False, True


def bit_flips(frame, rng):
    """One to three bits flipped anywhere in the frame."""
    frame = bytearray(_pad(frame))
    for _ in range(rng.randrange(1, 4)):
        frame[rng.randrange(len(frame))] ^= 1 << rng.randrange(8)
    return bytes(frame), False, True


def header_byte(frame, rng):
    """One octet of the first 54 (Ethernet, IPv4 and TCP headers) set to a random value."""
    frame = bytearray(_pad(frame))
    frame[rng.randrange(54)] = rng.randrange(256)
    return bytes(frame), False, True


#: Header fields (offset, size in octets) that :func:`header_field` sets, the checksums then
#: made good again so that the layer above the field sees it.
FIELDS = {"dst-mac": (0, 6), "ethertype": (12, 2), "version-ihl": (14, 1),
          "total-length": (16, 2), "flags-fragment": (20, 2), "protocol": (23, 1),
          "dst-ip": (30, 4), "tcp-ports": (34, 4), "tcp-seq": (38, 4), "tcp-offset": (46, 1),
          "tcp-flags": (47, 1)}


def header_field(frame, rng):
    """A header field set to a random value, or a value near its own, checksums made good."""
    frame = bytearray(_pad(frame))
    at, size = rng.choice(list(FIELDS.values()))
    old = int.from_bytes(frame[at:at + size], "big")
    value = rng.choice((rng.getrandbits(8 * size), old ^ 1 << rng.randrange(8 * size),
                        (old + rng.randrange(-64, 65)) % (1 << 8 * size)))
    frame[at:at + size] = value.to_bytes(size, "big")
    return _fix_checksums(bytes(frame)), False, True


def truncated(frame, rng):
    """The frame cut short at a random octet (then padded to the minimum frame)."""
    frame = _pad(frame)
    return _pad(frame[:rng.randrange(ETH_HEADER + 1, len(frame) + 1)]), False, True


def bad_fcs(frame, rng):
    """The frame with its FCS corrupted."""
    return _pad(frame), True, True


def runt(frame, rng):
    """The frame's first 15 to 59 octets, not padded: a runt."""
    return frame[:rng.randrange(ETH_HEADER + 1, ETH_MIN_FRAME)], False, False


#: The mutations, by name.
STRATEGIES = {f.__name__.replace("_", "-"): f for f in (
    clean, bit_flips, header_byte, header_field, truncated, bad_fcs, runt)}


class Fuzzer:
    """Frames for ``target`` from ``seed``: each a mutation of :data:`STRATEGIES` applied to
    a frame of :data:`BASES`, both drawn at random, made again until :func:`expected`
    settles it. :attr:`expected` sums what they must do; :attr:`made` counts them by
    ``(base, strategy)``; :attr:`unsettled` counts the frames made again."""

    def __init__(self, target, seed):
        self.target = target
        self.rng = random.Random(seed)
        self.expected = Counter()
        self.made = Counter()
        self.unsettled = 0

    def frame(self):
        """One more frame: ``(octets, bad_fcs, pad)`` for ``Harness.send_frame``."""
        rng = self.rng
        while True:
            base, strategy = rng.choice(list(BASES)), rng.choice(list(STRATEGIES))
            octets, fcs_bad, pad = STRATEGIES[strategy](BASES[base](self.target, rng), rng)
            try:
                counts = expected(octets, self.target, bad_fcs=fcs_bad)
            except Unsettled:
                self.unsettled += 1
                continue
            self.expected += counts
            self.made[base, strategy] += 1
            return octets, fcs_bad, pad


class Injector:
    """Puts ``count`` frames of ``fuzzer`` on the wire into a NIC, ``per_slice`` of them
    before each of its rig's slices (:attr:`NicModelRig.sources`); :attr:`pending` is how
    many are still to go."""

    def __init__(self, fuzzer, count, per_slice=4):
        self.fuzzer, self.pending, self.per_slice = fuzzer, count, per_slice

    def step(self, rig):
        for _ in range(min(self.per_slice, self.pending)):
            octets, fcs_bad, pad = self.fuzzer.frame()
            rig.h.send_frame(octets, bad_fcs=fcs_bad, pad=pad)
            self.pending -= 1
