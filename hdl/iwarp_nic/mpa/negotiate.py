"""MPA connection setup: RFC 5044 section 7.1 (the Request/Reply exchange, revision, CRC and
marker choice, Reject, the Responder's silence until the Initiator's first FPDU) with RFC 6581
sections 6 to 10 (revision 2, the IRD/ORD exchange, the peer-to-peer model and its RTR choice).

:class:`MpaNegotiator` runs one end of the exchange, as the model's ``Connection`` does from
``start()`` to full operation: it writes this end's frame, reads the peer's, decides, and says
what was settled. The stream's later octets (the FPDUs) pass through it once the connection is
in full operation.
"""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import enum, stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.wiring import In, Out

from ..errors import TerminateCode, Violation
from ..exact import Machine, add, eq, is_zero, same, select
from ..stream import BeatStream, check_data_bytes
from .startup import StartupError, StartupFrame, StartupReader, StartupWriter

__all__ = ["Rtr", "Outcome", "NegotiationConfig", "Decision", "Negotiated", "MpaNegotiator",
           "NO_RTR_REASON"]

#: The Reject's private data when the Request offers no RTR type this end accepts (the model's).
NO_RTR_REASON = b"no matching RTR type"


class Rtr(enum.Enum, shape=2):
    """The RFC 6581 ready-to-receive message of the peer-to-peer model: a zero-length Send,
    RDMA Write or RDMA Read, the Initiator's first FPDU. ``NONE``: no RTR (not peer-to-peer)."""

    NONE = 0
    SEND = 1
    WRITE = 2
    READ = 3


class Outcome(enum.Enum, shape=3):
    """How the exchange ended."""

    ESTABLISHED = 0         # full operation (peer-to-peer: with the RTR of ``Negotiated.rtr``)
    REJECTED = 1            # this end refused the Request: the host, or no RTR type in common
    PEER_REJECTED = 2       # the Reply has R set
    BAD_FRAME = 3           # the peer's frame is malformed (``Negotiated.error`` says how)
    BAD_REVISION = 4        # a Reply of a higher revision than the Request's
    NO_MATCHING_RTR = 5     # the Reply chose no RTR type offered, or several: a Terminate
    TIMEOUT = 6             # the peer's frame did not come in time


#: One end's wishes, as the model's ``Connection`` takes them. ``initiator`` (else the
#: Responder); ``revision`` 1 or 2 (the Responder answers with the lower of its own and the
#: Request's); ``crc``: ask for CRCs (used when either side asks); ``markers``: ask the peer to
#: insert markers; ``p2p`` (revision 2 only) with the RTR types offered (Initiator) or accepted
#: (Responder, which takes the first of Write, Read, Send the Request offers); ``ird``, ``ord``:
#: this end's inbound and outbound Read credits; ``private_length``: octets of private data on
#: ``i_private`` for the Request or the Reply (at most 512, or 508 with revision 2);
#: ``hold``: a Responder waits for ``i_decision`` instead of accepting at once.
NegotiationConfig = StructLayout({
    "initiator": 1, "revision": 2, "crc": 1, "markers": 1, "p2p": 1, "rtr_send": 1,
    "rtr_write": 1, "rtr_read": 1, "ird": 14, "ord": 14, "private_length": 10, "hold": 1,
})

#: The host's answer to a Request held (``hold``): accept it, or reject it; ``private_length``
#: octets on ``i_private`` go in the Reply (the reason, for a Reject).
Decision = StructLayout({"accept": 1, "private_length": 10})

#: What the exchange settled. With ``ESTABLISHED`` (and ``NO_MATCHING_RTR``, whose Terminate is
#: framed so): ``crc``, the markers of each direction, the ``revision`` in use, ``p2p`` and the
#: ``rtr`` to send (Initiator) or to await (Responder), the ``ird`` this end enforces and the
#: ``ord`` it keeps to (its own, lowered to the peer's IRD when the peer told it).
Negotiated = StructLayout({
    "outcome": Outcome, "error": StartupError, "revision": 2, "crc": 1, "tx_markers": 1,
    "rx_markers": 1, "p2p": 1, "rtr": Rtr, "ird": 14, "ord": 14,
})

_RTR_FLAGS = ("rtr_send", "rtr_write", "rtr_read")
_RTR_OF = {"rtr_send": Rtr.SEND, "rtr_write": Rtr.WRITE, "rtr_read": Rtr.READ}
_PREFERENCE = ("rtr_write", "rtr_read", "rtr_send")     # the Responder's choice, first first


