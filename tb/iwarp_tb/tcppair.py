"""Two TCP nodes back to back in one module: a test and benchmark fixture, not product gateware.

:class:`TcpPair` puts two :class:`~iwarp_nic.node.TcpNode` (``a`` and ``b``) in one top, each
one's PHY TX pins wired to the other's RX pins through one register stage (the wire), so a
whole TCP conversation runs inside a native :class:`~iwarp_tb.harness.Harness` at full speed:
no Python between the two ends. :class:`PairRig` builds it with a
:class:`~iwarp_tb.tcphost.TcpHost` per node.

Port names: every node port but the PHY pins, with the node's letter after the stream
direction (``i_cmd`` becomes ``i_a_cmd``, AXI ``s_axis_a_cmd``; ``o_rx`` becomes ``o_b_rx``,
``m_axis_b_rx``) or in front of a plain port (``a_mac``, ``b_ip``, ``a_tcp_rx_segments``).
"""

import hashlib
import random

from amaranth import Module
from amaranth.lib import wiring

from iwarp_nic.node import TcpNode, forward

from .harness import PHY_PINS, Harness
from .tcphost import TcpHost
from .tcprig import CLOCK_HZ, PHY_BY_WIDTH, NicTimers, ip_int, mac_int

__all__ = ["TcpPair", "PairRig", "NODES", "join_wire"]

NODES = ("a", "b")

#: Each PHY's wire: a TX pin and the RX pin of the other node it drives.
WIRE = {
    "gmii": {"gmii_txd": "gmii_rxd", "gmii_tx_en": "gmii_rx_dv", "gmii_tx_er": "gmii_rx_er"},
    "xgmii": {"xgmii_txd": "xgmii_rxd", "xgmii_txc": "xgmii_rxc"},
}


def _outer_name(node, name):
    """The pair's name for port ``name`` of node ``node``."""
    for direction in ("i_", "o_"):
        if name.startswith(direction):
            return f"{direction}{node}_{name[2:]}"
    return f"{node}_{name}"


class TcpPair(wiring.Component):
    """Nodes ``a`` and ``b`` (:class:`~iwarp_nic.node.TcpNode` of ``data_bytes``: GMII at 1,
    XGMII at 8) joined by a wire of one register per direction: each TX pin reaches the other
    node's RX pin one cycle later. ``engine`` parameters go to both engines.

    Ports: each node's, PHY pins excepted, renamed as the module docstring says. The nodes are
    independent: each needs its own ``mac``, ``ip`` and keys.
    """

    def __init__(self, data_bytes, **engine):
        self.data_bytes = data_bytes
        self.phy = PHY_BY_WIDTH[data_bytes]
        self.nodes = {node: TcpNode(data_bytes, engine=engine) for node in NODES}
        pins = PHY_PINS[self.phy]
        self._host = {name: member for name, member
                      in self.nodes["a"].signature.members.items() if name not in pins}
        super().__init__({_outer_name(node, name): member
                          for node in NODES for name, member in self._host.items()})

    def elaborate(self, platform):
        m = Module()
        for node, block in self.nodes.items():
            m.submodules[node] = block
            for name, member in self._host.items():
                forward(m, member, getattr(self, _outer_name(node, name)),
                        getattr(block, name))
        join_wire(m, self.phy, self.nodes["a"], self.nodes["b"])
        return m


def join_wire(m, phy, a, b):
    """The wire between the ``phy`` pins of blocks ``a`` and ``b``: each TX pin reaches the
    other block's RX pin through one register."""
    for tx, rx in WIRE[phy].items():
        for src, dst in ((a, b), (b, a)):
            m.d.sync += getattr(dst, rx).eq(getattr(src, tx))


