"""Ethernet, ARP, IPv4, ICMP and TCP codecs against scapy (an independent implementation):
decode what scapy builds, encode byte-identically (checksums included), round trips, and the
specific errors on bad input."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.all import ARP, ICMP, IP, TCP, Ether, IPOption_NOP, IPOption_RR, raw
from scapy.utils import checksum as scapy_checksum

from iwarp_model.wire.net import (
    ACK,
    ARP_REPLY,
    ARP_REQUEST,
    ETHERTYPE_ARP,
    ETHERTYPE_IPV4,
    ICMP_ECHO_REQUEST,
    PROTO_TCP,
    SYN,
    ArpPacket,
    BadFieldError,
    ChecksumError,
    EthernetFrame,
    IcmpEcho,
    IPv4Packet,
    TcpSegment,
    TruncatedError,
    internet_checksum,
    ipv4,
    ipv4_str,
    mac,
    mac_str,
)

MAC_A, MAC_B = "02:00:00:00:00:0a", "02:00:00:00:00:0b"
IP_A, IP_B = "10.0.0.1", "10.0.0.2"

u8, u16, u32 = (st.integers(0, (1 << n) - 1) for n in (8, 16, 32))
macs = st.binary(min_size=6, max_size=6)
ips = st.binary(min_size=4, max_size=4)
payloads = st.binary(max_size=200)


def test_rfc1071_example():
    # RFC 1071 section 3: the words 0001 f203 f4f5 f6f7 sum to ddf2; the checksum is 220d.
    assert internet_checksum(bytes.fromhex("0001f203f4f5f6f7")) == 0x220D


@given(st.binary(max_size=300))
def test_checksum_matches_scapy(data):
    assert internet_checksum(data) == scapy_checksum(data)


def test_checksum_never_yields_zero_for_nonzero_sum():
    # A sum of 0xFFFF (negative zero) must give checksum 0, all-zero data gives 0xFFFF.
    assert internet_checksum(b"\xff\xff") == 0
    assert internet_checksum(b"\x00\x00") == 0xFFFF
    assert internet_checksum(b"\xff\x00\x00\xff") == 0


def test_address_helpers():
    assert mac(MAC_A) == bytes.fromhex("02000000000a")
    assert mac_str(mac(MAC_B)) == MAC_B
    assert ipv4(IP_A) == bytes([10, 0, 0, 1])
    assert ipv4_str(bytes([169, 254, 10, 1])) == "169.254.10.1"
    for bad in ("02:00", "zz:00:00:00:00:00", b"\x00" * 5):
        with pytest.raises(BadFieldError):
            mac(bad)
    for bad in ("10.0.0", "10.0.0.256", b"\x00" * 3):
        with pytest.raises(BadFieldError):
            ipv4(bad)


@given(macs, macs, u16, payloads)
def test_ethernet_against_scapy(dst, src, ethertype, payload):
    ours = EthernetFrame(dst, src, ethertype, payload)
    theirs = raw(Ether(dst=mac_str(dst), src=mac_str(src), type=ethertype) / payload)
    assert ours.encode() == theirs
    assert EthernetFrame.decode(theirs) == ours


def test_ethernet_padding_and_truncation():
    frame = EthernetFrame(mac(MAC_A), mac(MAC_B), ETHERTYPE_ARP, b"x").encode(min_size=60)
    assert len(frame) == 60 and frame[15:] == bytes(45)
    with pytest.raises(TruncatedError):
        EthernetFrame.decode(frame[:13])
    with pytest.raises(BadFieldError):
        EthernetFrame(b"\x00" * 5, mac(MAC_B), 0x800)
    with pytest.raises(BadFieldError):
        EthernetFrame(mac(MAC_A), mac(MAC_B), 0x10000)


@given(st.sampled_from([ARP_REQUEST, ARP_REPLY]), macs, ips, macs, ips)
def test_arp_against_scapy(op, sha, spa, tha, tpa):
    ours = ArpPacket(op, sha, spa, tha, tpa)
    theirs = raw(ARP(op=op, hwsrc=mac_str(sha), psrc=ipv4_str(spa), hwdst=mac_str(tha),
                     pdst=ipv4_str(tpa)))
    assert ours.encode() == theirs
    assert ArpPacket.decode(theirs + bytes(18)) == ours  # Ethernet padding is ignored


def test_arp_rejects_other_address_types():
    good = ArpPacket(ARP_REQUEST, mac(MAC_A), ipv4(IP_A), bytes(6), ipv4(IP_B)).encode()
    with pytest.raises(BadFieldError):
        ArpPacket.decode(b"\x00\x06" + good[2:])  # hardware type 6 (IEEE 802)
    with pytest.raises(BadFieldError):
        ArpPacket.decode(raw(ARP(ptype=0x86DD)))
    with pytest.raises(TruncatedError):
        ArpPacket.decode(good[:27])


@given(ips, ips, u8, payloads, st.integers(1, 255), u16, u8, st.booleans())
def test_ipv4_against_scapy(src, dst, proto, payload, ttl, ident, tos, df):
    ours = IPv4Packet(src, dst, proto, payload, ttl=ttl, ident=ident, tos=tos, df=df)
    theirs = raw(IP(src=ipv4_str(src), dst=ipv4_str(dst), proto=proto, ttl=ttl, id=ident,
                    tos=tos, flags="DF" if df else 0) / payload)
    assert ours.encode() == theirs
    assert IPv4Packet.decode(theirs) == ours


def test_ipv4_options_skipped_padding_trimmed_fragments_seen():
    theirs = raw(IP(src=IP_A, dst=IP_B, proto=PROTO_TCP, id=9,
                    options=[IPOption_NOP(), IPOption_RR(routers=["1.2.3.4"])]) / b"data")
    packet = IPv4Packet.decode(theirs + bytes(10))
    assert packet.payload == b"data" and packet.ident == 9 and not packet.df
    frag = IPv4Packet.decode(raw(IP(src=IP_A, dst=IP_B, flags="MF", frag=0) / b"12345678"))
    assert frag.mf and frag.is_fragment
    assert IPv4Packet.decode(raw(IP(src=IP_A, dst=IP_B, frag=5) / b"x")).is_fragment


def test_ipv4_bad_input():
    good = IPv4Packet(ipv4(IP_A), ipv4(IP_B), PROTO_TCP, b"abcd").encode()
    with pytest.raises(ChecksumError):
        IPv4Packet.decode(good[:10] + b"\x00\x00" + good[12:])
    assert IPv4Packet.decode(good[:10] + b"\x00\x00" + good[12:], verify=False).payload == b"abcd"
    with pytest.raises(BadFieldError):
        IPv4Packet.decode(b"\x65" + good[1:])  # version 6
    with pytest.raises(BadFieldError):
        IPv4Packet.decode(b"\x44" + good[1:])  # header length 16
    with pytest.raises(BadFieldError):
        IPv4Packet.decode(good[:2] + struct.pack("!H", 19) + good[4:])
    with pytest.raises(TruncatedError):
        IPv4Packet.decode(good[:-1])
    with pytest.raises(TruncatedError):
        IPv4Packet.decode(good[:19])
    with pytest.raises(BadFieldError):
        IPv4Packet(ipv4(IP_A), ipv4(IP_B), 6, ttl=256)


@given(st.sampled_from([0, 8]), u16, u16, payloads)
def test_icmp_echo_against_scapy(typ, ident, seq, payload):
    ours = IcmpEcho(typ, ident, seq, payload)
    theirs = raw(ICMP(type=typ, id=ident, seq=seq) / payload)
    assert ours.encode() == theirs
    assert IcmpEcho.decode(theirs) == ours


def test_icmp_bad_input():
    good = IcmpEcho(ICMP_ECHO_REQUEST, 1, 2, b"ping").encode()
    with pytest.raises(ChecksumError):
        IcmpEcho.decode(good[:-1] + b"X")
    with pytest.raises(BadFieldError):
        IcmpEcho.decode(raw(ICMP(type=3, code=1)))
    with pytest.raises(TruncatedError):
        IcmpEcho.decode(good[:7])


tcp_segments = st.builds(
    TcpSegment, sport=u16, dport=u16, seq=u32, ack=u32, flags=u8, window=u16,
    payload=payloads, urgent=u16, mss=st.none() | u16, wscale=st.none() | st.integers(0, 14),
    sack_permitted=st.booleans())


def _scapy_tcp(seg: TcpSegment):
    options = []
    if seg.mss is not None:
        options.append(("MSS", seg.mss))
    if seg.wscale is not None:
        options += [("NOP", None), ("WScale", seg.wscale)]
    if seg.sack_permitted:
        options += [("NOP", None), ("NOP", None), ("SAckOK", b"")]
    return TCP(sport=seg.sport, dport=seg.dport, seq=seg.seq, ack=seg.ack, flags=seg.flags,
               window=seg.window, urgptr=seg.urgent, options=options) / seg.payload


@settings(max_examples=200)
@given(tcp_segments, ips, ips)
def test_tcp_against_scapy(seg, src, dst):
    theirs = raw(IP(src=ipv4_str(src), dst=ipv4_str(dst), id=1, flags="DF") / _scapy_tcp(seg))
    ours = IPv4Packet(src, dst, PROTO_TCP, seg.encode(src, dst), ident=1).encode()
    assert ours == theirs
    packet = IPv4Packet.decode(theirs)
    assert TcpSegment.decode(packet.payload, src, dst) == seg


def test_tcp_decodes_linux_style_syn_options():
    # What Linux puts in a SYN: MSS, SACK-permitted, timestamps, NOP, window scale.
    syn = TCP(sport=40000, dport=5000, seq=123, flags="S", window=64240,
              options=[("MSS", 1460), ("SAckOK", b""), ("Timestamp", (1, 0)), ("NOP", None),
                       ("WScale", 7)])
    data = raw(IP(src=IP_A, dst=IP_B) / syn)
    seg = TcpSegment.decode(data[20:], ipv4(IP_A), ipv4(IP_B))
    assert (seg.flags, seg.seq, seg.window, seg.mss, seg.wscale, seg.sack_permitted) == (
        SYN, 123, 64240, 1460, 7, True)
    sack = TCP(sport=1, dport=2, flags="A", options=[("NOP", None), ("NOP", None),
                                                      ("SAck", (100, 200))])
    data = raw(IP(src=IP_A, dst=IP_B) / sack / b"zz")
    seg = TcpSegment.decode(data[20:], ipv4(IP_A), ipv4(IP_B))
    assert seg.payload == b"zz" and seg.mss is None and seg.flags == ACK
    assert not seg.sack_permitted


def test_tcp_bad_input():
    a, b = ipv4(IP_A), ipv4(IP_B)
    good = TcpSegment(1, 2, 3, 4, ACK, 5, b"data", mss=1460).encode(a, b)
    with pytest.raises(ChecksumError):
        TcpSegment.decode(good, a, ipv4("10.0.0.3"))  # pseudo-header covers the addresses
    with pytest.raises(ChecksumError):
        TcpSegment.decode(good[:-1] + b"X", a, b)
    with pytest.raises(TruncatedError):
        TcpSegment.decode(good[:19], a, b)
    with pytest.raises(TruncatedError):
        TcpSegment.decode(good[:22], a, b)  # data offset says 24
    with pytest.raises(BadFieldError):
        TcpSegment.decode(good[:12] + b"\x40" + good[13:], a, b, verify=False)
    bad_opt = good[:20] + b"\x02\x05\x05\xb4" + good[24:]
    with pytest.raises(BadFieldError):
        TcpSegment.decode(bad_opt, a, b, verify=False)
    zero_len_opt = good[:20] + b"\x08\x00\x00\x00" + good[24:]
    with pytest.raises(BadFieldError):
        TcpSegment.decode(zero_len_opt, a, b, verify=False)
    with pytest.raises(BadFieldError):
        TcpSegment(1, 2, 1 << 32, 0, 0, 0)


@given(tcp_segments, ips, ips)
def test_tcp_round_trip(seg, src, dst):
    assert TcpSegment.decode(seg.encode(src, dst), src, dst) == seg


@given(macs, macs, ips, ips, payloads)
def test_full_frame_round_trip(dmac, smac, src, dst, payload):
    seg = TcpSegment(1000, 2000, 1, 2, ACK, 3, payload)
    frame = EthernetFrame(dmac, smac, ETHERTYPE_IPV4,
                          IPv4Packet(src, dst, PROTO_TCP, seg.encode(src, dst)).encode()
                          ).encode(min_size=60)
    eth = EthernetFrame.decode(frame)
    packet = IPv4Packet.decode(eth.payload)
    assert TcpSegment.decode(packet.payload, packet.src, packet.dst) == seg
