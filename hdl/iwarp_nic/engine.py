"""One connection's iWARP engine over its TCP byte stream: RFC 5044 (MPA: the startup exchange,
then FPDUs both ways), RFC 5041 (DDP placement and segmentation), RFC 5040 (RDMAP: Send,
Write, Read, Terminate) with RFC 6581 (IRD/ORD, the peer-to-peer RTR) and RFC 7306 (atomics,
Immediate Data), as the model's ``engine.Connection`` is one connection's engine.

:class:`IwarpEngine` wires the blocks of the three layers for one stream: the
:class:`~.mpa.MpaNegotiator` at the head of both directions, the
:class:`~.ddp.StreamReceiver` (deframer, parser, RTR check, placer, STag table), the
:class:`~.rdmap.RequestResponder` with its :class:`~.rdmap.AtomicExecutor`, the
:class:`~.rdmap.TerminateParser`, the :class:`~.rdmap.RequestIssuer`, the
:class:`~.rdmap.SendScheduler` and the :class:`~.ddp.StreamSender`; the first protocol
violation of any of them becomes the stream's one Terminate.
"""

from amaranth import C, Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .ddp import ConnectionsReceiver, StreamReceiver, StreamSender
from .ddp.placement import (
    PlaceRequest,
    PostedReceive,
    ReadDone,
    ReceiveCompletion,
)
from .ddp.stag import StagWrite
from .errors import TerminateCode, Violation
from .exact import eq, gt, one_of, select, widened
from .headers import DDP_TAGGED, READ_REQUEST
from .mpa import Decision, MpaNegotiator, Negotiated, NegotiationConfig, Outcome, Rtr
from .mpa.deframer import ErrorKind
from .mpa.startup import StartupFrame
from .rdmap import (
    AtomicExecutor,
    HostRead,
    HostWord,
    Refused,
    RequestIssuer,
    RequestResponder,
    SendScheduler,
    Sent,
    TerminateHeader,
    TerminateParser,
    WorkRequest,
)
from .stream import BeatLayout, BeatStream, SkidBuffer, check_data_bytes, pass_through, sliced
from .tcp.layouts import with_conn

__all__ = ["IwarpEngine", "EngineOpen", "ConnectionsEngine"]

_READ_REQUEST, _SEND, _TERMINATE, _ATOMIC_REQUEST = 1, 3, 7, 10
#: The Terminate code of each deframer error (the model's ``error_code_for``).
_DEFRAMER_CODES = {ErrorKind.CRC: TerminateCode.MPA_CRC,
                   ErrorKind.MARKER: TerminateCode.MPA_MARKER,
                   ErrorKind.LENGTH: TerminateCode.RDMAP_CATASTROPHIC_STREAM}


