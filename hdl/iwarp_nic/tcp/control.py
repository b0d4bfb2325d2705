"""The TCP engine's control: the connection table and every decision about a segment.

Implements RFC 9293 section 3.10 (event processing: OPEN, SEND, CLOSE, ABORT, SEGMENT ARRIVES,
timeouts) for the eleven connection states, section 3.8.6 (window management, zero-window
probes), section 3.10.7.4 "Other states" (acceptability test, ACK processing, in-order data,
FIN), RFC 6298 (retransmission timer: SRTT/RTTVAR in ticks, exponential backoff, Karn's rule),
RFC 5681 section 3.2 (fast retransmit on the third duplicate ACK; no congestion window, see
below) and 4.2 (an immediate, pure duplicate ACK for data out of order), RFC 2018 (SACK:
offered in the SYN; the parked run as one SACK block on pure ACKs while a hole is before it),
RFC 1122 section 4.2.3.2 (delayed ACK: at least every second full segment, and within
``dack_ticks``), RFC 5961 sections 3-5 (RST and SYN in a synchronised state answered with a
challenge ACK unless exactly at RCV.NXT; ACKs outside SND.UNA - SND.WND .. SND.MAX dropped), RFC
7323 section 2 (window scale) and RFC 6528 (keyed initial sequence numbers, :mod:`.isn`).

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

Throughput and latency: an event takes 5 to 10 cycles (plus the lookup and, for opens, the ISN).
A full-size segment lasts 183 cycles at 8 bytes per beat, so one data segment in each direction
and its ACKs leave the machine mostly idle. An event starts only when the output FIFOs it may
write have room, so it never waits half way; the sources are served round-robin. A transmit
turn also leaves one slot of the segment queue to the others, so a sender that keeps
:class:`.tx.TcpTx` busy never holds received segments back (before, the MAC's receive FIFO
overflowed at the start of a bulk transfer both ways, and its recovery by timeout cost 0.23 of
the measured goodput).

Limits, by design: out-of-order segments other than the parked run are dropped with an
immediate duplicate ACK (the peer's fast retransmit repairs the hole); there is no congestion
window (the peer's receive window and the send ring bound the flight: this engine is meant for
LANs); the advertised window follows the free space of the shared receive buffer, its edge
held while that moves by less than an MSS (so duplicate ACKs stay duplicates) and never moved
back, so connections together may be offered more than the buffer holds; a CLOSE in
SYN-RECEIVED aborts; an ESTABLISHED and a PEER_FIN event of one segment may be two events.
"""

from amaranth import Cat, Const, Module, Mux, Signal
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


