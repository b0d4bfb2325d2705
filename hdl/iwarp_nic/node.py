"""A network node: the Ethernet MAC for its PHY and the IP layer above it, as one component.

::

  PHY pins ─ MAC (GmiiMac | XgmiiMac) ─ o ─ FIFO ─────── i ─ IpStack ─ o_tcp_*, i_tcp_*
                                      ─ i ─ PacketFifo ─ o ─

* :class:`MacIp`: the MAC and the :class:`~iwarp_nic.ip.IpStack` joined back to back, with the
  ports a node exposes for them (PHY pins, addresses, counters). Nodes build on it: :class:`IpNode`
  passes the stack's TCP ports through; a TCP node attaches its engine to them instead.
* :class:`IpNode`: :class:`MacIp` with the TCP ports outside, for testbenches that play TCP.

Clock domains. By default one, ``sync``, for the MAC and the stack, at the same width. With
``mac_bytes`` narrower than ``data_bytes`` (GMII's one byte under a two-byte core: 125 MHz on
the line, 62.5 MHz in the core), the MAC runs at its own width in a domain of its own, ``mac``,
and the frames cross (:mod:`iwarp_nic.eth.cdc`) with the width converters of
:mod:`iwarp_nic.width` on the MAC's side::

  PHY pins ─ MAC ─ BeatUpsizer ─ MacRxCrossing ─── IpStack (sync)
     (mac)     ─ BeatDownsizer ─ MacTxCrossing ───
"""

