"""The whole NIC: RFC 5040/5041/5044/6581/7306 over TCP/IP and Ethernet, between a PHY and a
host's AXI4 memory and AXI4-Lite registers.

::

  PHY ─ TcpNode ─ o_rx ──────────────────── ConnectionsEngine ─ o_place/o_data ─┐
          │ └──── i_tx ─ chunk join ─ o/o_header ─┘  │  │  ├─ o_read/i_host ──── DmaMaster ─ m_axi
          │                 └─ frames ─┐             │  │  └─ atomics ──────────┤
          └─ i_cmd/o_event ──── HostControl ─ s_axil │  ├─ SendQueueEngine ────┤
                                  │   └─ commands ───┘  ├─ ReceiveQueueEngine ─┤
                                  └─────────────────── CompletionWriter ───────┘

:class:`NicCore` wires :class:`~.node.TcpNode`, :class:`~.engine.ConnectionsEngine`,
:class:`~.host.control.HostControl`, the send and receive queue engines, the completion
writer and :class:`~.dma.DmaMaster`; see ``docs/architecture.md`` (Host side) for the order
it keeps between host memory writes and what follows them.
"""

from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.wiring import Out

from .axi import Axi4
from .dma import DmaMaster, ReadReserve
from .engine import ConnectionsEngine
from .exact import mask
from .host.completion import CompletionWriter
from .host.control import COUNTER_BITS, HostControl
from .host.fence import WriteFence
from .host.formats import SQ_INLINE_OFFSET
from .host.nicmap import COUNTERS
from .host.receive_queue import ReceiveQueueEngine
from .host.send_queue import SendQueueEngine
from .ip.mux import Arbiter
from .node import TcpNode, forward
from .stream import SkidBuffer, check_data_bytes, sliced
from .tcp.layouts import ChunkHeader
from .width import resized

__all__ = ["NicCore"]

_PHY_PREFIXES = ("gmii_", "xgmii_")
#: The DMA engine's clients.
_PLACE, _ATOMIC_WRITE, _CQE = range(3)
_PAYLOAD, _SQ, _RQ, _ATOMIC_READ = range(4)
_OPERANDS = 4                   # atomic operands read ahead of the executor
_SEGMENTS = 2                   # segments' payloads read ahead of the TCP engine


def _word_write(m, word, command, data, name):
    """An atomic's 8-octet result (``word``, a stream of :data:`~.rdmap.HostWord`) as a DMA
    write: its command and its one data beat, each taken once."""
    sent_command, sent_data = Signal(name=f"{name}_command_sent"), Signal(name=f"{name}_data_sent")
    command_ready = sent_command | command.ready
    data_ready = sent_data | data.ready
    m.d.comb += [command.valid.eq(word.valid & ~sent_command),
                 command.payload.addr.eq(word.payload.addr), command.payload.length.eq(8),
                 data.valid.eq(word.valid & ~sent_data), data.payload.data.eq(word.payload.data),
                 data.payload.keep.eq(mask(8)), data.payload.last.eq(1),
                 word.ready.eq(command_ready & data_ready)]
    with m.If(command.valid & command.ready):
        m.d.sync += sent_command.eq(1)
    with m.If(data.valid & data.ready):
        m.d.sync += sent_data.eq(1)
    with m.If(word.valid & word.ready):
        m.d.sync += [sent_command.eq(0), sent_data.eq(0)]