def Tcb():
    """One connection's state (RFC 9293 section 3.3.1 names, plus the timers)."""
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
        Entries of the listen table: slots waiting in LISTEN at one time.
    park_segments : int
        Out-of-order segments (of at most ``mss`` bytes) the park buffer holds; the engine
        sizes the buffer so that they always fit.

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
                 time_wait_ticks=None, max_retries=8, listen_slots=16, park_segments=32):
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
        self.listen_slots = listen_slots
        if park_segments < 1:
            raise ValueError("park_segments must be 1 or more")
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
        tcb_shape = Tcb()
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

        m.submodules.lookup = lookup = ConnLookup(conns)
        m.submodules.isn = isn = IsnGenerator(self.clock_hz)
        m.d.comb += [lookup.hash_key.eq(self.hash_key), isn.key.eq(self.isn_key)]

        # Output FIFOs: an event starts only when each has room for all it may write.
        def out_fifo(name, shape, depth):
            f = fifo.SyncFIFOBuffered(width=data.Layout.cast(shape).size, depth=depth)
            m.submodules[name + "_fifo"] = f
            wiring.connect(m, f.r_stream, wiring.flipped(getattr(self, "o_" + name)))
            return f

        verdicts = out_fifo("verdict", Verdict(self.conns), 8)
        txq = out_fifo("tx", TxSegment(self.conns), 4)
        events = out_fifo("event", Event(self.conns), 8)
        rings = out_fifo("ring", RingRequest(self.conns), 4)
        routes = out_fifo("route", Route, 8)

        # Ready queue: connections with something to send, each at most once.
        m.submodules.ready = ready = fifo.SyncFIFOBuffered(width=cb, depth=max(conns, 2))
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
        listen_idx = Signal(range(max(ls, 2)))
        rto_update = Signal()
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

        # Derived values of the loaded TCB `t`.
        wnd_scaled = select(m, t.snd_ws, [Cat(Const(0, k), t.snd_wnd, Const(0, 16 - k))
                                         for k in range(15)], 32, "wnd_scaled")
        max_space = 0xFFFF << self.rcv_ws
        rcv_space = Signal(32)
        m.d.comb += rcv_space.eq(Mux(self.rx_free > max_space, max_space, self.rx_free))
        win_unscaled = Signal(16)
        m.d.comb += win_unscaled.eq(Mux(rcv_space > 0xFFFF, 0xFFFF, rcv_space))
        free_field = Signal(16)     # the window field that would offer all the free space
        m.d.comb += free_field.eq(Mux(t.ws_on, (rcv_space >> self.rcv_ws)[:16], win_unscaled))
        free_wnd = Signal(32)
        m.d.comb += free_wnd.eq(Mux(t.ws_on, free_field << self.rcv_ws, free_field))
        # RCV.WND: what is left of the window last advertised (0 once RCV.NXT has reached or,
        # by a FIN at its edge, passed the edge). It decides which segments are acceptable.
        rcv_wnd = Signal(32)
        m.d.comb += rcv_wnd.eq(Mux(_before(t.rcv_adv, t.rcv_nxt), 0, t.rcv_adv - t.rcv_nxt))

        synced = _in(t.state, State.SYN_RCVD, State.ESTABLISHED, State.FIN_WAIT_1,
                     State.FIN_WAIT_2, State.CLOSE_WAIT, State.CLOSING, State.LAST_ACK,
                     State.TIME_WAIT)
        sending = _in(t.state, State.ESTABLISHED, State.CLOSE_WAIT, State.FIN_WAIT_1,
                      State.CLOSING, State.LAST_ACK)
        receiving = _in(t.state, State.ESTABLISHED, State.FIN_WAIT_1, State.FIN_WAIT_2)
        opening = _in(t.state, State.SYN_SENT, State.SYN_RCVD)
        data_waiting = _before(t.snd_nxt, t.snd_ready)     # bytes in the ring, not yet sent
        in_flight = t.snd_una != t.snd_max
        fin_due = t.fin_pending & (t.snd_nxt == t.snd_end) & (t.snd_ready == t.snd_end)
        wnd_right = wrap_add(m, t.snd_una, wnd_scaled, 32, "wnd_right")
        window_open = _before(t.snd_nxt, wnd_right)
        wants_tx = Signal()
        m.d.comb += wants_tx.eq(
            (opening & (t.snd_nxt == t.snd_una))
            | (synced & t.ack_now)
            | (sending & (t.fast_rtx | t.probe | fin_due | (data_waiting & window_open))))
        persist = sending & ~in_flight & is_zero(t.snd_wnd) & data_waiting
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
        want = Cat(self.i_seg.valid, ready.r_rdy & lt(txq.w_level, txq.depth - 1),
                   self.i_chunk.valid & chunk_retry & rings.w_rdy & routes.w_rdy,
                   self.i_cmd.valid, sweep != 0, self.i_written.valid,
                   park_poke & parked.r_rdy)
        pick = Signal(range(SOURCES))
        with m.Switch(turn):
            for r in range(SOURCES):
                with (m.Case(r) if r < SOURCES - 1 else m.Default()):
                    for k in reversed(range(SOURCES)):
                        with m.If(want[(r + k) % SOURCES]):
                            m.d.comb += pick.eq((r + k) % SOURCES)
        # Room for what any event may write; only a chunk writes the ring and route queues, so
        # a full one holds chunks alone (holding every event would deadlock against the ring,
        # which waits for its write reports to be taken).
        room = verdicts.w_rdy & txq.w_rdy & lt(events.w_level, events.depth - 1)

        fsm = Machine(m, ["IDLE", "RX_LOOKUP", "RX_WAIT", "NO_CONN", "LOAD", "LOADED", "RX_A",
                          "RX_B", "ISN", "TX_A", "TX_B", "TX_C", "TX_D", "CHUNK", "WRITTEN",
                          "PARK", "CMD", "TIMER", "FIX", "COMMIT", "EVENTS", "TABLE"], "tcp_state")

        with fsm.state("IDLE"):
            m.d.sync += [verdict_valid.eq(0), seg_valid.eq(0), ev_valid.eq(0),
                         ring_valid.eq(0), route_valid.eq(0), release.eq(0), insert.eq(0),
                         no_tcb.eq(0), rto_update.eq(0)]
            with m.If(room & want.any()):
                m.d.sync += [kind.eq(pick), turn.eq(Mux(eq(pick, SOURCES - 1), 0, pick + 1))]
                with m.If(eq(pick, K_RX)):
                    m.d.comb += self.i_seg.ready.eq(1)
                    m.d.sync += s.eq(self.i_seg.payload)
                    fsm.goto("RX_LOOKUP")
                with m.If(eq(pick, K_TX)):
                    m.d.comb += ready.r_en.eq(1)
                    m.d.sync += [conn.eq(ready.r_data),
                                 queued.bit_select(ready.r_data, 1).eq(0)]
                    fsm.goto("LOAD")
                with m.If(eq(pick, K_CHUNK)):
                    m.d.sync += [chunk.eq(self.i_chunk.payload),
                                 conn.eq(self.i_chunk.payload.conn)]
                    fsm.goto("LOAD")
                with m.If(eq(pick, K_CMD)):
                    m.d.comb += self.i_cmd.ready.eq(1)
                    m.d.sync += [cmd.eq(self.i_cmd.payload), conn.eq(self.i_cmd.payload.conn)]
                    fsm.goto("LOAD")
                with m.If(eq(pick, K_TIMER)):
                    m.d.sync += [conn.eq(scan), sweep.eq(sweep - 1),
                                 scan.eq(Mux(scan == conns - 1, 0, scan + 1))]
                    fsm.goto("LOAD")
                with m.If(eq(pick, K_WRITTEN)):
                    m.d.comb += self.i_written.ready.eq(1)
                    m.d.sync += [written.eq(self.i_written.payload),
                                 conn.eq(self.i_written.payload.conn)]
                    fsm.goto("LOAD")
                with m.If(eq(pick, K_PARK)):
                    m.d.sync += conn.eq(park_conn)
                    fsm.goto("LOAD")

        # ---- RX: find the connection by address, or a listening slot for a SYN.
        key = Signal(ConnKey)
        m.d.comb += [key.remote_ip.eq(s.src_ip), key.remote_port.eq(s.src_port),
                     key.local_port.eq(s.dst_port)]
        syn, fin = (s.flags & SYN).any(), (s.flags & FIN).any()
        rst, ackf = (s.flags & RST).any(), (s.flags & ACK).any()
        with fsm.state("RX_LOOKUP"):
            m.d.comb += [lookup.i_lookup.valid.eq(1), lookup.i_lookup.payload.eq(key)]
            hit = Signal()
            for k in reversed(range(ls)):
                with m.If(l_valid[k] & (l_port[k] == s.dst_port)):
                    m.d.comb += hit.eq(1)
                    m.d.sync += listen_idx.eq(k)
            m.d.sync += listen_hit.eq(hit & syn & ~ackf & ~rst)
            with m.If(lookup.i_lookup.ready):
                fsm.goto("RX_WAIT")
        with fsm.state("RX_WAIT"):
            m.d.comb += lookup.o_lookup.ready.eq(1)
            with m.If(lookup.o_lookup.valid):
                count("rx_segments")
                with m.If(lookup.o_lookup.payload.hit):
                    m.d.sync += conn.eq(lookup.o_lookup.payload.conn)
                    fsm.goto("LOAD")
                with m.Elif(listen_hit):
                    for k in range(ls):
                        with m.If(eq(listen_idx, k)):
                            m.d.sync += conn.eq(l_conn[k])
                    fsm.goto("LOAD")
                with m.Else():
                    fsm.goto("NO_CONN")

        def reset_reply():
            """RFC 9293 3.10.7.1: answer a segment (not itself a RST) with a RST."""
            seg_len = s.length + s.flags[1] + s.flags[0]
            m.d.sync += [seg.conn.eq(0), seg.dst_ip.eq(s.src_ip), seg.src_port.eq(s.dst_port),
                         seg.dst_port.eq(s.src_port), seg.window.eq(0), seg.syn_opts.eq(0),
                         seg.sack.eq(0), seg.mss.eq(0), seg.ws.eq(0), seg.length.eq(0)]
            with m.If(~rst):
                m.d.sync += seg_valid.eq(1)
                count("tx_resets")
                with m.If(ackf):
                    m.d.sync += [seg.seq.eq(s.ack), seg.ack.eq(0), seg.flags.eq(RST)]
                with m.Else():
                    m.d.sync += [seg.seq.eq(0), seg.ack.eq(wrap_add(m, s.seq, seg_len, 32,
                                                                     "rst_ack")),
                                 seg.flags.eq(RST | ACK)]

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
                         verdict_valid.eq(s.length != 0)]

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
            for k, name in ((K_RX, "RX_A"), (K_TX, "TX_A"), (K_CHUNK, "CHUNK"),
                            (K_CMD, "CMD"), (K_TIMER, "TIMER"), (K_WRITTEN, "WRITTEN"),
                            (K_PARK, "PARK")):
                with m.If(eq(kind, k)):
                    fsm.goto(name)

        # ---- RX cycle A: classify the segment against the TCB (registered).
        seg_end = Signal(32)        # the sequence number after the payload
        seg_len = Signal(17)        # payload + SYN + FIN
        m.d.comb += [seg_end.eq(wrap_add(m, s.seq, s.length, 32, "seg_end_sum")),
                     seg_len.eq(s.length + syn + fin)]
        acceptable, at_rcv_nxt = Signal(), Signal()
        ack_new, ack_future, ack_too_old, ack_dup = Signal(), Signal(), Signal(), Signal()
        data_inorder, fin_inorder, fin_acked = Signal(), Signal(), Signal()
        wnd_update, rtt_sample = Signal(), Signal()
        parkable = Signal()     # an out-of-order segment that joins (or starts) the park
        rtt = Signal(TIME_BITS)
        trim = Signal(16)
        with fsm.state("RX_A"):
            rcv_right = wrap_add(m, t.rcv_nxt, rcv_wnd, 32, "rcv_right")

            def inside(x):
                return ~_before(x, t.rcv_nxt) & _before(x, rcv_right)
            last = Signal(32)
            m.d.comb += last.eq(wrap_add(m, s.seq, seg_len - 1, 32, "seg_last"))
            wnd_zero = is_zero(rcv_wnd)
            m.d.sync += [
                acceptable.eq(Mux(is_zero(seg_len),
                                  Mux(wnd_zero, s.seq == t.rcv_nxt, inside(s.seq)),
                                  ~wnd_zero & (inside(s.seq) | inside(last)))),
                at_rcv_nxt.eq(s.seq == t.rcv_nxt),
                ack_new.eq(_before(t.snd_una, s.ack) & ~_before(t.snd_max, s.ack)),
                ack_future.eq(_before(t.snd_max, s.ack)),
                ack_too_old.eq(_before(s.ack, t.snd_una - wnd_scaled)),
                ack_dup.eq((s.ack == t.snd_una) & is_zero(s.length) & ~syn & ~fin & in_flight
                           & (s.window == t.snd_wnd)),
                data_inorder.eq(~_before(t.rcv_nxt, s.seq) & _before(t.rcv_nxt, seg_end)),
                fin_inorder.eq(fin & ~_before(t.rcv_nxt, s.seq) & ~_before(seg_end, t.rcv_nxt)),
                fin_acked.eq(t.fin_pending & _before(t.snd_end, s.ack)
                             & ~_before(t.snd_max, s.ack)),
                wnd_update.eq(~_before(s.seq, t.snd_wl1)),
                rtt_sample.eq(t.rtt_active & ~_before(s.ack, t.rtt_seq)),
                rtt.eq((now - t.rtt_start)[:TIME_BITS]),
                trim.eq((t.rcv_nxt - s.seq)[:16]),
                parkable.eq(_before(t.rcv_nxt, s.seq) & ~fin & lt(s.length, self.mss + 1)
                            & receiving & ~park_flush & lt(park_count, ps)
                            & (is_zero(park_count)
                               | ((conn == park_conn) & (s.seq == park_end)))),
            ]
            count_conn("rx_segments")
            fsm.goto("RX_B")

        # ---- RX cycle B: act (RFC 9293 3.10.7).
        def challenge():
            m.d.sync += t.ack_now.eq(1)
            count("rx_challenged")

        def dropped():
            count("rx_dropped")
            count_conn("drops")

        syn_next = Signal(32)       # the sequence number after a SYN
        m.d.comb += syn_next.eq(s.seq + 1)

        def take_syn_options():
            m.d.sync += [t.rcv_nxt.eq(syn_next), t.snd_wl1.eq(s.seq), t.snd_wnd.eq(s.window),
                         t.rcv_adv.eq(wrap_add(m, syn_next, win_unscaled, 32, "syn_right")),
                         t.ws_on.eq(s.has_ws), t.snd_ws.eq(Mux(s.has_ws, s.ws, 0)),
                         t.sack_on.eq(s.sack_ok),
                         t.mss.eq(Mux(s.has_mss, Mux(gt(s.mss, self.mss), self.mss, s.mss), 536))]

        def rtt_update():
            """RFC 6298 2.2-2.3 in ticks, SRTT and RTTVAR scaled by 8 and 4."""
            with m.If(rtt_sample):
                m.d.sync += [t.rtt_active.eq(0), rto_update.eq(1), t.have_srtt.eq(1)]
                with m.If(~t.have_srtt):
                    m.d.sync += [t.srtt8.eq(rtt << 3), t.rttvar4.eq(rtt << 1)]
                with m.Else():
                    diff = Signal(TIME_BITS + 1)
                    m.d.comb += diff.eq(rtt - (t.srtt8 >> 3))
                    mag = Mux(diff[TIME_BITS], -diff, diff)[:TIME_BITS]
                    var = wrap_add(m, t.rttvar4, mag, TIME_BITS, "rttvar_up")
                    m.d.sync += [t.srtt8.eq((t.srtt8 + diff[:TIME_BITS])[:TIME_BITS]),
                                 t.rttvar4.eq(wrap_sub(m, var, t.rttvar4 >> 2, TIME_BITS,
                                                        "rttvar_down"))]

        def process_ack():
            """RFC 9293 3.10.7.4 "fifth": the ACK field of an acceptable segment."""
            with m.If(_in(t.state, State.SYN_RCVD)):
                m.d.sync += t.state.eq(State.ESTABLISHED)
                event(0, EventKind.ESTABLISHED)
            with m.If(ack_new):
                m.d.sync += [t.snd_una.eq(s.ack), t.dupacks.eq(0), t.retries.eq(0),
                             t.rto_armed.eq(0), t.fast_rtx.eq(0)]
                with m.If(_before(t.snd_nxt, s.ack)):
                    m.d.sync += t.snd_nxt.eq(s.ack)
                rtt_update()
                with m.If(fin_acked):
                    with m.If(_in(t.state, State.FIN_WAIT_1)):
                        m.d.sync += t.state.eq(State.FIN_WAIT_2)
                    with m.If(_in(t.state, State.CLOSING)):
                        m.d.sync += t.state.eq(State.TIME_WAIT)
                    with m.If(_in(t.state, State.LAST_ACK)):
                        free(EventKind.CLOSED)
            with m.Elif(ack_dup):
                count("dup_acks")
                count_conn("dup_acks")
                m.d.sync += t.dupacks.eq(Mux(eq(t.dupacks, 3), 3, t.dupacks + 1))
                with m.If(eq(t.dupacks, 2)):
                    m.d.sync += t.fast_rtx.eq(1)
            with m.If(wnd_update):
                m.d.sync += [t.snd_wnd.eq(s.window), t.snd_wl1.eq(s.seq)]

        def receive_data():
            """RFC 9293 3.10.7.4 "seventh": in-order bytes only; anything else is ACKed."""
            with m.If(~is_zero(s.length) & (receiving | _in(t.state, State.SYN_RCVD))):
                with m.If(data_inorder):
                    m.d.sync += [verdict.deliver.eq(1), verdict.trim.eq(trim),
                                 verdict.length.eq(s.length - trim), t.rcv_nxt.eq(seg_end)]
                    with m.If(t.unacked_seg | (s.flags & PSH).any()):
                        m.d.sync += [t.ack_now.eq(1), t.unacked_seg.eq(0)]
                    with m.Else():
                        m.d.sync += t.unacked_seg.eq(1)
                        with m.If(~t.ack_delayed):
                            m.d.sync += [t.ack_delayed.eq(1),
                                         t.dack_deadline.eq(add(now, self.dack_ticks))]
                    with m.If(park_mine):
                        # It fills all or part of the hole before the parked run: ACKed at
                        # once (RFC 5681 4.2), with the run's SACK block while a hole is left.
                        m.d.sync += [t.ack_now.eq(1), t.ack_pure.eq(1), t.unacked_seg.eq(0)]
                with m.Elif(parkable):
                    m.d.sync += [t.ack_now.eq(1), t.ack_pure.eq(1), verdict.park.eq(1),
                                 park_end.eq(seg_end),
                                 park_count.eq(park_count + 1)]
                    m.d.comb += [parked.w_en.eq(1), parked.w_data.eq(s.length)]
                    with m.If(is_zero(park_count)):
                        m.d.sync += [park_conn.eq(conn), park_head.eq(s.seq)]
                    count("rx_parked")
                with m.Else():
                    m.d.sync += [t.ack_now.eq(1), t.ack_pure.eq(1)]
                    dropped()

        def receive_fin():
            """RFC 9293 3.10.7.4 "eighth", once every byte before the FIN is in."""
            with m.If(fin_inorder & (receiving | _in(t.state, State.SYN_RCVD))):
                m.d.sync += [t.rcv_nxt.eq(add(seg_end, 1)), t.ack_now.eq(1)]
                event(1, EventKind.PEER_FIN)
                with m.If(_in(t.state, State.ESTABLISHED, State.SYN_RCVD)):
                    m.d.sync += t.state.eq(State.CLOSE_WAIT)
                with m.If(_in(t.state, State.FIN_WAIT_1) & fin_acked):
                    m.d.sync += t.state.eq(State.TIME_WAIT)
                with m.If(_in(t.state, State.FIN_WAIT_1) & ~fin_acked):
                    m.d.sync += t.state.eq(State.CLOSING)
                with m.If(_in(t.state, State.FIN_WAIT_2)):
                    m.d.sync += t.state.eq(State.TIME_WAIT)

        with fsm.state("RX_B"):
            drop_payload()
            fsm.goto("FIX")
            with m.If(park_held):
                m.d.sync += park_poke.eq(1)     # RCV.NXT may have reached the park
            with m.If(_in(t.state, State.CLOSED)):
                fsm.goto("NO_CONN")        # the listening slot was closed meanwhile
            with m.Elif(_in(t.state, State.LISTEN)):
                # RFC 9293 3.10.7.2: a SYN takes the slot to SYN-RECEIVED (TX sends SYN-ACK).
                with m.If(~rst & ackf):
                    reset_reply()
                with m.Elif(syn & ~rst):
                    take_syn_options()
                    m.d.sync += [t.remote_ip.eq(s.src_ip), t.remote_port.eq(s.src_port),
                                 t.local_port.eq(s.dst_port), t.state.eq(State.SYN_RCVD),
                                 l_valid.bit_select(listen_idx, 1).eq(0), insert.eq(1)]
                    fsm.goto("ISN")
            with m.Elif(_in(t.state, State.SYN_SENT)):
                # RFC 9293 3.10.7.3.
                with m.If(ackf & ~ack_new):
                    reset_reply()
                with m.Elif(rst):
                    with m.If(ackf):
                        free(EventKind.RESET)
                        count("resets")
                with m.Elif(syn):
                    take_syn_options()
                    with m.If(ackf):
                        m.d.sync += [t.snd_una.eq(s.ack), t.state.eq(State.ESTABLISHED),
                                     t.ack_now.eq(1), t.rto_armed.eq(0), t.retries.eq(0)]
                        event(0, EventKind.ESTABLISHED)
                        rtt_update()
                    with m.Else():
                        m.d.sync += [t.state.eq(State.SYN_RCVD), t.snd_nxt.eq(t.snd_una)]
            with m.Else():
                # RFC 9293 3.10.7.4, the synchronised states, in the RFC's order.
                with m.If(~acceptable):
                    with m.If(_in(t.state, State.SYN_RCVD) & ~rst):
                        m.d.sync += t.snd_nxt.eq(t.snd_una)     # send the SYN-ACK again
                    with m.Elif(~rst):
                        m.d.sync += t.ack_now.eq(1)
                    dropped()
                with m.Elif(rst):
                    with m.If(at_rcv_nxt):                      # RFC 5961 3.2
                        free(EventKind.RESET)
                        count("resets")
                    with m.Else():
                        challenge()
                with m.Elif(syn):                               # RFC 5961 4.2
                    challenge()
                with m.Elif(~ackf):
                    dropped()
                with m.Elif(_in(t.state, State.SYN_RCVD) & ~ack_new):
                    reset_reply()
                with m.Elif(ack_future | ack_too_old):          # RFC 5961 5.2
                    challenge()
                with m.Else():
                    process_ack()
                    receive_data()
                    receive_fin()

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
        with fsm.state("TX_A"):
            sent_end = Mux(_before(t.snd_max, t.snd_end), t.snd_max, t.snd_end)
            m.d.sync += [avail.eq(Mux(data_waiting, t.snd_ready - t.snd_nxt, 0)),
                         to_end.eq(t.snd_end - t.snd_nxt),
                         usable.eq(Mux(window_open, (wnd_right - t.snd_nxt)[:32], 0)),
                         una_span.eq(sent_end - t.snd_una),
                         sack_due.eq(t.sack_on & park_mine & _before(t.rcv_nxt, park_head))]
            free_right = wrap_add(m, t.rcv_nxt, free_wnd, 32, "free_right")
            step = Const(self.mss, 32)
            moved = _before(wrap_add(m, t.rcv_adv, step, 32, "adv_grow"), free_right)
            held_field = Signal(16)
            m.d.comb += held_field.eq(Mux(t.ws_on, (rcv_wnd >> self.rcv_ws)[:16],
                                          Mux(rcv_wnd > 0xFFFF, 0xFFFF, rcv_wnd)))
            m.d.sync += adv_field.eq(Mux(moved, free_field, held_field))
            fsm.goto("TX_B")

        def clip(value, limit):
            return Mux(value > limit, limit, value)

        # TX_B decides which segment (if any) and registers its geometry; TX_C emits it; TX_D
        # moves SND.NXT/SND.MAX past it. Split so that no cycle chains more than one or two
        # 32-bit carry chains (the core clock of the 1-byte configuration is 125 MHz).
        TxKind = ("NONE", "SYN", "FAST_RTX", "PROBE", "DATA", "ACK")
        tx_kind = Signal(range(len(TxKind)))
        tx_first = Signal(32)       # the segment's first sequence number
        tx_len = Signal(16)         # its data bytes
        tx_flags = Signal(8)
        tx_rtx = Signal()           # it sends sequence space sent before
        tx_after = Signal(32)       # the sequence number after it (SYN and FIN count one)

        def kind_is(name):
            return eq(tx_kind, TxKind.index(name))

        with fsm.state("TX_B"):
            fsm.goto("TX_C")
            m.d.sync += tx_kind.eq(TxKind.index("NONE"))
            data_len = Signal(16)
            m.d.comb += data_len.eq(clip(clip(avail, usable), t.mss))
            data_len32 = Signal(32)
            m.d.comb += data_len32.eq(data_len)

            def decide(name, first, length, flags, retransmit):
                m.d.sync += [tx_kind.eq(TxKind.index(name)), tx_first.eq(first),
                             tx_len.eq(length), tx_flags.eq(flags), tx_rtx.eq(retransmit)]

            with m.If(opening & (t.snd_nxt == t.snd_una)):
                decide("SYN", t.snd_una, 0, Mux(_in(t.state, State.SYN_RCVD), SYN | ACK, SYN),
                       t.snd_max != t.snd_una)
            with m.Elif(synced & t.ack_now & t.ack_pure):
                # An ACK for data out of order goes alone, ahead of data: the peer counts only
                # ACKs without data as duplicates (RFC 5681 section 2).
                decide("ACK", t.snd_nxt, 0, ACK, 0)
            with m.Elif(sending & t.fast_rtx):
                decide("FAST_RTX", t.snd_una, clip(una_span, t.mss)[:16], ACK, 1)
            with m.Elif(sending & t.probe & data_waiting):
                decide("PROBE", t.snd_nxt, 1, ACK, 0)
            with m.Elif(sending & ((data_waiting & window_open) | fin_due)):
                # FIN on the segment that reaches the end of the queued data, PSH on the one
                # that empties the ring (``to_end``, ``avail``: from SND.NXT, set in TX_A).
                decide("DATA", t.snd_nxt, data_len,
                       Mux(t.fin_pending & (data_len32 == to_end), ACK | FIN,
                           Mux(data_len32 == avail, ACK | PSH, ACK)),
                       _before(t.snd_nxt, t.snd_max))
            with m.Elif(synced & t.ack_now):
                decide("ACK", t.snd_nxt, 0, ACK, 0)

        with fsm.state("TX_C"):
            fsm.goto("FIX")
            m.d.sync += [seg.conn.eq(conn), seg.dst_ip.eq(t.remote_ip),
                         seg.src_port.eq(t.local_port), seg.dst_port.eq(t.remote_port),
                         seg.ack.eq(t.rcv_nxt), seg.window.eq(adv_field), seg.syn_opts.eq(0),
                         seg.mss.eq(self.mss), seg.ws.eq(self.rcv_ws), seg.syn_ws.eq(0),
                         seg.syn_sack.eq(0), seg.sack.eq(kind_is("ACK") & sack_due),
                         seg.sack_left.eq(park_head), seg.sack_right.eq(park_end)]
            span = Signal(17)
            m.d.comb += span.eq(tx_len + (tx_flags & (SYN | FIN)).any())
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
                with m.Elif(~t.rtt_active & ~is_zero(span)):
                    m.d.sync += [t.rtt_active.eq(1), t.rtt_seq.eq(after), t.rtt_start.eq(now)]
                with m.If(kind_is("SYN") | kind_is("PROBE") | kind_is("DATA")):
                    fsm.goto("TX_D")
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

        with fsm.state("TX_D"):
            fsm.goto("FIX")
            m.d.sync += [t.snd_nxt.eq(tx_after),
                         t.snd_max.eq(Mux(_before(t.snd_max, tx_after), tx_after, t.snd_max))]

        # ---- Host chunk: admit it into the send ring, or drop one with nowhere to go.
        with fsm.state("CHUNK"):
            fsm.goto("FIX")
            ring_used = wrap_sub(m, t.snd_end, t.snd_una, 32, "ring_used")
            total = wrap_add(m, ring_used, chunk.length, 32, "ring_total")
            can_send = _in(t.state, State.ESTABLISHED, State.CLOSE_WAIT) & ~t.fin_pending
            with m.If(~can_send):
                m.d.comb += self.i_chunk.ready.eq(1)
                m.d.sync += [route_keep.eq(0), route_valid.eq(1)]
            with m.Elif(gt(total, self.ring_bytes)):
                m.d.sync += chunk_retry.eq(0)
            with m.Else():
                m.d.comb += self.i_chunk.ready.eq(1)
                chunk32 = Signal(32)
                m.d.comb += chunk32.eq(chunk.length)
                m.d.sync += [route_keep.eq(1), route_valid.eq(1), ring_valid.eq(1),
                             t.snd_end.eq(t.snd_end + chunk32)]

        # ---- Park visit: the oldest parked segment leaves the park once RCV.NXT has reached it
        # (its bytes past RCV.NXT delivered, the rest dropped), or at once if the connection
        # is gone; otherwise the park waits for the next segment of its connection.
        with fsm.state("PARK"):
            fsm.goto("FIX")
            head_len = Signal(32)
            m.d.comb += head_len.eq(parked.r_data)
            head_end = wrap_add(m, park_head, head_len, 32, "park_head_end")
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

        # ---- Commands (RFC 9293 3.10.1 OPEN, 3.10.4 CLOSE, 3.10.5 ABORT).
        free_listen = Signal(range(max(ls, 2)))
        have_listen = Signal()
        for k in reversed(range(ls)):
            with m.If(~l_valid[k]):
                m.d.comb += [free_listen.eq(k), have_listen.eq(1)]

        def unlisten():
            for k in range(ls):
                with m.If(l_conn[k] == conn):
                    m.d.sync += l_valid[k].eq(0)
            m.d.sync += t.state.eq(State.CLOSED)

        with fsm.state("CMD"):
            fsm.goto("FIX")
            closed = _in(t.state, State.CLOSED)
            with m.If(_in(cmd.op, CommandOp.LISTEN)):
                with m.If(closed & have_listen):
                    m.d.sync += [t.state.eq(State.LISTEN), t.local_port.eq(cmd.local_port),
                                 t.remote_ip.eq(0), t.remote_port.eq(0),
                                 l_valid.bit_select(free_listen, 1).eq(1)]
                    for k in range(ls):
                        with m.If(eq(free_listen, k)):
                            m.d.sync += [l_port[k].eq(cmd.local_port), l_conn[k].eq(conn)]
                with m.Else():
                    event(0, EventKind.ABORTED)
            with m.If(_in(cmd.op, CommandOp.CONNECT)):
                with m.If(closed):
                    m.d.sync += [t.state.eq(State.SYN_SENT), t.local_port.eq(cmd.local_port),
                                 t.remote_ip.eq(cmd.remote_ip),
                                 t.remote_port.eq(cmd.remote_port), t.rcv_nxt.eq(0),
                                 t.snd_wnd.eq(0), t.snd_ws.eq(0), t.ws_on.eq(0),
                                 t.sack_on.eq(0), t.mss.eq(536), t.snd_wl1.eq(0), insert.eq(1)]
                    fsm.goto("ISN")
                with m.Else():
                    event(0, EventKind.ABORTED)
            with m.If(_in(cmd.op, CommandOp.CLOSE)):
                with m.If(_in(t.state, State.LISTEN)):
                    unlisten()
                    event(0, EventKind.CLOSED)
                with m.Elif(_in(t.state, State.SYN_SENT)):
                    free(EventKind.CLOSED)
                with m.Elif(_in(t.state, State.ESTABLISHED)):
                    m.d.sync += [t.fin_pending.eq(1), t.state.eq(State.FIN_WAIT_1)]
                with m.Elif(_in(t.state, State.CLOSE_WAIT)):
                    m.d.sync += [t.fin_pending.eq(1), t.state.eq(State.LAST_ACK)]
                with m.Elif(_in(t.state, State.SYN_RCVD)):
                    reset_connection()
                    free(EventKind.ABORTED)
                with m.Elif(closed):
                    event(0, EventKind.CLOSED)
            with m.If(_in(cmd.op, CommandOp.ABORT)):
                with m.If(_in(t.state, State.LISTEN)):
                    unlisten()
                    event(0, EventKind.ABORTED)
                with m.Elif(closed):
                    event(0, EventKind.ABORTED)
                with m.Else():
                    with m.If(synced):
                        reset_connection()
                    free(EventKind.ABORTED)

        # ---- Timer visit (RFC 6298 5.4-5.7, RFC 9293 3.8.6.1 persist, 3.10.8 timeouts).
        with fsm.state("TIMER"):
            fsm.goto("FIX")
            with m.If(t.ack_delayed & _reached(now, t.dack_deadline)):
                m.d.sync += [t.ack_now.eq(1), t.ack_delayed.eq(0)]
            with m.If(t.rto_armed & _reached(now, t.rto_deadline)):
                m.d.sync += t.rto_armed.eq(0)
                doubled = Mux(gt(t.rto_cur, self.rto_max >> 1), self.rto_max, t.rto_cur << 1)
                with m.If(_in(t.state, State.TIME_WAIT)):
                    free(EventKind.CLOSED)
                with m.Elif(persist):
                    m.d.sync += [t.probe.eq(1), t.rto_cur.eq(doubled)]
                with m.Elif(needs_timer):
                    with m.If(t.retries >= self.max_retries):
                        with m.If(synced):
                            reset_connection()
                        free(EventKind.TIMEOUT)
                        count("timeouts")
                    with m.Else():
                        m.d.sync += [t.retries.eq(t.retries + 1), t.snd_nxt.eq(t.snd_una),
                                     t.rto_cur.eq(doubled), t.rtt_active.eq(0),
                                     t.dupacks.eq(0), t.fast_rtx.eq(0)]

        # ---- Common end: the RTO from a new sample (RFC 6298 2.3, 2.4).
        with fsm.state("FIX"):
            fsm.goto("COMMIT")
            with m.If(rto_update):
                rto = Signal(TIME_BITS + 1)
                m.d.comb += rto.eq((t.srtt8 >> 3) + Mux(is_zero(t.rttvar4), 1, t.rttvar4))
                m.d.sync += t.rto_cur.eq(Mux(lt(rto, self.rto_min), self.rto_min,
                                             Mux(gt(rto, self.rto_max), self.rto_max, rto)))

        # Write back, with the timer armed exactly while something needs it (RFC 6298 5.1-5.3).
        with fsm.state("COMMIT"):
            fsm.goto("EVENTS")
            tcb_next = Signal(tcb_shape)
            m.d.comb += tcb_next.eq(t)
            with m.If(~needs_timer):
                m.d.comb += tcb_next.rto_armed.eq(0)
            with m.Elif(~t.rto_armed):
                timeout = Mux(_in(t.state, State.TIME_WAIT), self.time_wait_ticks, t.rto_cur)
                m.d.comb += [tcb_next.rto_armed.eq(1),
                             tcb_next.rto_deadline.eq(wrap_add(m, now, timeout, TIME_BITS,
                                                                 "deadline"))]
            ring_req = Signal(RingRequest(self.conns))
            m.d.comb += [
                tcb_wr.addr.eq(conn), tcb_wr.data.eq(tcb_next), tcb_wr.en.eq(~no_tcb),
                stats_wr.addr.eq(conn), stats_wr.data.eq(st), stats_wr.en.eq(~no_tcb),
                verdicts.w_en.eq(verdict_valid), verdicts.w_data.eq(verdict),
                txq.w_en.eq(seg_valid), txq.w_data.eq(seg),
                ring_req.conn.eq(conn),
                ring_req.seq.eq(wrap_sub(m, t.snd_end, chunk.length, 32, "chunk_seq")),
                ring_req.length.eq(chunk.length),
                rings.w_en.eq(ring_valid), rings.w_data.eq(ring_req),
                routes.w_en.eq(route_valid), routes.w_data.eq(route_keep),
            ]
            is_queued = select(m, conn, list(queued), 1, "is_queued")
            with m.If(~no_tcb & wants_tx & ~is_queued):
                m.d.comb += [ready.w_en.eq(1), ready.w_data.eq(conn)]
                m.d.sync += queued.bit_select(conn, 1).eq(1)
            with m.If(~eq(kind, K_CHUNK)):
                m.d.sync += chunk_retry.eq(1)

        with fsm.state("EVENTS"):
            report = Signal(Event(self.conns))
            m.d.comb += [report.kind.eq(Mux(ev_valid[0], ev[0], ev[1])), report.conn.eq(conn),
                         report.local_port.eq(t.local_port), report.remote_ip.eq(t.remote_ip),
                         report.remote_port.eq(t.remote_port), events.w_data.eq(report),
                         events.w_en.eq(ev_valid.any())]
            with m.If(ev_valid[0]):
                m.d.sync += ev_valid[0].eq(0)
            with m.Elif(ev_valid[1]):
                m.d.sync += ev_valid[1].eq(0)
            with m.Else():
                fsm.goto("TABLE")

        # The lookup table follows the slot: removed when freed, added when addressed.
        with fsm.state("TABLE"):
            m.d.comb += [lookup.i_remove.payload.conn.eq(conn),
                         lookup.i_insert.payload.conn.eq(conn),
                         lookup.i_insert.payload.key.remote_ip.eq(t.remote_ip),
                         lookup.i_insert.payload.key.remote_port.eq(t.remote_port),
                         lookup.i_insert.payload.key.local_port.eq(t.local_port)]
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
        return m
