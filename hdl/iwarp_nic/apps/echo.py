"""RFC 862 (Echo Protocol), TCP-based echo service: every byte received on a connection to the
echo port is sent back on it, until the client closes; then the server closes too.

* :class:`TcpEcho` drives the host ports of :class:`~iwarp_nic.tcp.engine.TcpEngine` (also those
  of :class:`~iwarp_nic.node.TcpNode`): it keeps every connection slot listening on one port and
  turns each received chunk into a chunk to send.
* :class:`EchoNode` is a :class:`~iwarp_nic.node.TcpNode` with a :class:`TcpEcho` on it: an echo
  server from the PHY pins up (ARP and ping answered by the IP layer).
"""

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import enum, stream, wiring
from amaranth.lib.wiring import In, Out

from ..exact import add, eq, lt, mask, select
from ..node import TcpNode
from ..stream import BeatStream, SkidBuffer, check_data_bytes
from ..tcp.layouts import ChunkHeader, Command, CommandOp, Event, EventKind, conn_bits

__all__ = ["TcpEcho", "SlotState", "EchoNode", "HOST_PORTS"]


#: The engine's host ports and the TcpEcho ports they join: (engine port, echo port, engine drives).
HOST_PORTS = (("i_cmd", "o_cmd", False), ("o_event", "i_event", True),
              ("i_tx_header", "o_tx_header", False), ("i_tx", "o_tx", False),
              ("o_rx_header", "i_rx_header", True), ("o_rx", "i_rx", True))


class SlotState(enum.Enum, shape=3):
    """What :class:`TcpEcho` knows of one connection slot."""

    FREE = 0           # closed: a LISTEN is due
    LISTENING = 1      # LISTEN issued, no connection yet
    CONNECTED = 2      # ESTABLISHED: echoing
    CLOSE_PENDING = 3  # the peer closed (PEER_FIN): a CLOSE is due once its bytes are echoed
    CLOSE_SENT = 4     # CLOSE issued: waiting for the slot to be freed


