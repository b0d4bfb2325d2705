"""One IPv4 datagram kept while the address of its next hop is resolved.

Implements RFC 1122 section 2.3.2.2 (ARP packet queue), with a documented departure. The RFC
says the link layer should save at least one packet, the latest, of each set sent to one
unresolved address. Here one datagram in all is kept, and it is the first to miss: a datagram
that misses while it waits is discarded by :class:`.ipv4.Ipv4Tx` (counted in
``tx_unresolved``). One buffer bounds what forged sources can hold (each answer to one needs
resolving), and keeping the first needs no second buffer to swap into; TCP's retransmission
recovers what is discarded.
"""

from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..exact import Machine
from ..fifo import PacketFifo
from ..stream import BeatStream, check_data_bytes
from .ipv4 import TxRequest

__all__ = ["ParkedDatagram", "PARK_BYTES"]

#: The buffer, in octets: one longest datagram payload (1480 octets, a 1500-octet datagram less
#: its header), rounded up to a power of two.
PARK_BYTES = 2048


class ParkedDatagram(wiring.Component):
    """Keep one datagram whose destination missed the ARP cache, resolve it, then offer it again.

    Ports
    -----
    i_header : In(stream.Signature(TxRequest)); i_payload : In(BeatStream(data_bytes, err=True))
        A datagram that missed the cache (from :class:`.ipv4.Ipv4Tx`). The header is taken at
        once while ``free``; its payload at one beat per cycle into a :data:`PARK_BYTES`
        buffer. A payload ending in ``err``, or longer than the buffer, is thrown away and
        nothing is resolved.
    resolve : Out(stream.Signature(32)); resolve_ok : In(1)
        The resolver (:class:`.arp.ArpEngine`), asked about the kept datagram's destination once
        its payload is whole.
    free : Out(1)
        Nothing is kept: a header offered now is taken. The sender discards a datagram it
        cannot park.
    o_header : Out(stream.Signature(TxRequest)); o_payload : Out(BeatStream(data_bytes, err=True))
        The kept datagram, offered again for sending once its address is known, header then
        payload (never with ``err``). Its new lookup normally hits; if the entry was lost
        meanwhile, the sender discards it (the buffer is still being read, so it cannot park).
        If the resolver gives up, the datagram is thrown away here (``arp_resolve_fail`` has
        counted it).

    Latency: the datagram is offered again in the cycle after the resolver answers. One datagram
    at a time: the next is taken once the kept one has left or been thrown away.
    """

    def __init__(self, data_bytes):
        check_data_bytes(data_bytes)
        self.data_bytes = data_bytes
        super().__init__({
            "i_header": In(stream.Signature(TxRequest)),
            "i_payload": In(BeatStream(data_bytes, err=True)),
            "resolve": Out(stream.Signature(32)),
            "resolve_ok": In(1),
            "o_header": Out(stream.Signature(TxRequest)),
            "o_payload": Out(BeatStream(data_bytes, err=True)),
            "free": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        m.submodules.buffer = buffer = PacketFifo(n, PARK_BYTES // n)
        wiring.connect(m, wiring.flipped(self.i_payload), buffer.i)
        request = Signal(TxRequest)
        out = buffer.o
        m.d.comb += [self.resolve.payload.eq(request.dst), self.o_header.payload.eq(request),
                     self.o_payload.payload.data.eq(out.payload.data),
                     self.o_payload.payload.keep.eq(out.payload.keep),
                     self.o_payload.payload.last.eq(out.payload.last)]

        fsm = Machine(m, ["EMPTY", "FILL", "RESOLVE", "OFFER", "SEND", "DISCARD"], "fsm_state")
        with fsm.state("EMPTY"):
            m.d.comb += [self.i_header.ready.eq(1), self.free.eq(1)]
            with m.If(self.i_header.valid):
                m.d.sync += request.eq(self.i_header.payload)
                fsm.goto("FILL")
        with fsm.state("FILL"):
            last = self.i_payload.valid & self.i_payload.ready & self.i_payload.payload.last
            with m.If(buffer.ended_kept):
                fsm.goto("RESOLVE")
            with m.Elif(last):                  # ended in err, or too long: rolled back
                fsm.goto("EMPTY")
        with fsm.state("RESOLVE"):
            m.d.comb += self.resolve.valid.eq(1)
            with m.If(self.resolve.ready):
                with m.If(self.resolve_ok):
                    fsm.goto("OFFER")
                with m.Else():
                    fsm.goto("DISCARD")
        with fsm.state("OFFER"):
            m.d.comb += self.o_header.valid.eq(1)
            with m.If(self.o_header.ready):
                fsm.goto("SEND")
        with fsm.state("SEND"):
            m.d.comb += [self.o_payload.valid.eq(out.valid), out.ready.eq(self.o_payload.ready)]
            with m.If(out.valid & self.o_payload.ready & out.payload.last):
                fsm.goto("EMPTY")
        with fsm.state("DISCARD"):
            m.d.comb += out.ready.eq(1)
            with m.If(out.valid & out.payload.last):
                fsm.goto("EMPTY")
        return m
