"""ARP for IPv4 over Ethernet: responder, address cache and resolver.

Implements:

* RFC 826 "Packet Reception": a packet is accepted only with hardware type 1 (Ethernet), protocol
  type 0x0800, lengths 6 and 4 and opcode 1 or 2; the merge rule (an existing entry for the
  sender's IP is updated from any packet; a new entry is added only when the target is us); a
  request for our IP is answered with a reply to the requester's hardware address.
* RFC 826 "Packet Generation" and RFC 1122 section 2.3.2.1: a resolver that broadcasts requests,
  retransmits them a bounded number of times, and reports failure.

Not implemented (documented limits): cache entries do not age out (RFC 1122 2.3.2.1 asks for a
timeout; entries here are only overwritten, round-robin, when the cache is full and refreshed by
the merge rule). The resolver works for one address at a time and queues nothing itself: its
client keeps the datagram that waits (:class:`.park.ParkedDatagram`, one at a time).
"""

import operator
from functools import reduce

from amaranth import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..exact import Machine, add_counts, eq, select, wire
from ..hdrparse import HeaderEmitter, HeaderParser, HeaderStream
from ..headers import ARP, ETHERNET
from ..stream import BeatStream, check_data_bytes

__all__ = ["ArpEngine", "check_params", "ETHERTYPE_ARP", "BROADCAST", "COUNTERS"]

ETHERTYPE_ARP = 0x0806
BROADCAST = (1 << 48) - 1
OP_REQUEST, OP_REPLY = 1, 2

#: The counters of :class:`ArpEngine`, in port order.
COUNTERS = ("rx_request", "rx_reply", "rx_bad", "tx_reply", "reply_busy", "tx_request",
            "resolve_fail")


def check_params(**params):
    """Validate :class:`ArpEngine`'s ``entries`` (>= 2), ``retries`` and ``timeout`` (>= 1)."""
    for name, value in params.items():
        least = 2 if name == "entries" else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, not {value!r}")


