"""The IP layer between the MAC and TCP: Ethernet demultiplexing, ARP, IPv4, ICMP echo.

Implements (through its blocks): IEEE 802.3 / RFC 894 Ethernet II framing of IPv4 and ARP
(destination our MAC or broadcast), RFC 826 (:mod:`.arp`), RFC 791 / 1071 / 1122 section 3.2.1
(:mod:`.ipv4`), RFC 792 echo (:mod:`.icmp`).

::

  i ─ EthParser ─ Demux ─┬─ ArpEngine ──────────────────────────────┐
                         └─ Ipv4Rx ─ Demux ─┬─ o_tcp_*              │
                                            └─ IcmpEcho ─┐          │
  i_tcp_* ──────────────────────────────── Arbiter ─ Ipv4Tx ─ Arbiter ─ EthEmitter ─ o
                           ParkedDatagram ─┘            │ a miss
                                  └─────────────────────┘

Ipv4Tx looks each destination up in ArpEngine's cache; ParkedDatagram asks its resolver.
"""

from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..exact import add_counts, eq
from ..hdrparse import HeaderEmitter, HeaderParser, HeaderStream
from ..headers import ETHERNET, IPV4
from ..stream import BeatStream, check_data_bytes
from . import arp as arp_mod
from . import icmp as icmp_mod
from .arp import ETHERTYPE_ARP, ArpEngine
from .icmp import PROTO_ICMP, IcmpEcho
from .ipv4 import ETHERTYPE_IPV4, RX_COUNTERS, TX_COUNTERS, Ipv4Rx, Ipv4Tx, TxRequest
from .mux import Arbiter, Demux
from .park import ParkedDatagram

__all__ = ["IpStack", "PROTO_TCP", "COUNTERS"]

PROTO_TCP = 6

_ETH_COUNTERS = ("eth_runt", "eth_not_ours", "eth_ethertype", "ip_protocol")
#: Every counter port of :class:`IpStack`, by owner: ``"arp_" + ...`` for ARP ones.
COUNTERS = (_ETH_COUNTERS + RX_COUNTERS + TX_COUNTERS
            + tuple("arp_" + c for c in arp_mod.COUNTERS) + icmp_mod.COUNTERS)


