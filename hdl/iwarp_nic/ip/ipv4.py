"""IPv4 receive and transmit for hosts on one Ethernet link.

Implements:

* RFC 791 section 3.1 (header format) and 3.2 (the header checksum is verified on receive and
  computed on transmit; Total Length delimits the datagram, so Ethernet padding is trimmed);
* RFC 1071 for the checksum arithmetic (:mod:`.checksum`);
* RFC 1122 section 3.2.1.1 (version other than 4 silently discarded), 3.2.1.2 (bad checksum
  silently discarded), 3.2.1.3 (datagrams not addressed to us discarded: no forwarding).

Deliberate limits (each dropped and counted): IP options (IHL > 5) and fragments (MF set or a
nonzero offset) are not supported on receive; datagrams are sent with DF set, TTL 64, no options.
"""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..exact import Machine, add, add_counts, eq, gt, lt, mask, ne, sub
from ..hdrparse import HeaderEmitter, HeaderParser, HeaderStream
from ..headers import ETHERNET, IPV4
from ..stream import BeatLayout, BeatStream, HalfRateSlice, SkidBuffer, check_data_bytes
from .checksum import lane_words, ones_reduce, ones_sum, words

__all__ = ["Ipv4Rx", "Ipv4Tx", "TxRequest", "ETHERTYPE_IPV4", "RX_COUNTERS", "TX_COUNTERS"]

ETHERTYPE_IPV4 = 0x0800
MF_BIT = 0                               # More Fragments: the flags field's last bit
DF = 0b010
TTL = 64

#: One datagram to send: destination, protocol and payload length in bytes (at least 1).
TxRequest = data.StructLayout({"dst": 32, "protocol": 8, "length": 16})

#: Counters of :class:`Ipv4Rx`: datagrams delivered, then one per reason of a drop.
RX_COUNTERS = ("rx_delivered", "rx_bad_header", "rx_options", "rx_bad_checksum",
               "rx_fragment", "rx_not_ours", "rx_truncated", "rx_frame_err")
#: Counters of :class:`Ipv4Tx`.
TX_COUNTERS = ("tx_sent", "tx_unresolved")


def _counters(m, owner):
    def count(name, strobe):
        counter = getattr(owner, name)
        with m.If(strobe):
            m.d.sync += counter.eq(counter + 1)
    return count


