"""Two NICs back to back in one module: a test and benchmark fixture, not product gateware.

:class:`NicPair` holds two instances of :class:`~iwarp_nic.core.NicCore`'s Verilog (``a`` and
``b``) whose PHY pins are joined by a wire of one register per direction (as
:class:`~iwarp_tb.tcppair.TcpPair` joins two TCP nodes), so whole RDMA conversations run
inside a native :class:`~iwarp_tb.harness.Harness` with no Python between the NICs: each
NIC's host memory (``a_m_axi``, ``b_m_axi``) and registers (``a_s_axil``, ``b_s_axil``) are
the harness's.
"""

import hashlib

from amaranth import ClockSignal, Instance, Module, ResetSignal
from amaranth.hdl._ir import PortDirection
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from iwarp_model.verbs import QpState
from iwarp_nic.axis import axi_ports
from iwarp_nic.core import NicCore
from iwarp_nic.node import forward

from .driver import NicDevice, run_until
from .harness import PHY_PINS, Harness
from .runner import write_verilog
from .tcppair import NODES, join_wire
from .tcprig import CLOCK_HZ, PHY_BY_WIDTH, ip_int, mac_int

__all__ = ["NicPair", "NicPairRig", "TwoNics", "RX_LOSSES", "core_params", "core_module"]

#: The counter registers of received frames or segments a NIC dropped: a bad FCS, the MAC's
#: receive FIFO full, TCP's receive front end discarding a cut frame, the receive buffer full.
RX_LOSSES = ("mac_rx_bad_fcs", "mac_rx_overflows", "tcp_rx_front_discarded",
             "tcp_rx_no_buffer")


class NicPair(wiring.Component):
    """NICs ``a`` and ``b`` of ``data_bytes`` (GMII at 1, XGMII at 8): two instances of the
    Verilog module ``core_module``, a :class:`~iwarp_nic.core.NicCore` whose signature is
    ``core``; each TX pin reaches the other NIC's RX pin one cycle later. Ports: every NIC
    port but the PHY pins, with the NIC's letter in front (``a_s_axil``, ``b_m_axi``,
    ``a_irq``), and each NIC's TX pins as outputs for the harness's taps
    (``tap_a_xgmii_txd``: what ``a`` sends).

    The NICs are instances of one module rather than two copies of the design, so that the
    NIC is converted to Verilog once, and the same Verilog serves the NicCore test. (Verilator
    still compiles each instance's logic on its own.)"""

    def __init__(self, data_bytes, core, core_module):
        self.data_bytes = data_bytes
        self.phy = PHY_BY_WIDTH[data_bytes]
        self.core_module = core_module
        self.nics = {nic: core.create(path=(nic,)) for nic in NODES}
        pins = PHY_PINS[self.phy]
        self._host = {name: member for name, member in core.members.items() if name not in pins}
        self._tx = [pin for pin, way in pins.items() if way == "out"]
        super().__init__({
            **{f"{nic}_{name}": member for nic in NODES for name, member in self._host.items()},
            **{f"tap_{nic}_{pin}": Out(len(getattr(self.nics[nic], pin)))
               for nic in NODES for pin in self._tx}})

    def elaborate(self, platform):
        m = Module()
        for nic, core in self.nics.items():
            ports = {("i_" if way == PortDirection.Input else "o_") + port: value
                     for port, (value, way) in axi_ports(core).items()}
            m.submodules[nic] = Instance(self.core_module, i_clk=ClockSignal(),
                                         i_rst=ResetSignal(), **ports)
            for name, member in self._host.items():
                forward(m, member, getattr(self, f"{nic}_{name}"), getattr(core, name))
            m.d.comb += [getattr(self, f"tap_{nic}_{pin}").eq(getattr(core, pin))
                         for pin in self._tx]
        join_wire(m, self.phy, self.nics["a"], self.nics["b"])
        return m


def core_params(width, **core):
    """What determines a NicCore's Verilog (:func:`~iwarp_tb.runner.write_verilog`'s
    ``params``): with no ``core`` parameters, NicPairRig's NIC and the NicCore test's are one
    file."""
    return ("NicCore", width, sorted(core.items()))


def core_module(width, **core):
    """The Verilog module name of a NicCore of ``width`` bytes with ``core`` parameters:
    ``iwarp_nic_core_w<width>``, with a digest of the parameters behind it when there are
    any."""
    if not core:
        return f"iwarp_nic_core_w{width}"
    digest = hashlib.sha256(repr(core_params(width, **core)).encode()).hexdigest()
    return f"iwarp_nic_core_w{width}_{digest[:8]}"


