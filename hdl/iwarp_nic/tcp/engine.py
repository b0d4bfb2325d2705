"""The TCP offload engine: RFC 9293 connections between the IP layer and a byte-stream host port.

Implements RFC 9293 (with RFC 6298, RFC 5681 section 3.2, RFC 1122 section 4.2.3.2, RFC 5961,
RFC 7323 section 2 and RFC 6528) through its blocks; see :mod:`.control` for the decisions and
their limits.

::

  i_ip ─ TcpRx ─┬─ payload ─ PacketFifo ─ RxDeliver ─ o_rx_header / o_rx
                │            park PacketFifo ─┤ (out-of-order segments, parked and back)
                └─ segment ─ TcpControl ─ verdict ─┘
                                 │  ├─ segment ─ TcpTx ─ o_ip
  i_cmd / o_event ───────────────┘  │            └ read ─ TxRing
  i_tx_header ── chunk ─────────────┴─ ring/route ─┐      │
  i_tx ─────────────────────────────────── HeadTrim ─ write

Retransmission data lives in :class:`.ring.TxRing`, a send ring per connection in block RAM:
bytes stay there from the host's write until the peer acknowledges them, so a retransmission
or a probe reads them again without the host. See docs/architecture.md for the trade-off.
"""

from amaranth import Module, Mux
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ..exact import is_zero
from ..fifo import PacketFifo
from ..hdrparse import HeaderStream
from ..headers import IPV4
from ..ip.ipv4 import TxRequest
from ..stream import BeatStream, HalfRateSlice, check_data_bytes, sliced
from ..trim import HeadTrim
from .control import CONN_COUNTERS, TcpControl
from .control import COUNTERS as CONTROL_COUNTERS
from .deliver import RxDeliver
from .layouts import ChunkHeader, Command, Event, conn_bits
from .ring import TxRing
from .rx import COUNTERS as RX_COUNTERS
from .rx import TcpRx
from .tx import TcpTx

__all__ = ["TcpEngine", "COUNTERS"]

#: Engine-wide counters: the control's, the receive front end's (``rx_front_<name>``), and
#: ``rx_no_buffer``: segments dropped because their payload found the receive buffer full.
COUNTERS = (CONTROL_COUNTERS + tuple(f"rx_front_{n}" for n in RX_COUNTERS)
            + ("rx_no_buffer",))


def _window_shift(buffer_bytes):
    shift = 0
    while buffer_bytes >> shift > 0xFFFF:
        shift += 1
    return shift