class ArpEngine(wiring.Component):
    """ARP responder, cache of ``entries`` (IP, MAC) pairs and resolver.

    Ports
    -----
    i : In(BeatStream(data_bytes, err=True))
        ARP packets: the Ethernet payload of frames with EtherType 0x0806 addressed to us or
        broadcast, padding included. A packet with ``err`` on its last beat, shorter than 28
        bytes, or not Ethernet/IPv4 ARP is dropped and counted in ``rx_bad``.
    o_header : Out(HeaderStream(ETHERNET)); o_payload : Out(BeatStream(data_bytes, err=True))
        Frames to send: replies (to the requester's MAC) and requests (broadcast), 42 bytes each
        with no padding (the MAC pads to the minimum frame size).
    lookup : In(stream.Signature(32))
        A search of the cache for an IPv4 address, never waiting for the network: the transfer
        completes in the cycle after its address is searched (the search is registered), with
        ``lookup_ok`` (found) and ``lookup_mac`` during that cycle. The payload must be held
        stable.
    resolve : In(stream.Signature(32))
        A request to resolve an IPv4 address. The transfer completes (``ready`` high) when the
        answer is known; during that cycle ``resolve_ok`` holds it. A cache hit completes in the
        cycle after its address is searched. On a miss a request is broadcast, and again after
        every ``timeout`` cycles in which its address is searched (every cycle but those the
        other clients take), ``retries`` times in all, until the address is learned; then the
        transfer completes with ``resolve_ok`` = 0 and ``resolve_fail`` counts it. The payload
        must be held stable.
    mac, ip : In(48), In(32)
        Our addresses (configuration, expected static while traffic flows).
    <counter> : Out(32) for each name of :data:`COUNTERS`, wrapping.

    The cache is searched once a cycle, for one client: an ARP packet's sender in the cycle
    its header arrives, else a lookup or the resolver, in turn when both wait. So a lookup
    completes in the cycle after it is offered, or a cycle or two later when it meets the
    others.

    Throughput: an ARP packet takes its beats plus two cycles, whatever the TX side does: the
    receive side never waits for it. A request for us that arrives while the previous reply
    still waits to be sent is not answered (it is learned from and counted in ``rx_request``
    as any other, and in ``reply_busy``); the requester asks again. One reply waits at most,
    behind the frame being sent. Latency: a reply is offered on ``o_header`` three cycles after
    the packet's last beat.
    """

    def __init__(self, data_bytes, *, entries=8, retries=3, timeout=1 << 20):
        check_data_bytes(data_bytes)
        check_params(entries=entries, retries=retries, timeout=timeout)
        self.data_bytes = data_bytes
        self.entries, self.retries, self.timeout = entries, retries, timeout
        members = {
            "i": In(BeatStream(data_bytes, err=True)),
            "o_header": Out(HeaderStream(ETHERNET)),
            "o_payload": Out(BeatStream(data_bytes, err=True)),
            "lookup": In(stream.Signature(32)),
            "lookup_ok": Out(1),
            "lookup_mac": Out(48),
            "resolve": In(stream.Signature(32)),
            "resolve_ok": Out(1),
            "mac": In(48),
            "ip": In(32),
        }
        members.update({name: Out(32) for name in COUNTERS})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        m.submodules.parser = parser = HeaderParser(ARP, n, err=True)
        m.submodules.emitter = emitter = HeaderEmitter(ARP, n, err=True)
        wiring.connect(m, wiring.flipped(self.i), parser.i)
        wiring.connect(m, emitter.o, wiring.flipped(self.o_payload))

        def count(name, strobe):
            counter = getattr(self, name)
            with m.If(strobe):
                m.d.sync += counter.eq(counter + 1)

        # A packet too short for the header (or header-only and bad) is dropped by the
        # parser, in a cycle that DECIDE's verdict on the packet before may share: both are
        # added, summed first (one adder on the counter, as for the others).
        decided_bad = Signal()
        m.d.sync += self.rx_bad.eq(add_counts(m, self.rx_bad, (parser.drop, decided_bad),
                                                      "rx_bad_step"))

        # --- the cache: `entries` registers, searched in parallel -----------------------------
        valid = Signal(self.entries)
        ips = [Signal(32, name=f"cache_ip{k}") for k in range(self.entries)]
        macs = [Signal(48, name=f"cache_mac{k}") for k in range(self.entries)]
        victim = Signal(range(self.entries))
        next_victim = select(m, victim, [*range(1, self.entries), 0], len(victim), "next_victim")
        # One search a cycle, shared by the three clients: one bank of comparators rather than
        # three (each takes about 40 LUT4 per entry). `holding`: the entries that hold the address
        # searched, at most one (an address is added only where none holds it).
        query = Signal(32)
        holding = Cat(valid[k] & (ips[k] == query) for k in range(self.entries))

        # --- RX: parse, wait for the end of the packet (err), then act --------------------------
        hdr = parser.o_header
        f = hdr.payload.fields
        bad_end = Signal()                      # the packet's last beat had err
        reply_pending = Signal()
        reply_mac = Signal(48)
        reply_ip = Signal(32)
        # The checks of the header, registered: the header is held from IDLE until DECIDE takes
        # it, and the cache is written only as DECIDE takes it, so in DECIDE these are those of
        # the header against the current cache.
        is_request, is_reply, well_formed, for_us, has_sender = (
            Signal(name=name) for name in ("is_request", "is_reply", "well_formed", "for_us",
                                           "has_sender"))
        learn_match = Signal(self.entries)      # the entries holding the sender's address
        learning = Signal()                     # the cache may be written this cycle
        grant_learn = Signal()                  # the sender's address is searched this cycle
        m.d.sync += [
            is_request.eq(eq(f.op, OP_REQUEST)), is_reply.eq(eq(f.op, OP_REPLY)),
            well_formed.eq(eq(f.hw_type, 1) & eq(f.proto_type, 0x0800) & eq(f.hw_len, 6)
                           & eq(f.proto_len, 4) & (eq(f.op, OP_REQUEST) | eq(f.op, OP_REPLY))),
            for_us.eq(f.target_ip == self.ip),
            has_sender.eq(f.sender_ip.any()),
        ]
        wants_reply = is_request & for_us
        learn_hit = learn_match.any()
        free = Signal(range(self.entries))
        has_free = Signal()
        for k in reversed(range(self.entries)):
            with m.If(~valid[k]):
                m.d.comb += [free.eq(k), has_free.eq(1)]

        rx = Machine(m, ["IDLE", "DRAIN", "DECIDE"], "rx_state")
        with rx.state("IDLE"):
            with m.If(hdr.valid):
                m.d.comb += grant_learn.eq(1)
                m.d.sync += bad_end.eq(0)
                with m.If(hdr.payload.has_payload):
                    rx.goto("DRAIN")
                with m.Else():
                    rx.goto("DECIDE")
        with rx.state("DRAIN"):
            m.d.comb += parser.o_payload.ready.eq(1)
            with m.If(parser.o_payload.valid & parser.o_payload.payload.last):
                m.d.sync += bad_end.eq(parser.o_payload.payload.err)
                rx.goto("DECIDE")
        with rx.state("DECIDE"):
            drop = bad_end | ~well_formed
            m.d.comb += hdr.ready.eq(1)
            rx.goto("IDLE")
            m.d.comb += decided_bad.eq(drop)
            count("rx_request", ~drop & is_request)
            count("rx_reply", ~drop & is_reply)
            with m.If(~drop & has_sender):
                m.d.comb += learning.eq(1)
                # RFC 826 merge: update any entry for the sender, add one if for us.
                for k in range(self.entries):
                    with m.If(learn_match[k]):
                        m.d.sync += macs[k].eq(f.sender_mac)
                with m.If(~learn_hit & for_us):
                    slot = Signal(range(self.entries))
                    m.d.comb += slot.eq(victim)
                    with m.If(has_free):
                        m.d.comb += slot.eq(free)
                    with m.Else():
                        m.d.sync += victim.eq(next_victim)
                    for k in range(self.entries):
                        with m.If(eq(slot, k)):
                            m.d.sync += [valid[k].eq(1), ips[k].eq(f.sender_ip),
                                         macs[k].eq(f.sender_mac)]
            count("reply_busy", ~drop & wants_reply & reply_pending)
            with m.If(~drop & wants_reply & ~reply_pending):
                m.d.sync += [reply_pending.eq(1), reply_mac.eq(f.sender_mac),
                             reply_ip.eq(f.sender_ip)]

        # --- lookup and resolver --------------------------------------------------------------
        # The search's clients, first first: the sender of an ARP packet whose header has just
        # arrived (RX's IDLE; its DECIDE comes a cycle or more later, and only DECIDE writes the
        # cache), then a lookup and the resolver, in turn when both wait. A search's result is
        # registered (which entries hold the address); it stands (`*_searched`) in the next
        # cycle if the client still waits then (payloads are held) and the cache was not
        # written meanwhile. The MAC is read from the registered match.
        want_lookup = wire(m, self.lookup.valid & ~self.lookup.ready, "want_lookup")
        want_resolve = wire(m, self.resolve.valid & ~self.resolve.ready, "want_resolve")
        resolve_turn = Signal()                 # the resolver lost the last contest
        grant_resolve = wire(m, ~grant_learn & want_resolve & (~want_lookup | resolve_turn),
                             "grant_resolve")
        grant_lookup = wire(m, ~grant_learn & want_lookup & ~grant_resolve, "grant_lookup")
        m.d.sync += resolve_turn.eq(want_resolve & ~grant_resolve)
        with m.If(grant_learn):
            m.d.comb += query.eq(f.sender_ip)
        with m.Elif(grant_resolve):
            m.d.comb += query.eq(self.resolve.payload)
        with m.Else():
            m.d.comb += query.eq(self.lookup.payload)
        match = Signal(self.entries)
        look_searched = Signal()
        searched = Signal()                     # the resolver's
        with m.If(grant_learn):
            m.d.sync += learn_match.eq(holding)
        m.d.sync += [match.eq(holding), look_searched.eq(grant_lookup & ~learning),
                     searched.eq(grant_resolve & ~learning)]
        m.d.comb += [self.lookup.ready.eq(self.lookup.valid & look_searched),
                     self.lookup_ok.eq(match.any()),
                     self.lookup_mac.eq(reduce(operator.or_, (
                         macs[k] & match[k].replicate(48) for k in range(self.entries))))]
        res_hit = match.any()

        req_pending = Signal()
        req_ip = Signal(32)
        tries = Signal(range(self.retries + 1))
        timer = Signal(range(self.timeout + 1))
        resolver = Machine(m, ["IDLE", "WAIT"], "resolver_state")
        with resolver.state("IDLE"):
            with m.If(self.resolve.valid & searched):
                with m.If(res_hit):
                    m.d.comb += [self.resolve.ready.eq(1), self.resolve_ok.eq(1)]
                with m.Elif(~req_pending):
                    m.d.sync += [req_pending.eq(1), req_ip.eq(self.resolve.payload),
                                 tries.eq(1), timer.eq(self.timeout)]
                    resolver.goto("WAIT")
        with resolver.state("WAIT"):
            with m.If(searched & res_hit):
                m.d.comb += [self.resolve.ready.eq(1), self.resolve_ok.eq(1)]
                resolver.goto("IDLE")
            with m.Elif(searched & ~req_pending):
                with m.If(timer.any()):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(eq(tries, self.retries)):
                    m.d.comb += self.resolve.ready.eq(1)
                    count("resolve_fail", 1)
                    resolver.goto("IDLE")
                with m.Else():
                    m.d.sync += [req_pending.eq(1), tries.eq(tries + 1),
                                 timer.eq(self.timeout)]

        # --- TX: one frame at a time, replies first ----------------------------------------------
        tx_op = Signal(16)
        tx_mac = Signal(48)                     # target hardware address (0 in a request)
        tx_ip = Signal(32)
        tx_dst = Signal(48)
        eth_done = Signal()
        arp_done = Signal()
        oh, eh = self.o_header, emitter.i_header
        m.d.comb += [
            oh.payload.fields.dst.eq(tx_dst),
            oh.payload.fields.src.eq(self.mac),
            oh.payload.fields.ethertype.eq(ETHERTYPE_ARP),
            oh.payload.has_payload.eq(1),
            eh.payload.fields.hw_type.eq(1),
            eh.payload.fields.proto_type.eq(0x0800),
            eh.payload.fields.hw_len.eq(6),
            eh.payload.fields.proto_len.eq(4),
            eh.payload.fields.op.eq(tx_op),
            eh.payload.fields.sender_mac.eq(self.mac),
            eh.payload.fields.sender_ip.eq(self.ip),
            eh.payload.fields.target_mac.eq(tx_mac),
            eh.payload.fields.target_ip.eq(tx_ip),
            eh.payload.has_payload.eq(0),
        ]
        tx = Machine(m, ["IDLE", "SEND"], "tx_state")
        with tx.state("IDLE"):
            m.d.sync += [eth_done.eq(0), arp_done.eq(0)]
            with m.If(reply_pending):
                m.d.sync += [reply_pending.eq(0), tx_op.eq(OP_REPLY), tx_mac.eq(reply_mac),
                             tx_ip.eq(reply_ip), tx_dst.eq(reply_mac)]
                tx.goto("SEND")
            with m.Elif(req_pending):
                m.d.sync += [req_pending.eq(0), tx_op.eq(OP_REQUEST), tx_mac.eq(0),
                             tx_ip.eq(req_ip), tx_dst.eq(BROADCAST)]
                tx.goto("SEND")
        with tx.state("SEND"):
            m.d.comb += [oh.valid.eq(~eth_done), eh.valid.eq(~arp_done)]
            eth_now = eth_done | oh.ready
            arp_now = arp_done | eh.ready
            m.d.sync += [eth_done.eq(eth_now), arp_done.eq(arp_now)]
            with m.If(eth_now & arp_now):
                count("tx_reply", eq(tx_op, OP_REPLY))
                count("tx_request", eq(tx_op, OP_REQUEST))
                tx.goto("IDLE")
        m.d.comb += emitter.i_payload.valid.eq(0)
        return m