class IpStack(wiring.Component):
    """Ethernet/ARP/IPv4/ICMP for one host address; TCP is attached above it.

    Ports
    -----
    i : In(BeatStream(data_bytes, err=True))
        Received frames from the MAC, destination MAC first, no FCS; ``err`` on the last beat
        marks a bad frame (dropped, counted by the block that sees its end).
    o : Out(BeatStream(data_bytes, err=True))
        Frames to send, no FCS and no padding (the MAC pads to 60 bytes and appends the FCS);
        ``err`` on a last beat asks the MAC to abort the frame (an echo reply whose request
        turned out bad).
    o_tcp_header : Out(HeaderStream(IPV4)); o_tcp_payload : Out(BeatStream(data_bytes, err=True))
        Received TCP datagrams (protocol 6) to us: IPv4 header fields, then the TCP segment
        trimmed to Total Length (``err`` on its last beat: discard it; see :class:`.Ipv4Rx`).
    i_tcp_header : In(stream.Signature(TxRequest)); i_tcp_payload : In(BeatStream(..))
        TCP segments to send: destination IP, protocol (6), segment length, then the segment.
    mac, ip : In(48), In(32)
        Our addresses.
    <counter> : Out(32) for each name of :data:`COUNTERS`, wrapping: ``eth_runt`` (frames
        shorter than 14 bytes), ``eth_not_ours`` (destination neither us nor broadcast),
        ``eth_ethertype`` (neither ARP nor IPv4, or IPv4 to the broadcast MAC), ``ip_protocol``
        (neither TCP nor ICMP), and those of :class:`.Ipv4Rx`, :class:`.Ipv4Tx`,
        :class:`.ArpEngine` (prefixed ``arp_``) and :class:`.IcmpEcho`.

    TX arbitration is round-robin at two points: echo replies against TCP datagrams into
    :class:`.Ipv4Tx`, and ARP frames against IPv4 frames into the Ethernet emitter; a packet is
    never interleaved with another.

    Throughput (measured, no back-pressure, 20 back-to-back TCP frames, first beat in to last
    beat out): RX runs at the input rate (2646 cycles for 2640 input beats of 1000-byte segments
    at 8 bytes; 2365 for 2360 with 64-byte segments at 1 byte); TX adds about two cycles per
    frame at 8 bytes and three at 1 byte (2678 cycles for 2640 output beats; 2417 for 2360 with
    64-byte segments), less than the MAC's preamble and inter-frame gap. Latency, RX: a TCP
    header is offered four cycles after the beat completing the IPv4 header (:class:`.Ipv4Rx`
    registers its ports and its checks); TX: the first frame beat leaves about seven cycles
    after a TCP request meets an idle stack and a cache hit.
    Back-pressure: no datagram waits for the network. One whose destination misses the ARP
    cache is parked (:class:`.ParkedDatagram`, one at a time) while the resolver asks
    (``arp_timeout`` cycles per try, ``arp_retries`` tries), or discarded and counted in
    ``tx_unresolved`` if another is parked; the datagrams behind it go on. So TX stalls only
    while the MAC takes frames. RX waits for TX in one place only, at TX's pace: TCP above
    stops taking segments while its transmit queue is full. An echo request's reply is made
    whole in :class:`.IcmpEcho`'s buffer first, and an ARP request that finds the previous
    reply still waiting is left unanswered (``arp_reply_busy``).
    """

    def __init__(self, data_bytes, *, arp_entries=8, arp_retries=3, arp_timeout=1 << 20):
        check_data_bytes(data_bytes)
        self.data_bytes = data_bytes
        self._arp = dict(entries=arp_entries, retries=arp_retries, timeout=arp_timeout)
        arp_mod.check_params(**self._arp)
        members = {
            "i": In(BeatStream(data_bytes, err=True)),
            "o": Out(BeatStream(data_bytes, err=True)),
            "o_tcp_header": Out(HeaderStream(IPV4)),
            "o_tcp_payload": Out(BeatStream(data_bytes, err=True)),
            "i_tcp_header": In(stream.Signature(TxRequest)),
            "i_tcp_payload": In(BeatStream(data_bytes, err=True)),
            "mac": In(48),
            "ip": In(32),
        }
        members.update({name: Out(32) for name in COUNTERS})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        m.submodules.eth_rx = eth_rx = HeaderParser(ETHERNET, n, err=True)
        eth_shape = HeaderStream(ETHERNET).members["payload"].shape
        m.submodules.eth_demux = eth_demux = Demux(eth_shape, n, 2, headers=False)
        m.submodules.arp = arp = ArpEngine(n, **self._arp)
        m.submodules.ip_rx = ip_rx = Ipv4Rx(n)
        m.submodules.ip_demux = ip_demux = Demux(HeaderStream(IPV4).members["payload"].shape, n, 2)
        m.submodules.icmp = icmp = IcmpEcho(n)
        m.submodules.park = park = ParkedDatagram(n)
        m.submodules.ip_arb = ip_arb = Arbiter(TxRequest, n, 3)
        m.submodules.ip_tx = ip_tx = Ipv4Tx(n)
        m.submodules.eth_arb = eth_arb = Arbiter(eth_shape, n, 2)
        m.submodules.eth_tx = eth_tx = HeaderEmitter(ETHERNET, n, err=True)

        for block in (arp, ip_rx, ip_tx):
            m.d.comb += block.ip.eq(self.ip)
        for block in (arp, ip_tx):
            m.d.comb += block.mac.eq(self.mac)

        def count(name, strobe):
            counter = getattr(self, name)
            with m.If(strobe):
                m.d.sync += counter.eq(counter + 1)

        # RX: Ethernet demux (ARP: way 0, IPv4: way 1, drop: 2).
        wiring.connect(m, wiring.flipped(self.i), eth_rx.i)
        wiring.connect(m, eth_rx.o_header, eth_demux.i_header)
        wiring.connect(m, eth_rx.o_payload, eth_demux.i_payload)
        eh = eth_rx.o_header.payload.fields
        to_us = eh.dst == self.mac
        broadcast = eq(eh.dst, arp_mod.BROADCAST)
        is_arp = eq(eh.ethertype, ETHERTYPE_ARP) & (to_us | broadcast)
        is_ip = eq(eh.ethertype, ETHERTYPE_IPV4) & to_us
        m.d.comb += eth_demux.sel.eq(2)
        with m.If(is_arp & eth_rx.o_header.payload.has_payload):
            m.d.comb += eth_demux.sel.eq(0)
        with m.Elif(is_ip & eth_rx.o_header.payload.has_payload):
            m.d.comb += eth_demux.sel.eq(1)
        eth_take = eth_rx.o_header.valid & eth_rx.o_header.ready
        # A frame under 14 octets (dropped by the parser) and a header-only one may end in one
        # cycle: both are added.
        m.d.sync += self.eth_runt.eq(add_counts(
            m, self.eth_runt, (eth_rx.drop, eth_take & ~eth_rx.o_header.payload.has_payload),
            "eth_runt_step"))
        count("eth_not_ours", eth_take & eth_rx.o_header.payload.has_payload & ~to_us
              & ~broadcast)
        count("eth_ethertype", eth_take & eth_rx.o_header.payload.has_payload
              & (to_us | broadcast) & ~is_arp & ~is_ip)
        wiring.connect(m, eth_demux.o_payload[0], arp.i)
        wiring.connect(m, eth_demux.o_payload[1], ip_rx.i)

        # IPv4 demux (TCP: way 0, ICMP: way 1, drop: 2).
        wiring.connect(m, ip_rx.o_header, ip_demux.i_header)
        wiring.connect(m, ip_rx.o_payload, ip_demux.i_payload)
        proto = ip_rx.o_header.payload.fields.protocol
        m.d.comb += ip_demux.sel.eq(2)
        with m.If(eq(proto, PROTO_TCP)):
            m.d.comb += ip_demux.sel.eq(0)
        with m.Elif(eq(proto, PROTO_ICMP)):
            m.d.comb += ip_demux.sel.eq(1)
        count("ip_protocol", ip_rx.o_header.valid & ip_rx.o_header.ready
              & eq(ip_demux.sel, 2))
        wiring.connect(m, ip_demux.o_header[0], wiring.flipped(self.o_tcp_header))
        wiring.connect(m, ip_demux.o_payload[0], wiring.flipped(self.o_tcp_payload))
        wiring.connect(m, ip_demux.o_header[1], icmp.i_header)
        wiring.connect(m, ip_demux.o_payload[1], icmp.i_payload)

        # TX: echo replies (whole in IcmpEcho's buffer, never an err), TCP, and the parked
        # datagram once its address is known, into IPv4; then ARP and IPv4 into Ethernet.
        wiring.connect(m, icmp.o_header, ip_arb.i_header[0])
        reply, way = icmp.o_payload, ip_arb.i_payload[0]
        m.d.comb += [way.valid.eq(reply.valid), reply.ready.eq(way.ready),
                     way.payload.data.eq(reply.payload.data),
                     way.payload.keep.eq(reply.payload.keep),
                     way.payload.last.eq(reply.payload.last)]
        wiring.connect(m, wiring.flipped(self.i_tcp_header), ip_arb.i_header[1])
        wiring.connect(m, wiring.flipped(self.i_tcp_payload), ip_arb.i_payload[1])
        wiring.connect(m, park.o_header, ip_arb.i_header[2])
        wiring.connect(m, park.o_payload, ip_arb.i_payload[2])
        wiring.connect(m, ip_arb.o_header, ip_tx.i_header)
        wiring.connect(m, ip_arb.o_payload, ip_tx.i_payload)
        wiring.connect(m, ip_tx.lookup, arp.lookup)
        m.d.comb += [ip_tx.lookup_ok.eq(arp.lookup_ok), ip_tx.lookup_mac.eq(arp.lookup_mac),
                     ip_tx.park_free.eq(park.free)]
        wiring.connect(m, ip_tx.o_park_header, park.i_header)
        wiring.connect(m, ip_tx.o_park_payload, park.i_payload)
        wiring.connect(m, park.resolve, arp.resolve)
        m.d.comb += park.resolve_ok.eq(arp.resolve_ok)
        wiring.connect(m, arp.o_header, eth_arb.i_header[0])
        wiring.connect(m, arp.o_payload, eth_arb.i_payload[0])
        wiring.connect(m, ip_tx.o_header, eth_arb.i_header[1])
        wiring.connect(m, ip_tx.o_payload, eth_arb.i_payload[1])
        wiring.connect(m, eth_arb.o_header, eth_tx.i_header)
        wiring.connect(m, eth_arb.o_payload, eth_tx.i_payload)
        wiring.connect(m, eth_tx.o, wiring.flipped(self.o))

        for name in RX_COUNTERS:
            m.d.comb += getattr(self, name).eq(getattr(ip_rx, name))
        for name in TX_COUNTERS:
            m.d.comb += getattr(self, name).eq(getattr(ip_tx, name))
        for name in arp_mod.COUNTERS:
            m.d.comb += getattr(self, "arp_" + name).eq(getattr(arp, name))
        for name in icmp_mod.COUNTERS:
            m.d.comb += getattr(self, name).eq(getattr(icmp, name))
        return m