class Ipv4Rx(wiring.Component):
    """Check IPv4 datagrams and deliver our unfragmented, option-less ones as header + payload.

    Ports
    -----
    i : In(BeatStream(data_bytes, err=True))
        The Ethernet payload of frames with EtherType 0x0800, padding included.
    o_header : Out(HeaderStream(IPV4))
        One transfer per delivered datagram: its header fields; ``has_payload`` is 0 when Total
        Length is 20.
    o_payload : Out(BeatStream(data_bytes, err=True))
        The datagram's payload, exactly ``total_length - 20`` bytes (padding removed). ``err`` on
        its last beat means the frame was bad (MAC ``err``) or ended before Total Length; the
        consumer must then discard the datagram (``rx_truncated`` / ``rx_frame_err`` count it).
    ip : In(32)
        Our address.
    <counter> : Out(32) for each name of :data:`RX_COUNTERS`, wrapping.

    Drops (whole datagram, counted, no output, no effect on the next one), first reason wins:
    shorter than 20 bytes (``rx_truncated``); version != 4, IHL < 5 or Total Length < 20
    (``rx_bad_header``); IHL > 5 (``rx_options``); header checksum (``rx_bad_checksum``); MF or
    offset (``rx_fragment``); destination not ``ip`` (``rx_not_ours``); a header-only datagram
    whose frame carried ``err`` (``rx_frame_err``) or whose frame is shorter than Total Length
    (``rx_truncated``).

    Latency: the header is offered four cycles after the input beat completing it (a skid
    buffer at the input, the parser's register, the registered checks, a skid buffer at the
    output); payload beats follow four cycles after arriving (a second skid buffer after the
    parser), except that when Ethernet padding follows the datagram's last byte, its last beat
    is held until the frame's last beat shows ``err``. A header-only datagram is offered only
    once its frame has ended. Throughput: one beat per cycle within a datagram, plus one cycle
    per datagram for its header, and one more when the header was not already parsed as the
    previous datagram ended; a datagram every other cycle at most (its header leaves through a
    one-entry register slice, :class:`~iwarp_nic.stream.HalfRateSlice`).

    Timing: every port is registered (:class:`~iwarp_nic.stream.SkidBuffer` on ``i``,
    ``o_header`` and ``o_payload``), so no combinational path crosses the block. The header
    checksum is summed as the header streams in (one ones' complement add per two header bytes
    of a beat) and its verdict registered with the parser's header; the other checks are
    registered from the parsed header, so the decision on a header reads registers only.
    """

    def __init__(self, data_bytes):
        check_data_bytes(data_bytes)
        self.data_bytes = data_bytes
        members = {
            "i": In(BeatStream(data_bytes, err=True)),
            "o_header": Out(HeaderStream(IPV4)),
            "o_payload": Out(BeatStream(data_bytes, err=True)),
            "ip": In(32),
        }
        members.update({name: Out(32) for name in RX_COUNTERS})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        count = _counters(m, self)
        m.submodules.i_skid = i_skid = SkidBuffer(BeatLayout(n, err=True))
        m.submodules.parser = parser = HeaderParser(IPV4, n, err=True)
        # Two beats of slack for the cycle the header checks take: the payload behind a header
        # waits here, not at the input.
        m.submodules.parsed_skid = parsed_skid = SkidBuffer(BeatLayout(n, err=True))
        m.submodules.header_skid = header_skid = HalfRateSlice(self.o_header.payload.shape())
        m.submodules.payload_skid = payload_skid = SkidBuffer(BeatLayout(n, err=True))
        wiring.connect(m, wiring.flipped(self.i), i_skid.i)
        wiring.connect(m, i_skid.o, parser.i)
        wiring.connect(m, parser.o_payload, parsed_skid.i)
        wiring.connect(m, header_skid.o, wiring.flipped(self.o_header))
        wiring.connect(m, payload_skid.o, wiring.flipped(self.o_payload))
        # A datagram cut short is found by the parser (under 20 octets) or by the FSM below,
        # possibly in one cycle for two datagrams: both are added.
        cut_short = Signal()
        m.d.sync += self.rx_truncated.eq(add_counts(m, self.rx_truncated,
                                                    (parser.drop, cut_short), "rx_truncated_step"))

        # The header checksum, summed as the header's bytes go into the parser: `idx` counts the
        # beats of the packet up to the one completing the header, whose sum is judged and
        # registered as the parser registers the header (both hold until the header is taken).
        hdr_beat = (IPV4.length - 1) // n
        head = IPV4.length - hdr_beat * n
        idx = Signal(range(hdr_beat + 2))
        acc = Signal(16)
        bad_sum = Signal()
        at_hdr = eq(idx, hdr_beat)
        lanes = Mux(at_hdr, Const(mask(head), n), Const(mask(n), n))
        ib = parser.i.payload
        odd = idx[0] if n == 1 else None
        beat_sum = ones_sum(m, [acc, *lane_words(ib.data, lanes, odd)], "rx_sum")
        with m.If(parser.i.valid & parser.i.ready):
            with m.If(ib.last):
                m.d.sync += [idx.eq(0), acc.eq(0)]
            with m.Elif(lt(idx, hdr_beat + 1)):
                m.d.sync += [idx.eq(idx + 1), acc.eq(beat_sum)]
            with m.If(at_hdr):
                m.d.sync += bad_sum.eq(ne(beat_sum, 0xFFFF))

        h, p, o, oh = parser.o_header, parsed_skid.o, payload_skid.i, header_skid.i
        f = h.payload.fields
        m.d.comb += [oh.payload.fields.eq(f), oh.payload.has_payload.eq(ne(f.total_length, 20))]
        length = Signal(16)
        m.d.comb += length.eq(sub(f.total_length, 20))

        # The checks of the parsed header, registered: they stand (`checked`) once the header
        # has been held for a cycle (the parser keeps it until it is taken).
        checked = Signal()
        m.d.sync += checked.eq(h.valid & ~h.ready)

        def registered(name, cond):
            reg = Signal(name=name)
            m.d.sync += reg.eq(cond)
            return reg

        reasons = [
            ("rx_bad_header", registered("bad_header", ne(f.version, 4) | lt(f.ihl, 5)
                                         | lt(f.total_length, 20))),
            ("rx_options", registered("options", gt(f.ihl, 5))),
            ("rx_bad_checksum", bad_sum),
            ("rx_fragment", registered("fragment", f.flags[MF_BIT] | f.fragment_offset.any())),
            ("rx_not_ours", registered("not_ours", f.dst != self.ip)),
        ]
        empty = registered("empty", eq(f.total_length, 20))

        remaining = Signal(16)
        hold = Signal(BeatLayout(n, err=True))
        bad_end = Signal()
        beat = p.payload
        ends = lt(remaining, n + 1)                                 # the datagram ends in this beat
        kmask = Cat(*(gt(remaining, j) for j in range(n)))
        covered = Cat(*(beat.keep[j] & eq(remaining, j + 1) for j in range(n))).any()
        short = beat.last & ~(ends & covered)
        trimmed = {"data": beat.data, "keep": beat.keep & kmask, "last": beat.last | ends,
                   "err": (beat.last & beat.err) | short}

        fsm = Machine(m, ["IDLE", "PASS", "TAIL", "FLUSH", "DROP", "PAD0", "HDR0"], "fsm_state")
        with fsm.state("IDLE"):
            with m.If(h.valid & checked):
                first = None
                for name, cond in reasons:
                    earlier = first
                    first = cond if first is None else first | cond
                    count(name, cond & (~earlier if earlier is not None else 1))
                with m.If(first):
                    m.d.comb += h.ready.eq(1)
                    with m.If(h.payload.has_payload):
                        fsm.goto("DROP")
                with m.Elif(empty):
                    with m.If(h.payload.has_payload):
                        fsm.goto("PAD0")
                    with m.Else():
                        m.d.comb += [oh.valid.eq(1), h.ready.eq(oh.ready)]
                        count("rx_delivered", oh.ready)
                with m.Elif(~h.payload.has_payload):
                    m.d.comb += [h.ready.eq(1), cut_short.eq(1)]
                with m.Else():
                    m.d.comb += [oh.valid.eq(1), h.ready.eq(oh.ready)]
                    count("rx_delivered", oh.ready)
                    with m.If(oh.ready):
                        m.d.sync += remaining.eq(length)
                        fsm.goto("PASS")
        with fsm.state("PASS"):
            with m.If(ends & ~beat.last):
                m.d.comb += p.ready.eq(1)
                with m.If(p.valid):
                    m.d.sync += [hold[k].eq(v) for k, v in trimmed.items()]
                    fsm.goto("TAIL")
            with m.Else():
                m.d.comb += [o.valid.eq(p.valid), p.ready.eq(o.ready)]
                m.d.comb += [o.payload[k].eq(v) for k, v in trimmed.items()]
                with m.If(p.valid & o.ready):
                    m.d.sync += remaining.eq(sub(remaining, n))
                    with m.If(beat.last):
                        m.d.comb += cut_short.eq(short)
                        count("rx_frame_err", beat.err & ~short)
                        fsm.goto("IDLE")
        with fsm.state("TAIL"):
            m.d.comb += p.ready.eq(1)
            with m.If(p.valid & beat.last):
                m.d.sync += hold.err.eq(beat.err)
                count("rx_frame_err", beat.err)
                fsm.goto("FLUSH")
        with fsm.state("FLUSH"):
            m.d.comb += [o.valid.eq(1), o.payload.eq(hold)]
            with m.If(o.ready):
                fsm.goto("IDLE")
        with fsm.state("DROP"):
            m.d.comb += p.ready.eq(1)
            with m.If(p.valid & beat.last):
                fsm.goto("IDLE")
        with fsm.state("PAD0"):
            m.d.comb += p.ready.eq(1)
            with m.If(p.valid & beat.last):
                m.d.sync += bad_end.eq(beat.err)
                fsm.goto("HDR0")
        with fsm.state("HDR0"):
            with m.If(bad_end):
                m.d.comb += h.ready.eq(1)
                count("rx_frame_err", 1)
                fsm.goto("IDLE")
            with m.Else():
                m.d.comb += [oh.valid.eq(1), h.ready.eq(oh.ready)]
                count("rx_delivered", oh.ready)
                with m.If(oh.ready):
                    fsm.goto("IDLE")
        return m


