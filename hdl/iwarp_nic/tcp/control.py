"""The TCP engine's control: the connection table and every decision about a segment.

Implements RFC 9293 section 3.10 (event processing: OPEN, SEND, CLOSE, ABORT, SEGMENT ARRIVES,
timeouts) for the eleven connection states, section 3.8.6 (window management, zero-window
probes), section 3.10.7.4 "Other states" (acceptability test, ACK processing, in-order data,
FIN), RFC 6298 (retransmission timer: SRTT/RTTVAR in ticks, exponential backoff, Karn's rule),
RFC 5681 section 3.2 (fast retransmit on the third duplicate ACK; no congestion window, see
below) and 4.2 (an immediate, pure duplicate ACK for data out of order), RFC 2018 (SACK: offered
in the SYN; the parked run as one SACK block on pure ACKs while a hole is before it), RFC 1122
section 4.2.3.2 (delayed ACK: at least every second full segment or one with PSH, and within
``dack_ticks``; with ``ack_with_data`` one due waits while a chunk goes into the ring and the
window lets it go, for the data segment after it to carry), RFC 5961 sections 3-5 (RST and SYN
in a synchronised state answered with a challenge ACK unless exactly at RCV.NXT; ACKs outside
SND.UNA - SND.WND .. SND.MAX dropped; one exactly at RCV.NXT in TIME-WAIT ends the connection as
CLOSED, since both FINs were acknowledged, as the model's TCP does), RFC 7323 section 2 (window
scale) and RFC 6528 (keyed initial sequence numbers, :mod:`.isn`).

The connection table (TCB) is one block-RAM word per connection. Every event is handled by one
serial state machine that loads the TCB, decides, and writes it back:

* a received segment (``i_seg`` from :class:`.rx.TcpRx`): looked up by its address in
  :class:`.lookup.ConnLookup`, or, for a SYN, in the listen table; gives at most one verdict on
  its payload (``o_verdict``), at most one RST for a segment with no connection, and events;
* a transmit turn for a connection in the ready queue (a FIFO holding each connection at most
  once): at most one segment (``o_tx``) to :class:`.tx.TcpTx`, then the connection goes to the
  back of the queue if it has more to send (round-robin between connections);
* a chunk of application data (``i_chunk``): admitted when the connection's send ring has room
  (then ``o_ring`` tells :class:`.ring.TxRing` where to write it, and ``o_route`` says to keep
  the chunk's bytes) or dropped when the connection cannot send (``o_route`` says to drop them);
* a chunk stored in the ring (``i_written``): its bytes become sendable;
* a park visit: the oldest parked segment leaves the park once RCV.NXT has reached it;
* a command (``i_cmd``); and a timer visit, each connection once per tick.

Out-of-order segments (RFC 9293 3.10.7.4 "seventh" allows keeping them): one connection at a
time may *park* a run of contiguous segments that starts past RCV.NXT (the first hole, as a
lost or late segment leaves it), up to ``park_segments`` of them. Each is ACKed at once with
a duplicate ACK (RFC 5681 section 4.2), so the peer's fast retransmit still fires. When the
hole is filled, the parked segments are delivered in order behind it and ACKed at once, so
the peer's cumulative ACK jumps over the whole run: one retransmission repairs a loss, a late
segment costs none, and the ACK covers segments sent once, whose round-trip samples Karn's rule
lets the peer take (without them a peer's backed-off timer never comes down). Segments of
another connection, out of the run's order, carrying a FIN, or longer than ``mss`` are dropped
as before. A connection that closes with segments parked has them thrown away.

While a hole is open, ACKs go out alone, ahead of data (a peer counts only ACKs without data
as duplicates), and if the peer's SYN offered SACK they carry the parked run as a SACK block
(RFC 2018 section 4: the first block holds the latest segment kept, and here the run is the
only one). So a peer that lost several segments of a window learns at once what arrived after
the first hole and what did not, rather than one hole per round trip. Data segments carry no
SACK option (an MSS-sized one would have no room for it): a departure from RFC 2018 section
4, which says every ACK should carry SACK while data is held past a hole; the peer learns of
the run from the pure ACKs only. Received SACK blocks are ignored: the
sender repairs by cumulative ACK, fast retransmit and timeout only.

Segments that hold whole chunks (``cut_slots`` > 0; an optimized MPA-aware TCP, RFC 5044
Appendix A: the NIC's chunks are FPDUs, and each segment should start with one). Without it a
segment is cut at the MSS wherever that falls, so once the send ring backs up most segments
start inside a chunk. With it, each admitted chunk of at most the MSS is planned into a
segment: it joins the open planned segment if that stays within the MSS, or closes it and opens
the next. The planned segments' ends wait in the connection's *cut list* (``cut_slots``
sequence numbers per connection, one block RAM for all) until acknowledged. A data segment, a
fast retransmission and the segments resent after a timeout each end at the next planned end
(or sooner, at the end of the bytes stored). One the window cannot hold whole waits for the
peer's next segment (an ACK or a window update), or with nothing in flight for the persist
timer, which sends what the window holds (the one case where a segment is cut inside a chunk,
with chunks longer than the MSS). A chunk that needs a list entry while the list holds
``cut_slots`` ends not yet acknowledged waits as for a full ring.

Throughput and latency: an event takes 9 cycles (a ring write report, a park visit, a command)
to 17 (a received segment whose connection heads its lookup chain, 6 of them in the lookup);
a transmit turn takes 12 or 13 (with ``cut_slots`` one more, and three per list entry it
finds behind SND.NXT), a chunk and a timer visit 10; plus one per event reported, one
for an RTT sample and four for any but a connection's first, one per further entry of the
lookup's chain, and for opens and closes the ISN and the lookup table's update. A full-size
segment lasts 183 cycles at 8 bytes per beat, so one data segment in each direction and its
ACKs leave the machine mostly idle. An event starts only when the output FIFOs it may
write have room, so it never waits half way; the sources are served round-robin. A transmit
turn also leaves one slot of the segment queue to the others, so a sender that keeps
:class:`.tx.TcpTx` busy never holds received segments back (before, the MAC's receive FIFO
overflowed at the start of a bulk transfer both ways, and its recovery by timeout cost 0.23 of
the measured goodput).

Timing (the 125 MHz core clock of the 1-byte configuration, on an ECP5 of speed 8): no cycle
chains more than one or two carry chains or a long decision. Values derived from the TCB
(window edges, RCV.WND, what is waiting or in flight) are registered from the block RAM's output
in LOADED and again from the updated TCB in FIX; a segment's own sequence arithmetic while the
lookup runs; the transmit turn's geometry, lengths and choice in TX_A, TX_B and TX_C; the RTT
average and the RTO in RTT_A, RTT_B and RTO. What RX_B, TIMER_B and CMD do is decided a cycle
before (RX_P, TIMER, LOADED) into one flag per action; IDLE registers the round-robin grant and
TAKE takes the source; the machine's states are one-hot. Fitted alone at the ECPIX-5
configuration (16 connections, 16 KB rings, window shift 0; ``boards.fit.fit``, seed 1)
TcpControl reaches 132.6 MHz (79.3 before this staging).

Limits, by design: out-of-order segments other than the parked run are dropped with an
immediate duplicate ACK (the peer's fast retransmit repairs the hole); there is no congestion
window (the peer's receive window and the send ring bound the flight: this engine is meant for
LANs); the advertised window follows the free space of the shared receive buffer, its edge
held while that moves by less than an MSS (so duplicate ACKs stay duplicates) and never moved
back, so connections together may be offered more than the buffer holds; a CLOSE in
SYN-RECEIVED aborts; an ESTABLISHED and a PEER_FIN event of one segment may be two events.
"""

from amaranth import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import data, enum, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..exact import Machine, add, eq, gt, is_zero, lt, select, wrap_add, wrap_sub
from .isn import IsnGenerator
from .layouts import (
    ACK,
    FIN,
    PSH,
    RST,
    SYN,
    ChunkHeader,
    Command,
    CommandOp,
    ConnKey,
    Event,
    EventKind,
    RingRequest,
    RxSegment,
    TxSegment,
    conn_bits,
)
from .lookup import ConnLookup

__all__ = ["TcpControl", "State", "Verdict", "Route", "COUNTERS", "CONN_COUNTERS"]


class State(enum.Enum, shape=4):
    CLOSED = 0
    LISTEN = 1
    SYN_SENT = 2
    SYN_RCVD = 3
    ESTABLISHED = 4
    FIN_WAIT_1 = 5
    FIN_WAIT_2 = 6
    CLOSE_WAIT = 7
    CLOSING = 8
    LAST_ACK = 9
    TIME_WAIT = 10


TIME_BITS = 24  # timer fields, in ticks; deadlines compare modulo 2**TIME_BITS


def Tcb(cut_slots=0):
    """One connection's state (RFC 9293 section 3.3.1 names, plus the timers), and with
    ``cut_slots`` the planned segments' bookkeeping (see :class:`TcpControl`)."""
    cuts = {} if not cut_slots else {
        "cut_open": 32,     # where the planned segment still open starts
        # Indices (modulo 2 * cut_slots) into the connection's cut list: its oldest entry,
        # the first SND.NXT has not reached, and the next free one.
        "cut_una": cut_slots.bit_length(), "cut_nxt": cut_slots.bit_length(),
        "cut_end": cut_slots.bit_length(),
        "cut_wait": 1,      # the next planned segment waits for the window to hold it whole
    }
    return data.StructLayout({
        "state": State,
        "remote_ip": 32, "remote_port": 16, "local_port": 16,
        "snd_una": 32, "snd_nxt": 32, "snd_max": 32,  # snd_max: highest sequence sent + 1
        "snd_end": 32,                                 # end of the data queued by the host
        "snd_ready": 32,                               # end of the queued data in the ring
        "snd_wl1": 32, "snd_wnd": 16, "snd_ws": 4,     # peer's window, as sent, and its shift
        "rcv_nxt": 32, "ws_on": 1, "mss": 16,
        "rcv_adv": 32,      # right edge of the window last advertised (RCV.NXT + RCV.WND sent)
        "fin_pending": 1,   # a FIN follows the queued data (sequence number snd_end)
        "ack_now": 1, "ack_delayed": 1, "unacked_seg": 1, "dack_deadline": TIME_BITS,
        "ack_pure": 1,      # the ACK due is for data out of order: a pure ACK, ahead of data
        "sack_on": 1,       # the peer's SYN offered SACK (RFC 2018 2): ours send SACK blocks
        "fast_rtx": 1, "probe": 1, "dupacks": 2, "retries": 4,
        "rto_armed": 1, "rto_deadline": TIME_BITS, "rto_cur": TIME_BITS,
        "rtt_active": 1, "rtt_seq": 32, "rtt_start": TIME_BITS,
        "have_srtt": 1, "srtt8": TIME_BITS, "rttvar4": TIME_BITS,
        **cuts,
    })


#: Per-connection counters (32 bits, wrapping), readable through ``stat_conn``/``stat_*``.
CONN_COUNTERS = ("rx_segments", "tx_segments", "retransmits", "dup_acks", "drops")
#: Engine-wide counters (32 bits, wrapping).
COUNTERS = ("rx_segments", "rx_no_conn", "rx_dropped", "rx_challenged", "rx_parked",
            "tx_segments", "tx_resets", "retransmits", "fast_retransmits", "dup_acks",
            "timeouts", "resets")


def Verdict(conns):
    """What to do with one received payload: deliver ``length`` bytes to connection ``conn``
    after dropping the first ``trim`` bytes, or drop it all; or ``park`` it (move it whole to
    the park buffer, to wait for the bytes before it). ``parked``: the payload is the park
    buffer's oldest, not the receive buffer's. Each buffer's payloads get their verdicts in
    the order they were stored."""
    return data.StructLayout({"conn": conn_bits(conns), "deliver": 1, "park": 1, "parked": 1,
                              "trim": 16, "length": 16})


