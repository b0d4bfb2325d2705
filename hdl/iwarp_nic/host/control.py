"""The host's control path: the register bank of :func:`~.nicmap.nic_map` and what stands
behind its registers (ARM IHI 0022 part B for the bus, through :class:`~.bank.RegisterBank`):
the command mailbox decoded into each block's command stream, the frames the driver sends
(its MPA request or reply, RFC 5044 section 7) and the startup frames it reads, and the
event queue (see :mod:`.nicmap` for how the driver uses them).
"""

from amaranth import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..axi import AxiLite
from ..counters import CounterMemory
from ..ddp.stag import StagWrite
from ..engine import EngineOpen
from ..errors import Violation
from ..exact import add, eq, is_zero, lt, mask, sub, widened
from ..mpa.gather import GatherCommand, Release
from ..rdmap import TerminateHeader
from ..roundrobin import merge
from ..stream import BeatStream, check_data_bytes
from ..tcp.layouts import ChunkHeader, Command, Event, with_conn
from ..width import resized
from .bank import RegisterBank, pulse_index
from .completion import CqEvent, QueuePairCqs
from .nicmap import (
    COUNTERS,
    MAGIC,
    MAILBOX_WORDS,
    VERSION,
    CommandOp,
    NicEvent,
    NicEventKind,
    TcpEventData,
    command_layouts,
    nic_map,
)
from .rings import Doorbell, ReceiveRing, Ring

__all__ = ["HostControl", "COUNTER_BITS"]

_WORD = 4           # octets of a bus word
#: The low bits of each event count that HostControl takes from its block: the counter
#: registers are 32-bit totals in a :class:`~iwarp_nic.counters.CounterMemory`, which visits
#: each at least every 77 cycles (50 counters; a read takes its memory at most every third
#: cycle), the first time within 127 cycles of reset, so a block may count up to 8 events a
#: cycle; none counts more than a few (a frame, packet or segment each, or a MAC's crossed
#: count: five a cycle at four MAC cycles to one).
COUNTER_BITS = 10