class MpaNegotiator(wiring.Component):
    """One end of the MPA Request/Reply exchange, then the stream's FPDUs passed on.

    Ports
    -----
    i_config : In(stream.Signature(NegotiationConfig))
        One transfer starts the exchange (nothing is read from ``i`` before it). One exchange
        per reset: a new connection resets the negotiator.
    tick, timeout : In(1), In(16)
        The timer: ``tick`` pulses at the host's time unit; the peer's frame (the Reply, or the
        Request) must complete within ``timeout`` ticks of the wait's start (0: no limit), or
        the outcome is ``TIMEOUT`` (RFC 5044 7.1: either end closes a connection whose startup
        stalls). The Initiator's wait starts once its Request has gone out.
    i : In(BeatStream(data_bytes))
        The stream received, from its first octet, in chunks of any size.
    o : Out(BeatStream(data_bytes))
        The octets after the peer's frame (its FPDUs), once ``o_result`` has been taken with
        ``ESTABLISHED``; until then they wait (a Responder's Initiator may send its first FPDU
        before the Reply has gone). After any other outcome they are dropped.
    o_tx : Out(BeatStream(data_bytes))
        This end's frame, one packet: the Request, or the Reply (accepting or rejecting). The
        caller sends it before any FPDU: ``o_result`` is offered only after its last octet.
    i_private : In(BeatStream(data_bytes))
        The private data for this end's frame, one packet of ``private_length`` octets (of the
        config; of the decision for a Request held). A Responder that writes no Reply (a bad
        frame, a timeout) or rejects a Request on its own (no RTR type in common, with its own
        reason) drops the config's private data: the host's packet is always taken.
    o_private : Out(BeatStream(data_bytes))
        The peer's private data (after the RFC 6581 octets), one packet, when there is some.
    o_peer : Out(stream.Signature(StartupFrame))
        The peer's frame once read, or its error: what the host looks at before deciding on a
        Request held. The next exchange waits until it is taken.
    i_decision : In(stream.Signature(Decision))
        With ``hold``: the host's answer to the Request on ``o_peer``.
    o_result : Out(stream.Signature(Negotiated))
        One transfer: the outcome and what was settled.
    o_fault : Out(stream.Signature(Violation))
        With ``NO_MATCHING_RTR``: the Terminate to send (MPA "No matching RTR", no copies).

    The decisions are the model's (``Connection._on_request``, ``_send_reply``, ``_on_reply``):
    the Responder's revision is the lower of the two, the CRC is used when either side asks,
    each side's M bit asks for markers in what the other sends, the ORD is lowered to the
    peer's IRD, the peer-to-peer model needs the RFC 6581 octets and the A flag in both frames;
    a Reject mirrors the Request's revision, C flag and connection model. The frames are read
    and written an octet per cycle (:class:`~.startup.StartupReader`,
    :class:`~.startup.StartupWriter`); the decision takes a cycle. Bad input (a malformed
    frame, a frame of the wrong kind) ends the exchange with ``BAD_FRAME`` and never hangs.
    """

    def __init__(self, data_bytes):
        self.data_bytes = check_data_bytes(data_bytes)
        super().__init__({
            "i_config": In(stream.Signature(NegotiationConfig)),
            "tick": In(1), "timeout": In(16),
            "i": In(BeatStream(data_bytes)),
            "o": Out(BeatStream(data_bytes)),
            "o_tx": Out(BeatStream(data_bytes)),
            "i_private": In(BeatStream(data_bytes)),
            "o_private": Out(BeatStream(data_bytes)),
            "o_peer": Out(stream.Signature(StartupFrame)),
            "i_decision": In(stream.Signature(Decision)),
            "o_result": Out(stream.Signature(Negotiated)),
            "o_fault": Out(stream.Signature(Violation)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.reader = reader = StartupReader(self.data_bytes)
        m.submodules.writer = writer = StartupWriter(self.data_bytes)
        wiring.connect(m, reader.o_private, wiring.flipped(self.o_private))
        wiring.connect(m, writer.o, wiring.flipped(self.o_tx))

        cfg, peer = Signal(NegotiationConfig), Signal(StartupFrame)
        configured = Signal()
        m.d.comb += [reader.reply.eq(cfg.initiator), writer.reply.eq(~cfg.initiator),
                     reader.i.payload.eq(self.i.payload),
                     reader.i.valid.eq(self.i.valid & configured),
                     self.i.ready.eq(reader.i.ready & configured)]

        # What both ends settle the same way (the Request is the Initiator's frame or the
        # peer's, the Reply the other).
        lower_ord = peer.enhanced & (peer.ird < cfg.ord)
        peer_revision = peer.revision[:2]       # 1 or 2 in a good frame
        ord_ = Mux(lower_ord, peer.ird, cfg.ord)
        p2p = cfg.p2p & eq(cfg.revision, 2) & peer.enhanced & peer.p2p
        both = {flag: p2p & cfg[flag] & peer[flag] for flag in _RTR_FLAGS}
        revision = Mux(cfg.initiator | (peer_revision < cfg.revision), peer_revision,
                       cfg.revision)
        chosen = Signal(Rtr)            # the Responder's choice, the Initiator's single one
        for flag in reversed(_PREFERENCE):
            with m.If(both[flag]):
                m.d.comb += chosen.eq(_RTR_OF[flag])
        single = select(m, Cat(both[f] for f in _RTR_FLAGS), {1: 1, 2: 1, 4: 1, 0: 0}, 1,
                        "single")

        # The frame to write: the Request, a Reply accepting, or a Reject.
        accepting = Signal()
        private_length = Signal(10)
        frame = writer.i_frame.payload
        with m.If(cfg.initiator):
            m.d.comb += [frame.markers.eq(cfg.markers), frame.crc.eq(cfg.crc),
                         frame.revision.eq(cfg.revision), frame.enhanced.eq(eq(cfg.revision, 2)),
                         frame.ord.eq(cfg.ord), frame.p2p.eq(cfg.p2p)]
            m.d.comb += [frame[flag].eq(cfg.p2p & cfg[flag]) for flag in _RTR_FLAGS]
        with m.Elif(accepting):
            m.d.comb += [frame.markers.eq(cfg.markers), frame.crc.eq(cfg.crc | peer.crc),
                         frame.revision.eq(revision),
                         frame.enhanced.eq(eq(revision, 2) & peer.enhanced),
                         frame.ord.eq(ord_), frame.p2p.eq(p2p)]
            m.d.comb += [frame[flag].eq(eq(chosen.as_value(), _RTR_OF[flag].value))
                         for flag in _RTR_FLAGS]
        with m.Else():
            m.d.comb += [frame.crc.eq(peer.crc), frame.reject.eq(1),
                         frame.revision.eq(peer.revision), frame.enhanced.eq(peer.enhanced),
                         frame.ord.eq(ord_), frame.p2p.eq(peer.p2p)]
            m.d.comb += [frame[flag].eq(peer[flag]) for flag in _RTR_FLAGS]
        m.d.comb += [frame.ird.eq(cfg.ird), frame.private_length.eq(private_length)]

        reason = Signal()               # the private data is NO_RTR_REASON, not the host's
        drain = Signal()                # the host's private data, unused, is being dropped
        writing = Signal()              # a frame is being written: its private data flows
        self._private(m, writer.i_private, reason=reason, drain=drain, writing=writing)

        # The outcome and its report.
        outcome, error = Signal(Outcome), Signal(StartupError)
        result = self.o_result.payload
        m.d.comb += [result.outcome.eq(outcome), result.error.eq(error),
                     result.revision.eq(revision), result.crc.eq(cfg.crc | peer.crc),
                     result.tx_markers.eq(peer.markers), result.rx_markers.eq(cfg.markers),
                     result.p2p.eq(p2p), result.rtr.eq(chosen), result.ird.eq(cfg.ird),
                     result.ord.eq(ord_)]
        fault = self.o_fault
        m.d.comb += fault.payload.code.eq(TerminateCode.MPA_NO_MATCHING_RTR)
        with m.If(fault.ready):
            m.d.sync += fault.valid.eq(0)

        # The timer, while the peer's frame is awaited.
        waiting = Signal()
        ticks = Signal(16)
        expired = ~is_zero(self.timeout) & same(ticks, self.timeout)
        with m.If(waiting & self.tick & ~expired):
            m.d.sync += ticks.eq(add(ticks, 1))

        peer_out = self.o_peer
        with m.If(peer_out.ready):
            m.d.sync += peer_out.valid.eq(0)

        # The config's private data, when a Responder will not write it, is dropped.
        unused = ~cfg.initiator & ~cfg.hold & ~is_zero(cfg.private_length)

        def end(kind):
            m.d.sync += [outcome.eq(kind), drain.eq(unused)]
            stage.goto("RESULT")

        def answer(accept, length, *, own_reason=False):
            m.d.sync += [accepting.eq(accept), private_length.eq(length), reason.eq(own_reason),
                         outcome.eq(Mux(accept, Outcome.ESTABLISHED, Outcome.REJECTED))]
            stage.goto("REPLY")

        stage = Machine(m, ["START", "REQUEST", "SENDING", "WAIT", "DECIDE", "HOST", "REPLY",
                            "RESULT", "DONE"], "negotiate")
        with stage.state("START"):
            m.d.comb += self.i_config.ready.eq(1)
            with m.If(self.i_config.valid):
                config = self.i_config.payload
                m.d.sync += [cfg.eq(config), configured.eq(1),
                             private_length.eq(config.private_length)]
                with m.If(config.initiator):
                    stage.goto("REQUEST")
                with m.Else():
                    stage.goto("WAIT")
        with stage.state("REQUEST"):
            m.d.comb += [writing.eq(1), writer.i_frame.valid.eq(1)]
            with m.If(writer.i_frame.ready):
                stage.goto("SENDING")
        with stage.state("SENDING"):
            m.d.comb += writing.eq(1)
            # The frame's octets leave; then the Initiator waits, the Responder reports.
            with m.If(self.o_tx.valid & self.o_tx.ready & self.o_tx.payload.last):
                with m.If(cfg.initiator):
                    stage.goto("WAIT")
                with m.Else():
                    stage.goto("RESULT")
        with stage.state("WAIT"):
            m.d.comb += [waiting.eq(1), reader.o_frame.ready.eq(~peer_out.valid)]
            with m.If(reader.o_frame.valid & ~peer_out.valid):
                m.d.sync += [peer.eq(reader.o_frame.payload), peer_out.valid.eq(1),
                             peer_out.payload.eq(reader.o_frame.payload)]
                stage.goto("DECIDE")
            with m.Elif(expired):
                end(Outcome.TIMEOUT)
        with stage.state("DECIDE"):
            with m.If(peer.error != StartupError.NONE):
                m.d.sync += error.eq(peer.error)
                end(Outcome.BAD_FRAME)
            with m.Elif(cfg.initiator):
                with m.If(peer.reject):
                    end(Outcome.PEER_REJECTED)
                with m.Elif(peer_revision > cfg.revision):
                    end(Outcome.BAD_REVISION)
                with m.Elif(cfg.p2p & ~single):
                    m.d.sync += fault.valid.eq(1)
                    end(Outcome.NO_MATCHING_RTR)
                with m.Else():
                    end(Outcome.ESTABLISHED)
            with m.Elif(p2p & eq(chosen.as_value(), Rtr.NONE.value)):
                m.d.sync += drain.eq(unused)
                answer(0, len(NO_RTR_REASON), own_reason=True)
            with m.Elif(cfg.hold):
                stage.goto("HOST")
            with m.Else():
                answer(1, cfg.private_length)
        with stage.state("HOST"):
            m.d.comb += self.i_decision.ready.eq(1)
            with m.If(self.i_decision.valid):
                decision = self.i_decision.payload
                answer(decision.accept, decision.private_length)
        with stage.state("REPLY"):
            m.d.comb += [writing.eq(1), writer.i_frame.valid.eq(1)]
            with m.If(writer.i_frame.ready):
                stage.goto("SENDING")
        with stage.state("RESULT"):
            m.d.comb += self.o_result.valid.eq(~drain)
            with m.If(self.o_result.ready & ~drain):
                stage.goto("DONE")
        with stage.state("DONE"):
            self._pass(m, reader.o, open_=eq(outcome.as_value(), Outcome.ESTABLISHED.value))
        return m

    def _private(self, m, private, *, reason, drain, writing):
        """The writer's private data while ``writing``: the host's ``i_private``, or
        :data:`NO_RTR_REASON` a beat at a time; the host's packet dropped while ``drain``."""
        n = self.data_bytes
        beats = -(-len(NO_RTR_REASON) // n)
        index = Signal(range(beats))
        chunks = [NO_RTR_REASON[k * n:(k + 1) * n] for k in range(beats)]
        host = self.i_private
        with m.If(reason):
            if beats > 1:
                data = select(m, index, [int.from_bytes(c, "little") for c in chunks], 8 * n,
                              "reason_data")
                last = eq(index, beats - 1)
            else:
                data, last = Const(int.from_bytes(chunks[0], "little"), 8 * n), Const(1)
            m.d.comb += [private.valid.eq(writing), private.payload.data.eq(data),
                         private.payload.keep.eq(Mux(last, (1 << len(chunks[-1])) - 1,
                                                     (1 << n) - 1)),
                         private.payload.last.eq(last), host.ready.eq(drain)]
            with m.If(private.ready & writing):
                if beats > 1:
                    m.d.sync += index.eq(Mux(last, 0, add(index, 1)))
                with m.If(last):
                    m.d.sync += reason.eq(0)
        with m.Else():
            m.d.comb += [private.valid.eq(host.valid & writing), private.payload.eq(host.payload),
                         host.ready.eq(private.ready & writing | drain)]
        with m.If(drain & host.valid & host.payload.last):
            m.d.sync += drain.eq(0)

    def _pass(self, m, rest, *, open_):
        """After the exchange: the FPDUs on to ``o`` when established, else dropped."""
        m.d.comb += [self.o.payload.eq(rest.payload), self.o.valid.eq(rest.valid & open_),
                     rest.ready.eq(self.o.ready | ~open_)]