class Ipv4Tx(wiring.Component):
    """Prepend an IPv4 header (with its checksum) and an Ethernet header to each datagram.

    Ports
    -----
    i_header : In(stream.Signature(TxRequest))
        One request per datagram: destination, protocol, payload length (>= 1).
    i_payload : In(BeatStream(data_bytes, err=True))
        Exactly ``length`` bytes per request; ``err`` on the last beat is passed on (the MAC
        aborts such a frame).
    o_header : Out(HeaderStream(ETHERNET)); o_payload : Out(BeatStream(data_bytes, err=True))
        The frame to send: Ethernet header (to the resolved MAC, EtherType 0x0800) and its
        payload, the 20-byte IPv4 header then the datagram's payload.
    lookup : Out(stream.Signature(32)); lookup_ok, lookup_mac : In
        The ARP cache (:class:`.arp.ArpEngine`), searched once per datagram; it never waits.
    o_park_header : Out(stream.Signature(TxRequest)); o_park_payload : Out(BeatStream(..))
    park_free : In(1)
        A datagram whose destination is not in the cache goes to the park whole, to wait while
        its address is resolved (:class:`.park.ParkedDatagram`, which offers it again); its
        header is offered only while ``park_free`` (the park then takes it at once). If the
        park keeps another, the datagram's payload is consumed and discarded and
        ``tx_unresolved`` counts it.
    mac, ip : In(48), In(32)
        Our addresses.
    tx_sent, tx_unresolved : Out(32)

    Header fields: version 4, IHL 5, DSCP/ECN 0, identification a per-datagram counter, DF
    set, offset 0, TTL 64. Latency: from a request offered to an idle block with a cache hit to
    its Ethernet and IPv4 headers offered, four cycles (the cache search is registered, and the
    header checksum is summed over two register stages meanwhile; one or two more when the
    search meets the ARP engine's other clients). Throughput: one beat per cycle within a
    datagram; the five cycles per datagram of request, lookup and headers overlap the
    emitter's output of the previous datagram, so about one cycle per datagram shows at the
    output. No datagram waits for the network: a miss is parked or discarded at
    the payload's pace, and the datagrams behind it go on. Datagrams to one destination leave
    in request order, except that a parked one may follow some sent after its address was
    learned.
    """

    def __init__(self, data_bytes):
        check_data_bytes(data_bytes)
        self.data_bytes = data_bytes
        members = {
            "i_header": In(stream.Signature(TxRequest)),
            "i_payload": In(BeatStream(data_bytes, err=True)),
            "o_header": Out(HeaderStream(ETHERNET)),
            "o_payload": Out(BeatStream(data_bytes, err=True)),
            "lookup": Out(stream.Signature(32)),
            "lookup_ok": In(1),
            "lookup_mac": In(48),
            "o_park_header": Out(stream.Signature(TxRequest)),
            "o_park_payload": Out(BeatStream(data_bytes, err=True)),
            "park_free": In(1),
            "mac": In(48),
            "ip": In(32),
        }
        members.update({name: Out(32) for name in TX_COUNTERS})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        count = _counters(m, self)
        m.submodules.emitter = emitter = HeaderEmitter(IPV4, self.data_bytes, err=True)
        wiring.connect(m, emitter.o, wiring.flipped(self.o_payload))

        req = Signal(TxRequest)
        total_length = Signal(16)               # req.length + 20, loaded with it
        dst_mac = Signal(48)
        ident = Signal(16)
        eth_done = Signal()
        ip_done = Signal()
        oh, ih = self.o_header, emitter.i_header

        fields = Signal(IPV4.layout)
        m.d.comb += [
            fields.version.eq(4), fields.ihl.eq(5), fields.total_length.eq(total_length),
            fields.identification.eq(ident), fields.flags.eq(DF), fields.ttl.eq(TTL),
            fields.protocol.eq(req.protocol), fields.src.eq(self.ip), fields.dst.eq(req.dst),
        ]
        # The header checksum, over two stages of registers that follow `req`, `ident` and `ip`
        # every cycle (two levels of the adder tree each): right two cycles after `req` is
        # loaded (`ident` changes only as a datagram leaves SEND, before the next is loaded).
        partial = ones_reduce(m, words(IPV4.pack(fields), IPV4.length), "tx_sum", levels=2)
        stage = [Signal(16, name=f"tx_sum_p{k}") for k in range(len(partial))]
        csum = Signal(16)
        summed = Signal(range(3))               # cycles since `req` was loaded, up to 2
        m.d.sync += [*(r.eq(v) for r, v in zip(stage, partial)),
                     csum.eq(~ones_sum(m, stage, "tx_sum_s2"))]
        with m.If(~eq(summed, 2)):
            m.d.sync += summed.eq(add(summed, 1))
        m.d.comb += [
            ih.payload.fields.eq(fields),
            ih.payload.fields.checksum.eq(csum),
            ih.payload.has_payload.eq(1),
            oh.payload.fields.dst.eq(dst_mac),
            oh.payload.fields.src.eq(self.mac),
            oh.payload.fields.ethertype.eq(ETHERTYPE_IPV4),
            oh.payload.has_payload.eq(1),
            self.lookup.payload.eq(req.dst),
            emitter.i_payload.payload.eq(self.i_payload.payload),
            self.o_park_header.payload.eq(req),
            self.o_park_payload.payload.eq(self.i_payload.payload),
        ]

        fsm = Machine(m, ["IDLE", "LOOKUP", "SEND", "PASS", "PARK", "DRAIN"], "fsm_state")
        with fsm.state("IDLE"):
            m.d.comb += self.i_header.ready.eq(1)
            m.d.sync += [eth_done.eq(0), ip_done.eq(0)]
            with m.If(self.i_header.valid):
                m.d.sync += [req.eq(self.i_header.payload), summed.eq(0),
                             total_length.eq(add(self.i_header.payload.length, 20))]
                fsm.goto("LOOKUP")
        with fsm.state("LOOKUP"):
            m.d.comb += self.lookup.valid.eq(1)
            with m.If(self.lookup.ready):
                with m.If(self.lookup_ok):
                    m.d.sync += dst_mac.eq(self.lookup_mac)
                    fsm.goto("SEND")
                with m.Else():
                    m.d.comb += self.o_park_header.valid.eq(self.park_free)
                    with m.If(self.park_free):
                        fsm.goto("PARK")
                    with m.Else():
                        count("tx_unresolved", 1)
                        fsm.goto("DRAIN")
        with fsm.state("SEND"):
            m.d.comb += [oh.valid.eq(~eth_done), ih.valid.eq(~ip_done & eq(summed, 2))]
            eth_now = eth_done | oh.ready
            ip_now = ip_done | (ih.valid & ih.ready)
            m.d.sync += [eth_done.eq(eth_now), ip_done.eq(ip_now)]
            with m.If(eth_now & ip_now):
                m.d.sync += ident.eq(ident + 1)
                count("tx_sent", 1)
                fsm.goto("PASS")
        with fsm.state("PASS"):
            m.d.comb += [emitter.i_payload.valid.eq(self.i_payload.valid),
                         self.i_payload.ready.eq(emitter.i_payload.ready)]
            with m.If(self.i_payload.valid & emitter.i_payload.ready
                      & self.i_payload.payload.last):
                fsm.goto("IDLE")
        with fsm.state("PARK"):
            m.d.comb += [self.o_park_payload.valid.eq(self.i_payload.valid),
                         self.i_payload.ready.eq(self.o_park_payload.ready)]
            with m.If(self.i_payload.valid & self.o_park_payload.ready
                      & self.i_payload.payload.last):
                fsm.goto("IDLE")
        with fsm.state("DRAIN"):
            m.d.comb += self.i_payload.ready.eq(1)
            with m.If(self.i_payload.valid & self.i_payload.payload.last):
                fsm.goto("IDLE")
        return m
