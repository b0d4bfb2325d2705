"""A network node: the Ethernet MAC for its PHY and the IP layer above it, as one component.

::

  PHY pins ─ MAC (GmiiMac | XgmiiMac) ─ o ─ FIFO ─────── i ─ IpStack ─ o_tcp_*, i_tcp_*
                                      ─ i ─ PacketFifo ─ o ─

* :class:`MacIp`: the MAC and the :class:`~iwarp_nic.ip.IpStack` joined back to back, with the
  ports a node exposes for them (PHY pins, addresses, counters). Nodes build on it: :class:`IpNode`
  passes the stack's TCP ports through; a TCP node attaches its engine to them instead.
* :class:`IpNode`: :class:`MacIp` with the TCP ports outside, for testbenches that play TCP.

One clock domain, ``sync``, for the MAC and the stack (the MAC's clock-domain crossing is left
out: see :mod:`iwarp_nic.eth.mac`).
"""

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .eth import GmiiMac, XgmiiMac
from .fifo import PacketFifo
from .ip import IpStack
from .ip.stack import COUNTERS
from .stream import BeatLayout

__all__ = ["mac_for", "forward", "MacIp", "IpNode", "TcpNode", "TCP_PORTS"]

#: The IpStack ports that carry TCP: received datagrams out, segments to send in.
TCP_PORTS = ("o_tcp_header", "o_tcp_payload", "i_tcp_header", "i_tcp_payload")


def mac_for(data_bytes):
    """The MAC whose PHY interface carries ``data_bytes`` per cycle: GMII (1) or XGMII (8)."""
    macs = {1: GmiiMac, 8: XgmiiMac}
    if data_bytes not in macs:
        raise ValueError(f"no MAC has a {data_bytes}-byte PHY interface: data_bytes must be "
                         f"1 (GMII) or 8 (XGMII)")
    return macs[data_bytes]()


def forward(m, member, outer, inner):
    """Join a component's port ``outer`` to the same port ``inner`` of a block inside it:
    ``member`` is the port's signature member (a stream or a plain signal, either flow)."""
    if member.is_signature:
        if member.flow == In:
            wiring.connect(m, wiring.flipped(outer), inner)
        else:
            wiring.connect(m, inner, wiring.flipped(outer))
    else:
        m.d.comb += inner.eq(outer) if member.flow == In else outer.eq(inner)


