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
from amaranth.lib.wiring import In, Out

from .ddp import StreamReceiver, StreamSender
from .ddp.placement import (
    PlaceRequest,
    PostedReceive,
    ReadDone,
    ReceiveCompletion,
)
from .ddp.stag import StagWrite
from .errors import TerminateCode, Violation
from .exact import eq, one_of, select
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
    TerminateHeader,
    TerminateParser,
    WorkRequest,
)
from .stream import BeatLayout, BeatStream, SkidBuffer, check_data_bytes

__all__ = ["IwarpEngine"]

_READ_REQUEST, _TERMINATE, _ATOMIC_REQUEST = 1, 7, 10
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
    peer-to-peer Initiator sends its RTR as its first message, a zero-length Write or Send; a
    Read RTR needs the 28 octets of its header from host memory, which the engine cannot yet
    ask for: the Initiator's config must not offer it (a Responder accepts it). Throughput and
    latency are the blocks' (one beat per cycle each way).
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
            "pd": In(pd_bits), "max_ulpdu": In(16),
            "i_write": In(stream.Signature(StagWrite(pd_bits, index_bits))),
            "i_receive": In(stream.Signature(PostedReceive)), "receive_pending": In(1),
            "i_work": In(stream.Signature(WorkRequest)),
            "o_place": Out(stream.Signature(PlaceRequest)),
            "o_data": Out(BeatStream(n)),
            "o_read": Out(stream.Signature(HostRead)),
            "i_host": In(BeatStream(n)),
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
        with m.If(result.valid & result.ready):
            p = result.payload
            m.d.sync += awaited.eq(Mux(initiator | ~p.p2p, Rtr.NONE, p.rtr))
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
        self._forwarded(m, rx, resp, term)
        outward(term.o, "o_peer_terminate")

        # The responder, its table checks and its atomics.
        wiring.connect(m, resp.o_lookup, rx.i_check)
        wiring.connect(m, rx.o_check, resp.i_lookup)
        m.d.comb += [resp.pd.eq(self.pd),
                     resp.ird.eq(Mux(agreed.ird[8:].any(), 0xFF, agreed.ird[:8]))]
        wiring.connect(m, resp.o_atomic, ex.i_atomic)
        wiring.connect(m, ex.o_original, resp.i_original)
        outward(ex.o_read, "o_atomic_read")
        inward("i_atomic_read", ex.i_read)
        outward(ex.o_write, "o_atomic_write")

        # Send: work requests and responses to FPDUs; a peer-to-peer Initiator's RTR first.
        self._work(m, iss.i_work, result, initiator, running)
        m.d.comb += iss.ord.eq(agreed.ord)
        outward(iss.o_refused, "o_refused")
        wiring.connect(m, iss.o_outstanding, rx.i_outstanding)
        wiring.connect(m, iss.o_send, sch.i_send)
        wiring.connect(m, resp.o_response, sch.i_response)
        m.d.comb += [resp.done.eq(sch.response_sent), resp.done_inline.eq(sch.response_inline)]
        wiring.connect(m, tx.o_fetch, sch.i_fetch)
        wiring.connect(m, sch.o_payload, tx.i_payload)
        outward(sch.o_read, "o_read")
        inward("i_host", sch.i_host)
        m.d.comb += [tx.max_ulpdu.eq(self.max_ulpdu), tx.crc.eq(agreed.crc),
                     tx.markers.eq(agreed.tx_markers)]
        ended = Signal()                # a Terminate went or came: no new message is sent
        message = sch.o_message
        m.d.comb += [tx.i_message.payload.eq(message.payload),
                     tx.i_message.valid.eq(message.valid & ~ended),
                     message.ready.eq(tx.i_message.ready & ~ended)]
        with m.If(term.o.valid):
            m.d.sync += ended.eq(1)
        self._terminate(m, [rx.o_fault, resp.o_fault, neg.o_fault], rx.o_error, tx, ended)

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

    def _work(self, m, work, result, initiator, running):
        """The host's work requests, once the connection runs, after the RTR message of a
        peer-to-peer Initiator (RFC 6581 section 7: a zero-length Write or Send, the first
        FPDU it sends)."""
        rtr = Signal(Rtr)               # the RTR still to send
        established = eq(result.payload.outcome.as_value(), Outcome.ESTABLISHED.value)
        with m.If(result.valid & result.ready & initiator & result.payload.p2p & established):
            m.d.sync += rtr.eq(result.payload.rtr)
        pending = ~eq(rtr.as_value(), Rtr.NONE.value)
        with m.If(pending):
            msg = work.payload.message
            m.d.comb += [work.valid.eq(1),
                         msg.opcode.eq(Mux(eq(rtr.as_value(), Rtr.SEND.value), 3, 0))]
            with m.If(work.ready):
                m.d.sync += rtr.eq(Rtr.NONE)
        with m.Else():
            m.d.comb += [work.payload.eq(self.i_work.payload),
                         work.valid.eq(self.i_work.valid & running),
                         self.i_work.ready.eq(work.ready & running)]

    def _forwarded(self, m, rx, resp, term):
        """The placer's other segments: Read and Atomic Requests to the responder, a
        Terminate's length and header octets to the parser."""
        header = rx.o_header
        opcode = header.payload.opcode
        to_responder = one_of(opcode, (_READ_REQUEST, _ATOMIC_REQUEST))
        to_parser = eq(opcode, _TERMINATE)
        m.d.comb += [resp.i_request.payload.eq(header.payload),
                     resp.i_request.valid.eq(header.valid & to_responder),
                     term.i_length.payload.eq(Mux(header.payload.has_payload,
                                                  header.payload.length, 0)),
                     term.i_length.valid.eq(header.valid & to_parser),
                     header.ready.eq(Mux(to_responder, resp.i_request.ready,
                                         Mux(to_parser, term.i_length.ready, 1)))]
        m.submodules.terminate_octets = octets = SkidBuffer(BeatLayout(self.data_bytes))
        wiring.connect(m, rx.o_payload, octets.i)   # a register slice (the placer's routes)
        wiring.connect(m, octets.o, term.i)

    def _terminate(self, m, faults, deframer, tx, ended):
        """The first violation found, as the stream's Terminate (queue 2's MSN 1, RFC 5040
        7.1) and on ``o_fault``; later ones are dropped."""
        first = Signal(Violation)
        reporting = Signal()
        sent = Signal()                 # the Terminate was requested
        for fault in faults:
            m.d.comb += fault.ready.eq(1)
        m.d.comb += deframer.ready.eq(1)
        chosen = Signal(Violation)
        any_fault = Signal()
        m.d.comb += any_fault.eq(Cat(f.valid for f in faults).any())
        found = any_fault | deframer.valid
        for fault in reversed(faults):
            with m.If(fault.valid):
                m.d.comb += chosen.eq(fault.payload)
        deframer_code = select(m, deframer.payload.as_value(), {
            kind.value: code.value for kind, code in _DEFRAMER_CODES.items()}, 16,
            "deframer_code")
        with m.If(deframer.valid & ~any_fault):
            m.d.comb += chosen.code.as_value().eq(deframer_code)
        with m.If(found & ~reporting & ~sent):
            m.d.sync += [first.eq(chosen), reporting.eq(1), sent.eq(1), ended.eq(1)]
        request = tx.i_terminate
        code = first.code.as_value()
        m.d.comb += [request.valid.eq(reporting), request.payload.layer.eq(code[12:16]),
                     request.payload.etype.eq(code[8:12]), request.payload.ecode.eq(code[:8]),
                     request.payload.msn.eq(C(1, 32)),
                     request.payload.offending.eq(first.offending),
                     request.payload.offending_length.eq(first.offending_length),
                     self.o_fault.payload.eq(first)]
        reported = Signal()             # o_fault taken
        m.d.comb += self.o_fault.valid.eq(sent & ~reported)
        with m.If(self.o_fault.valid & self.o_fault.ready):
            m.d.sync += reported.eq(1)
        with m.If(request.valid & request.ready):
            m.d.sync += reporting.eq(0)