class NicCore(wiring.Component):
    """The NIC, for ``conns`` connections (queue pairs), ``cqs`` completion queues and
    ``srqs`` shared receive queues, each 1 or more (one of each is the generated
    ``iwarp_nic_core_c1_w8``, run against the model in ``tb/nic/test_nic_model.py``).
    ``tcp`` holds further :class:`~.tcp.engine.TcpEngine` parameters: its timers (RFC
    6298's by default, for a clock of 125 MHz), which simulation scales down so that a
    retransmission timeout is tens of thousands of cycles (78,000 for 0.5 ms at 156.25 MHz),
    not tens of millions. ``ip_stack`` holds :class:`~.ip.stack.IpStack` parameters (its ARP
    cache's ``arp_entries``, 8 by default, ``arp_retries``, ``arp_timeout``). Without
    ``event_counters`` the counter registers read 0 and the blocks' event counts are left to
    synthesis to remove (:class:`~.host.control.HostControl`).

    Ports
    -----
    PHY pins : those of :class:`~.eth.GmiiMac` (``data_bytes`` 1) or :class:`~.eth.XgmiiMac`
        (8), from the :class:`~.node.TcpNode`. With ``mac_bytes`` (narrower than
        ``data_bytes``), the MAC is of that width in the ``mac`` domain, behind
        :class:`~.node.MacIp`'s clock-domain crossings: a GMII MAC at 125 MHz before a core
        of 2 bytes at 62.5 MHz, say (the boards).
    s_axil : In(AxiLite(addr_width=16, data_bytes=4))
        The registers of :func:`~.host.nicmap.nic_map` (Verilog ``s_axil_*``).
    m_axi : Out(Axi4(addr_width=64, data_bytes=dma_bytes))
        Host memory (Verilog ``m_axi_*``): ``dma_bytes`` per beat (8 by default: 64 bits).
    irq : Out(1)
        The registers' interrupt.

    Throughput and latency are the blocks'. Order kept between host memory accesses: a
    completion is written only once the placements before it are done (their write
    responses in), and a payload read for a Read Response or an atomic's read only once
    the placements and atomic results issued before it are done (RFC 5040 section 5.5).
    The DMA engine returns all reads in the order they were issued, so the reads whose data
    waits on other reads' go through a :class:`~.dma.ReadReserve`: their data always has a
    place, and never holds up the rest. Send queue entries wait for the issuer, which waits
    for the payload of the entry before; atomic operands wait for the executor; payloads wait
    for the TCP engine to take their segment, which waits while the received stream does
    (its verdicts), and that for a receive queue entry, read after the payload (two NICs
    sending each other small Sends stopped so).
    """

    def __init__(self, data_bytes, *, conns=16, cqs=16, srqs=4, dma_bytes=8,
                 stag_entries=4096, pd_bits=16, tcp=None, ip_stack=None, mac_bytes=None,
                 event_counters=True):
        self.data_bytes = check_data_bytes(data_bytes)
        self.dma_bytes = check_data_bytes(dma_bytes, what="dma_bytes")
        if dma_bytes < 8:
            raise ValueError(f"dma_bytes must be 8 or more (an atomic is one beat), not "
                             f"{dma_bytes}")
        self.conns, self.cqs, self.srqs = conns, cqs, srqs
        # TCP segments hold whole FPDUs (RFC 5044 Appendix A, an optimized MPA-aware TCP): 64
        # planned segments per connection cover the engine's 64 KiB send ring (45 full ones).
        # ACKs ride on data segments where data follows (with data both ways, a pure ACK per
        # segment took 5% of the line).
        self._node = TcpNode(data_bytes, mac_bytes=mac_bytes,
                             engine={"conns": conns, "cut_slots": 64, "ack_with_data": True,
                                     **(tcp or {})}, **(ip_stack or {}))
        self._engine = ConnectionsEngine(data_bytes, conns=conns, stag_entries=stag_entries,
                                         pd_bits=pd_bits)
        #: The longest ULPDU the receive path takes in: an FPDU whose ULPDU_Length is above it
        #: ends its stream as soon as the length is read (a catastrophic error of the stream,
        #: RFC 5040 section 7.1; the gather's ring holds one FPDU beside one TCP chunk).
        self.max_rx_ulpdu = self._engine.max_ulpdu
        self._control = HostControl(data_bytes, conns=conns, cqs=cqs, srqs=srqs,
                                    pd_bits=pd_bits,
                                    stag_entries=stag_entries, ird_max=self._engine.ird_max,
                                    ord_max=self._engine.ord_depth,
                                    event_counters=event_counters)
        self._pins = {name: member for name, member in self._node.signature.members.items()
                      if name.startswith(_PHY_PREFIXES)}
        super().__init__({
            **self._pins,
            "s_axil": self._control.signature.members["s_axil"],
            "m_axi": Out(Axi4(addr_width=64, data_bytes=dma_bytes)),
            "irq": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        n, d = self.data_bytes, self.dma_bytes
        m.submodules.node = node = self._node
        m.submodules.engine = engine = self._engine
        m.submodules.control = control = self._control
        m.submodules.send_queues = sq = SendQueueEngine(d, conns=self.conns)
        m.submodules.receive_queues = rq = ReceiveQueueEngine(d, conns=self.conns,
                                                              srqs=self.srqs)
        m.submodules.completions = cqw = CompletionWriter(d, conns=self.conns, cqs=self.cqs,
                                                          writers=2)
        m.submodules.dma = dma = DmaMaster(d, write_clients=3, read_clients=4)
        for name, member in self._pins.items():
            forward(m, member, getattr(self, name), getattr(node, name))
        wiring.connect(m, wiring.flipped(self.s_axil), control.s_axil)
        wiring.connect(m, dma.m_axi, wiring.flipped(self.m_axi))
        m.d.comb += [self.irq.eq(control.irq), node.mac.eq(control.mac),
                     node.ip.eq(control.ip), node.isn_key.eq(control.isn_key),
                     node.hash_key.eq(control.hash_key), node.stat_conn.eq(0),
                     *(control.counters[name].eq(getattr(node, port)[:COUNTER_BITS])
                       for name, port in COUNTERS.items())]

        # TCP: commands and events; the received chunks straight into the engine.
        wiring.connect(m, control.o_tcp, node.i_cmd)
        wiring.connect(m, node.o_event, control.i_tcp_event)
        wiring.connect(m, node.o_rx_header, engine.i_header)
        wiring.connect(m, node.o_rx, engine.i)
        self._transmit(m, node, engine, control)

        # The engine's commands, and what it reports.
        wiring.connect(m, control.o_gather, engine.i_cmd)
        wiring.connect(m, engine.o_startup_header, control.i_startup_header)
        wiring.connect(m, engine.o_startup, control.i_startup)
        # (registered: an open takes the issuer's context write, which its work offer waits on)
        sliced(m, "open_skid", control.o_engine_open, engine.i_open, half_rate=True)
        wiring.connect(m, control.o_stag_write, engine.i_write)
        wiring.connect(m, engine.o_fault, control.i_fault)
        wiring.connect(m, engine.o_peer_terminate, control.i_peer_terminate)

        # Queues: rings, doorbells, work, receives, completions.
        wiring.connect(m, control.o_sq_ring, sq.i_ring)
        wiring.connect(m, control.o_rq_ring, rq.i_ring)
        wiring.connect(m, control.o_srq_ring, rq.i_srq_ring)
        wiring.connect(m, control.o_qp_cqs, cqw.i_qp)
        wiring.connect(m, control.o_cq, cqw.i_cq)
        wiring.connect(m, control.o_sq_doorbell, sq.i_doorbell)
        wiring.connect(m, control.o_rq_doorbell, rq.i_doorbell)
        wiring.connect(m, control.o_cq_head, cqw.i_head)
        wiring.connect(m, sq.o_work, engine.i_work)
        wiring.connect(m, engine.o_deferred, sq.i_deferred)
        wiring.connect(m, engine.o_ask_receive, rq.i_ask)
        wiring.connect(m, rq.o_receive, engine.i_receive)
        wiring.connect(m, engine.o_sent, cqw.i_sent)
        wiring.connect(m, engine.o_complete, cqw.i_complete)
        wiring.connect(m, engine.o_refused, cqw.i_refused)
        read_done = engine.o_read_done
        wiring.connect(m, read_done, cqw.i_read_done)
        # A Read's end may let its connection's deferred work go.
        m.d.comb += [sq.i_wake.valid.eq(read_done.valid & read_done.ready),
                     sq.i_wake.payload.conn.eq(read_done.payload.conn)]
        wiring.connect(m, cqw.o_event, control.i_cq_event)
        self._host_memory(m, engine, sq, rq, cqw, dma, n, d)
        return m

    def _transmit(self, m, node, engine, control):
        """The engine's FPDUs and the host's frames into the TCP engine, a chunk at a time.
        Up to two chunk headers go ahead of the bytes still flowing, so the TCP engine admits
        the next chunk into its send ring while the current one is written: a chunk then
        follows the one before with no idle cycles, and the ring fills faster than the line
        drains it (at 8 bytes, 1460-octet FPDUs came 192 cycles apart, one segment's time on
        the wire, so any delay showed on the line)."""
        n = self.data_bytes
        m.submodules.chunks = join = Arbiter(ChunkHeader(self.conns), n, 2, ahead=2)
        fpdus, frames = join.i_payload[0], join.i_payload[1]
        wiring.connect(m, engine.o_header, join.i_header[0])
        wiring.connect(m, control.o_frame_header, join.i_header[1])
        for source, sink in ((engine.o, fpdus), (control.o_frame, frames)):
            m.d.comb += [sink.valid.eq(source.valid), source.ready.eq(sink.ready),
                         sink.payload.data.eq(source.payload.data),
                         sink.payload.keep.eq(source.payload.keep),
                         sink.payload.last.eq(source.payload.last)]
        wiring.connect(m, join.o_header, node.i_tx_header)
        # The bytes pass a register slice: the send ring's ready reaches the engine's and the
        # host's senders only through a register.
        m.submodules.tx_skid = tx_skid = SkidBuffer(join.o_payload.payload.shape())
        wiring.connect(m, join.o_payload, tx_skid.i)
        out = tx_skid.o
        m.d.comb += [node.i_tx.valid.eq(out.valid), out.ready.eq(node.i_tx.ready),
                     node.i_tx.payload.data.eq(out.payload.data),
                     node.i_tx.payload.keep.eq(out.payload.keep),
                     node.i_tx.payload.last.eq(out.payload.last)]

    def _host_memory(self, m, engine, sq, rq, cqw, dma, n, d):
        """Every host memory access through the DMA engine's clients, in order where it
        matters."""
        def client(kind, k, what):
            into = what == "command" or (kind, what) == ("write", "data")
            return getattr(dma, f"{'i' if into else 'o'}_{kind}{k}_{what}")

        # Writes: placements, atomics' results, completions; each done counted.
        wiring.connect(m, engine.o_place, client("write", _PLACE, "command"))
        wiring.connect(m, resized(m, engine.o_data, n, d, "place_width"),
                       client("write", _PLACE, "data"))
        _word_write(m, engine.o_atomic_write, client("write", _ATOMIC_WRITE, "command"),
                    client("write", _ATOMIC_WRITE, "data"), "atomic_write")
        wiring.connect(m, cqw.o_write, client("write", _CQE, "command"))
        wiring.connect(m, cqw.o_data, client("write", _CQE, "data"))
        wiring.connect(m, client("write", _CQE, "done"), cqw.i_written)
        place_done, atomic_done = client("write", _PLACE, "done"), \
            client("write", _ATOMIC_WRITE, "done")
        m.d.comb += [place_done.ready.eq(1), atomic_done.ready.eq(1)]
        issued = [engine.o_place.valid & engine.o_place.ready,
                  engine.o_atomic_write.valid & engine.o_atomic_write.ready]
        done = [place_done.valid, atomic_done.valid]
        for k in range(2):
            m.d.comb += [cqw.place_issued[k].eq(issued[k]), cqw.place_done[k].eq(done[k])]

        # Reads: payloads and atomics' operands after the writes before them; entries.
        def fenced(source, name):
            fence = WriteFence(StructLayout({"addr": 64, "length": 16}), writers=2)
            m.submodules[name] = fence
            for k in range(2):
                m.d.comb += [fence.issued[k].eq(issued[k]), fence.done[k].eq(done[k])]
            m.d.comb += [fence.i.valid.eq(source.valid), source.ready.eq(fence.i.ready)]
            return fence

        # Clients whose data waits on the others' reads (see the class docstring).
        def reserved(source, k, beats, name):
            reserve = m.submodules[name] = ReadReserve(d, beats)
            wiring.connect(m, source, reserve.i_command)
            wiring.connect(m, reserve.o_command, client("read", k, "command"))
            wiring.connect(m, client("read", k, "data"), reserve.i_data)
            return reserve

        payload = fenced(engine.o_read, "payload_fence")
        m.d.comb += [payload.i.payload.addr.eq(engine.o_read.payload.addr),
                     payload.i.payload.length.eq(engine.o_read.payload.length)]
        payloads = reserved(payload.o, _PAYLOAD, _SEGMENTS * -(-engine.max_fetch // d),
                            "payload_reserve")
        host = resized(m, payloads.o_data, d, n, "payload_width", err=True)
        m.d.comb += [engine.i_host.valid.eq(host.valid), host.ready.eq(engine.i_host.ready),
                     engine.i_host.payload.data.eq(host.payload.data),
                     engine.i_host.payload.keep.eq(host.payload.keep),
                     engine.i_host.payload.last.eq(host.payload.last)]
        atomic = fenced(engine.o_atomic_read, "atomic_fence")
        m.d.comb += [atomic.i.payload.addr.eq(engine.o_atomic_read.payload),
                     atomic.i.payload.length.eq(8)]
        operands = reserved(atomic.o, _ATOMIC_READ, _OPERANDS, "atomic_reserve")
        operand = operands.o_data
        m.d.comb += [engine.i_atomic_read.valid.eq(operand.valid),
                     operand.ready.eq(engine.i_atomic_read.ready),
                     engine.i_atomic_read.payload.eq(operand.payload.data[:64])]
        entries = reserved(sq.o_fetch, _SQ, sq.ahead * -(-SQ_INLINE_OFFSET // d), "sq_reserve")
        sliced(m, "sq_fetched_skid", entries.o_data, sq.i_fetched)
        wiring.connect(m, rq.o_fetch, client("read", _RQ, "command"))
        wiring.connect(m, client("read", _RQ, "data"), rq.i_fetched)