class TcpEngine(wiring.Component):
    """TCP for ``conns`` connections of one local IPv4 address.

    Parameters
    ----------
    data_bytes : int
        Datapath width.
    conns : int
        Connection slots.
    ring_bytes : int
        Send ring per connection: the most unacknowledged plus queued bytes (a power of two).
    rx_buffer_bytes : int
        The receive buffer shared by all connections (its free space is the advertised window).
    mss : int
        The MSS advertised and the largest segment sent.
    park_segments : int
        Out-of-order segments kept for later (one run, one connection at a time; see
        :mod:`.control`); the park buffer holds that many segments of ``mss`` bytes.
    Other keyword arguments go to :class:`.control.TcpControl` (timers, ``clock_hz``).

    Ports
    -----
    i_ip_header, i_ip : from :class:`~iwarp_nic.ip.IpStack` ``o_tcp_header``/``o_tcp_payload``
    o_ip_header, o_ip : to :class:`~iwarp_nic.ip.IpStack` ``i_tcp_header``/``i_tcp_payload``
    i_cmd : In(stream Command); o_event : Out(stream Event)
        LISTEN, CONNECT, CLOSE, ABORT per slot; ESTABLISHED, PEER_FIN, CLOSED, RESET, TIMEOUT,
        ABORTED back (see :mod:`.layouts`). ``o_event`` must be drained. An event does not
        wait for the bytes received before it: a connection's last bytes may still leave
        ``o_rx`` after its PEER_FIN or its end (a peer's RST in TIME-WAIT ends the slot at
        once), and are never discarded; a consumer drains ``o_rx`` before it forgets a slot.
    i_tx_header : In(stream ChunkHeader); i_tx : In(BeatStream(data_bytes))
        Bytes to send: ``{conn, length}`` then ``length`` bytes. A header may come before
        the bytes of the chunks ahead of it have all come (the bytes follow the headers'
        order through the route queue): offered while the previous chunk's bytes flow, it is
        admitted in their shadow and the chunks follow each other on ``i_tx`` with no idle
        cycles. A chunk waits until its connection's ring has room for all of it (so a chunk
        must not exceed ``ring_bytes``, and chunks to a stalled connection hold those behind
        them); a chunk for a connection that cannot send (not ESTABLISHED or CLOSE-WAIT, or
        closing) is dropped.
    o_rx_header : Out(stream ChunkHeader); o_rx : Out(BeatStream(data_bytes))
        Received bytes in order, per connection, one chunk per segment's new bytes.
    ip : In(32); isn_key : In(128); hash_key : In(32)
        Our address; the secrets of the ISN function and of the lookup hash.
    stat_conn : In(conn_bits); stat_<name> : Out(32) per :data:`.control.CONN_COUNTERS`
    <name> : Out(32) per :data:`COUNTERS`
    """

    def __init__(self, data_bytes, *, conns=16, ring_bytes=1 << 16, rx_buffer_bytes=1 << 16,
                 mss=1460, park_segments=32, **control):
        check_data_bytes(data_bytes)
        self.data_bytes = data_bytes
        self.conns = conns
        self.ring_bytes = ring_bytes
        self.rx_buffer_beats = -(-rx_buffer_bytes // data_bytes)
        self.mss = mss
        self.park_beats = park_segments * -(-mss // data_bytes)
        # Room for the verdicts of a receive buffer full of full-sized segments (a power of
        # two: block RAM), so that a receive side slower than the line closes the window
        # before the control stops taking segments (see TcpControl's ``verdicts``).
        full_segments = -(-rx_buffer_bytes // mss)
        self._control = dict(conns=conns, ring_bytes=ring_bytes, mss=mss,
                             park_segments=park_segments,
                             verdicts=1 << (full_segments - 1).bit_length(),
                             rcv_ws=_window_shift(rx_buffer_bytes), **control)
        n = data_bytes
        members = {
            "i_ip_header": In(HeaderStream(IPV4)),
            "i_ip": In(BeatStream(n, err=True)),
            "o_ip_header": Out(stream.Signature(TxRequest)),
            "o_ip": Out(BeatStream(n, err=True)),
            "i_cmd": In(stream.Signature(Command(conns))),
            "o_event": Out(stream.Signature(Event(conns))),
            "i_tx_header": In(stream.Signature(ChunkHeader(conns))),
            "i_tx": In(BeatStream(n)),
            "o_rx_header": Out(stream.Signature(ChunkHeader(conns))),
            "o_rx": Out(BeatStream(n)),
            "ip": In(32), "isn_key": In(128), "hash_key": In(32),
            "stat_conn": In(conn_bits(conns)),
        }
        members.update({f"stat_{name}": Out(32) for name in CONN_COUNTERS})
        members.update({name: Out(32) for name in COUNTERS})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        m.submodules.rx = rx = TcpRx(n)
        m.submodules.rx_buffer = rx_buffer = PacketFifo(n, self.rx_buffer_beats)
        m.submodules.park_buffer = park_buffer = PacketFifo(n, self.park_beats,
                                                            overflow="stall")
        m.submodules.deliver = deliver = RxDeliver(n, self.conns)
        m.submodules.control = control = TcpControl(**self._control)
        m.submodules.ring = ring = TxRing(n, self.conns, self.ring_bytes)
        m.submodules.tx = tx = TcpTx(n, self.conns)
        m.submodules.tx_gate = tx_gate = HeadTrim(n, 16)

        # Receive: segments checked by TcpRx, payloads buffered until the control's verdict.
        # Register slices on the engine's four IP-side streams, so no valid/ready or data path
        # runs between the IP stack's arbiters and TcpRx/TcpTx (each blocks' fit alone leaves its
        # ports untimed). The header streams, one transfer per segment, take one-entry slices:
        # TcpControl handles a segment in nine cycles or more each way.
        sliced(m, "ip_header_skid", wiring.flipped(self.i_ip_header), rx.i_header, half_rate=True)
        sliced(m, "ip_skid", wiring.flipped(self.i_ip), rx.i)
        wiring.connect(m, rx.o_data, rx_buffer.i)
        m.d.comb += control.rx_free.eq(rx_buffer.free)
        # A payload that overflowed the buffer takes its segment with it (the peer sends it
        # again): the fate of each payload, in order, meets its record here. The records pass a
        # register slice first, so the control's ready does not reach back into TcpRx.
        m.submodules.seg_skid = seg_skid = HalfRateSlice(rx.o_seg.payload.shape())
        wiring.connect(m, rx.o_seg, seg_skid.i)
        seg = seg_skid.o
        m.submodules.fates = fates = fifo.SyncFIFOBuffered(width=1, depth=4)
        m.d.comb += [fates.w_en.eq(rx_buffer.ended_kept | rx_buffer.ended_overflow),
                     fates.w_data.eq(rx_buffer.ended_kept)]
        has_payload = ~is_zero(seg.payload.length)
        m.d.comb += [control.i_seg.payload.eq(seg.payload),
                     control.i_seg.valid.eq(seg.valid & (~has_payload
                                                         | (fates.r_rdy & fates.r_data))),
                     seg.ready.eq(Mux(has_payload, fates.r_rdy & (control.i_seg.ready
                                                               | ~fates.r_data),
                                      control.i_seg.ready)),
                     fates.r_en.eq(seg.valid & seg.ready & has_payload)]
        with m.If(fates.r_en & ~fates.r_data):
            m.d.sync += self.rx_no_buffer.eq(self.rx_no_buffer + 1)
        wiring.connect(m, control.o_verdict, deliver.i_verdict)
        # The buffers' beats come out of block RAM: registered before RxDeliver acts on them.
        sliced(m, "rx_buffer_skid", rx_buffer.o, deliver.i)
        # The control parks no more than the park buffer holds, so it never stalls.
        wiring.connect(m, deliver.o_park, park_buffer.i)
        sliced(m, "park_buffer_skid", park_buffer.o, deliver.i_parked)
        wiring.connect(m, deliver.o_header, wiring.flipped(self.o_rx_header))
        wiring.connect(m, deliver.o, wiring.flipped(self.o_rx))

        # Transmit: host chunks into the rings (or dropped), segments out of them.
        wiring.connect(m, wiring.flipped(self.i_tx_header), control.i_chunk)
        wiring.connect(m, control.o_ring, ring.i_write)
        wiring.connect(m, ring.o_written, control.i_written)
        m.d.comb += [tx_gate.i_count.valid.eq(control.o_route.valid),
                     tx_gate.i_count.payload.eq(Mux(control.o_route.payload.keep, 0, 0xFFFF)),
                     control.o_route.ready.eq(tx_gate.i_count.ready)]
        wiring.connect(m, wiring.flipped(self.i_tx), tx_gate.i)
        wiring.connect(m, tx_gate.o, ring.i_data)
        wiring.connect(m, control.o_tx, tx.i_seg)
        wiring.connect(m, tx.o_read, ring.i_read)
        # The ring's words come straight out of its block RAMs (and the mux between them): a
        # skid buffer registers them before TcpTx, which acts on them in the same cycle.
        sliced(m, "ring_skid", ring.o_data, tx.i_data)
        sliced(m, "tx_header_skid", tx.o_header, wiring.flipped(self.o_ip_header), half_rate=True)
        sliced(m, "tx_skid", tx.o, wiring.flipped(self.o_ip))

        wiring.connect(m, wiring.flipped(self.i_cmd), control.i_cmd)
        wiring.connect(m, control.o_event, wiring.flipped(self.o_event))
        m.d.comb += [control.ip.eq(self.ip), tx.ip.eq(self.ip),
                     control.isn_key.eq(self.isn_key), control.hash_key.eq(self.hash_key),
                     control.stat_conn.eq(self.stat_conn)]
        for name in CONN_COUNTERS:
            m.d.comb += getattr(self, f"stat_{name}").eq(getattr(control, f"stat_{name}"))
        for name in CONTROL_COUNTERS:
            m.d.comb += getattr(self, name).eq(getattr(control, name))
        for name in RX_COUNTERS:
            m.d.comb += getattr(self, f"rx_front_{name}").eq(getattr(rx, name))
        return m