from amaranth import DomainRenamer, Module
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .eth import RX_COUNTERS as MAC_RX_COUNTERS
from .eth import TX_COUNTERS as MAC_TX_COUNTERS
from .eth import GmiiMac, XgmiiMac
from .eth.cdc import CountCrossing, MacRxCrossing, MacTxCrossing, count_bits
from .fifo import PacketFifo
from .ip import IpStack
from .ip.stack import COUNTERS
from .stream import BeatLayout, SkidBuffer
from .width import BeatDownsizer, BeatUpsizer

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

    With ``mac_bytes`` (narrower than ``data_bytes``) the MAC is of that width, in the ``mac``
    domain, and the FIFOs are the crossings of :mod:`iwarp_nic.eth.cdc`, each two maximum
    frames deep, with a :class:`~iwarp_nic.width.BeatUpsizer` before the RX one and a
    :class:`~iwarp_nic.width.BeatDownsizer` after the TX one, both in ``mac``:

    * RX: the crossing never stalls the MAC; a frame that finds it full is cut and counted in
      ``rx_crossing_overflows`` (an extra member). The core must take
      the line's bytes at the line's rate on average: ``data_bytes`` times its clock at least
      ``mac_bytes`` times the MAC's (62.5 MHz at two bytes for GMII's 125 MHz at one).
    * TX: a frame crosses whole before the MAC starts it, as from the FIFO; a frame the stack
      aborts is sent with its FCS inverted (:class:`~iwarp_nic.eth.TxFramer`), so receivers
      drop it, instead of being dropped here.
    * The MAC's pins are in the ``mac`` domain. Its counters, and ``rx_crossing_overflows``,
      are counted again in ``sync``, each through a :class:`~iwarp_nic.eth.cdc.CountCrossing`
      (a few Gray-coded bits of the MAC's count, :func:`~iwarp_nic.eth.cdc.count_bits` of the
      clock ratio that ``data_bytes / mac_bytes`` allows), so the host reads every counter in
      ``sync``, whole, two or three cycles behind the MAC's.

    Contracts are otherwise those of the MAC (:class:`~iwarp_nic.eth.MacComponent`) and the
    stack; the FIFOs add a cycle or two of latency (the crossings two or three cycles of the
    receiving clock), and on TX the time to store the frame (plus one cycle for a skid buffer
    in front of the TX FIFO, which keeps the FIFO's ready out of the stack's TX path).
    """

    def __init__(self, data_bytes, *, mac_bytes=None, **ip_params):
        self.crossing = mac_bytes is not None and mac_bytes != data_bytes
        self.mac_bytes = mac_bytes if self.crossing else data_bytes
        mac = mac_for(self.mac_bytes)
        if self.crossing and not self.mac_bytes < data_bytes:
            raise ValueError(f"mac_bytes ({mac_bytes}) must be at most data_bytes "
                             f"({data_bytes})")
        self.mac = DomainRenamer("mac")(mac) if self.crossing else mac
        self.stack = IpStack(data_bytes, **ip_params)
        self.data_bytes = data_bytes
        self.longest = -(-(mac.max_frame - 4) // data_bytes)  # beats of a frame, no FCS
        if self.crossing:
            self.rx_crossing = MacRxCrossing(data_bytes)
            self.tx_crossing = MacTxCrossing(data_bytes)
        else:
            self.tx_fifo = PacketFifo(data_bytes, 2 * self.longest, overflow="stall")
        mac_ports = {name: member for name, member in mac.signature.members.items()
                     if name not in ("i", "o")}
        # The RX crossing's own counter, driven by _wire_crossing.
        crossing_ports = {"rx_crossing_overflows": Out(32)} if self.crossing else {}
        # Counters the MAC's domain keeps and `sync` reads (each through a CountCrossing).
        self._crossed = ((*MAC_RX_COUNTERS, *MAC_TX_COUNTERS, *crossing_ports)
                         if self.crossing else ())
        stack_ports = {name: self.stack.signature.members[name]
                       for name in ("mac", "ip", *COUNTERS)}
        clash = set(mac_ports | crossing_ports) & set(stack_ports)
        if clash:
            raise ValueError(f"MAC and IP ports share names: {sorted(clash)}")
        self._mac_ports, self._stack_ports = mac_ports, stack_ports
        self.members = {**mac_ports, **crossing_ports, **stack_ports}

    def wire(self, m, node):
        """Add the MAC and the stack to ``m`` and connect them to ``node``'s :attr:`members`."""
        m.submodules.mac = mac = self.mac
        m.submodules.ip = stack = self.stack
        # A skid buffer between the stack and the TX FIFO or crossing, so that its ready (a free
        # count) does not run back through the stack's TX arbiters into its blocks.
        m.submodules.tx_skid = tx_skid = SkidBuffer(stack.o.payload.shape())
        wiring.connect(m, stack.o, tx_skid.i)
        if self.crossing:
            self._wire_crossing(m, node, tx_skid)
        else:
            self._wire_fifos(m, tx_skid)
        for block, ports in ((mac, self._mac_ports), (stack, self._stack_ports)):
            for name, member in ports.items():
                if name not in self._crossed:
                    outer, inner = getattr(node, name), getattr(block, name)
                    m.d.comb += inner.eq(outer) if member.flow == In else outer.eq(inner)

    def _wire_crossing(self, m, node, tx_skid):
        mac, stack = self.mac, self.stack
        up = DomainRenamer("mac")(BeatUpsizer(self.mac_bytes, self.data_bytes, err=True))
        down = DomainRenamer("mac")(BeatDownsizer(self.data_bytes, self.mac_bytes, err=True))
        m.submodules.rx_upsizer, m.submodules.tx_downsizer = up, down
        m.submodules.rx_crossing = rx = self.rx_crossing
        m.submodules.tx_crossing = tx = self.tx_crossing
        wiring.connect(m, mac.o, up.i)
        wiring.connect(m, up.o, rx.i)
        wiring.connect(m, rx.o, stack.i)
        wiring.connect(m, tx_skid.o, tx.i)
        # A skid buffer between the crossing and the downsizer, so that the FIFO's read enable
        # is a register, not the downsizer's choice of its last narrow beat.
        m.submodules.tx_mac_skid = tx_mac_skid = DomainRenamer("mac")(
            SkidBuffer(BeatLayout(self.data_bytes, err=True)))
        wiring.connect(m, tx.o, tx_mac_skid.i)
        wiring.connect(m, tx_mac_skid.o, down.i)
        # And one before the MAC, so the framer's decisions start from registers, not from the
        # downsizer's choice of lanes.
        m.submodules.tx_line_skid = tx_line_skid = DomainRenamer("mac")(
            SkidBuffer(BeatLayout(self.mac_bytes, err=True)))
        wiring.connect(m, down.o, tx_line_skid.i)
        wiring.connect(m, tx_line_skid.o, mac.i)
        bits = count_bits(self.data_bytes // self.mac_bytes)
        for name in self._crossed:
            counted = rx.overflows if name == "rx_crossing_overflows" else getattr(mac, name)
            crossing = CountCrossing(bits)
            m.submodules[f"{name}_crossing"] = crossing
            m.d.comb += [crossing.i.eq(counted[:bits]), getattr(node, name).eq(crossing.o)]

    def _wire_fifos(self, m, tx_skid):
        mac, stack = self.mac, self.stack
        m.submodules.tx_fifo = self.tx_fifo
        m.submodules.rx_fifo = rx_fifo = SyncFIFOBuffered(
            width=BeatLayout(self.data_bytes, err=True).size, depth=self.longest)
        m.d.comb += [rx_fifo.w_data.eq(mac.o.payload), rx_fifo.w_en.eq(mac.o.valid),
                     mac.o.ready.eq(rx_fifo.w_rdy), stack.i.payload.eq(rx_fifo.r_data),
                     stack.i.valid.eq(rx_fifo.r_rdy), rx_fifo.r_en.eq(stack.i.ready)]
        wiring.connect(m, tx_skid.o, self.tx_fifo.i)
        tx = self.tx_fifo.o
        m.d.comb += [mac.i.payload.data.eq(tx.payload.data),
                     mac.i.payload.keep.eq(tx.payload.keep),
                     mac.i.payload.last.eq(tx.payload.last), mac.i.valid.eq(tx.valid),
                     tx.ready.eq(mac.i.ready)]


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
    a width with no MAC. ``mac_bytes``: a narrower MAC in its own domain (:class:`MacIp`).
    """

    def __init__(self, data_bytes, *, mac_bytes=None, **ip_params):
        self.data_bytes = data_bytes
        self._core = MacIp(data_bytes, mac_bytes=mac_bytes, **ip_params)
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
    ``engine`` parameters go to the engine, ``ip_params`` to the IP layer; ``mac_bytes`` is
    :class:`MacIp`'s (a narrower MAC in its own domain).
    """

    def __init__(self, data_bytes, *, mac_bytes=None, engine=None, **ip_params):
        from .tcp.engine import COUNTERS as TCP_COUNTERS
        from .tcp.engine import TcpEngine

        self.data_bytes = data_bytes
        self._core = MacIp(data_bytes, mac_bytes=mac_bytes, **ip_params)
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