class TcpEcho(wiring.Component):
    """An echo server on port ``port`` for every one of the engine's ``conns`` slots.

    Ports
    -----
    The engine's host ports, flipped, to join with ``wiring.connect``, and two counters:

    o_cmd : Out(stream Command)              to the engine's ``i_cmd``
    i_event : In(stream Event)               from ``o_event``; always ready
    o_tx_header : Out(stream ChunkHeader)    to ``i_tx_header``
    o_tx : Out(BeatStream(data_bytes))       to ``i_tx``
    i_rx_header : In(stream ChunkHeader)     from ``o_rx_header``
    i_rx : In(BeatStream(data_bytes))        from ``o_rx``
    accepted : Out(32)       connections established on a listening slot (wraps)
    echoed_bytes : Out(32)   bytes handed to the engine on ``o_tx`` (wraps)

    Connections. After reset every slot is FREE; a FREE slot gets ``LISTEN`` on ``port`` (one
    command at a time, lowest slot first, never in a cycle with an event). ``ESTABLISHED`` makes
    a LISTENING slot CONNECTED. ``PEER_FIN`` makes a LISTENING or CONNECTED slot CLOSE_PENDING;
    its ``CLOSE`` is issued once every byte the engine received before that FIN has been echoed:
    when the echo path is idle (no chunk taken and not yet handed over), ``i_rx_header`` has
    offered nothing, and :attr:`SETTLE` cycles have passed since the last ``PEER_FIN`` with both
    still true. That relies on the engine writing a payload's delivery before (or with) the
    segment's ``PEER_FIN`` event and offering its header on ``o_rx_header`` within a few cycles
    when that port is idle, which :class:`~iwarp_nic.tcp.engine.TcpEngine` does. ``RESET``,
    ``TIMEOUT`` and ``ABORTED`` free the slot whatever its state, ``CLOSED`` unless the slot is
    FREE or LISTENING: there it can only be the answer to a ``CLOSE`` that met a slot the peer had
    already reset, and the slot is already being reused. A freed slot listens again.

    Data. Each chunk on ``i_rx_header``/``i_rx`` goes back to its connection as one chunk of the
    same length: its header is taken and offered on ``o_tx_header`` (one cycle later, from a
    register), then, once the engine has taken it, its bytes pass from ``i_rx`` to ``o_tx``
    through a :class:`~iwarp_nic.stream.SkidBuffer`, beats unchanged. Back-pressure goes end to
    end: the engine holds a chunk until its connection's send ring has room for all of it (so the
    ring must hold the largest segment received, the MSS), and the echo holds the receive side
    meanwhile. One chunk at a time: a connection whose peer stops reading (its send ring full)
    holds the echo for every connection. Throughput: one beat per cycle within a chunk, plus the
    engine's header handling (a few cycles) between chunks. Latency: one cycle from a header
    taken on ``i_rx_header`` to it on ``o_tx_header``, and from a beat taken on ``i_rx`` to it on
    ``o_tx``.

    Parameters
    ----------
    data_bytes : int
        The width of the byte streams, one of :data:`~iwarp_nic.stream.DATA_BYTES`.
    conns : int
        The engine's connection slots.
    port : int
        The TCP port to serve (RFC 862: 7).
    """

    #: Idle cycles after a ``PEER_FIN`` before a CLOSE may go out (see the class docstring).
    SETTLE = 16

    def __init__(self, data_bytes, conns, port):
        self.data_bytes = check_data_bytes(data_bytes)
        conn_bits(conns)
        if not isinstance(port, int) or not 0 < port <= 0xFFFF:
            raise ValueError(f"port must be an integer in 1..65535, not {port!r}")
        self.conns = conns
        self.port = port
        super().__init__({
            "o_cmd": Out(stream.Signature(Command(conns))),
            "i_event": In(stream.Signature(Event(conns))),
            "o_tx_header": Out(stream.Signature(ChunkHeader(conns))),
            "o_tx": Out(BeatStream(data_bytes)),
            "i_rx_header": In(stream.Signature(ChunkHeader(conns))),
            "i_rx": In(BeatStream(data_bytes)),
            "accepted": Out(32),
            "echoed_bytes": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.data_bytes

        # ---- Data: header register, then the chunk's bytes through a skid buffer.
        header = Signal(ChunkHeader(self.conns))
        header_valid = Signal()
        forwarding = Signal()  # the chunk's header went out: its bytes pass now
        m.d.comb += [self.i_rx_header.ready.eq(~header_valid & ~forwarding),
                     self.o_tx_header.valid.eq(header_valid),
                     self.o_tx_header.payload.eq(header)]
        with m.If(self.i_rx_header.valid & self.i_rx_header.ready):
            m.d.sync += [header.eq(self.i_rx_header.payload), header_valid.eq(1)]
        with m.If(self.o_tx_header.valid & self.o_tx_header.ready):
            m.d.sync += [header_valid.eq(0), forwarding.eq(1)]

        m.submodules.data_slice = skid = SkidBuffer(self.i_rx.payload.shape())
        m.d.comb += [skid.i.payload.eq(self.i_rx.payload),
                     skid.i.valid.eq(self.i_rx.valid & forwarding),
                     self.i_rx.ready.eq(skid.i.ready & forwarding)]
        with m.If(skid.i.valid & skid.i.ready & self.i_rx.payload.last):
            m.d.sync += forwarding.eq(0)
        wiring.connect(m, skid.o, wiring.flipped(self.o_tx))
        beat_bytes = select(m, self.o_tx.payload.keep, {mask(k): k for k in range(1, n + 1)},
                            32, "beat_bytes")
        with m.If(self.o_tx.valid & self.o_tx.ready):
            m.d.sync += self.echoed_bytes.eq(self.echoed_bytes + beat_bytes)

        # ---- Close gate: the echo path idle and no header offered, SETTLE cycles in a row.
        event = self.i_event.payload
        kind = event.kind.as_value()

        def is_event(*kinds):
            return self.i_event.valid & Cat(eq(kind, k.value) for k in kinds).any()

        idle = ~header_valid & ~forwarding & ~skid.o.valid & ~self.i_rx_header.valid
        quiet = Signal(range(self.SETTLE + 1))
        with m.If(~idle | is_event(EventKind.PEER_FIN)):
            m.d.sync += quiet.eq(0)
        with m.Elif(lt(quiet, self.SETTLE)):
            m.d.sync += quiet.eq(add(quiet, 1))
        may_close = eq(quiet, self.SETTLE)

        # ---- Slots: events move them, commands go out for FREE and CLOSE_PENDING ones.
        slots = [Signal(3, name=f"slot{k}", init=SlotState.FREE.value) for k in range(self.conns)]

        def slot_in(value, *states):
            return Cat(eq(value, state.value) for state in states).any()

        m.d.comb += self.i_event.ready.eq(1)
        for k, slot in enumerate(slots):
            def on(*kinds, slot_k=k):
                return is_event(*kinds) & eq(event.conn, slot_k)

            with m.If(on(EventKind.ESTABLISHED) & slot_in(slot, SlotState.LISTENING)):
                m.d.sync += [slot.eq(SlotState.CONNECTED.value),
                             self.accepted.eq(add(self.accepted, 1))]
            with m.If(on(EventKind.PEER_FIN)
                      & slot_in(slot, SlotState.LISTENING, SlotState.CONNECTED)):
                m.d.sync += slot.eq(SlotState.CLOSE_PENDING.value)
            with m.If(on(EventKind.CLOSED) & ~slot_in(slot, SlotState.FREE, SlotState.LISTENING)):
                m.d.sync += slot.eq(SlotState.FREE.value)
            with m.If(on(EventKind.RESET, EventKind.TIMEOUT, EventKind.ABORTED)):
                m.d.sync += slot.eq(SlotState.FREE.value)

        # The next command: LISTEN for the lowest FREE slot, else CLOSE for the lowest
        # CLOSE_PENDING one once may_close. The candidates are registered (`wanted`, `listen`),
        # so a command is loaded only when they are fresh: the command register is free, and
        # neither an event nor a load moved a slot in this cycle or the one before.
        free = Cat(slot_in(s, SlotState.FREE) for s in slots)
        closing = Cat(slot_in(s, SlotState.CLOSE_PENDING) for s in slots) & may_close.replicate(
            self.conns)
        listen = Signal()
        wanted = Signal(self.conns)
        fresh = Signal()
        load = Signal()
        m.d.sync += [listen.eq(free.any()), wanted.eq(Mux(free.any(), free, closing)),
                     fresh.eq(~self.i_event.valid & ~load)]
        grant = Signal(self.conns)  # the lowest set bit of `wanted`
        m.d.comb += grant.eq(wanted & (~wanted + 1)[:self.conns])
        chosen = Signal(conn_bits(self.conns))
        m.d.comb += chosen.eq(Cat(Cat(grant[k] for k in range(self.conns) if k >> b & 1).any()
                                  for b in range(len(chosen))))

        cmd_valid = Signal()
        cmd_op = Signal(CommandOp)
        cmd_conn = Signal.like(chosen)
        cmd = self.o_cmd.payload
        m.d.comb += [self.o_cmd.valid.eq(cmd_valid), cmd.op.eq(cmd_op), cmd.conn.eq(cmd_conn),
                     cmd.local_port.eq(self.port), cmd.remote_ip.eq(0), cmd.remote_port.eq(0)]
        with m.If(self.o_cmd.ready):
            m.d.sync += cmd_valid.eq(0)
        m.d.comb += load.eq((~cmd_valid | self.o_cmd.ready) & ~self.i_event.valid & fresh)
        with m.If(load):
            m.d.sync += [cmd_valid.eq(wanted.any()), cmd_conn.eq(chosen),
                         cmd_op.eq(Mux(listen, CommandOp.LISTEN, CommandOp.CLOSE))]
            for k in range(self.conns):
                with m.If(grant[k]):
                    m.d.sync += slots[k].eq(Mux(listen, SlotState.LISTENING.value,
                                                SlotState.CLOSE_SENT.value))
        return m


class EchoNode(wiring.Component):
    """An echo server: :class:`~iwarp_nic.node.TcpNode` (MAC, IP, TCP) with :class:`TcpEcho`
    on its host ports, serving ``port`` on every connection slot.

    Ports: those of the node but its host side (:data:`HOST_PORTS`) and the per-connection
    statistics (``stat_conn`` is tied to 0, ``stat_*`` left out): the PHY pins, ``mac``, ``ip``,
    ``isn_key``, ``hash_key``, every MAC, IP and ``tcp_*`` counter; then the echo's ``accepted``
    and ``echoed_bytes``. Contracts are the node's and the echo's.

    Parameters
    ----------
    data_bytes : int
        The core's width: 1 (GMII) or 8 (XGMII) with no ``mac_bytes``.
    port : int
        The echo port.
    mac_bytes : int or None
        A narrower MAC in a ``mac`` clock domain of its own (:class:`~iwarp_nic.node.MacIp`):
        1 for GMII under a 2-byte core.
    engine : dict
        :class:`~iwarp_nic.tcp.engine.TcpEngine` parameters; ``conns`` (default 16) is also the
        echo's.
    ip_params
        :class:`~iwarp_nic.ip.IpStack` parameters.
    """

    def __init__(self, data_bytes, port, *, mac_bytes=None, engine=None, **ip_params):
        engine = dict(engine or {})
        self.node = TcpNode(data_bytes, mac_bytes=mac_bytes, engine=engine, **ip_params)
        self.echo = TcpEcho(data_bytes, self.node.engine.conns, port)
        host = {name for name, _, _ in HOST_PORTS}
        members = {name: member for name, member in self.node.signature.members.items()
                   if name not in host and not name.startswith("stat_")}
        super().__init__({**members, "accepted": Out(32), "echoed_bytes": Out(32)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.node = node = self.node
        m.submodules.echo = echo = self.echo
        for name, member in self.signature.members.items():
            if name in ("accepted", "echoed_bytes"):
                m.d.comb += getattr(self, name).eq(getattr(echo, name))
            else:
                outer, inner = getattr(self, name), getattr(node, name)
                m.d.comb += inner.eq(outer) if member.flow == In else outer.eq(inner)
        m.d.comb += node.stat_conn.eq(0)
        # A skid buffer on each stream between the two, so no path runs from the echo's slot
        # logic into the engine's control or back.
        for node_port, echo_port, node_drives in HOST_PORTS:
            ours, theirs = getattr(node, node_port), getattr(echo, echo_port)
            source, sink = (ours, theirs) if node_drives else (theirs, ours)
            m.submodules[f"{echo_port}_skid"] = buffer = SkidBuffer(source.payload.shape())
            wiring.connect(m, source, buffer.i)
            wiring.connect(m, buffer.o, sink)
        return m