class HostControl(wiring.Component):
    """The registers of :func:`~.nicmap.nic_map` and the command, frame and event paths.

    Ports
    -----
    s_axil : In(AxiLite(addr_width=16, data_bytes=4))
    mac, ip, hash_key, isn_key : Out(48), Out(32), Out(32), Out(128)
        The node's addresses and keys (registers).
    o_stag_write, o_cq, o_qp_cqs, o_sq_ring, o_rq_ring, o_engine_open, o_gather, o_tcp,
    o_srq_ring :
        The commands (:class:`~.nicmap.CommandOp`), each from the mailbox as written:
        ``MR_WRITE``, ``CQ_OPEN``, ``QP_OPEN`` (three transfers at once: completion queues,
        send queue ring, receives, taken together), ``ENGINE_OPEN``, ``GATHER``, ``TCP``,
        ``SRQ_OPEN``.
    o_frame_header, o_frame : Out(stream.Signature(ChunkHeader(conns))), Out(BeatStream(n))
        ``FRAME``: a chunk of the connection's TCP stream, the octets written into
        ``frame_data`` (four per write, lane 0 first; the last word's spare octets dropped).
    o_sq_doorbell, o_rq_doorbell, o_cq_head : the doorbells, each naming its queue
        (``o_rq_doorbell``: queue pair ``k``'s receive queue is ``k``, shared receive queue
        ``s`` is ``conns + s``, from ``srq_doorbell``)
    i_tcp_event, i_startup_header, i_startup, i_fault, i_peer_terminate, i_cq_event :
        What the NIC reports, each queued as an event (a startup piece's octets into the
        ``startup_data`` queue); taken round robin while the event queue has room.
    irq : Out(1)
        ``irq_status`` and ``irq_enable``.
    counters : In(StructLayout({name: COUNTER_BITS for name in nicmap.COUNTERS}))
        The events behind each counter register (:data:`~.nicmap.COUNTERS`), by its name:
        the block's count modulo ``2**COUNTER_BITS`` (its low bits). The registers read 32-bit
        totals from a :class:`~iwarp_nic.counters.CounterMemory`, each at most 80 cycles
        behind its events; a read of one answers a cycle later than the other registers.
        Without ``event_counters`` these inputs are not read: the registers read 0, and
        synthesis drops the counters behind them (a host that never reads them, as the
        memory target's, need not pay for them).

    ``limits`` reads ``ird_max`` and ``ord_max``: the engine's (the host must agree no larger
    IRD and ORD with a peer), and ``srqs``.

    A command whose block is busy holds the bus's write response until it is taken; an
    unknown command is taken and ignored. A ``FRAME`` longer than the octets written waits for
    the rest. The queues: ``events`` events, 256 words of frame octets to send, 256 words of
    startup octets received.
    """

    def __init__(self, data_bytes, *, conns=16, cqs=16, srqs=4, pd_bits=16, stag_entries=4096,
                 events=16, ird_max=8, ord_max=32, event_counters=True):
        self.data_bytes = check_data_bytes(data_bytes)
        self.conns, self.cqs, self.srqs, self.events = conns, cqs, srqs, events
        self.event_counters = event_counters
        self.ird_max, self.ord_max = ird_max, ord_max
        self.regmap = nic_map(conns=conns, cqs=cqs, srqs=srqs)
        self.commands = command_layouts(conns=conns, cqs=cqs, srqs=srqs, pd_bits=pd_bits,
                                        stag_entries=stag_entries)
        n = data_bytes
        super().__init__({
            "s_axil": In(AxiLite(addr_width=self.regmap.addr_width, data_bytes=4)),
            "mac": Out(48), "ip": Out(32), "hash_key": Out(32), "isn_key": Out(128),
            "o_stag_write": Out(stream.Signature(StagWrite(pd_bits,
                                                           stag_entries.bit_length() - 1))),
            "o_cq": Out(stream.Signature(with_conn(Ring, cqs))),
            "o_qp_cqs": Out(stream.Signature(QueuePairCqs(conns, cqs))),
            "o_sq_ring": Out(stream.Signature(with_conn(Ring, conns))),
            "o_rq_ring": Out(stream.Signature(with_conn(ReceiveRing(srqs), conns))),
            "o_srq_ring": Out(stream.Signature(with_conn(Ring, srqs))),
            "o_engine_open": Out(stream.Signature(EngineOpen(conns, pd_bits))),
            "o_gather": Out(stream.Signature(GatherCommand(conns))),
            "o_tcp": Out(stream.Signature(Command(conns))),
            "o_frame_header": Out(stream.Signature(ChunkHeader(conns))),
            "o_frame": Out(BeatStream(n)),
            "o_sq_doorbell": Out(stream.Signature(with_conn(Doorbell, conns))),
            "o_rq_doorbell": Out(stream.Signature(with_conn(Doorbell, conns + srqs))),
            "o_cq_head": Out(stream.Signature(with_conn(Doorbell, cqs))),
            "i_tcp_event": In(stream.Signature(Event(conns))),
            "i_startup_header": In(stream.Signature(Release(conns))),
            "i_startup": In(BeatStream(n)),
            "i_fault": In(stream.Signature(with_conn(Violation, conns))),
            "i_peer_terminate": In(stream.Signature(with_conn(TerminateHeader, conns))),
            "i_cq_event": In(stream.Signature(CqEvent(cqs))),
            "irq": Out(1),
            "counters": In(StructLayout({name: COUNTER_BITS for name in COUNTERS})),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes
        stored = tuple(COUNTERS) if self.event_counters else ()
        m.submodules.bank = bank = RegisterBank(self.regmap, stored=stored)
        wiring.connect(m, wiring.flipped(self.s_axil), bank.s_axil)
        if self.event_counters:
            m.submodules.counters = counters = CounterMemory(len(COUNTERS), COUNTER_BITS)
            wiring.connect(m, bank.stored, counters.read)
            m.d.comb += [counters.sources[k].eq(self.counters[name])
                         for k, name in enumerate(COUNTERS)]
        m.d.comb += [
            bank.id.eq(MAGIC), bank.version.eq(VERSION),
            bank.features.eq(self.conns | self.cqs << 13 | n << 26),
            bank.limits.eq(self.ird_max | self.ord_max << 8 | self.srqs << 16),
            self.mac.eq(bank.mac), self.ip.eq(bank.ip), self.hash_key.eq(bank.hash_key),
            self.isn_key.eq(Cat(bank.isn_key_lo, bank.isn_key_hi)), self.irq.eq(bank.irq),
        ]
        for name in ("sq_doorbell", "rq_doorbell", "cq_head"):
            door, out = getattr(bank, name), getattr(self, f"o_{name}")
            m.d.comb += [out.valid.eq(door.valid), out.payload.conn.eq(pulse_index(door)),
                         out.payload.tail.eq(door.payload.value), door.ready.eq(out.ready)]
        # A shared receive queue's doorbell, on the receive queues' after theirs (one register
        # write at a time: the two are never valid together).
        shared, out = bank.srq_doorbell, self.o_rq_doorbell
        queue = add(widened(m, pulse_index(shared), len(out.payload.conn), "srq_queue"),
                    self.conns)
        m.d.comb += shared.ready.eq(out.ready)
        with m.If(shared.valid):
            m.d.comb += [out.valid.eq(1), out.payload.conn.eq(queue),
                         out.payload.tail.eq(shared.payload.value)]
        frame = stream.Signature(ChunkHeader(self.conns)).create()
        self._commands(m, bank, frame)
        self._frames(m, bank, frame, n)
        self._events(m, bank, n)
        return m

    def _commands(self, m, bank, frame):
        """Each command to its block, its fields from the mailbox (``FRAME``: to ``frame``)."""
        mailbox = Cat(bank.cmd_args[k] for k in range(MAILBOX_WORDS))
        command = bank.command
        op = command.payload.value[:8]
        qp = self.commands[CommandOp.QP_OPEN](mailbox[:self.commands[CommandOp.QP_OPEN].size])
        qp_ports = (self.o_qp_cqs, self.o_sq_ring, self.o_rq_ring)
        m.d.comb += [self.o_qp_cqs.payload.eq(qp.cqs),
                     self.o_sq_ring.payload.conn.eq(qp.cqs.conn),
                     self.o_sq_ring.payload.base.eq(qp.sq.base),
                     self.o_sq_ring.payload.log2_entries.eq(qp.sq.log2_entries),
                     self.o_rq_ring.payload.conn.eq(qp.cqs.conn),
                     self.o_rq_ring.payload.base.eq(qp.rq.base),
                     self.o_rq_ring.payload.log2_entries.eq(qp.rq.log2_entries),
                     self.o_rq_ring.payload.srq.eq(qp.rq.srq)]
        qp_ready = Cat(port.ready for port in qp_ports).all()
        for port in qp_ports:
            m.d.comb += port.valid.eq(command.valid & eq(op, CommandOp.QP_OPEN) & qp_ready)
        targets = {CommandOp.MR_WRITE: self.o_stag_write, CommandOp.CQ_OPEN: self.o_cq,
                   CommandOp.ENGINE_OPEN: self.o_engine_open, CommandOp.GATHER: self.o_gather,
                   CommandOp.TCP: self.o_tcp, CommandOp.FRAME: frame,
                   CommandOp.SRQ_OPEN: self.o_srq_ring}
        known = Cat(eq(op, code) for code in CommandOp).any()
        ready = ~known | (eq(op, CommandOp.QP_OPEN) & qp_ready)
        for code, port in targets.items():
            layout = self.commands[code]
            hit = eq(op, code)
            m.d.comb += [port.valid.eq(command.valid & hit),
                         port.payload.as_value().eq(mailbox[:layout.size])]
            ready = ready | (hit & port.ready)
        m.d.comb += command.ready.eq(ready)

    def _frames(self, m, bank, frame, n):
        """``frame_data`` words queued; a ``FRAME`` command (``frame``) sends ``length``
        octets of them as a chunk: its header, then its octets."""
        m.submodules.frame_words = words = SyncFIFOBuffered(width=8 * _WORD, depth=256)
        data = bank.frame_data
        m.d.comb += [words.w_data.eq(data.payload.value), words.w_en.eq(data.valid),
                     data.ready.eq(words.w_rdy)]
        header = self.o_frame_header
        left = Signal(16)                       # octets of the frame still to send
        sending = ~is_zero(left)
        m.d.comb += frame.ready.eq(~sending & (~header.valid | header.ready))
        with m.If(header.ready):
            m.d.sync += header.valid.eq(0)
        with m.If(frame.valid & frame.ready):
            m.d.sync += [header.valid.eq(~is_zero(frame.payload.length)),
                         header.payload.eq(frame.payload), left.eq(frame.payload.length)]
        beats = stream.Signature(StructLayout({"data": 32, "keep": _WORD, "last": 1})).create()
        last = lt(left, _WORD + 1)
        m.d.comb += [beats.valid.eq(sending & words.r_rdy), beats.payload.data.eq(words.r_data),
                     beats.payload.keep.eq(mask(_WORD)), beats.payload.last.eq(last),
                     words.r_en.eq(beats.valid & beats.ready)]
        for k in range(1, _WORD):
            with m.If(eq(left, k)):
                m.d.comb += beats.payload.keep.eq(mask(k))
        with m.If(beats.valid & beats.ready):
            m.d.sync += left.eq(sub(left, _WORD))
            with m.If(last):
                m.d.sync += left.eq(0)
        out = resized(m, beats, _WORD, n, "frame_width")
        wiring.connect(m, out, wiring.flipped(self.o_frame))

    def _events(self, m, bank, n):
        """Every report queued as a :data:`NicEvent`; a startup piece's octets queued as
        words for ``startup_data``."""
        sources = [self.i_tcp_event, self.i_startup_header, self.i_fault,
                   self.i_peer_terminate, self.i_cq_event]
        made = [Signal(NicEvent, name=f"event_{k}") for k in range(len(sources))]
        tcp, startup, fault, terminate, cq = made
        event = self.i_tcp_event.payload
        tcp_data = TcpEventData(tcp.data[:TcpEventData.size])
        m.d.comb += [tcp.kind.eq(NicEventKind.TCP), tcp.conn.eq(event.conn),
                     tcp.code.eq(event.kind.as_value()), tcp_data.remote_ip.eq(event.remote_ip),
                     tcp_data.remote_port.eq(event.remote_port),
                     tcp_data.local_port.eq(event.local_port)]
        piece = self.i_startup_header.payload
        m.d.comb += [startup.kind.eq(NicEventKind.STARTUP), startup.conn.eq(piece.conn),
                     startup.code.eq(piece.kind.as_value()), startup.data.eq(piece.length)]
        m.d.comb += [fault.kind.eq(NicEventKind.FAULT), fault.conn.eq(self.i_fault.payload.conn),
                     fault.code.eq(self.i_fault.payload.code.as_value())]
        peer = self.i_peer_terminate.payload
        m.d.comb += [terminate.kind.eq(NicEventKind.TERMINATE), terminate.conn.eq(peer.conn),
                     terminate.code.eq(Cat(peer.ecode, peer.etype, peer.layer))]
        report = self.i_cq_event.payload
        m.d.comb += [cq.kind.eq(NicEventKind.CQ), cq.conn.eq(report.cq),
                     cq.code.eq(Cat(report.overflow, report.error))]

        m.submodules.events = queue = SyncFIFOBuffered(width=NicEvent.size, depth=self.events)
        _, taken = merge(m, sources, made, queue.w_data, queue.w_rdy, "event")
        m.d.comb += [queue.w_en.eq(taken), bank.irq_status.eq(taken)]
        head = Signal(NicEvent)
        with m.If(queue.r_rdy):
            m.d.comb += head.eq(queue.r_data)
        m.d.comb += [bank.event0.eq(head.as_value()[:64]), bank.event1.eq(head.as_value()[64:]),
                     queue.r_en.eq(bank.event_pop.valid), bank.event_pop.ready.eq(1)]

        # Startup octets, four per word (the last word of a piece zero-filled).
        words = resized(m, wiring.flipped(self.i_startup), n, _WORD, "startup_width")
        m.submodules.startup_words = queue = SyncFIFOBuffered(width=8 * _WORD, depth=256)
        lanes = Cat(lane.replicate(8) for lane in words.payload.keep)
        m.d.comb += [queue.w_data.eq(words.payload.data & lanes), queue.w_en.eq(words.valid),
                     words.ready.eq(queue.w_rdy),
                     bank.startup_data.eq(queue.r_data & queue.r_rdy.replicate(8 * _WORD)),
                     queue.r_en.eq(bank.startup_pop.valid), bank.startup_pop.ready.eq(1)]