class PairRig:
    """A :class:`TcpPair` of ``width`` bytes built natively, its addresses and keys set, and a
    :class:`~iwarp_tb.tcphost.TcpHost` per node (:attr:`hosts`, by node letter) handing over
    chunks of up to ``chunk`` bytes, ``in_flight`` at a time. Engine parameters as
    :class:`~iwarp_tb.tcprig.NicRig`'s (``timers`` by default
    :class:`~iwarp_tb.tcprig.NicTimers`); :attr:`ips` and :attr:`macs` are the nodes' addresses
    (integers)."""

    def __init__(self, width, *, conns=4, ring_bytes=1 << 16, rx_buffer_bytes=1 << 16,
                 timers=None, seed=1, chunk=8192, in_flight=32):
        self.width = width
        self.clock_hz = CLOCK_HZ[width]
        engine = dict(conns=conns, ring_bytes=ring_bytes, rx_buffer_bytes=rx_buffer_bytes,
                      **(timers or NicTimers()).engine_params(self.clock_hz))
        params = ("TcpPair", width, sorted(engine.items()))
        name = f"iwarp_tcp_pair_w{width}_" + hashlib.sha256(repr(params).encode()).hexdigest()[:8]
        self.h = Harness(name, TcpPair(width, **engine), clock_mhz=self.clock_hz / 1e6,
                         seed=seed, params=params)
        rng = random.Random(seed)
        self.macs = {node: mac_int(f"02:00:00:00:00:{k + 1:02x}") for k, node in enumerate(NODES)}
        self.ips = {node: ip_int(f"169.254.20.{k + 1}") for k, node in enumerate(NODES)}
        self.hosts = {}
        for node in NODES:
            self.h.set(f"{node}_mac", self.macs[node])
            self.h.set(f"{node}_ip", self.ips[node])
            self.h.set(f"{node}_isn_key", rng.getrandbits(128))
            self.h.set(f"{node}_hash_key", rng.getrandbits(32))
            self.hosts[node] = TcpHost(self.h, conns, chunk=min(chunk, ring_bytes),
                                       in_flight=in_flight, prefix=f"{node}_")

    def service(self):
        for host in self.hosts.values():
            host.service()

    def run(self, until, *, timeout_cycles, cycles=2000):
        """Service both hosts and run the clock in slices of ``cycles`` until ``until()``;
        AssertionError after ``timeout_cycles``."""
        end = self.h.cycle + timeout_cycles
        while not until():
            if self.h.cycle > end:
                raise AssertionError(f"not done after {timeout_cycles} cycles")
            self.service()
            self.h.run(cycles)
            self.service()

    def open(self, conn=0, port=5000, local_port=40000):
        """Slot ``conn`` of ``a`` listens on ``port``, the same slot of ``b`` connects to it;
        returns when both are ESTABLISHED."""
        a, b = self.hosts["a"], self.hosts["b"]
        a.listen(conn, port)
        self.h.run(200)
        b.connect(conn, local_port, self.ips["a"], port)
        self.run(lambda: a.slots[conn].peer is not None and b.slots[conn].peer is not None,
                 timeout_cycles=200_000)

    def transfer(self, data, conn=0, *, slice_cycles=20_000, timeout_cycles=None):
        """Send ``data[node]`` from each node to the other on slot ``conn`` (open, both
        directions at once) and return, per sending node, the cycles from the first byte taken
        by its engine (its first beat accepted on ``i_<node>_tx``) to the last byte out of the
        peer's ``o_rx``, both counted. The clock runs in slices of ``slice_cycles`` between
        services, then output by output once a direction may end within a slice, so both ends
        are exact. AssertionError if a peer received other bytes than those sent, or after
        ``timeout_cycles`` (by default four times the bytes per byte of width)."""
        h, hosts = self.h, self.hosts
        peer = dict(zip(NODES, reversed(NODES)))
        sizes = {node: len(data[node]) for node in NODES}
        timeout = timeout_cycles or 4 * max(sizes.values()) // self.width + 100_000
        for node in NODES:
            hosts[node].send(conn, data[node])
        self.service()
        queued = {node: h.pending(f"s_axis_{node}_tx") for node in NODES}
        end = h.cycle + timeout
        first, last = {}, {}
        while len(first) < len(NODES) and h.cycle < end:
            h.run(1)
            for node in NODES:
                if node not in first and h.pending(f"s_axis_{node}_tx") < queued[node]:
                    first[node] = h.cycle - 1

        def delivered(node):
            return len(hosts[peer[node]].slots[conn].received)

        while len(last) < len(NODES):
            if h.cycle > end:
                done = {node: delivered(node) for node in NODES}
                raise AssertionError(f"transfer not done after {timeout} cycles: {done} of "
                                     f"{sizes} bytes delivered")
            near = any(sizes[n] - delivered(n) <= slice_cycles * self.width
                       for n in NODES if n not in last)
            h.run(slice_cycles, until_output=near)
            self.service()
            for node in NODES:
                if node not in last and delivered(node) >= sizes[node]:
                    last[node] = h.cycle - 1
        for node in NODES:
            if bytes(hosts[peer[node]].slots[conn].received) != bytes(data[node]):
                raise AssertionError(f"{peer[node]} received other bytes than {node} sent")
        return {node: last[node] - first[node] + 1 for node in NODES}

    def close(self):
        self.h.close()