#: Keep (1) or drop (0) the bytes of one application chunk, in chunk order.
Route = data.StructLayout({"keep": 1})


def _before(a, b):
    """``a`` precedes ``b`` in 32-bit sequence space (RFC 9293 section 3.4); 32-bit operands."""
    return (a - b)[31]


def _reached(now, deadline):
    return ~(now - deadline)[TIME_BITS - 1]


def _in(value, *states):
    return Cat(*(eq(value.as_value(), s.value) for s in states)).any()


class TcpControl(wiring.Component):
    """The connection table and the state machine of every TCP connection.

    Parameters
    ----------
    conns : int
        Connection slots (ids ``0 .. conns-1``).
    ring_bytes : int
        Send ring size per connection (bytes): the most data in flight plus queued.
    mss : int
        The MSS this end advertises and the largest segment it sends.
    rcv_ws : int
        The window-scale shift this end offers (RFC 7323), 0..14.
    clock_hz : int
        Core clock, for the ISN timer (:class:`.isn.IsnGenerator`).
    tick_cycles : int
        Cycles per timer tick.
    rto_initial, rto_min, rto_max, dack_ticks, time_wait_ticks : int
        RFC 6298 and RFC 1122 timer values, in ticks.
    max_retries : int
        Retransmission timeouts in a row before a connection is given up (RST, TIMEOUT event);
        a zero-window probe never gives up.
    listen_slots : int
        Entries of the listen table: slots waiting in LISTEN at one time. A slot in LISTEN
        holds one entry (it leaves it for SYN-RECEIVED, CLOSED or an abort), so more than
        ``conns`` are never used: the table has ``min(listen_slots, conns)``.
    park_segments : int
        Out-of-order segments (of at most ``mss`` bytes) the park buffer holds; the engine
        sizes the buffer so that they always fit.
    ack_with_data : bool
        An ACK due (not one for data out of order) waits while a chunk goes into the ring and
        the window lets its bytes go: the data segment after it carries the ACK.
    cut_slots : int
        0, or a power of two: the planned segments' ends each connection keeps, so that
        segments hold whole chunks (see above). ``ring_bytes / mss`` of them cover a ring of
        full-sized chunks; fewer bound the chunks queued and in flight.
    verdicts : int
        Verdicts that may wait for the receive side (``o_verdict``) before the machine stops
        taking segments. While it is stopped, ``i_seg`` waits, and so does everything before
        it, back to the MAC, whose one-frame FIFO then overflows: the engine makes this at
        least the full-sized segments its receive buffer holds, so that the window, not this
        FIFO, is what runs out.

    Ports
    -----
    i_seg : In(stream RxSegment)        received segments, from :class:`.rx.TcpRx`
    o_verdict : Out(stream Verdict)     one per ``i_seg`` with ``length`` > 0, in order, and
                                        one per parked payload when it leaves the park
    rx_free : In(32)                    free bytes in the receive buffer (advertised window)
    o_tx : Out(stream TxSegment)        segments to send, to :class:`.tx.TcpTx`
    i_chunk : In(stream ChunkHeader)    host data chunks offered for sending
    o_ring : Out(stream RingRequest)    where an admitted chunk goes in the send ring
    i_written : In(stream RingRequest)  the ring's report that a chunk is stored: from then on
                                        its bytes may be sent
    o_route : Out(stream Route)         per chunk, keep its bytes (admitted) or drop them
    i_cmd : In(stream Command); o_event : Out(stream Event)
    ip : In(32); isn_key : In(128); hash_key : In(32)
    stat_conn : In(conn_bits); stat_<name> : Out(32) for :data:`CONN_COUNTERS`, one cycle after
    <name> : Out(32) for :data:`COUNTERS`

    The host must drain ``o_event``: a full event FIFO holds the machine.
    """

    def __init__(self, *, conns=16, ring_bytes=1 << 16, mss=1460, rcv_ws=7, clock_hz=125_000_000,
                 tick_cycles=1024, rto_initial=None, rto_min=None, rto_max=None, dack_ticks=None,
                 time_wait_ticks=None, max_retries=8, listen_slots=16, park_segments=32,
                 verdicts=8, cut_slots=0, ack_with_data=False):
        ticks_per_s = clock_hz / tick_cycles
        if ring_bytes & (ring_bytes - 1) or ring_bytes < 64:
            raise ValueError("ring_bytes must be a power of two >= 64")
        if not 0 <= rcv_ws <= 14:
            raise ValueError("rcv_ws must be in 0..14")
        if not 64 <= mss <= 0xFFFF:
            raise ValueError("mss must be in 64..65535")
        self.conns, self.ring_bytes, self.mss, self.rcv_ws = conns, ring_bytes, mss, rcv_ws
        self.clock_hz, self.tick_cycles = clock_hz, tick_cycles

        def ticks(value, seconds):
            value = round(seconds * ticks_per_s) if value is None else value
            return max(1, min(value, (1 << (TIME_BITS - 2)) - 1))

        self.rto_initial = ticks(rto_initial, 1.0)
        self.rto_min = ticks(rto_min, 0.2)
        self.rto_max = ticks(rto_max, 60.0)
        self.dack_ticks = ticks(dack_ticks, 0.04)
        self.time_wait_ticks = ticks(time_wait_ticks, 0.5)
        if not self.rto_min <= self.rto_initial <= self.rto_max:
            raise ValueError("need rto_min <= rto_initial <= rto_max")
        self.max_retries = max_retries
        self.listen_slots = min(listen_slots, conns)
        self.verdicts = verdicts
        if park_segments < 1:
            raise ValueError("park_segments must be 1 or more")
        if cut_slots and (cut_slots & (cut_slots - 1) or cut_slots < 2):
            raise ValueError("cut_slots must be 0 or a power of two >= 2")
        self.cut_slots = cut_slots
        self.ack_with_data = ack_with_data
        self.park_segments = park_segments
        cb = conn_bits(conns)
        members = {
            "i_seg": In(stream.Signature(RxSegment)),
            "o_verdict": Out(stream.Signature(Verdict(conns))),
            "rx_free": In(32),
            "o_tx": Out(stream.Signature(TxSegment(conns))),
            "i_chunk": In(stream.Signature(ChunkHeader(conns))),
            "i_written": In(stream.Signature(RingRequest(conns))),
            "o_ring": Out(stream.Signature(RingRequest(conns))),
            "o_route": Out(stream.Signature(Route)),
            "i_cmd": In(stream.Signature(Command(conns))),
            "o_event": Out(stream.Signature(Event(conns))),
            "ip": In(32), "isn_key": In(128), "hash_key": In(32),
            "stat_conn": In(cb),
        }
        members.update({f"stat_{n}": Out(32) for n in CONN_COUNTERS})
        members.update({n: Out(32) for n in COUNTERS})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        conns, cb, ls = self.conns, conn_bits(self.conns), self.listen_slots
        tcb_shape = Tcb(self.cut_slots)
        stats_shape = data.StructLayout({n: 32 for n in CONN_COUNTERS})

        m.submodules.tcb_mem = tcb_mem = memory.Memory(shape=tcb_shape, depth=conns, init=[])
        m.submodules.stats_mem = stats_mem = memory.Memory(shape=stats_shape, depth=conns,
                                                           init=[])
        tcb_rd, tcb_wr = tcb_mem.read_port(), tcb_mem.write_port()
        stats_rd, stats_wr = stats_mem.read_port(), stats_mem.write_port()
        stats_host = stats_mem.read_port()
        m.d.comb += stats_host.addr.eq(self.stat_conn)
        for n in CONN_COUNTERS:
            m.d.comb += getattr(self, f"stat_{n}").eq(stats_host.data[n])

        # The planned segments' ends (``cut_slots``): each connection's list, a ring of
        # ``cut_slots`` sequence numbers, in one block RAM (the connection's number above the
        # index). Read in LOADED (and TX_R) for the next state, written in CHUNK_B.
        align = self.cut_slots > 0
        if align:
            m.submodules.cut_mem = cut_mem = memory.Memory(shape=32, depth=conns * self.cut_slots,
                                                           init=[])
            cut_rd, cut_wr = cut_mem.read_port(), cut_mem.write_port()
            index_bits = self.cut_slots.bit_length() - 1

            def cut_addr(index):
                return Cat(index[:index_bits], conn)

        m.submodules.lookup = lookup = ConnLookup(conns)
        m.submodules.isn = isn = IsnGenerator(self.clock_hz)
        m.d.comb += [lookup.hash_key.eq(self.hash_key), isn.key.eq(self.isn_key)]

        # Output FIFOs: an event starts only when each has room for all it may write.
        def out_fifo(name, shape, depth):
            f = fifo.SyncFIFOBuffered(width=data.Layout.cast(shape).size, depth=depth)
            m.submodules[name + "_fifo"] = f
            wiring.connect(m, f.r_stream, wiring.flipped(getattr(self, "o_" + name)))
            return f

        verdicts = out_fifo("verdict", Verdict(self.conns), self.verdicts)
        txq = out_fifo("tx", TxSegment(self.conns), 4)
        events = out_fifo("event", Event(self.conns), 8)
        rings = out_fifo("ring", RingRequest(self.conns), 4)
        routes = out_fifo("route", Route, 8)

        # Ready queue: connections with something to send, each at most once.
        # (At least 3 deep: a SyncFIFOBuffered of 2 has an inner FIFO of 1, a zero-width
        # address that Verilator refuses.)
        m.submodules.ready = ready = fifo.SyncFIFOBuffered(width=cb, depth=max(conns, 3))
        queued = Signal(conns)

        # Timer base: `now` counts ticks; each tick starts a sweep visiting every connection.
        now = Signal(TIME_BITS)
        tick_count = Signal(range(self.tick_cycles))
        sweep = Signal(range(conns + 1))
        scan = Signal(cb)
        with m.If(tick_count == self.tick_cycles - 1):
            m.d.sync += [tick_count.eq(0), now.eq(now + 1)]
        with m.Else():
            m.d.sync += tick_count.eq(tick_count + 1)

        # Listen table: slots in LISTEN, by local port.
        l_valid = Signal(ls)
        l_port = [Signal(16, name=f"listen_port{k}") for k in range(ls)]
        l_conn = [Signal(cb, name=f"listen_conn{k}") for k in range(ls)]

        # The first free entry of the listen table, registered (a cycle old: the table changes
        # only in RX_B and CMD, never in the two cycles before CMD).
        free_listen = Signal(range(max(ls, 2)))
        have_listen = Signal()
        m.d.sync += have_listen.eq(0)
        for k in reversed(range(ls)):
            with m.If(~l_valid[k]):
                m.d.sync += [free_listen.eq(k), have_listen.eq(1)]

        # Which of CMD's actions apply (see CMD), registered by LOADED from the command and
        # the TCB as the block RAM gives it.
        cact = {n: Signal(name=f"cmd_{n}") for n in (
            "listen", "connect", "unlisten", "closed_event", "aborted_event", "free_closed",
            "fin_wait", "last_ack", "reset", "free_aborted")}

        def command(tcb):
            def at(*states):
                return _in(tcb.state, *states)
            op_listen, op_connect = _in(cmd.op, CommandOp.LISTEN), _in(cmd.op, CommandOp.CONNECT)
            op_close, op_abort = _in(cmd.op, CommandOp.CLOSE), _in(cmd.op, CommandOp.ABORT)
            closed, listening = at(State.CLOSED), at(State.LISTEN)
            tcb_synced = at(State.SYN_RCVD, State.ESTABLISHED, State.FIN_WAIT_1,
                            State.FIN_WAIT_2, State.CLOSE_WAIT, State.CLOSING, State.LAST_ACK,
                            State.TIME_WAIT)
            abort_open = op_abort & ~listening & ~closed
            m.d.sync += [
                cact["listen"].eq(op_listen & closed & have_listen),
                cact["connect"].eq(op_connect & closed),
                cact["unlisten"].eq((op_close | op_abort) & listening),
                cact["closed_event"].eq(op_close & (listening | closed)),
                cact["aborted_event"].eq((op_listen & ~(closed & have_listen))
                                         | (op_connect & ~closed)
                                         | (op_abort & (listening | closed))),
                cact["free_closed"].eq(op_close & at(State.SYN_SENT)),
                cact["fin_wait"].eq(op_close & at(State.ESTABLISHED)),
                cact["last_ack"].eq(op_close & at(State.CLOSE_WAIT)),
                cact["reset"].eq((op_close & at(State.SYN_RCVD)) | (abort_open & tcb_synced)),
                cact["free_aborted"].eq((op_close & at(State.SYN_RCVD)) | abort_open),
            ]

        # Working registers of the event being handled.
        t = Signal(tcb_shape)
        st = Signal(stats_shape)
        s = Signal(RxSegment)
        conn = Signal(cb)
        cmd = Signal(Command(self.conns))
        chunk = Signal(ChunkHeader(self.conns))
        written = Signal(RingRequest(self.conns))
        verdict = Signal(Verdict(self.conns))
        verdict_valid = Signal()
        seg = Signal(TxSegment(self.conns))
        seg_valid = Signal()
        ev = [Signal(EventKind, name=f"ev{k}_kind") for k in range(2)]
        ev_valid = Signal(2)
        ring_valid = Signal()
        route_valid = Signal()
        route_keep = Signal()
        release = Signal()     # the slot was freed: remove it from the lookup table
        insert = Signal()      # the slot got an address: add it to the lookup table
        no_tcb = Signal()      # a segment for no connection: nothing to write back
        listen_hit = Signal()
        listen_first = Signal(ls)   # the first listening slot on the segment's port, one-hot
        listen_match = Signal(ls)   # the listening slots on the segment's port
        listen_wait = Signal(2)     # RX_WAIT's cycles so far, up to 2: then listen_hit,
                                    # listen_idx and listen_conn are set
        listen_conn = Signal(cb)    # the connection of listen_idx
        listen_idx = Signal(range(max(ls, 2)))
        rto_update = Signal()
        rtt_avg = Signal()     # an RTT sample (not the first) waits to be averaged in
        enqueue = Signal()     # the connection has something to send: add it to the ready queue
        chunk_retry = Signal(init=1)  # a chunk that found its ring full waits for a change

        # The park: a contiguous run of out-of-order segments of connection `park_conn`, from
        # sequence number `park_head` (the oldest's first byte) to `park_end`; their lengths
        # in order in `parked`. `park_poke`: RCV.NXT may have reached the oldest (a park
        # visit is due). `park_flush`: the connection is gone; the run is thrown away.
        ps = self.park_segments
        m.submodules.parked = parked = fifo.SyncFIFOBuffered(width=16, depth=ps)
        park_count = Signal(range(ps + 1))
        park_conn = Signal(cb)
        park_head, park_end = Signal(32), Signal(32)
        park_poke, park_flush = Signal(), Signal()
        park_held = ~is_zero(park_count) & (conn == park_conn)    # `conn` has the run
        park_mine = park_held & ~park_flush                          # ... and keeps it

        def count(name):
            counter = getattr(self, name)
            m.d.sync += counter.eq(counter + 1)

        def count_conn(name):
            m.d.sync += st[name].eq(st[name] + 1)

        def event(k, kind_):
            m.d.sync += [ev[k].eq(kind_), ev_valid[k].eq(1)]

        def free(kind_):
            event(0, kind_)
            m.d.sync += [t.state.eq(State.CLOSED), release.eq(1)]
            with m.If(park_held):
                m.d.sync += [park_flush.eq(1), park_poke.eq(1)]

        # The receive buffer's free space, registered twice on its way in (a snapshot anyway,
        # taken a few cycles before it is used): ``rcv_space`` is what may be offered,
        # ``win_unscaled`` the window field offering it without scaling (at most 0xFFFF) and
        # ``scaled_field`` with the shift ``rcv_ws``.
        max_space = 0xFFFF << self.rcv_ws
        rcv_space = Signal(32)
        m.d.sync += rcv_space.eq(Mux(self.rx_free > max_space, max_space, self.rx_free))
        win_unscaled, scaled_field = Signal(16), Signal(16)
        m.d.sync += [win_unscaled.eq(Mux(rcv_space[16:].any(), 0xFFFF, rcv_space[:16])),
                     scaled_field.eq((rcv_space >> self.rcv_ws)[:16])]

        # Values derived from the TCB, registered: from the block RAM's output in LOADED (read
        # by the event's first states, before they change `t`), and again from `t` in FIX
        # (read by COMMIT). Each costs one or two carry chains, so no later cycle chains them.
        wnd_left = Signal(32)       # SND.UNA - SND.WND: an ACK before it is too old (RFC 5961)
        wnd_right = Signal(32)      # SND.UNA + SND.WND: the right edge of the peer's window
        # RCV.WND: what is left of the window last advertised (0 once RCV.NXT has reached or,
        # by a FIN at its edge, passed the edge). It decides which segments are acceptable;
        # rcv_right = RCV.NXT + RCV.WND.
        rcv_wnd, rcv_right = Signal(32), Signal(32)
        data_waiting = Signal()     # bytes in the ring, not yet sent
        writing = Signal()          # with ``ack_with_data``: a chunk is going into the ring
        in_flight = Signal()        # SND.UNA != SND.MAX
        una_at_nxt = Signal()       # SND.NXT == SND.UNA
        fin_due = Signal()          # the FIN is next: queued, and every byte before it sent
        # LOADED only (for TX_A, CHUNK, PARK): the window field offering all the free space,
        # the right edge it would give and the current edge plus one MSS; the send ring's use;
        # the end of the park's oldest segment.
        free_field = Signal(16)
        free_right, adv_grow = Signal(32), Signal(32)
        ring_used = Signal(32)
        park_head_end = Signal(32)
        open_len = Signal(32)       # with ``cut_slots``: the open planned segment's bytes

        # One set of the arithmetic serves both: its TCB is the block RAM's output in LOADED
        # and `t` in FIX (`derive_fixed`), and the values are registered in those two states
        # (`deriving`).
        deriving, derive_fixed = Signal(), Signal()
        src = Signal(tcb_shape, name="derive_src")
        m.d.comb += src.eq(Mux(derive_fixed, t, tcb_rd.data))
        scaled = select(m, src.snd_ws, [Cat(Const(0, k), src.snd_wnd, Const(0, 16 - k))
                                        for k in range(15)], 32, "wnd_scaled")
        adv_behind = _before(src.rcv_adv, src.rcv_nxt)
        waiting, flying = _before(src.snd_nxt, src.snd_ready), src.snd_una != src.snd_max
        with m.If(deriving):
            if self.ack_with_data:
                m.d.sync += writing.eq(src.snd_ready != src.snd_end)
            m.d.sync += [
                wnd_left.eq(wrap_sub(m, src.snd_una, scaled, 32, "wnd_left")),
                wnd_right.eq(wrap_add(m, src.snd_una, scaled, 32, "wnd_right")),
                rcv_wnd.eq(Mux(adv_behind, 0, src.rcv_adv - src.rcv_nxt)),
                rcv_right.eq(Mux(adv_behind, src.rcv_nxt, src.rcv_adv)),
                data_waiting.eq(waiting),
                in_flight.eq(flying),
                una_at_nxt.eq(src.snd_nxt == src.snd_una),
                fin_due.eq(src.fin_pending & (src.snd_nxt == src.snd_end)
                           & (src.snd_ready == src.snd_end)),
            ]

        synced = _in(t.state, State.SYN_RCVD, State.ESTABLISHED, State.FIN_WAIT_1,
                     State.FIN_WAIT_2, State.CLOSE_WAIT, State.CLOSING, State.LAST_ACK,
                     State.TIME_WAIT)
        sending = _in(t.state, State.ESTABLISHED, State.CLOSE_WAIT, State.FIN_WAIT_1,
                      State.CLOSING, State.LAST_ACK)
        receiving = _in(t.state, State.ESTABLISHED, State.FIN_WAIT_1, State.FIN_WAIT_2)
        opening = _in(t.state, State.SYN_SENT, State.SYN_RCVD)
        window_open = _before(t.snd_nxt, wnd_right)
        wants_tx = Signal()
        data_due = data_waiting & window_open
        # An ACK due waits while a chunk is going into the ring and the window lets its bytes
        # go: the data segment that follows carries it (with data both ways, a pure ACK per
        # segment cost 5% of the line at 8 bytes). Not the ACKs for data out of order.
        ack_due = synced & t.ack_now
        if self.ack_with_data:
            ack_due &= ~(sending & writing & window_open & ~t.ack_pure
                         & (~t.cut_wait if align else 1))
        if align:
            data_due &= ~t.cut_wait
        m.d.comb += wants_tx.eq(
            (opening & una_at_nxt)
            | ack_due
            | (sending & (t.fast_rtx | t.probe | fin_due | data_due)))
        # Persist (RFC 9293 3.8.6.1): nothing in flight and a zero window, or with
        # ``cut_slots`` a window too short for the next planned segment (its timer then sends
        # what the window holds: 3.8.6.2.1's override of sender-side SWS avoidance).
        shut = (is_zero(t.snd_wnd) | t.cut_wait) if align else is_zero(t.snd_wnd)
        persist = sending & ~in_flight & shut & data_waiting
        needs_timer = opening | (synced & in_flight) | persist | _in(t.state, State.TIME_WAIT)

        # The next source, round-robin from `turn`: RX, TX, chunk, command, timer, ring write
        # report, park.
        SOURCES = 7
        K_RX, K_TX, K_CHUNK, K_CMD, K_TIMER, K_WRITTEN, K_PARK = range(SOURCES)
        kind = Signal(range(SOURCES))
        turn = Signal(range(SOURCES))
        # A transmit turn leaves one slot of the segment queue free: a busy sender keeps that
        # queue full, and received segments (whose events may send a RST) must still be taken
        # as they come, or the MAC's receive FIFO overflows behind them.
        # The conditions on the machine's own queues and registers are registered (a cycle
        # old): in the cycle before IDLE (TABLE, or IDLE without a grant) the machine writes
        # no queue and reads none, so they can only be late, never wrong: a queue's consumer
        # only makes room, and what the machine writes shows a cycle or more later.
        tx_ok, chunk_ok, timer_ok, park_ok, room = (Signal(name=n) for n in (
            "tx_ok", "chunk_ok", "timer_ok", "park_ok", "room"))
        m.d.sync += [tx_ok.eq(ready.r_rdy & lt(txq.w_level, txq.depth - 1)),
                     chunk_ok.eq(chunk_retry & rings.w_rdy & routes.w_rdy),
                     timer_ok.eq(sweep != 0), park_ok.eq(park_poke & parked.r_rdy)]
        want = Cat(self.i_seg.valid, tx_ok, self.i_chunk.valid & chunk_ok, self.i_cmd.valid,
                   timer_ok, self.i_written.valid, park_ok)
        # `grant`: one-hot, the first source wanting from `turn` on (a flat function of `want`
        # and `turn`, so that the choice of the connection below is an AND-OR).
        grant = Signal(SOURCES)
        granted = Signal(SOURCES)   # `grant` as IDLE found it, for TAKE
        for j in range(SOURCES):
            terms = []
            for r in range(SOURCES):
                ahead = [want[(r + i) % SOURCES] for i in range((j - r) % SOURCES)]
                at_r = eq(turn, r) if r < SOURCES - 1 else turn >= r
                terms.append(at_r & ~Cat(Const(0, 1), *ahead).any())
            m.d.comb += grant[j].eq(want[j] & Cat(*terms).any())
        # Room for what any event may write; only a chunk writes the ring and route queues, so
        # a full one holds chunks alone (holding every event would deadlock against the ring,
        # which waits for its write reports to be taken).
        m.d.sync += room.eq(verdicts.w_rdy & txq.w_rdy & lt(events.w_level, events.depth - 1))

        fsm = Machine(m, ["IDLE", "TAKE", "RX_LOOKUP", "RX_WAIT", "NO_CONN", "LOAD", "LOADED",
                          "RX_A", "RX_P", "RX_B", "ISN", "TX_A", "TX_B", "TX_C", "TX_D", "TX_E",
                          "CHUNK", "CHUNK_B", "WRITTEN", "PARK", "CMD", "TIMER", "TIMER_B", "FIX",
                          "RTT_A", "RTT_B", "RTO", "COMMIT", "EVENTS", "TABLE",
                          *(("TX_P", "TX_R") if align else ())], "tcp_state", onehot=True)

        with fsm.state("IDLE"):
            m.d.sync += [verdict_valid.eq(0), seg_valid.eq(0), ev_valid.eq(0),
                         ring_valid.eq(0), route_valid.eq(0), release.eq(0), insert.eq(0),
                         no_tcb.eq(0), rto_update.eq(0), rtt_avg.eq(0)]
            with m.If(room & want.any()):
                m.d.sync += granted.eq(grant)
                fsm.goto("TAKE")

        # TAKE: the source granted in IDLE (registered) is taken. An input stream holds its
        # valid until it is taken (the stream rule); one that dropped it is not taken.
        with fsm.state("TAKE"):
            fsm.goto("IDLE")
            valids = Cat(self.i_seg.valid, 1, self.i_chunk.valid, self.i_cmd.valid, 1,
                         self.i_written.valid, 1)
            # The connection of the source granted (RX's is found by the lookup: kept).
            sources = {K_RX: conn, K_TX: ready.r_data, K_CHUNK: self.i_chunk.payload.conn,
                       K_CMD: self.i_cmd.payload.conn, K_TIMER: scan,
                       K_WRITTEN: self.i_written.payload.conn, K_PARK: park_conn}
            granted_conn = Signal(cb)
            m.d.comb += granted_conn.eq(Cat(*(
                Cat(*(granted[k] & Value.cast(v)[b] for k, v in sources.items())).any()
                for b in range(cb))))
            grant = granted & valids
            with m.If(grant.any()):
                m.d.sync += conn.eq(granted_conn)
                for k in range(SOURCES):
                    with m.If(granted[k]):
                        m.d.sync += [kind.eq(k), turn.eq((k + 1) % SOURCES)]
                with m.If(grant[K_RX]):
                    m.d.comb += self.i_seg.ready.eq(1)
                    m.d.sync += s.eq(self.i_seg.payload)
                    fsm.goto("RX_LOOKUP")
                with m.If(grant[K_TX]):
                    m.d.comb += ready.r_en.eq(1)
                    m.d.sync += queued.bit_select(ready.r_data, 1).eq(0)
                    fsm.goto("LOAD")
                with m.If(grant[K_CHUNK]):
                    m.d.sync += chunk.eq(self.i_chunk.payload)
                    fsm.goto("LOAD")
                with m.If(grant[K_CMD]):
                    m.d.comb += self.i_cmd.ready.eq(1)
                    m.d.sync += cmd.eq(self.i_cmd.payload)
                    fsm.goto("LOAD")
                with m.If(grant[K_TIMER]):
                    m.d.sync += [sweep.eq(sweep - 1),
                                 scan.eq(Mux(scan == conns - 1, 0, scan + 1))]
                    fsm.goto("LOAD")
                with m.If(grant[K_WRITTEN]):
                    m.d.comb += self.i_written.ready.eq(1)
                    m.d.sync += written.eq(self.i_written.payload)
                    fsm.goto("LOAD")
                with m.If(grant[K_PARK]):
                    fsm.goto("LOAD")

        # ---- RX: find the connection by address, or a listening slot for a SYN.
        key = Signal(ConnKey)
        m.d.comb += [key.remote_ip.eq(s.src_ip), key.remote_port.eq(s.src_port),
                     key.local_port.eq(s.dst_port)]
        syn, fin = (s.flags & SYN).any(), (s.flags & FIN).any()
        rst, ackf = (s.flags & RST).any(), (s.flags & ACK).any()
        # The segment's own sequence arithmetic, registered while the lookup runs (RX_LOOKUP
        # and RX_WAIT last a cycle or more each, and `s` holds): RX_A and RX_B use the results.
        seg_len = Signal(17)        # payload + SYN + FIN
        seg_end = Signal(32)        # the sequence number after the payload
        seg_after = Signal(32)      # ... after the payload, SYN and FIN
        seg_last = Signal(32)       # the last sequence number the segment occupies
        seg_end1 = Signal(32)       # seg_end + 1: RCV.NXT after an in-order FIN
        syn_next = Signal(32)       # the sequence number after a SYN
        mss_opt = Signal(16)        # the send MSS a SYN's options give
        has_data = Signal()         # a payload (length > 0)
        seg_small = Signal()        # length <= MSS: it may be parked
        seg_empty = Signal()        # seg_len == 0
        m.d.comb += [lookup.i_lookup.payload.eq(key),
                     lookup.i_remove.payload.conn.eq(conn),
                     lookup.i_insert.payload.conn.eq(conn),
                     lookup.i_insert.payload.key.remote_ip.eq(t.remote_ip),
                     lookup.i_insert.payload.key.remote_port.eq(t.remote_port),
                     lookup.i_insert.payload.key.local_port.eq(t.local_port)]
        with fsm.state("RX_LOOKUP"):
            m.d.comb += lookup.i_lookup.valid.eq(1)
            m.d.sync += [seg_len.eq(s.length + syn + fin), has_data.eq(s.length.any()),
                         seg_small.eq(lt(s.length, self.mss + 1)),
                         seg_end.eq(wrap_add(m, s.seq, s.length, 32, "seg_end_sum")),
                         syn_next.eq(add(s.seq, 1)),
                         mss_opt.eq(Mux(s.has_mss, Mux(gt(s.mss, self.mss), self.mss, s.mss),
                                        536))]
            m.d.sync += [listen_match.eq(Cat(l_valid[k] & (l_port[k] == s.dst_port)
                                             for k in range(ls))),
                         listen_wait.eq(0)]
            with m.If(lookup.i_lookup.ready):
                fsm.goto("RX_WAIT")
        with fsm.state("RX_WAIT"):
            # The listen table's answer, from the match registered in RX_LOOKUP: the first
            # matching slot (one-hot) in RX_WAIT's first cycle, its connection in the second;
            # ready from the third (the lookup's comes later anyway, see ConnLookup's timing).
            listen_ready = listen_wait[1]
            m.d.comb += lookup.o_lookup.ready.eq(listen_ready)
            m.d.sync += [listen_wait.eq(Cat(1, listen_wait[0])),
                         listen_first.eq(Cat(listen_match[k] & ~listen_match[:k].any()
                                             for k in range(ls)))]
            first = listen_first
            m.d.sync += [listen_hit.eq(first.any() & syn & ~ackf & ~rst),
                         listen_conn.eq(Cat(*(
                             Cat(*(first[k] & l_conn[k][b] for k in range(ls))).any()
                             for b in range(cb))))]
            for k in range(ls):
                with m.If(first[k]):
                    m.d.sync += listen_idx.eq(k)
            m.d.sync += [seg_after.eq(wrap_add(m, s.seq, seg_len, 32, "seg_after_sum")),
                         seg_last.eq(wrap_add(m, s.seq, seg_len - 1, 32, "seg_last_sum")),
                         seg_end1.eq(add(seg_end, 1)), seg_empty.eq(~seg_len.any())]
            with m.If(lookup.o_lookup.valid & listen_ready):
                count("rx_segments")
                with m.If(lookup.o_lookup.payload.hit):
                    m.d.sync += conn.eq(lookup.o_lookup.payload.conn)
                    fsm.goto("LOAD")
                with m.Elif(listen_hit):
                    m.d.sync += conn.eq(listen_conn)
                    fsm.goto("LOAD")
                with m.Else():
                    fsm.goto("NO_CONN")

        def reset_reply():
            """RFC 9293 3.10.7.1: answer a segment (not itself a RST) with a RST."""
            m.d.sync += [seg.conn.eq(0), seg.dst_ip.eq(s.src_ip), seg.src_port.eq(s.dst_port),
                         seg.dst_port.eq(s.src_port), seg.window.eq(0), seg.syn_opts.eq(0),
                         seg.sack.eq(0), seg.mss.eq(0), seg.ws.eq(0), seg.length.eq(0)]
            with m.If(~rst):
                m.d.sync += seg_valid.eq(1)
                count("tx_resets")
                with m.If(ackf):
                    m.d.sync += [seg.seq.eq(s.ack), seg.ack.eq(0), seg.flags.eq(RST)]
                with m.Else():
                    m.d.sync += [seg.seq.eq(0), seg.ack.eq(seg_after), seg.flags.eq(RST | ACK)]

        def reset_connection():
            """RFC 9293 3.10.5 ABORT: a RST at SND.NXT to the connection's peer."""
            m.d.sync += [seg.conn.eq(conn), seg.dst_ip.eq(t.remote_ip),
                         seg.src_port.eq(t.local_port), seg.dst_port.eq(t.remote_port),
                         seg.seq.eq(t.snd_nxt), seg.ack.eq(0), seg.flags.eq(RST),
                         seg.window.eq(0), seg.syn_opts.eq(0), seg.sack.eq(0), seg.mss.eq(0),
                         seg.ws.eq(0), seg.length.eq(0), seg_valid.eq(1)]
            count("tx_resets")

        def drop_payload():
            m.d.sync += [verdict.conn.eq(conn), verdict.deliver.eq(0), verdict.park.eq(0),
                         verdict.parked.eq(0), verdict.trim.eq(0), verdict.length.eq(s.length),
                         verdict_valid.eq(has_data)]

        with fsm.state("NO_CONN"):
            count("rx_no_conn")
            reset_reply()
            drop_payload()
            m.d.sync += no_tcb.eq(1)
            fsm.goto("COMMIT")

        with fsm.state("LOAD"):
            m.d.comb += [tcb_rd.addr.eq(conn), stats_rd.addr.eq(conn)]
            fsm.goto("LOADED")
        with fsm.state("LOADED"):
            m.d.comb += [tcb_rd.addr.eq(conn), stats_rd.addr.eq(conn)]
            m.d.sync += [t.eq(tcb_rd.data), st.eq(stats_rd.data)]
            loaded = tcb_rd.data
            m.d.comb += deriving.eq(1)
            command(loaded)
            field = Mux(loaded.ws_on, scaled_field, win_unscaled)
            m.d.sync += [
                free_field.eq(field),
                free_right.eq(wrap_add(m, loaded.rcv_nxt,
                                       Mux(loaded.ws_on, field << self.rcv_ws, field), 32,
                                       "free_right_sum")),
                adv_grow.eq(wrap_add(m, loaded.rcv_adv, Const(self.mss, 16), 32, "adv_grow_sum")),
                ring_used.eq(wrap_sub(m, loaded.snd_end, loaded.snd_una, 32, "ring_used_sum")),
                park_head_end.eq(wrap_add(m, park_head, parked.r_data, 32, "park_head_end_sum")),
            ]
            if align:
                # The cut list's entry the event needs next: a chunk's and a fast
                # retransmission's the oldest, a transmit turn's the first after SND.NXT.
                use_una = ~eq(kind, K_TX) | loaded.fast_rtx
                m.d.comb += cut_rd.addr.eq(cut_addr(Mux(use_una, loaded.cut_una,
                                                        loaded.cut_nxt)))
                m.d.sync += open_len.eq(wrap_sub(m, loaded.snd_end, loaded.cut_open, 32,
                                                 "open_len_sum"))
                with m.If(eq(kind, K_RX)):
                    m.d.sync += t.cut_wait.eq(0)    # the segment may have moved the window
            for k, name in ((K_RX, "RX_A"), (K_TX, "TX_A"), (K_CHUNK, "CHUNK"),
                            (K_CMD, "CMD"), (K_TIMER, "TIMER"), (K_WRITTEN, "WRITTEN"),
                            (K_PARK, "PARK")):
                with m.If(eq(kind, k)):
                    fsm.goto(name)

        # ---- RX cycle A: classify the segment against the TCB (registered).
        acceptable, at_rcv_nxt = Signal(), Signal()
        ack_new, ack_future, ack_too_old, ack_dup = Signal(), Signal(), Signal(), Signal()
        data_inorder, fin_inorder, fin_acked = Signal(), Signal(), Signal()
        wnd_update, rtt_sample = Signal(), Signal()
        parkable = Signal()     # an out-of-order segment that joins (or starts) the park
        rtt = Signal(TIME_BITS)
        trim = Signal(16)
        deliver_len = Signal(16)    # the in-order bytes past RCV.NXT: length - trim
        nxt_before_ack = Signal()   # the ACK moves SND.NXT on (after a retransmission timeout)
        syn_right = Signal(32)      # RCV.NXT + the window a SYN-ACK offers
        # The classes of the connection's state RX_P needs, registered by RX_A.
        rx_st = {n: Signal(name=f"rx_st_{n}") for n in (
            "closed", "listen", "ss", "sr", "fw1", "fw2", "closing", "last_ack", "tw",
            "est_sr", "other", "rcv_ok")}
        with fsm.state("RX_A"):
            m.d.sync += [
                rx_st["closed"].eq(_in(t.state, State.CLOSED)),
                rx_st["listen"].eq(_in(t.state, State.LISTEN)),
                rx_st["ss"].eq(_in(t.state, State.SYN_SENT)),
                rx_st["sr"].eq(_in(t.state, State.SYN_RCVD)),
                rx_st["fw1"].eq(_in(t.state, State.FIN_WAIT_1)),
                rx_st["fw2"].eq(_in(t.state, State.FIN_WAIT_2)),
                rx_st["closing"].eq(_in(t.state, State.CLOSING)),
                rx_st["last_ack"].eq(_in(t.state, State.LAST_ACK)),
                rx_st["tw"].eq(_in(t.state, State.TIME_WAIT)),
                rx_st["est_sr"].eq(_in(t.state, State.ESTABLISHED, State.SYN_RCVD)),
                rx_st["other"].eq(~_in(t.state, State.CLOSED, State.LISTEN, State.SYN_SENT)),
                rx_st["rcv_ok"].eq(receiving | _in(t.state, State.SYN_RCVD)),
            ]

            def inside(x):
                return ~_before(x, t.rcv_nxt) & _before(x, rcv_right)
            wnd_zero = is_zero(rcv_wnd)
            m.d.sync += [
                acceptable.eq(Mux(seg_empty,
                                  Mux(wnd_zero, s.seq == t.rcv_nxt, inside(s.seq)),
                                  ~wnd_zero & (inside(s.seq) | inside(seg_last)))),
                at_rcv_nxt.eq(s.seq == t.rcv_nxt),
                ack_new.eq(_before(t.snd_una, s.ack) & ~_before(t.snd_max, s.ack)),
                ack_future.eq(_before(t.snd_max, s.ack)),
                ack_too_old.eq(_before(s.ack, wnd_left)),
                ack_dup.eq((s.ack == t.snd_una) & ~has_data & ~syn & ~fin & in_flight
                           & (s.window == t.snd_wnd)),
                data_inorder.eq(~_before(t.rcv_nxt, s.seq) & _before(t.rcv_nxt, seg_end)),
                fin_inorder.eq(fin & ~_before(t.rcv_nxt, s.seq) & ~_before(seg_end, t.rcv_nxt)),
                fin_acked.eq(t.fin_pending & _before(t.snd_end, s.ack)
                             & ~_before(t.snd_max, s.ack)),
                wnd_update.eq(~_before(s.seq, t.snd_wl1)),
                rtt_sample.eq(t.rtt_active & ~_before(s.ack, t.rtt_seq)),
                rtt.eq((now - t.rtt_start)[:TIME_BITS]),
                trim.eq((t.rcv_nxt - s.seq)[:16]),
                deliver_len.eq((seg_end - t.rcv_nxt)[:16]),
                nxt_before_ack.eq(_before(t.snd_nxt, s.ack)),
                syn_right.eq(wrap_add(m, syn_next, win_unscaled, 32, "syn_right_sum")),
                parkable.eq(_before(t.rcv_nxt, s.seq) & ~fin & seg_small
                            & receiving & ~park_flush & lt(park_count, ps)
                            & (is_zero(park_count)
                               | ((conn == park_conn) & (s.seq == park_end)))),
            ]
            count_conn("rx_segments")
            fsm.goto("RX_P")

        # ---- RX cycle B: act (RFC 9293 3.10.7).
        def challenge():
            m.d.sync += t.ack_now.eq(1)
            count("rx_challenged")

        def dropped():
            count("rx_dropped")
            count_conn("drops")

        def take_syn_options():
            m.d.sync += [t.rcv_nxt.eq(syn_next), t.snd_wl1.eq(s.seq), t.snd_wnd.eq(s.window),
                         t.rcv_adv.eq(syn_right), t.ws_on.eq(s.has_ws),
                         t.snd_ws.eq(Mux(s.has_ws, s.ws, 0)), t.mss.eq(mss_opt),
                         t.sack_on.eq(s.sack_ok)]

        def rtt_update():
            """RFC 6298 2.2-2.3 in ticks, SRTT and RTTVAR scaled by 8 and 4. The first sample is
            taken here; a later one sets `rtt_avg`, and RTT_A/RTT_B average it in."""
            with m.If(rtt_sample):
                m.d.sync += [t.rtt_active.eq(0), rto_update.eq(1), t.have_srtt.eq(1)]
                with m.If(~t.have_srtt):
                    m.d.sync += [t.srtt8.eq(rtt << 3), t.rttvar4.eq(rtt << 1)]
                with m.Else():
                    m.d.sync += rtt_avg.eq(1)

        # ---- RX cycle P: which of RX_B's actions apply (RFC 9293 3.10.7.2-3.10.7.4, in the
        # RFC's order), registered, so that RX_B acts on one flag per action. The actions of
        # an acceptable synchronised segment: `pa_*` process its ACK ("fifth"), `rd_*` its
        # data ("seventh"), `rf` its FIN ("eighth").
        names = ("p_closed", "p_reply", "p_l_syn", "p_reset", "p_tw_reset", "p_ss_syn",
                 "p_ss_synack", "p_ss_synonly", "p_unacc_sr", "p_unacc_ack", "p_drop",
                 "p_challenge",
                 "pa_sr", "pa_new", "pa_dup", "pa_wnd", "pa_fw2", "pa_tw", "pa_free",
                 "rd_deliver", "rd_park", "rd_drop", "rf", "rf_cw", "rf_tw", "rf_closing")
        act = {n: Signal(name=n) for n in names}
        with fsm.state("RX_P"):
            fsm.goto("RX_B")
            closed, listen, ss, sr = (rx_st[n] for n in ("closed", "listen", "ss", "sr"))
            fw1, other, rcv_ok = rx_st["fw1"], rx_st["other"], rx_st["rcv_ok"]
            acc = other & acceptable
            # The ACK-bearing segments of RFC 9293 3.10.7.4 "fifth" that get this far.
            acked = acc & ~rst & ~syn & ackf
            process = acked & ~(sr & ~ack_new) & ~(ack_future | ack_too_old)
            rd = process & has_data & rcv_ok
            ss_syn = ss & ~(ackf & ~ack_new) & ~rst & syn
            m.d.sync += [
                act["p_closed"].eq(closed),     # the listening slot was closed meanwhile
                act["p_reply"].eq((listen & ~rst & ackf) | (ss & ackf & ~ack_new)
                                  | (acked & sr & ~ack_new)),
                act["p_l_syn"].eq(listen & ~ackf & syn & ~rst),
                act["p_reset"].eq((ss & rst & ackf & ack_new)
                                  | (acc & rst & at_rcv_nxt & ~rx_st["tw"])),
                act["p_tw_reset"].eq(acc & rst & at_rcv_nxt & rx_st["tw"]),
                act["p_ss_syn"].eq(ss_syn),
                act["p_ss_synack"].eq(ss_syn & ackf),
                act["p_ss_synonly"].eq(ss_syn & ~ackf),
                act["p_unacc_sr"].eq(other & ~acceptable & sr & ~rst),
                act["p_unacc_ack"].eq(other & ~acceptable & ~sr & ~rst),
                act["p_drop"].eq((other & ~acceptable) | (acc & ~rst & ~syn & ~ackf)
                                 | (rd & ~data_inorder & ~parkable)),
                act["p_challenge"].eq((acc & rst & ~at_rcv_nxt) | (acc & ~rst & syn)
                                      | (acked & ~(sr & ~ack_new)
                                         & (ack_future | ack_too_old))),
                act["pa_sr"].eq(process & sr),
                act["pa_new"].eq(process & ack_new),
                act["pa_dup"].eq(process & ~ack_new & ack_dup),
                act["pa_wnd"].eq(process & wnd_update),
                act["rd_deliver"].eq(rd & data_inorder),
                act["rd_park"].eq(rd & ~data_inorder & parkable),
                act["rd_drop"].eq(rd & ~data_inorder & ~parkable),
                act["rf"].eq(process & fin_inorder & rcv_ok),
                # The state changes of "fifth" (our FIN acknowledged) and "eighth".
                act["pa_fw2"].eq(process & ack_new & fin_acked & fw1),
                act["pa_tw"].eq(process & ack_new & fin_acked & rx_st["closing"]),
                act["pa_free"].eq(process & ack_new & fin_acked & rx_st["last_ack"]),
                act["rf_cw"].eq(process & fin_inorder & rcv_ok & rx_st["est_sr"]),
                act["rf_tw"].eq(process & fin_inorder & rcv_ok
                                & ((fw1 & fin_acked) | rx_st["fw2"])),
                act["rf_closing"].eq(process & fin_inorder & rcv_ok & fw1 & ~fin_acked),
            ]

        # ---- RX cycle B: act (RFC 9293 3.10.7), in the RFC's order (a later assignment wins).
        with fsm.state("RX_B"):
            drop_payload()
            fsm.goto("FIX")
            with m.If(park_held):
                m.d.sync += park_poke.eq(1)     # RCV.NXT may have reached the park
            with m.If(act["p_closed"]):
                fsm.goto("NO_CONN")
            with m.If(act["p_reply"]):
                reset_reply()
            # RFC 9293 3.10.7.2: a SYN takes the slot to SYN-RECEIVED (TX sends SYN-ACK).
            with m.If(act["p_l_syn"]):
                take_syn_options()
                m.d.sync += [t.remote_ip.eq(s.src_ip), t.remote_port.eq(s.src_port),
                             t.local_port.eq(s.dst_port), t.state.eq(State.SYN_RCVD),
                             l_valid.bit_select(listen_idx, 1).eq(0), insert.eq(1)]
                fsm.goto("ISN")
            # RFC 9293 3.10.7.3 (SYN-SENT) and RFC 5961 3.2 (a RST exactly at RCV.NXT).
            with m.If(act["p_reset"]):
                free(EventKind.RESET)
                count("resets")
            # Both FINs were acknowledged: TIME-WAIT cut short by the peer's RST (a peer that
            # has forgotten the connection answers our ACK so) still ends a clean close.
            with m.If(act["p_tw_reset"]):
                free(EventKind.CLOSED)
            with m.If(act["p_ss_syn"]):
                take_syn_options()
            with m.If(act["p_ss_synack"]):
                m.d.sync += [t.snd_una.eq(s.ack), t.state.eq(State.ESTABLISHED),
                             t.ack_now.eq(1), t.rto_armed.eq(0), t.retries.eq(0)]
                event(0, EventKind.ESTABLISHED)
                rtt_update()
            with m.If(act["p_ss_synonly"]):
                m.d.sync += [t.state.eq(State.SYN_RCVD), t.snd_nxt.eq(t.snd_una)]
            # RFC 9293 3.10.7.4, the synchronised states.
            with m.If(act["p_unacc_sr"]):
                m.d.sync += t.snd_nxt.eq(t.snd_una)     # send the SYN-ACK again
            with m.If(act["p_unacc_ack"]):
                m.d.sync += t.ack_now.eq(1)
            with m.If(act["p_drop"]):
                dropped()
            with m.If(act["p_challenge"]):                  # RFC 5961 3.2, 4.2, 5.2
                challenge()
            # "fifth": the ACK field.
            with m.If(act["pa_sr"]):
                m.d.sync += t.state.eq(State.ESTABLISHED)
                event(0, EventKind.ESTABLISHED)
            with m.If(act["pa_new"]):
                m.d.sync += [t.snd_una.eq(s.ack), t.dupacks.eq(0), t.retries.eq(0),
                             t.rto_armed.eq(0), t.fast_rtx.eq(0)]
                with m.If(nxt_before_ack):
                    m.d.sync += t.snd_nxt.eq(s.ack)
                rtt_update()
            with m.If(act["pa_fw2"]):
                m.d.sync += t.state.eq(State.FIN_WAIT_2)
            with m.If(act["pa_tw"]):
                m.d.sync += t.state.eq(State.TIME_WAIT)
            with m.If(act["pa_free"]):
                free(EventKind.CLOSED)
            with m.If(act["pa_dup"]):
                count("dup_acks")
                count_conn("dup_acks")
                m.d.sync += t.dupacks.eq(Mux(eq(t.dupacks, 3), 3, t.dupacks + 1))
                with m.If(eq(t.dupacks, 2)):
                    m.d.sync += t.fast_rtx.eq(1)
            with m.If(act["pa_wnd"]):
                m.d.sync += [t.snd_wnd.eq(s.window), t.snd_wl1.eq(s.seq)]
            # "seventh": in-order bytes only; a segment that starts past RCV.NXT may be parked;
            # anything else is dropped and ACKed.
            with m.If(act["rd_deliver"]):
                m.d.sync += [verdict.deliver.eq(1), verdict.trim.eq(trim),
                             verdict.length.eq(deliver_len), t.rcv_nxt.eq(seg_end)]
                with m.If(t.unacked_seg | (s.flags & PSH).any()):
                    m.d.sync += [t.ack_now.eq(1), t.unacked_seg.eq(0)]
                with m.Else():
                    m.d.sync += t.unacked_seg.eq(1)
                    with m.If(~t.ack_delayed):
                        m.d.sync += [t.ack_delayed.eq(1),
                                     t.dack_deadline.eq(add(now, self.dack_ticks))]
                with m.If(park_mine):
                    # It fills all or part of the hole before the parked run: ACKed at once
                    # (RFC 5681 4.2), with the run's SACK block while a hole is left.
                    m.d.sync += [t.ack_now.eq(1), t.ack_pure.eq(1), t.unacked_seg.eq(0)]
            with m.If(act["rd_park"]):
                m.d.sync += [t.ack_now.eq(1), t.ack_pure.eq(1), verdict.park.eq(1),
                             park_end.eq(seg_end), park_count.eq(park_count + 1)]
                m.d.comb += [parked.w_en.eq(1), parked.w_data.eq(s.length)]
                with m.If(is_zero(park_count)):
                    m.d.sync += [park_conn.eq(conn), park_head.eq(s.seq)]
                count("rx_parked")
            with m.If(act["rd_drop"]):
                m.d.sync += [t.ack_now.eq(1), t.ack_pure.eq(1)]
            # "eighth": the FIN, once every byte before it is in.
            with m.If(act["rf"]):
                m.d.sync += [t.rcv_nxt.eq(seg_end1), t.ack_now.eq(1)]
                event(1, EventKind.PEER_FIN)
            with m.If(act["rf_cw"]):
                m.d.sync += t.state.eq(State.CLOSE_WAIT)
            with m.If(act["rf_tw"]):
                m.d.sync += t.state.eq(State.TIME_WAIT)
            with m.If(act["rf_closing"]):
                m.d.sync += t.state.eq(State.CLOSING)

        # ---- ISN for a passive (SYN in LISTEN) or an active (CONNECT) open.
        with fsm.state("ISN"):
            m.d.comb += [isn.i.valid.eq(1), isn.i.payload.local_ip.eq(self.ip),
                         isn.i.payload.local_port.eq(t.local_port),
                         isn.i.payload.remote_ip.eq(t.remote_ip),
                         isn.i.payload.remote_port.eq(t.remote_port),
                         isn.o.ready.eq(1)]
            with m.If(isn.o.valid):
                iss = isn.o.payload
                m.d.sync += [t.snd_una.eq(iss), t.snd_nxt.eq(iss), t.snd_max.eq(iss),
                             t.snd_end.eq(iss + 1), t.snd_ready.eq(iss + 1),
                             t.fin_pending.eq(0), t.ack_now.eq(0), t.ack_pure.eq(0),
                             t.ack_delayed.eq(0), t.unacked_seg.eq(0), t.fast_rtx.eq(0),
                             t.probe.eq(0), t.dupacks.eq(0), t.retries.eq(0),
                             t.rto_armed.eq(0), t.rto_cur.eq(self.rto_initial),
                             t.rtt_active.eq(0), t.have_srtt.eq(0), st.eq(0)]
                if align:
                    m.d.sync += [t.cut_open.eq(iss + 1), t.cut_una.eq(0), t.cut_nxt.eq(0),
                                 t.cut_end.eq(0), t.cut_wait.eq(0)]
                fsm.goto("FIX")

        # ---- TX turn: at most one segment (RFC 9293 3.10.2 SEND, 3.8.6.2.1, 3.8.6.1).
        avail = Signal(32)          # queued bytes not sent yet
        usable = Signal(32)         # window not used yet
        una_span = Signal(32)       # data bytes from snd_una to the end of what was sent
        to_end = Signal(32)         # bytes from snd_nxt to the end of the queued data
        sack_due = Signal()         # an ACK now carries the parked run's SACK block
        # The window to advertise (RFC 9293 3.8.6.2.2, receiver-side SWS avoidance): the right
        # edge moves only when the free space would move it on by more than one MSS, and never
        # back (3.8.6: a receiver should not shrink the window). Held otherwise, so the window
        # of a duplicate ACK equals the one before it, as the peer's fast retransmit requires
        # (RFC 5681 section 2), while the shared buffer's free space wobbles with segments
        # waiting for their turn and with the other connections' traffic. A segment that
        # finds the buffer full anyway is dropped (``rx_no_buffer``) and sent again.
        adv_field = Signal(16)
        win_open = Signal()         # window_open, as TX_A found it
        nxt_behind_max = Signal()   # SND.NXT < SND.MAX: data from SND.NXT was sent before
        # With ``cut_slots``: the cut list's entry for this turn, as bytes past its base, and
        # whether there is one; ``plan``: the bytes the next data segment may carry (to the
        # entry, or ``avail``); ``cut_short``: the entry comes before the end of ``avail``.
        cut_len, cut_have, plan, cut_short = Signal(32), Signal(), Signal(32), Signal()
        syn_again = Signal()        # SND.MAX != SND.UNA: the SYN was sent before
        with fsm.state("TX_A"):
            m.d.sync += [avail.eq(Mux(data_waiting, t.snd_ready - t.snd_nxt, 0)),
                         to_end.eq(t.snd_end - t.snd_nxt),
                         win_open.eq(window_open),
                         usable.eq(Mux(window_open, (wnd_right - t.snd_nxt)[:32], 0)),
                         una_span.eq(Mux(_before(t.snd_max, t.snd_end), t.snd_max - t.snd_una,
                                         t.snd_end - t.snd_una)),
                         nxt_behind_max.eq(_before(t.snd_nxt, t.snd_max)),
                         syn_again.eq(t.snd_max != t.snd_una),
                         sack_due.eq(t.sack_on & park_mine & _before(t.rcv_nxt, park_head))]
            moved = _before(adv_grow, free_right)       # both from LOADED
            held_field = Signal(16)
            m.d.comb += held_field.eq(Mux(t.ws_on, (rcv_wnd >> self.rcv_ws)[:16],
                                          Mux(rcv_wnd[16:].any(), 0xFFFF, rcv_wnd[:16])))
            m.d.sync += adv_field.eq(Mux(moved, free_field, held_field))
            if align:
                base = Mux(t.fast_rtx, t.snd_una, t.snd_nxt)
                m.d.sync += [cut_len.eq(wrap_sub(m, cut_rd.data, base, 32, "cut_len_sum")),
                             cut_have.eq(Mux(t.fast_rtx, t.cut_una, t.cut_nxt) != t.cut_end)]
                fsm.goto("TX_P")
            else:
                fsm.goto("TX_B")

        if align:
            # TX_P: the cut list's entry read for this turn (``cut_len`` past its base: SND.UNA
            # for a fast retransmission, SND.NXT otherwise). One the base has reached or passed
            # is behind (acknowledged, or sent: a timeout or an ACK moved SND.NXT): TX_P skips
            # it and TX_R reads the next, then TX_A again. Otherwise the segment may go as far
            # as the entry (``plan``, ``una_span``) and no further.
            with fsm.state("TX_P"):
                behind = cut_have & (is_zero(cut_len) | cut_len[31])
                with m.If(behind):
                    fsm.goto("TX_R")
                    with m.If(t.fast_rtx):
                        m.d.sync += t.cut_una.eq(add(t.cut_una, 1))
                        with m.If(t.cut_nxt == t.cut_una):
                            m.d.sync += t.cut_nxt.eq(add(t.cut_nxt, 1))
                    with m.Else():
                        m.d.sync += t.cut_nxt.eq(add(t.cut_nxt, 1))
                with m.Else():
                    fsm.goto("TX_B")
                    short = cut_have & ~t.fast_rtx & (cut_len < avail)
                    m.d.sync += [plan.eq(Mux(short, cut_len, avail)), cut_short.eq(short),
                                 una_span.eq(Mux(cut_have & t.fast_rtx & (cut_len < una_span),
                                                 cut_len, una_span))]
            with fsm.state("TX_R"):
                fsm.goto("TX_A")
                m.d.comb += cut_rd.addr.eq(cut_addr(Mux(t.fast_rtx, t.cut_una, t.cut_nxt)))

        # TX_A sets the geometry from SND.NXT; TX_B the lengths it allows; TX_C decides which
        # segment (if any) and registers it; TX_D emits it; TX_E moves SND.NXT/SND.MAX past it.
        # Split so that no cycle chains more than one or two carry chains (the core clock of
        # the 1-byte configuration is 125 MHz).
        data_len = Signal(16)       # min(avail, usable, MSS): the next data segment's length
        data_all = Signal()         # data_len == avail: the segment empties the ring
        fast_len = Signal(16)       # min(una_span, MSS): a fast retransmission's length
        cut_hold = Signal()         # with ``cut_slots``: the next data segment waits (TX_B)
        with fsm.state("TX_B"):
            fsm.goto("TX_C")
            mss32 = Signal(32)
            m.d.comb += mss32.eq(t.mss)
            want = plan if align else avail
            want_over_usable, want_over_mss = want > usable, want > mss32
            m.d.sync += [
                data_len.eq(Mux(want_over_usable, Mux(usable > mss32, mss32, usable),
                                Mux(want_over_mss, mss32, want))[:16]),
                data_all.eq(~want_over_usable & ~want_over_mss & ~cut_short if align
                            else ~want_over_usable & ~want_over_mss),
                fast_len.eq(Mux(una_span > mss32, mss32, una_span)[:16]),
            ]
            if align:
                # A planned segment the window cannot hold whole waits for a segment from the
                # peer (an ACK, a window update); with nothing in flight, also for the persist
                # timer, which then sends what the window holds (``t.probe``).
                m.d.sync += cut_hold.eq(~t.fast_rtx & ~t.probe & ~want_over_mss
                                        & want_over_usable)

        TxKind = ("NONE", "SYN", "FAST_RTX", "PROBE", "DATA", "ACK")
        tx_kind = Signal(range(len(TxKind)))
        tx_first = Signal(32)       # the segment's first sequence number
        tx_len = Signal(16)         # its data bytes
        tx_flags = Signal(8)
        tx_rtx = Signal()           # it sends sequence space sent before
        tx_after = Signal(32)       # the sequence number after it (SYN and FIN count one)

        def kind_is(name):
            return eq(tx_kind, TxKind.index(name))

        with fsm.state("TX_C"):
            fsm.goto("TX_D")
            m.d.sync += tx_kind.eq(TxKind.index("NONE"))
            data_len32 = Signal(32)
            m.d.comb += data_len32.eq(data_len)

            def decide(name, first, length, flags, retransmit):
                m.d.sync += [tx_kind.eq(TxKind.index(name)), tx_first.eq(first),
                             tx_len.eq(length), tx_flags.eq(flags), tx_rtx.eq(retransmit)]

            with m.If(opening & una_at_nxt):
                decide("SYN", t.snd_una, 0, Mux(_in(t.state, State.SYN_RCVD), SYN | ACK, SYN),
                       syn_again)
            with m.Elif(synced & t.ack_now & t.ack_pure):
                # An ACK for data out of order goes alone, ahead of data: the peer counts only
                # ACKs without data as duplicates (RFC 5681 section 2).
                decide("ACK", t.snd_nxt, 0, ACK, 0)
            with m.Elif(sending & t.fast_rtx):
                decide("FAST_RTX", t.snd_una, fast_len, ACK, 1)
            probe_go = sending & t.probe & data_waiting
            if align:
                probe_go &= ~win_open       # an open window takes the planned segment, cut
            with m.Elif(probe_go):
                decide("PROBE", t.snd_nxt, 1, ACK, 0)
            data_go = data_waiting & win_open
            if align:
                data_go &= ~cut_hold
            with m.Elif(sending & (data_go | fin_due)):
                # FIN on the segment that reaches the end of the queued data, PSH on the one
                # that empties the ring (``to_end``, ``avail``: from SND.NXT, set in TX_A).
                decide("DATA", t.snd_nxt, data_len,
                       Mux(t.fin_pending & (data_len32 == to_end), ACK | FIN,
                           Mux(data_all, ACK | PSH, ACK)),
                       nxt_behind_max)
            ack_go = synced & t.ack_now
            if self.ack_with_data:
                ack_go &= ~(sending & writing & win_open & (~cut_hold if align else 1))
            with m.Elif(ack_go):
                decide("ACK", t.snd_nxt, 0, ACK, 0)
            if align:
                with m.If(cut_hold):
                    m.d.sync += t.cut_wait.eq(1)    # no turn for data until another event

        with fsm.state("TX_D"):
            fsm.goto("FIX")
            m.d.sync += [seg.conn.eq(conn), seg.dst_ip.eq(t.remote_ip),
                         seg.src_port.eq(t.local_port), seg.dst_port.eq(t.remote_port),
                         seg.ack.eq(t.rcv_nxt), seg.window.eq(adv_field), seg.syn_opts.eq(0),
                         seg.mss.eq(self.mss), seg.ws.eq(self.rcv_ws), seg.syn_ws.eq(0),
                         seg.syn_sack.eq(0), seg.sack.eq(kind_is("ACK") & sack_due),
                         seg.sack_left.eq(park_head), seg.sack_right.eq(park_end)]
            seq_flag = (tx_flags & (SYN | FIN)).any()     # SYN and FIN take a sequence number
            span = Signal(17)
            m.d.comb += span.eq(tx_len + seq_flag)
            after = Signal(32)
            m.d.comb += after.eq(wrap_add(m, tx_first, span, 32, "tx_after_sum"))
            adv_wnd = Signal(32)
            m.d.comb += adv_wnd.eq(Mux(t.ws_on, adv_field << self.rcv_ws, adv_field))
            with m.If(kind_is("NONE")):
                m.d.sync += t.probe.eq(0)
            with m.Else():
                m.d.sync += [seg.seq.eq(tx_first), seg.flags.eq(tx_flags),
                             seg.length.eq(tx_len), seg_valid.eq(1), t.ack_now.eq(0),
                             t.ack_pure.eq(0),
                             t.ack_delayed.eq(0), t.unacked_seg.eq(0), tx_after.eq(after),
                             t.rcv_adv.eq(wrap_add(m, t.rcv_nxt, adv_wnd, 32, "tx_adv_right"))]
                count("tx_segments")
                count_conn("tx_segments")
                with m.If(tx_rtx):
                    count("retransmits")
                    count_conn("retransmits")
                    m.d.sync += t.rtt_active.eq(0)              # Karn's rule
                with m.Elif(~t.rtt_active & (tx_len.any() | seq_flag)):
                    m.d.sync += [t.rtt_active.eq(1), t.rtt_seq.eq(after), t.rtt_start.eq(now)]
                with m.If(kind_is("SYN") | kind_is("PROBE") | kind_is("DATA")):
                    fsm.goto("TX_E")
            with m.If(kind_is("SYN")):
                # RFC 7323 2.2, RFC 2018 2: a SYN-ACK offers window scaling and SACK only if
                # the SYN did.
                answer = _in(t.state, State.SYN_RCVD)
                m.d.sync += [seg.syn_opts.eq(1), seg.window.eq(win_unscaled),
                             t.rcv_adv.eq(wrap_add(m, t.rcv_nxt, win_unscaled, 32, "syn_adv")),
                             seg.syn_ws.eq(~answer | t.ws_on),
                             seg.syn_sack.eq(~answer | t.sack_on)]
            with m.If(kind_is("FAST_RTX")):
                count("fast_retransmits")
                m.d.sync += t.fast_rtx.eq(0)
            with m.If(kind_is("PROBE") | kind_is("DATA")):
                m.d.sync += t.probe.eq(0)

        with fsm.state("TX_E"):
            fsm.goto("FIX")
            m.d.sync += [t.snd_nxt.eq(tx_after),
                         t.snd_max.eq(Mux(_before(t.snd_max, tx_after), tx_after, t.snd_max))]
            if align:
                with m.If(kind_is("DATA") & cut_have & ~cut_len[16:].any()
                          & (tx_len == cut_len[:16])):
                    m.d.sync += t.cut_nxt.eq(add(t.cut_nxt, 1))     # the segment reached it

        # ---- Host chunk: admit it into the send ring, or drop one with nowhere to go.
        # CHUNK finds whether it fits (`ring_used` from LOADED), CHUNK_B acts.
        # With ``cut_slots`` (the planned segments): a chunk of at most the MSS that would make
        # the open planned segment longer than the MSS closes it (``cut_new``: its end, the
        # chunk's start, joins the cut list) and opens the next (a longer chunk is cut at the
        # MSS anyway, so it starts no segment of its own); the list's oldest entry, once
        # acknowledged (``cut_acked``), leaves it. A chunk that needs an entry while the
        # list is full of entries not yet acknowledged waits, as for a full ring.
        ring_over = Signal()
        cut_new, cut_full, cut_acked = Signal(), Signal(), Signal()
        with fsm.state("CHUNK"):
            fsm.goto("CHUNK_B")
            m.d.sync += ring_over.eq(gt(wrap_add(m, ring_used, chunk.length, 32, "ring_total"),
                                        self.ring_bytes))
            if align:
                send_mss = Signal(32)
                m.d.comb += send_mss.eq(t.mss)
                used = wrap_sub(m, t.cut_end, t.cut_una, len(t.cut_end), "cut_used")
                m.d.sync += [
                    cut_new.eq(~is_zero(open_len) & ~(chunk.length > t.mss)
                               & (wrap_add(m, open_len, chunk.length, 32, "open_total")
                                  > send_mss)),
                    cut_full.eq(eq(used, self.cut_slots)),
                    cut_acked.eq((t.cut_una != t.cut_end) & ~_before(t.snd_una, cut_rd.data)),
                ]
        with fsm.state("CHUNK_B"):
            fsm.goto("FIX")
            can_send = _in(t.state, State.ESTABLISHED, State.CLOSE_WAIT) & ~t.fin_pending
            with m.If(~can_send):
                m.d.comb += self.i_chunk.ready.eq(1)
                m.d.sync += [route_keep.eq(0), route_valid.eq(1)]
            with m.Elif(ring_over | (cut_new & cut_full & ~cut_acked) if align else ring_over):
                m.d.sync += chunk_retry.eq(0)
            with m.Else():
                m.d.comb += self.i_chunk.ready.eq(1)
                chunk32 = Signal(32)
                m.d.comb += chunk32.eq(chunk.length)
                m.d.sync += [route_keep.eq(1), route_valid.eq(1), ring_valid.eq(1),
                             t.snd_end.eq(t.snd_end + chunk32)]
                if align:
                    with m.If(cut_acked):
                        m.d.sync += t.cut_una.eq(add(t.cut_una, 1))
                        with m.If(t.cut_nxt == t.cut_una):
                            m.d.sync += t.cut_nxt.eq(add(t.cut_nxt, 1))
                    with m.If(cut_new):
                        m.d.comb += [cut_wr.addr.eq(cut_addr(t.cut_end)),
                                     cut_wr.data.eq(t.snd_end), cut_wr.en.eq(1)]
                        m.d.sync += [t.cut_end.eq(add(t.cut_end, 1)), t.cut_open.eq(t.snd_end)]

        # ---- Park visit: the oldest parked segment leaves the park once RCV.NXT has reached it
        # (its bytes past RCV.NXT delivered, the rest dropped), or at once if the connection
        # is gone; otherwise the park waits for the next segment of its connection.
        with fsm.state("PARK"):
            fsm.goto("FIX")
            head_end = park_head_end                    # from LOADED
            gone = park_flush | ~receiving
            reached = ~_before(t.rcv_nxt, park_head)
            m.d.sync += [verdict.conn.eq(conn), verdict.deliver.eq(0), verdict.park.eq(0),
                         verdict.parked.eq(1), verdict.trim.eq(0),
                         verdict.length.eq(parked.r_data)]
            with m.If(gone | reached):
                m.d.comb += parked.r_en.eq(1)
                m.d.sync += [verdict_valid.eq(1), park_head.eq(head_end),
                             park_count.eq(park_count - 1)]
                with m.If(eq(park_count, 1)):
                    m.d.sync += [park_flush.eq(0), park_poke.eq(0)]
                with m.If(gone):
                    dropped()
                with m.Elif(_before(t.rcv_nxt, head_end)):
                    m.d.sync += [verdict.deliver.eq(1),
                                 verdict.trim.eq((t.rcv_nxt - park_head)[:16]),
                                 verdict.length.eq((head_end - t.rcv_nxt)[:16]),
                                 t.rcv_nxt.eq(head_end), t.ack_now.eq(1)]
            with m.Else():
                m.d.sync += park_poke.eq(0)

        # ---- A chunk is in the ring: its bytes may be sent. A report for a slot freed and
        # reused meanwhile lies outside the new connection's queue and changes nothing.
        with fsm.state("WRITTEN"):
            fsm.goto("FIX")
            with m.If(_before(t.snd_ready, written.seq) & ~_before(t.snd_end, written.seq)):
                m.d.sync += t.snd_ready.eq(written.seq)

        # ---- Commands (RFC 9293 3.10.1 OPEN, 3.10.4 CLOSE, 3.10.5 ABORT). LOADED registers
        # which of CMD's actions apply to the command `cmd` (from TAKE) and the TCB loaded.

        def unlisten():
            for k in range(ls):
                with m.If(l_conn[k] == conn):
                    m.d.sync += l_valid[k].eq(0)
            m.d.sync += t.state.eq(State.CLOSED)

        with fsm.state("CMD"):
            fsm.goto("FIX")
            with m.If(cact["listen"]):
                m.d.sync += [t.state.eq(State.LISTEN), t.local_port.eq(cmd.local_port),
                             t.remote_ip.eq(0), t.remote_port.eq(0),
                             l_valid.bit_select(free_listen, 1).eq(1)]
                for k in range(ls):
                    with m.If(eq(free_listen, k)):
                        m.d.sync += [l_port[k].eq(cmd.local_port), l_conn[k].eq(conn)]
            with m.If(cact["connect"]):
                m.d.sync += [t.state.eq(State.SYN_SENT), t.local_port.eq(cmd.local_port),
                             t.remote_ip.eq(cmd.remote_ip),
                             t.remote_port.eq(cmd.remote_port), t.rcv_nxt.eq(0),
                             t.snd_wnd.eq(0), t.snd_ws.eq(0), t.ws_on.eq(0),
                             t.sack_on.eq(0), t.mss.eq(536), t.snd_wl1.eq(0), insert.eq(1)]
                fsm.goto("ISN")
            with m.If(cact["unlisten"]):
                unlisten()
            with m.If(cact["closed_event"]):
                event(0, EventKind.CLOSED)
            with m.If(cact["aborted_event"]):
                event(0, EventKind.ABORTED)
            with m.If(cact["free_closed"]):
                free(EventKind.CLOSED)
            with m.If(cact["fin_wait"]):
                m.d.sync += [t.fin_pending.eq(1), t.state.eq(State.FIN_WAIT_1)]
            with m.If(cact["last_ack"]):
                m.d.sync += [t.fin_pending.eq(1), t.state.eq(State.LAST_ACK)]
            with m.If(cact["reset"]):
                reset_connection()
            with m.If(cact["free_aborted"]):
                free(EventKind.ABORTED)

        # ---- Timer visit (RFC 6298 5.4-5.7, RFC 9293 3.8.6.1 persist, 3.10.8 timeouts).
        # TIMER decides (registered), TIMER_B acts.
        dack_fire, rto_fire = Signal(), Signal()
        tw_close, probe_fire, give_up, retry = Signal(), Signal(), Signal(), Signal()
        rto_doubled = Signal(TIME_BITS)
        with fsm.state("TIMER"):
            fsm.goto("TIMER_B")
            fire = t.rto_armed & _reached(now, t.rto_deadline)
            tw = _in(t.state, State.TIME_WAIT)
            exhausted = t.retries >= self.max_retries
            m.d.sync += [
                dack_fire.eq(t.ack_delayed & _reached(now, t.dack_deadline)),
                rto_fire.eq(fire),
                tw_close.eq(fire & tw),
                probe_fire.eq(fire & ~tw & persist),
                give_up.eq(fire & ~tw & ~persist & needs_timer & exhausted),
                retry.eq(fire & ~tw & ~persist & needs_timer & ~exhausted),
                rto_doubled.eq(Mux(gt(t.rto_cur, self.rto_max >> 1), self.rto_max,
                                   t.rto_cur << 1)),
            ]
        with fsm.state("TIMER_B"):
            fsm.goto("FIX")
            with m.If(dack_fire):
                m.d.sync += [t.ack_now.eq(1), t.ack_delayed.eq(0)]
            with m.If(rto_fire):
                m.d.sync += t.rto_armed.eq(0)
            with m.If(tw_close):
                free(EventKind.CLOSED)
            with m.If(probe_fire):
                m.d.sync += [t.probe.eq(1), t.rto_cur.eq(rto_doubled)]
            with m.If(give_up):
                with m.If(synced):
                    reset_connection()
                free(EventKind.TIMEOUT)
                count("timeouts")
            with m.If(retry):
                m.d.sync += [t.retries.eq(t.retries + 1), t.snd_nxt.eq(t.snd_una),
                             t.rto_cur.eq(rto_doubled), t.rtt_active.eq(0),
                             t.dupacks.eq(0), t.fast_rtx.eq(0)]
                if align:
                    # The segments go again as planned, with the window as it now is.
                    m.d.sync += [t.cut_nxt.eq(t.cut_una), t.cut_wait.eq(0)]

        # ---- Common end: the derived values again, for COMMIT; a later RTT sample averaged in
        # (RTT_A, RTT_B: RFC 6298 2.3, SRTT and RTTVAR scaled by 8 and 4, ``rtt - SRTT`` and
        # ``RTTVAR - RTTVAR/4`` first), then FIX again; the RTO from a new sample (RTO: 2.3,
        # 2.4, from the sum FIX registers).
        rtt_diff = Signal(TIME_BITS + 1)    # R' - SRTT (its top bit: negative)
        rtt_ndiff = Signal(TIME_BITS)       # SRTT - R'
        rttvar_kept = Signal(TIME_BITS)     # RTTVAR4 - RTTVAR4/4
        rto_sum = Signal(TIME_BITS + 1)     # SRTT + max(G, K*RTTVAR), G one tick
        timer_off = Signal()        # nothing needs the retransmission timer: disarm it
        timer_arm = Signal()        # something needs it and it is not armed: arm it
        with fsm.state("FIX"):
            m.d.comb += [deriving.eq(1), derive_fixed.eq(1)]
            stuck = sending & ~flying & shut & waiting      # `persist`, of `t`
            needed = opening | (synced & flying) | stuck | _in(t.state, State.TIME_WAIT)
            m.d.sync += [timer_off.eq(~needed), timer_arm.eq(needed & ~t.rto_armed)]
            m.d.sync += rto_sum.eq((t.srtt8 >> 3) + Mux(is_zero(t.rttvar4), 1, t.rttvar4))
            with m.If(rtt_avg):
                fsm.goto("RTT_A")
            with m.Elif(rto_update):
                fsm.goto("RTO")
            with m.Else():
                fsm.goto("COMMIT")
        with fsm.state("RTT_A"):
            fsm.goto("RTT_B")
            m.d.sync += [rtt_diff.eq(rtt - (t.srtt8 >> 3)),
                         rtt_ndiff.eq(((t.srtt8 >> 3) - rtt)[:TIME_BITS]),
                         rttvar_kept.eq(wrap_sub(m, t.rttvar4, t.rttvar4 >> 2, TIME_BITS,
                                                 "rttvar_kept"))]
        with fsm.state("RTT_B"):
            fsm.goto("FIX")
            mag = Mux(rtt_diff[TIME_BITS], rtt_ndiff, rtt_diff[:TIME_BITS])
            m.d.sync += [rtt_avg.eq(0),
                         t.srtt8.eq((t.srtt8 + rtt_diff[:TIME_BITS])[:TIME_BITS]),
                         t.rttvar4.eq(wrap_add(m, rttvar_kept, mag, TIME_BITS, "rttvar_new"))]
        with fsm.state("RTO"):
            fsm.goto("COMMIT")
            m.d.sync += t.rto_cur.eq(Mux(lt(rto_sum, self.rto_min), self.rto_min,
                                         Mux(gt(rto_sum, self.rto_max), self.rto_max, rto_sum)))

        # Write back, with the timer armed exactly while something needs it (RFC 6298 5.1-5.3).
        # The memories' and FIFOs' addresses and data are set whatever the state (only their
        # enables are COMMIT's), so no multiplexer selects them by state.
        tcb_next = Signal(tcb_shape)
        m.d.comb += tcb_next.eq(t)
        with m.If(timer_off):
            m.d.comb += tcb_next.rto_armed.eq(0)
        with m.Elif(timer_arm):
            timeout = Mux(_in(t.state, State.TIME_WAIT), self.time_wait_ticks, t.rto_cur)
            m.d.comb += [tcb_next.rto_armed.eq(1),
                         tcb_next.rto_deadline.eq(wrap_add(m, now, timeout, TIME_BITS,
                                                             "deadline"))]
        ring_req = Signal(RingRequest(self.conns))
        m.d.comb += [
            tcb_wr.addr.eq(conn), tcb_wr.data.eq(tcb_next),
            stats_wr.addr.eq(conn), stats_wr.data.eq(st),
            verdicts.w_data.eq(verdict), txq.w_data.eq(seg),
            ring_req.conn.eq(conn),
            ring_req.seq.eq(wrap_sub(m, t.snd_end, chunk.length, 32, "chunk_seq")),
            ring_req.length.eq(chunk.length),
            rings.w_data.eq(ring_req), routes.w_data.eq(route_keep),
        ]
        with fsm.state("COMMIT"):
            fsm.goto("EVENTS")
            m.d.comb += [
                tcb_wr.en.eq(~no_tcb), stats_wr.en.eq(~no_tcb),
                verdicts.w_en.eq(verdict_valid), txq.w_en.eq(seg_valid),
                rings.w_en.eq(ring_valid), routes.w_en.eq(route_valid),
            ]
            is_queued = select(m, conn, list(queued), 1, "is_queued")
            m.d.sync += enqueue.eq(~no_tcb & wants_tx & ~is_queued)
            with m.If(~eq(kind, K_CHUNK)):
                m.d.sync += chunk_retry.eq(1)

        # EVENTS: the connection joins the ready queue (in its first cycle), and the events go.
        report = Signal(Event(self.conns))
        m.d.comb += [report.kind.eq(Mux(ev_valid[0], ev[0], ev[1])), report.conn.eq(conn),
                     report.local_port.eq(t.local_port), report.remote_ip.eq(t.remote_ip),
                     report.remote_port.eq(t.remote_port), events.w_data.eq(report),
                     ready.w_data.eq(conn)]
        with fsm.state("EVENTS"):
            with m.If(enqueue):
                m.d.comb += ready.w_en.eq(1)
                m.d.sync += [queued.bit_select(conn, 1).eq(1), enqueue.eq(0)]
            m.d.comb += events.w_en.eq(ev_valid.any())
            with m.If(ev_valid[0]):
                m.d.sync += ev_valid[0].eq(0)
            with m.Elif(ev_valid[1]):
                m.d.sync += ev_valid[1].eq(0)
            with m.Else():
                fsm.goto("TABLE")

        # The lookup table follows the slot: removed when freed, added when addressed.
        with fsm.state("TABLE"):
            with m.If(release):
                m.d.comb += lookup.i_remove.valid.eq(1)
                with m.If(lookup.i_remove.ready):
                    m.d.sync += release.eq(0)
            with m.Elif(insert):
                m.d.comb += lookup.i_insert.valid.eq(1)
                with m.If(lookup.i_insert.ready):
                    m.d.sync += insert.eq(0)
            with m.Else():
                fsm.goto("IDLE")

        # Each tick starts a sweep of timer visits over every connection (after the machine's
        # own update of `sweep`, so a tick always wins).
        with m.If(tick_count == self.tick_cycles - 1):
            m.d.sync += sweep.eq(conns)
        fsm.done()
        return m