class IwarpEngine(wiring.Component):
    """MPA, DDP and RDMAP for one connection, between its TCP byte stream and host memory.

    Ports
    -----
    i_config, tick, timeout, i_private, o_private, o_peer, i_decision, o_result
        The connection's setup, as :class:`~.mpa.MpaNegotiator` takes and gives it. The
        engine uses what ``o_result`` settled from the transfer on (the host must take it).
    i, o : In(BeatStream(data_bytes)), Out(BeatStream(data_bytes))
        The TCP stream received and the one to send, from their first octets: this end's MPA
        frame, then its FPDUs. A Responder sends no FPDU before the Initiator's first one (RFC
        5044 7.1.2), or its RTR.
    pd, max_ulpdu : In(pd_bits), In(16)
        The connection's protection domain and the MULPDU of its sends (from the EMSS; at
        least 70 octets).
    rtr_source : In(64)
        For a peer-to-peer Initiator whose RTR is a Read: the host address of its header, 28
        zero octets (RFC 6581 section 7; read as any Read Request's header is).
    i_write : In(stream.Signature(StagWrite))
        STag table entries.
    i_receive, receive_pending : In
        Receives posted (:class:`~.ddp.SegmentPlacer`).
    i_work : In(stream.Signature(WorkRequest))
        Work requests from the send queue (:class:`~.rdmap.RequestIssuer`), taken once the
        connection runs.
    o_place, o_data : Out
        Host memory writes: RDMA Writes, Read Responses, receives, atomics' original values.
    o_read, i_host : Out(stream.Signature(HostRead)), In(BeatStream(data_bytes))
        Host memory reads for the payloads sent, answered in order.
    o_sent : Out(stream.Signature(Sent))
        Each Send, Write and Immediate Data work request done with host memory (the
        :class:`~.rdmap.SendScheduler`'s): it completes.
    o_atomic_read, i_atomic_read, o_atomic_write
        The atomic executor's read-modify-write of host memory.
    o_complete, o_read_done, o_refused : Out
        Receive completions, the ends of Reads and atomics, work refused for an ORD of 0 (and
        each work request after it, flushed).
    o_fault : Out(stream.Signature(Violation))
        The violation this end found first, which its Terminate reports.
    o_peer_terminate : Out(stream.Signature(TerminateHeader))
        A Terminate received from the peer.

    After a Terminate, sent or received, the engine takes no more messages to send. A
    peer-to-peer Initiator sends its RTR as its first message, a zero-length Write, Send or
    Read (the Read outstanding like any, its end not reported; sent whatever the ORD, as the
    model does). Throughput and latency are the blocks' (one beat per cycle each way).
    """

    def __init__(self, data_bytes, *, stag_entries=4096, pd_bits=16, fifo_bytes=16384,
                 max_ord=32):
        self.data_bytes = n = check_data_bytes(data_bytes)
        self.stag_entries, self.pd_bits = stag_entries, pd_bits
        self.fifo_bytes, self.max_ord = fifo_bytes, max_ord
        index_bits = stag_entries.bit_length() - 1
        super().__init__({
            "i_config": In(stream.Signature(NegotiationConfig)),
            "tick": In(1), "timeout": In(16),
            "i_private": In(BeatStream(n)),
            "o_private": Out(BeatStream(n)),
            "o_peer": Out(stream.Signature(StartupFrame)),
            "i_decision": In(stream.Signature(Decision)),
            "o_result": Out(stream.Signature(Negotiated)),
            "i": In(BeatStream(n)),
            "o": Out(BeatStream(n)),
            "pd": In(pd_bits), "max_ulpdu": In(16), "rtr_source": In(64),
            "i_write": In(stream.Signature(StagWrite(pd_bits, index_bits))),
            "i_receive": In(stream.Signature(PostedReceive)), "receive_pending": In(1),
            "i_work": In(stream.Signature(WorkRequest)),
            "o_place": Out(stream.Signature(PlaceRequest)),
            "o_data": Out(BeatStream(n)),
            "o_read": Out(stream.Signature(HostRead)),
            "i_host": In(BeatStream(n)),
            "o_sent": Out(stream.Signature(Sent)),
            "o_atomic_read": Out(stream.Signature(64)),
            "i_atomic_read": In(stream.Signature(64)),
            "o_atomic_write": Out(stream.Signature(HostWord)),
            "o_complete": Out(stream.Signature(ReceiveCompletion)),
            "o_read_done": Out(stream.Signature(ReadDone)),
            "o_refused": Out(stream.Signature(Refused)),
            "o_fault": Out(stream.Signature(Violation)),
            "o_peer_terminate": Out(stream.Signature(TerminateHeader)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        m.submodules.negotiator = neg = MpaNegotiator(n)
        m.submodules.receiver = rx = StreamReceiver(
            n, stag_entries=self.stag_entries, pd_bits=self.pd_bits, fifo_bytes=self.fifo_bytes)
        m.submodules.responder = resp = RequestResponder(pd_bits=self.pd_bits)
        m.submodules.executor = ex = AtomicExecutor()
        m.submodules.terminates = term = TerminateParser(n)
        m.submodules.issuer = iss = RequestIssuer(max_ord=self.max_ord)
        m.submodules.scheduler = sch = SendScheduler(n)
        m.submodules.sender = tx = StreamSender(n)

        def outward(inner, name):
            wiring.connect(m, inner, wiring.flipped(getattr(self, name)))

        def inward(name, inner):
            wiring.connect(m, wiring.flipped(getattr(self, name)), inner)

        # Connection setup; what it settled is kept from the result's transfer on.
        for name in ("i_config", "i_private", "i_decision", "i"):
            inward(name, getattr(neg, name))
        for name in ("o_private", "o_peer"):
            outward(getattr(neg, name), name)
        m.d.comb += [neg.tick.eq(self.tick), neg.timeout.eq(self.timeout)]
        result = neg.o_result
        m.d.comb += [self.o_result.valid.eq(result.valid), self.o_result.payload.eq(result.payload),
                     result.ready.eq(self.o_result.ready)]
        agreed = Signal(Negotiated)
        initiator, running = Signal(), Signal()
        with m.If(self.i_config.valid & self.i_config.ready):
            m.d.sync += initiator.eq(self.i_config.payload.initiator)
        with m.If(result.valid & result.ready):
            outcome = result.payload.outcome.as_value()
            m.d.sync += [agreed.eq(result.payload),
                         running.eq(one_of(outcome, (Outcome.ESTABLISHED.value,
                                                     Outcome.NO_MATCHING_RTR.value)))]

        # Receive: FPDUs to placements; Read, Atomic Requests and Terminates on.
        awaited = Signal(Rtr)           # the RTR a peer-to-peer Responder awaits
        ird = Signal(8)                 # the responder's credits, registered
        with m.If(result.valid & result.ready):
            p = result.payload
            m.d.sync += [awaited.eq(Mux(initiator | ~p.p2p, Rtr.NONE, p.rtr)),
                         ird.eq(_ird_credits(p.ird))]
        m.submodules.received = received = SkidBuffer(BeatLayout(n))   # a register slice
        wiring.connect(m, neg.o, received.i)
        wiring.connect(m, received.o, rx.i)
        m.d.comb += [rx.crc.eq(agreed.crc), rx.markers.eq(agreed.rx_markers),
                     rx.max_ulpdu.eq(rx.ulpdu_limit), rx.pd.eq(self.pd),
                     rx.rtr.eq(awaited),
                     rx.receive_pending.eq(self.receive_pending)]
        for name in ("i_write", "i_receive"):
            inward(name, getattr(rx, name))
        for name in ("o_place", "o_data", "o_complete", "o_read_done"):
            outward(getattr(rx, name), name)
        _forward_segments(m, rx, resp, term, n)
        outward(term.o, "o_peer_terminate")

        # The responder, its table checks and its atomics.
        wiring.connect(m, resp.o_lookup, rx.i_check)
        wiring.connect(m, rx.o_check, resp.i_lookup)
        m.d.comb += [resp.pd.eq(self.pd),
                     resp.ird.eq(ird)]
        wiring.connect(m, resp.o_atomic, ex.i_atomic)
        wiring.connect(m, ex.o_original, resp.i_original)
        outward(ex.o_read, "o_atomic_read")
        inward("i_atomic_read", ex.i_read)
        outward(ex.o_write, "o_atomic_write")

        # Send: work requests and responses to FPDUs; a peer-to-peer Initiator's RTR first.
        rtr = Signal(Rtr)               # the RTR still to send
        established = eq(result.payload.outcome.as_value(), Outcome.ESTABLISHED.value)
        with m.If(result.valid & result.ready & initiator & result.payload.p2p & established):
            m.d.sync += rtr.eq(result.payload.rtr)
        _rtr_first(m, iss.i_work, self.i_work, rtr, self.rtr_source, running)
        m.d.comb += iss.ord.eq(agreed.ord)
        outward(iss.o_refused, "o_refused")
        wiring.connect(m, iss.o_outstanding, rx.i_outstanding)
        _sends_sliced(m, iss, sch, n)
        wiring.connect(m, resp.o_response, sch.i_response)
        m.d.comb += [resp.done.eq(sch.response_sent), resp.done_inline.eq(sch.response_inline)]
        wiring.connect(m, tx.o_fetch, sch.i_fetch)
        wiring.connect(m, sch.o_payload, tx.i_payload)
        outward(sch.o_read, "o_read")
        inward("i_host", sch.i_host)
        outward(sch.o_sent, "o_sent")
        m.d.comb += [tx.max_ulpdu.eq(self.max_ulpdu), tx.crc.eq(agreed.crc),
                     tx.markers.eq(agreed.tx_markers)]
        ended = Signal()                # a Terminate went or came: no new message is sent
        message = sch.o_message
        m.d.comb += [tx.i_message.payload.eq(message.payload),
                     tx.i_message.valid.eq(message.valid & ~ended),
                     message.ready.eq(tx.i_message.ready & ~ended)]
        with m.If(term.o.valid):
            m.d.sync += ended.eq(1)
        latched = _first_violations(m, [rx.o_fault, resp.o_fault, neg.o_fault], rx.o_error,
                                    tx.i_terminate, self.o_fault, None, reached=rx.bad_fpdu)
        with m.If(latched):
            m.d.sync += ended.eq(1)

        # The stream sent: this end's MPA frame, then its FPDUs once running (a Responder's
        # after the Initiator's first FPDU, or a Terminate).
        may_send = running & (initiator | rx.started | ended)
        with m.If(running):
            m.d.comb += [self.o.payload.eq(tx.o.payload), self.o.valid.eq(tx.o.valid & may_send),
                         tx.o.ready.eq(self.o.ready & may_send)]
        with m.Else():
            m.d.comb += [self.o.payload.eq(neg.o_tx.payload), self.o.valid.eq(neg.o_tx.valid),
                         neg.o_tx.ready.eq(self.o.ready)]
        return m


def EngineOpen(conns, pd_bits):
    """A new stream taking connection ``conn``'s slot of a :class:`ConnectionsEngine`, with
    what its MPA negotiation settled (:class:`~.mpa.Negotiated`): this end's role, the
    protection domain, the IRD and ORD, the RTR of the peer-to-peer model (``NONE`` without
    it: sent first by an Initiator, awaited by a Responder; for an Initiator's Read RTR,
    ``rtr_source`` is the host address of its header, 28 zero octets), the MULPDU of its
    sends (a :class:`ConnectionsEngine` takes at most its ``max_send_ulpdu``), CRCs and the
    markers of the stream sent."""
    return with_conn(StructLayout({"pd": pd_bits, "ird": 14, "ord": 14, "initiator": 1,
                                   "rtr": Rtr, "rtr_source": 64, "max_ulpdu": 16, "crc": 1,
                                   "markers": 1}), conns)


class ConnectionsEngine(wiring.Component):
    """MPA, DDP and RDMAP for ``conns`` connections, between the TCP engine's streams and host
    memory: the :class:`IwarpEngine` of many connections, each connection's state a word of
    each block's context memory.

    It wires the :class:`~.ddp.ConnectionsReceiver` (gather, deframer, segment parser, RTR
    check, placer, STag table, outstanding Reads), the :class:`~.rdmap.RequestResponder` with
    its :class:`~.rdmap.AtomicExecutor`, the :class:`~.rdmap.TerminateParser`, the
    :class:`~.rdmap.RequestIssuer`, the :class:`~.rdmap.SendScheduler` and the
    :class:`~.ddp.StreamSender`, all with ``conns``. The MPA startup exchange is the host's:
    the startup frames it receives come out of the gather, and it writes its own frame into
    the TCP stream before the engine's FPDUs.

    Ports
    -----
    i_header, i, i_cmd, o_startup_header, o_startup :
        The :class:`~.mpa.MpaReceiver`'s: the TCP engine's chunks, the host's ``START`` and
        ``FPDUS`` (with the CRC and markers of the stream received), the startup frames.
    i_open : In(stream.Signature(EngineOpen(conns, pd_bits)))
        A new stream takes connection ``conn``'s slot, between its startup frames and its
        ``FPDUS`` command: every block's context made afresh in one cycle. A peer-to-peer
        Initiator's RTR (a zero-length Write, Send or Read) is its first message, sent from the next
        cycle; ``i_open`` waits while one is still to go. The stream that had the slot must be
        done with (no work request, response or FPDU of it in flight).
    i_write, o_ask_receive, i_receive, o_place, o_data, o_complete, o_read_done :
        The :class:`~.ddp.ConnectionsPlacer`'s: STag table entries, receives posted,
        placements, receive completions, the ends of Reads and atomics.
    i_work, o_deferred, o_refused : the :class:`~.rdmap.RequestIssuer`'s
        Work requests from the send queue engine, each naming its connection, after the
        connection's ``i_open``. A work request that must wait (ORD, a fence, or a Responder
        whose peer has not sent its first FPDU, RFC 5044 section 7.1.2) is given back on
        ``o_deferred`` to be offered again.
    o_read, i_host, o_sent : the :class:`~.rdmap.SendScheduler`'s
        Host memory reads for the payloads sent, each naming its connection, answered in
        order, each at most :attr:`max_fetch` octets (one segment's payload); each Send, Write
        and Immediate Data work request done with host memory.
    o_atomic_read, i_atomic_read, o_atomic_write : the :class:`~.rdmap.AtomicExecutor`'s
    o : Out(BeatStream(data_bytes, err=True, conns=conns))
        The FPDUs sent, each beat naming its connection (an FPDU's beats are contiguous).
    o_header : Out(stream.Signature(ChunkHeader(conns)))
        Each FPDU's connection and length, in ``o``'s order: with ``o``, the chunks of
        :class:`~.tcp.engine.TcpEngine`'s ``i_tx_header`` and ``i_tx``.
    o_fault : Out(stream.Signature(with_conn(Violation, conns)))
        Each connection's first violation, found by the deframer, the placer or the responder,
        which its Terminate reports (RFC 5040 section 7.1, queue 2 MSN 1); its later ones are
        dropped, and the sender drops that connection's later segments.
    o_peer_terminate : Out(stream.Signature(with_conn(TerminateHeader, conns)))
        A Terminate received from a connection's peer. The host ends the connection: work
        offered for it afterwards is still sent.

    A connection's fault holds the others back only for the cycles its Terminate takes to be
    requested; a connection whose work must wait (ORD, fence, a Responder not yet started)
    gives it back rather than hold the shared send queue. Throughput and latency: the
    blocks'; from the MPA data phase on, one connection behaves as :class:`IwarpEngine`.

    The received stream never waits for the sent one. The responses wait in a queue of
    ``conns * ird_max`` entries (block RAM) for the scheduler: each holds an IRD credit until
    it is handed over, so a peer within the IRD the host agreed (at most ``ird_max``; an
    ``i_open`` asking more gives ``ird_max``, and requests beyond it are refused as beyond the
    IRD) never fills it, and the responder never holds up the requests of the segments
    behind. Without it the received stream, TCP's acknowledgements among them, would wait
    for the responses to be sent, and they for those acknowledgements (RFC 6581 section 4:
    the IRD is what the responder has room for).
    """

    def __init__(self, data_bytes, *, conns=16, ring_bytes=4096, max_chunk=1460,
                 stag_entries=4096, pd_bits=16, ord_depth=32, ird_max=8):
        self.data_bytes = n = check_data_bytes(data_bytes)
        if not isinstance(ird_max, int) or not 1 <= ird_max <= 255:
            raise ValueError(f"ird_max must be an integer from 1 to 255, not {ird_max!r}")
        self.conns, self.pd_bits, self.ird_max, self.ord_depth = conns, pd_bits, ird_max, \
            ord_depth
        self._receiver = ConnectionsReceiver(
            n, conns=conns, ring_bytes=ring_bytes, max_chunk=max_chunk,
            stag_entries=stag_entries, pd_bits=pd_bits, ord_depth=ord_depth)
        self._issuer = RequestIssuer(max_ord=ord_depth, conns=conns)
        self._scheduler = SendScheduler(n, conns=conns)
        self._sender = StreamSender(n, conns=conns)
        self._responder = RequestResponder(pd_bits=pd_bits, conns=conns)
        self._executor = AtomicExecutor()
        self._terminates = TerminateParser(n, conns=conns)
        self.max_ulpdu = self._receiver.max_ulpdu
        #: The largest MULPDU of the sends: one TCP chunk. A larger ``i_open`` MULPDU is cut
        #: to it, so no payload read is longer than :attr:`max_fetch` octets, the most a
        #: segment carries after the shorter (tagged) DDP header.
        self.max_send_ulpdu = max_chunk
        self.max_fetch = max_chunk - DDP_TAGGED.length

        def ports(block, names):
            return {name: block.signature.members[name] for name in names}
        super().__init__({
            **ports(self._receiver, _RECEIVER_PORTS),
            "i_open": In(stream.Signature(EngineOpen(conns, pd_bits))),
            "i_work": self._issuer.signature.members["i_work"],
            **ports(self._issuer, _ISSUER_PORTS),
            **ports(self._scheduler, _SCHEDULER_PORTS),
            **{_atomic_name(name): member
               for name, member in ports(self._executor, _EXECUTOR_PORTS).items()},
            "o": self._sender.signature.members["o"],
            "o_header": self._sender.signature.members["o_header"],
            "o_fault": Out(stream.Signature(with_conn(Violation, conns))),
            "o_peer_terminate": self._terminates.signature.members["o"],
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.receiver = rx = self._receiver
        m.submodules.responder = resp = self._responder
        m.submodules.executor = ex = self._executor
        m.submodules.terminates = term = self._terminates
        m.submodules.issuer = iss = self._issuer
        m.submodules.scheduler = sch = self._scheduler
        m.submodules.sender = tx = self._sender
        pass_through(m, self, rx, _RECEIVER_PORTS)
        pass_through(m, self, iss, _ISSUER_PORTS)
        pass_through(m, self, sch, _SCHEDULER_PORTS)
        pass_through(m, self, ex, _EXECUTOR_PORTS, rename=_atomic_name)
        wiring.connect(m, tx.o, wiring.flipped(self.o))
        wiring.connect(m, tx.o_header, wiring.flipped(self.o_header))
        wiring.connect(m, term.o, wiring.flipped(self.o_peer_terminate))

        # Opening a slot: every block's context at once; an Initiator's RTR then sent first.
        opening, open_payload = self.i_open, self.i_open.payload
        rtr, rtr_conn, rtr_source = Signal(Rtr), Signal.like(open_payload.conn), Signal(64)
        targets = [rx.i_open, iss.i_open, resp.i_open, tx.i_open]
        for target in targets:
            m.d.comb += target.payload.conn.eq(open_payload.conn)
        m.d.comb += [rx.i_open.payload.pd.eq(open_payload.pd),
                     rx.i_open.payload.rtr.eq(Mux(open_payload.initiator, Rtr.NONE,
                                                  open_payload.rtr)),
                     iss.i_open.payload.ord.eq(open_payload.ord),
                     resp.i_open.payload.ird.eq(_ird_credits(open_payload.ird,
                                                             self.ird_max)),
                     resp.i_open.payload.pd.eq(open_payload.pd),
                     tx.i_open.payload.max_ulpdu.eq(
                         Mux(gt(open_payload.max_ulpdu, self.max_send_ulpdu),
                             self.max_send_ulpdu, open_payload.max_ulpdu)),
                     tx.i_open.payload.crc.eq(open_payload.crc),
                     tx.i_open.payload.markers.eq(open_payload.markers)]
        rtr_sent = eq(rtr.as_value(), Rtr.NONE.value)
        for target in targets:
            others = [t.ready for t in targets if t is not target]
            m.d.comb += target.valid.eq(opening.valid & rtr_sent & Cat(others).all())
        m.d.comb += opening.ready.eq(rtr_sent & Cat(t.ready for t in targets).all())
        opened = opening.valid & opening.ready
        with m.If(opened & open_payload.initiator):
            m.d.sync += [rtr.eq(open_payload.rtr), rtr_conn.eq(open_payload.conn),
                         rtr_source.eq(open_payload.rtr_source)]
        _rtr_first(m, iss.i_work, self.i_work, rtr, rtr_source, C(1, 1), rtr_conn)

        # Each connection may send from its open as the Initiator, or from its peer's first
        # FPDU (the RTR check's o_started) as the Responder; until then its work is deferred.
        may_send = Signal(self.conns)
        started = rx.o_started
        m.d.comb += [started.ready.eq(1),
                     iss.held.eq(~select(m, iss.i_work.payload.conn, list(may_send), 1,
                                         "may_send_now"))]
        with m.If(started.valid):
            m.d.sync += may_send.bit_select(started.payload.conn, 1).eq(1)
        with m.If(opened):
            m.d.sync += may_send.bit_select(open_payload.conn, 1).eq(open_payload.initiator)

        # Receive: Read and Atomic Requests to the responder, Terminates to the parser.
        _forward_segments(m, rx, resp, term, self.data_bytes)
        wiring.connect(m, resp.o_lookup, rx.i_check)
        wiring.connect(m, rx.o_check, resp.i_lookup)
        wiring.connect(m, resp.o_atomic, ex.i_atomic)
        wiring.connect(m, ex.o_original, resp.i_original)

        # Send: work requests and responses to FPDUs.
        _sends_sliced(m, iss, sch, self.data_bytes)
        wiring.connect(m, iss.o_outstanding, rx.i_push)
        m.d.comb += [rx.count_conn.eq(iss.outstanding_conn),
                     iss.outstanding.eq(widened(m, rx.count, 14, "outstanding_count"))]
        response, queued = resp.o_response, sch.i_response
        m.submodules.responses = responses = SyncFIFOBuffered(
            width=response.payload.shape().size, depth=self.conns * self.ird_max)
        m.d.comb += [responses.w_data.eq(response.payload), responses.w_en.eq(response.valid),
                     response.ready.eq(responses.w_rdy),
                     queued.payload.eq(responses.r_data), queued.valid.eq(responses.r_rdy),
                     responses.r_en.eq(queued.ready),
                     resp.done.eq(sch.response_sent), resp.done_inline.eq(sch.response_inline),
                     resp.done_conn.eq(sch.response_conn)]
        wiring.connect(m, sch.o_message, tx.i_message)
        wiring.connect(m, tx.o_fetch, sch.i_fetch)
        wiring.connect(m, sch.o_payload, tx.i_payload)

        # Each connection's first violation: its Terminate; a reopened slot may have one again.
        _first_violations(m, [rx.o_fault, resp.o_fault], rx.o_error, tx.i_terminate,
                          self.o_fault, self.conns, reached=rx.bad_fpdu,
                          reached_conn=rx.bad_fpdu_conn, cleared=opened,
                          cleared_conn=open_payload.conn)
        return m


#: The ports a ConnectionsEngine passes through from each of its blocks (the atomic
#: executor's renamed by :func:`_atomic_name`, as on :class:`IwarpEngine`; the issuer's
#: ``i_work`` goes through the RTR injection).
_RECEIVER_PORTS = ("i_header", "i", "i_cmd", "o_startup_header", "o_startup", "i_write",
                   "o_ask_receive", "i_receive", "o_place", "o_data", "o_complete",
                   "o_read_done")
_ISSUER_PORTS = ("o_deferred", "o_refused")
_SCHEDULER_PORTS = ("o_read", "i_host", "o_sent")
_EXECUTOR_PORTS = ("o_read", "i_read", "o_write")


def _atomic_name(name):
    """The engine's name of the atomic executor's port ``name``: ``o_read`` is
    ``o_atomic_read``."""
    return f"{name[:2]}atomic_{name[2:]}"


def _ird_credits(ird, most=0xFF):
    """The Read and Atomic Requests the responder takes outstanding: the IRD agreed, at most
    ``most`` (255 at most: its counts are 8 bits)."""
    return Mux(gt(ird, most), most, ird[:8])


def _rtr_first(m, work, host_work, rtr, source, allowed, conn=None):
    """The work requests into the issuer (``work``): a peer-to-peer Initiator's RTR message
    while ``rtr`` says one is still to send (RFC 6581 section 7: a zero-length Write, Send or
    Read, its first FPDU; for connection ``conn``; a Read's header, 28 zero octets, read at
    host address ``source``), else the host's (``host_work``) while ``allowed``."""
    pending = ~eq(rtr.as_value(), Rtr.NONE.value)
    with m.If(pending):
        kind = rtr.as_value()
        read = eq(kind, Rtr.READ.value)
        m.d.comb += [work.valid.eq(1), work.payload.rtr.eq(1),
                     work.payload.message.opcode.eq(
                         Mux(read, _READ_REQUEST, Mux(eq(kind, Rtr.SEND.value), _SEND, 0))),
                     work.payload.message.length.eq(Mux(read, READ_REQUEST.length, 0)),
                     work.payload.source.eq(source)]
        if conn is not None:
            m.d.comb += work.payload.conn.eq(conn)
        with m.If(work.ready):
            m.d.sync += rtr.eq(Rtr.NONE)
    with m.Else():
        m.d.comb += [work.payload.eq(host_work.payload),
                     work.valid.eq(host_work.valid & allowed),
                     host_work.ready.eq(work.ready & allowed)]


def _sends_sliced(m, issuer, scheduler, data_bytes):
    """The issuer's messages into the scheduler through a register slice, so that the
    scheduler's ready is a register. At 8 bytes a beat or less every FPDU (16 octets at least:
    the length field and a tagged header, with no payload and no CRC) spans two beats or more,
    so a message every other cycle is all the sender can put out: a one-entry slice
    (:class:`~iwarp_nic.stream.HalfRateSlice`) then holds the message; wider datapaths keep a
    skid buffer's full rate."""
    sliced(m, "send_skid", issuer.o_send, scheduler.i_send, half_rate=data_bytes <= 8)


def _forward_segments(m, rx, resp, term, data_bytes):
    """The placer's other segments: Read and Atomic Requests to the responder, a Terminate's
    length and header octets to the parser (each naming its connection where they do)."""
    header = rx.o_header
    opcode = header.payload.opcode
    to_responder = one_of(opcode, (_READ_REQUEST, _ATOMIC_REQUEST))
    to_parser = eq(opcode, _TERMINATE)
    length = term.i_length.payload
    if hasattr(header.payload, "conn"):
        m.d.comb += length.conn.eq(header.payload.conn)
        length = length.length
    m.d.comb += [resp.i_request.payload.eq(header.payload),
                 resp.i_request.valid.eq(header.valid & to_responder),
                 length.eq(Mux(header.payload.has_payload, header.payload.length, 0)),
                 term.i_length.valid.eq(header.valid & to_parser),
                 header.ready.eq(Mux(to_responder, resp.i_request.ready,
                                     Mux(to_parser, term.i_length.ready, 1)))]
    m.submodules.terminate_octets = octets = SkidBuffer(BeatLayout(data_bytes))
    wiring.connect(m, rx.o_payload, octets.i)   # a register slice (the placer's routes)
    wiring.connect(m, octets.o, term.i)


def _first_violations(m, faults, deframer, terminate, report, conns, *, reached,
                      reached_conn=None, cleared=None, cleared_conn=None):
    """Each stream's first violation of ``faults`` (streams of ``Violation``, first the most
    urgent) and ``deframer`` (its error events): its Terminate request to ``terminate`` (RFC
    5040 section 7.1: queue 2, MSN 1) and the violation on ``report``; a stream's later ones
    are dropped, until ``cleared`` names it (``cleared_conn``). ``conns`` None: one stream.
    One violation at a time: the others wait while one's Terminate and report are taken.

    The deframer finds a bad FPDU before the placer has decided the segments ahead of it, and
    one of those may be the stream's first violation. So a deframer event is held (and the
    deframer's next waits) until ``reached`` pulses for its stream (``reached_conn``): the
    placer has come to the bad FPDU, and an earlier segment's fault is offered by then.
    Returns the signal that is 1 in the cycle a stream's first violation is taken."""
    holding, kept = Signal(), Signal(deframer.payload.shape())
    arrived = Signal(1 if conns is None else conns)     # the placer reached the bad FPDU
    with m.If(reached):
        m.d.sync += arrived.bit_select(0 if conns is None else reached_conn, 1).eq(1)
    m.d.comb += deframer.ready.eq(~holding)
    with m.If(deframer.valid & ~holding):
        m.d.sync += [holding.eq(1), kept.eq(deframer.payload)]
    kept_conn = 0 if conns is None else kept.conn
    reached_kept = arrived if conns is None else select(m, kept_conn, list(arrived), 1,
                                                        "reached_kept")
    held = stream.Signature(deframer.payload.shape()).flip().create()
    m.d.comb += [held.payload.eq(kept), held.valid.eq(holding & reached_kept)]
    with m.If(held.valid & held.ready):
        m.d.sync += [holding.eq(0), arrived.bit_select(kept_conn, 1).eq(0)]
    deframer = held
    first = Signal(with_conn(Violation, conns))
    to_send, to_report = Signal(), Signal()
    busy = to_send | to_report
    chosen = Signal(with_conn(Violation, conns))
    error = deframer.payload if conns is None else deframer.payload.kind
    deframer_code = select(m, error.as_value(), {
        kind.value: code.value for kind, code in _DEFRAMER_CODES.items()}, 16, "deframer_code")
    sources = [*faults, deframer]
    ahead = C(0, 1)                 # a source before this one offers a violation
    for source in sources:
        m.d.comb += source.ready.eq(~busy & ~ahead)
        with m.If(source.valid & ~ahead):
            if source is deframer:
                m.d.comb += chosen.code.as_value().eq(deframer_code)
                if conns is not None:
                    m.d.comb += chosen.conn.eq(deframer.payload.conn)
            else:
                m.d.comb += chosen.eq(source.payload)
        ahead = ahead | source.valid
    terminated = Signal(1 if conns is None else conns)   # the stream's Terminate was requested
    conn = C(0, 1) if conns is None else chosen.conn
    latched = Signal()
    done_before = select(m, conn, list(terminated), 1, "terminated_before")
    m.d.comb += latched.eq(ahead & ~busy & ~done_before)
    if cleared is not None:
        with m.If(cleared):
            m.d.sync += terminated.bit_select(cleared_conn, 1).eq(0)
    with m.If(latched):
        m.d.sync += [first.eq(chosen), to_send.eq(1), to_report.eq(1),
                     terminated.bit_select(conn, 1).eq(1)]
    code = first.code.as_value()
    request = terminate.payload
    m.d.comb += [terminate.valid.eq(to_send), request.layer.eq(code[12:16]),
                 request.etype.eq(code[8:12]), request.ecode.eq(code[:8]),
                 request.msn.eq(C(1, 32)), request.offending.eq(first.offending),
                 request.offending_length.eq(first.offending_length),
                 report.valid.eq(to_report), report.payload.eq(first)]
    if conns is not None:
        m.d.comb += request.conn.eq(first.conn)
    with m.If(terminate.valid & terminate.ready):
        m.d.sync += to_send.eq(0)
    with m.If(report.valid & report.ready):
        m.d.sync += to_report.eq(0)
    return latched