class TwoNics:
    """What a rig of NICs ``a`` and ``b`` (:attr:`ips`, their IPv4 addresses as integers,
    and ``run_until``) does the same way however they are joined."""

    def connect(self, qps, port=4791, **options):
        """Open queue pairs ``qps`` (``{letter: NicQp}``): ``b``'s listens on ``port``,
        ``a``'s connects to it, both with MPA ``options``; returns once both are in RTS."""
        qps["b"].listen(port, **options)
        qps["a"].connect(self.ips["b"], port, 40000 + qps["a"].qp_num, **options)
        self.run_until(lambda: all(qp.state != QpState.RTR for qp in qps.values()),
                       timeout_cycles=2_000_000)
        for qp in qps.values():
            if qp.state != QpState.RTS:
                raise AssertionError(f"{qp!r}: {qp.reason}")


class NicPairRig(TwoNics):
    """A :class:`NicPair` of ``width`` bytes built natively, each NIC with its
    :class:`~iwarp_tb.driver.NicDevice` (:attr:`devices`, by letter) and host memory of
    ``memory_bytes``; ``trace`` as :class:`~iwarp_tb.harness.Harness`'s. The frames each NIC
    sends are recorded (:meth:`frames`). :attr:`ips` are the NICs' IPv4
    addresses (integers)."""

    def __init__(self, width, *, seed=1, trace=None, memory_bytes=1 << 24, **core):
        params = ("NicPair", "instances", width, sorted(core.items()))
        suffix = f"_{hashlib.sha256(repr(params).encode()).hexdigest()[:8]}" if core else ""
        nic = NicCore(width, **core)
        module = core_module(width, **core)
        source = write_verilog(module, nic, params=core_params(width, **core))
        self.width = width
        self.h = Harness(f"iwarp_nic_pair_w{width}{suffix}",
                         NicPair(width, nic.signature, module),
                         clock_mhz=CLOCK_HZ[width] / 1e6, seed=seed, params=params,
                         trace=trace, memory_bytes=memory_bytes,
                         taps=[f"tap_{nic}" for nic in NODES], sources=[source])
        self.ips = {nic: ip_int(f"169.254.30.{k + 1}") for k, nic in enumerate(NODES)}
        self.devices = {nic: NicDevice(self.h, prefix=f"{nic}_", seed=seed + k,
                                       mac=mac_int(f"02:00:00:00:01:{k + 1:02x}"),
                                       ip=self.ips[nic], heap=(1 << 16, memory_bytes - (1 << 16)))
                        for k, nic in enumerate(NODES)}

    def host_latency(self, ns):
        """Both NICs' host memory answering after ``ns`` nanoseconds of this clock, with no
        stalls."""
        for k, device in enumerate(self.devices.values()):
            device.memory.configure(latency=round(ns * self.h.clock_mhz / 1000), seed=k)

    def run_until(self, condition, *, timeout_cycles, slice_cycles=256):
        run_until(self.h, self.devices.values(), condition, timeout_cycles=timeout_cycles,
                  slice_cycles=slice_cycles)

    def losses(self, quiet_cycles=2000):
        """After ``quiet_cycles`` more cycles (for the frames on their way), what each NIC lost
        of the frames the other sent, read from both NICs' counter registers: ``{letter:
        {name: count}}``, each nonzero one of :data:`RX_LOSSES` and ``not_taken`` (frames the
        other's MAC sent that this one did not count as received good); ``{}`` per NIC when
        it lost nothing. The link itself loses nothing, so anything here is the NIC's."""
        self.h.run(quiet_cycles)
        counters = {nic: device.counters() for nic, device in self.devices.items()}
        found = {}
        for nic, peer in zip(NODES, reversed(NODES)):
            lost = {name: counters[nic][name] for name in RX_LOSSES if counters[nic][name]}
            not_taken = counters[peer]["mac_tx_frames"] - counters[nic]["mac_rx_frames_ok"]
            found[nic] = {**lost, "not_taken": not_taken} if not_taken else lost
        return found

    def frames(self):
        """The frames both NICs sent since the last call, in the order their last octets
        left (``frame.cycle``)."""
        frames = [f for nic in NODES for f in self.h.tap_frames(f"tap_{nic}")]
        return sorted(frames, key=lambda f: f.cycle)

    def close(self):
        self.h.close()