class MacIp:
    """The MAC for ``data_bytes`` and an :class:`~iwarp_nic.ip.IpStack` of the same width, wired
    for a node component to embed.

    :attr:`members` are the node ports it drives: the MAC's PHY pins (their MAC names), ``mac``
    and ``ip`` (``In(48)``, ``In(32)``), and every counter of the MAC (:data:`~iwarp_nic.eth.
    RX_COUNTERS`, :data:`~iwarp_nic.eth.TX_COUNTERS`) and of the stack (:data:`~iwarp_nic.ip.
    stack.COUNTERS`) under its own name (the names do not collide; a collision raises
    ``ValueError``). :meth:`wire` adds both to a module, joins MAC RX to stack RX and stack TX to
    MAC TX through a FIFO each, and connects those ports; the stack's TCP ports are left to the
    node (:attr:`stack`). ``ip_params`` go to the stack (ARP cache size, retries, timeout).

    The FIFOs are there because the MAC cannot wait (:mod:`iwarp_nic.eth.mac`):

    * RX: a FIFO of one maximum frame (:attr:`longest` beats) absorbs the stack's stalls (it
      holds its input while an echo reply waits for the TX side). A frame that finds it full is
      cut by the MAC and counted in ``rx_overflows``.
    * TX: :attr:`tx_fifo`, a :class:`~iwarp_nic.fifo.PacketFifo` of two maximum frames (it
      stalls the stack when full), hands the MAC a frame only once it is whole, so its beats
      come on consecutive cycles. A frame the stack aborts (``err``: an echo reply whose request
      turned out bad) is dropped there and never sent. The stack must not send a frame longer
      than the MAC's ``max_frame`` (it would never be whole: the FIFO would lock up).

    Contracts are otherwise those of the MAC (:class:`~iwarp_nic.eth.MacComponent`) and the
    stack; the FIFOs add a cycle or two of latency, and on TX the time to store the frame.
    """

    def __init__(self, data_bytes, **ip_params):
        self.mac = mac_for(data_bytes)
        self.stack = IpStack(data_bytes, **ip_params)
        self.data_bytes = data_bytes
        self.longest = -(-(self.mac.max_frame - 4) // data_bytes)  # beats of a frame, no FCS
        self.tx_fifo = PacketFifo(data_bytes, 2 * self.longest, overflow="stall")
        mac_ports = {name: member for name, member in self.mac.signature.members.items()
                     if name not in ("i", "o")}
        stack_ports = {name: self.stack.signature.members[name]
                       for name in ("mac", "ip", *COUNTERS)}
        clash = set(mac_ports) & set(stack_ports)
        if clash:
            raise ValueError(f"MAC and IP ports share names: {sorted(clash)}")
        self._mac_ports, self._stack_ports = mac_ports, stack_ports
        self.members = {**mac_ports, **stack_ports}

    def wire(self, m, node):
        """Add the MAC and the stack to ``m`` and connect them to ``node``'s :attr:`members`."""
        m.submodules.mac = mac = self.mac
        m.submodules.ip = stack = self.stack
        m.submodules.tx_fifo = self.tx_fifo
        m.submodules.rx_fifo = rx_fifo = SyncFIFOBuffered(
            width=BeatLayout(self.data_bytes, err=True).size, depth=self.longest)
        m.d.comb += [rx_fifo.w_data.eq(mac.o.payload), rx_fifo.w_en.eq(mac.o.valid),
                     mac.o.ready.eq(rx_fifo.w_rdy), stack.i.payload.eq(rx_fifo.r_data),
                     stack.i.valid.eq(rx_fifo.r_rdy), rx_fifo.r_en.eq(stack.i.ready)]
        wiring.connect(m, stack.o, self.tx_fifo.i)
        tx = self.tx_fifo.o
        m.d.comb += [mac.i.payload.data.eq(tx.payload.data),
                     mac.i.payload.keep.eq(tx.payload.keep),
                     mac.i.payload.last.eq(tx.payload.last), mac.i.valid.eq(tx.valid),
                     tx.ready.eq(mac.i.ready)]
        for block, ports in ((self.mac, self._mac_ports), (self.stack, self._stack_ports)):
            for name, member in ports.items():
                outer, inner = getattr(node, name), getattr(block, name)
                m.d.comb += inner.eq(outer) if member.flow == In else outer.eq(inner)


class IpNode(wiring.Component):
    """A MAC and the IP layer, with the TCP ports outside: GMII at ``data_bytes=1``, XGMII at 8.

    Ports
    -----
    PHY pins : those of :class:`~iwarp_nic.eth.GmiiMac` (``gmii_rxd/rx_dv/rx_er``,
        ``gmii_txd/tx_en/tx_er``) or :class:`~iwarp_nic.eth.XgmiiMac` (``xgmii_rxd/rxc``,
        ``xgmii_txd/txc``).
    mac, ip : In(48), In(32)
        Our addresses.
    o_tcp_header, o_tcp_payload, i_tcp_header, i_tcp_payload
        The :class:`~iwarp_nic.ip.IpStack` TCP ports, unchanged.
    counters : Out(32) each, the MAC's (``rx_frames_ok``, ``rx_bad_fcs``, ..., ``tx_frames``,
        ``tx_underruns``) and the stack's (``eth_runt``, ..., ``icmp_replies``, ...).

    Latency and throughput are the sums of the MAC's and the stack's; raises ``ValueError`` for
    a width with no MAC.
    """

    def __init__(self, data_bytes, **ip_params):
        self.data_bytes = data_bytes
        self._core = MacIp(data_bytes, **ip_params)
        stack = self._core.stack.signature.members
        super().__init__({**self._core.members, **{name: stack[name] for name in TCP_PORTS}})

    def elaborate(self, platform):
        m = Module()
        self._core.wire(m, self)
        stack = self._core.stack
        wiring.connect(m, stack.o_tcp_header, wiring.flipped(self.o_tcp_header))
        wiring.connect(m, stack.o_tcp_payload, wiring.flipped(self.o_tcp_payload))
        wiring.connect(m, wiring.flipped(self.i_tcp_header), stack.i_tcp_header)
        wiring.connect(m, wiring.flipped(self.i_tcp_payload), stack.i_tcp_payload)
        return m


class TcpNode(wiring.Component):
    """A MAC, the IP layer and the TCP engine: a host's network stack up to its byte streams.

    Ports: those of :class:`IpNode` but the TCP ones (PHY pins, ``mac``, ``ip``, the MAC and IP
    counters), then the :class:`~iwarp_nic.tcp.engine.TcpEngine`'s host side unchanged
    (``i_cmd``, ``o_event``, ``i_tx_header``, ``i_tx``, ``o_rx_header``, ``o_rx``,
    ``isn_key``, ``hash_key``, ``stat_conn``, ``stat_*``) and its counters as ``tcp_<name>``.
    ``engine`` parameters go to the engine, ``ip_params`` to the IP layer.
    """

    def __init__(self, data_bytes, *, engine=None, **ip_params):
        from .tcp.engine import COUNTERS as TCP_COUNTERS
        from .tcp.engine import TcpEngine

        self.data_bytes = data_bytes
        self._core = MacIp(data_bytes, **ip_params)
        self.engine = TcpEngine(data_bytes, **(engine or {}))
        self._counters = TCP_COUNTERS
        host = {name: member for name, member in self.engine.signature.members.items()
                if not name.startswith(("i_ip", "o_ip")) and name not in TCP_COUNTERS
                and name != "ip"}
        counters = {f"tcp_{name}": Out(32) for name in TCP_COUNTERS}
        clash = set(self._core.members) & (set(host) | set(counters))
        if clash:
            raise ValueError(f"node ports share names: {sorted(clash)}")
        self._host = host
        super().__init__({**self._core.members, **host, **counters})

    def elaborate(self, platform):
        m = Module()
        self._core.wire(m, self)
        stack, engine = self._core.stack, self.engine
        m.submodules.tcp = engine
        wiring.connect(m, stack.o_tcp_header, engine.i_ip_header)
        wiring.connect(m, stack.o_tcp_payload, engine.i_ip)
        wiring.connect(m, engine.o_ip_header, stack.i_tcp_header)
        wiring.connect(m, engine.o_ip, stack.i_tcp_payload)
        m.d.comb += engine.ip.eq(self.ip)
        for name, member in self._host.items():
            forward(m, member, getattr(self, name), getattr(engine, name))
        for name in self._counters:
            m.d.comb += getattr(self, f"tcp_{name}").eq(getattr(engine, name))
        return m
