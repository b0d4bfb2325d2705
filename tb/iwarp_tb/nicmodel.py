"""One NIC against the reference model on one Ethernet segment: a test fixture.

:class:`NicModelRig` holds a :class:`~iwarp_nic.core.NicCore` built natively (the Verilog
:class:`~iwarp_tb.nicpair.NicPairRig` instantiates twice, here the harness's top module, with
the PHY on its pins) and its :class:`~iwarp_tb.driver.NicDevice`, and the model's whole NIC
on the other end of the wire: its TCP/IP (:class:`~iwarp_model.transport.rawtcp.RawStack`,
joined as :class:`~iwarp_tb.tcprig.ModelWire` joins it to a TCP node) with a
:class:`~iwarp_model.transport.frames.FrameEndpoint` making engine
:class:`~iwarp_model.engine.Connection` links on it. Both run on the NIC's simulated time.
Every frame is recorded both ways (:attr:`NicModelRig.captured`, :meth:`NicModelRig.write_pcap`).
"""

from iwarp_model.engine import ConnState
from iwarp_model.pcap import PcapWriter
from iwarp_model.transport.frames import FrameEndpoint
from iwarp_model.verbs import QpState
from iwarp_nic.core import NicCore

from .driver import NicDevice
from .harness import Harness
from .nicpair import core_module, core_params
from .tcprig import CLOCK_HZ, MODEL_TCP, PHY_BY_WIDTH, ModelWire, ip_int, mac_int

__all__ = ["Sliced", "NicModelRig", "one_nic", "NIC_IP", "MODEL_IP"]

NIC_IP = "169.254.40.2"
NIC_MAC = "02:00:00:00:04:02"
MODEL_IP = "169.254.40.1"
MODEL_MAC = "02:00:00:00:04:01"
_SETTLED = (ConnState.ESTABLISHED, ConnState.CLOSED, ConnState.TERMINATED)


def one_nic(width, *, ip, mac, seed=1, memory_bytes=1 << 24, **core):
    """A NicCore of ``width`` bytes (with ``core`` parameters) built natively with its PHY on
    the harness's pins, and its driver at ``ip`` and ``mac`` (strings; TCP keys from
    ``seed``) with host memory of ``memory_bytes``: ``(harness, device)``."""
    h = Harness(core_module(width, **core), NicCore(width, **core), phy=PHY_BY_WIDTH[width],
                clock_mhz=CLOCK_HZ[width] / 1e6, seed=seed, params=core_params(width, **core),
                memory_bytes=memory_bytes)
    device = NicDevice(h, seed=seed, mac=mac_int(mac), ip=ip_int(ip),
                       heap=(1 << 16, memory_bytes - (1 << 16)))
    return h, device


class Sliced:
    """Running a rig of NICs in slices: its ``step(cycles)`` runs one slice and ``cycle``
    counts its NIC cycles. Before each slice, each of :attr:`sources` (objects with
    ``step(rig)`` and ``pending``, frames still to come, such as a
    :class:`~iwarp_tb.fuzz.Injector`) may put frames on the wire."""

    def __init__(self):
        self.sources = []

    def run_until(self, condition, *, timeout_cycles, slice_cycles=1000):
        """Run until ``condition()``; :exc:`TimeoutError` after ``timeout_cycles`` cycles."""
        end = self.cycle + timeout_cycles
        while not condition():
            if self.cycle > end:
                raise TimeoutError(f"not done after {timeout_cycles} cycles")
            self._slice(slice_cycles)

    def run(self, cycles, *, slice_cycles=1000):
        """Run for ``cycles`` cycles."""
        end = self.cycle + cycles
        while self.cycle < end:
            self._slice(slice_cycles)

    def _slice(self, cycles):
        for source in self.sources:
            source.step(self)
        self.step(cycles)


class NicModelRig(Sliced):
    """A NicCore of ``width`` bytes (with ``core`` parameters) at :data:`NIC_IP` with host
    memory of ``memory_bytes`` (:attr:`device`, its driver; TCP keys from ``seed``), and the
    model at :data:`MODEL_IP` (:attr:`stack`, :attr:`endpoint`) on a wire of ``delay``
    seconds each way with the model TCP ``config``, impaired as ``impair`` says (keyword
    arguments of :class:`~iwarp_model.transport.impair.Link`, both ways; :attr:`wire`'s
    ``to_nic`` and ``to_model`` count what was done).

    :meth:`run_until` (:class:`Sliced`) moves both ends: NIC cycles in slices, the device's
    events serviced, frames carried and the model's timers run between slices.
    :attr:`captured` is every frame in the order it was put on the wire: ``(seconds, sender,
    frame)``, the sender ``"nic"`` or ``"model"``."""

    def __init__(self, width=8, *, seed=1, memory_bytes=1 << 24, delay=2e-6, config=MODEL_TCP,
                 impair=None, core=None):
        super().__init__()
        self.h, self.device = one_nic(width, ip=NIC_IP, mac=NIC_MAC, seed=seed,
                                      memory_bytes=memory_bytes, **(core or {}))
        self.clock_hz = CLOCK_HZ[width]
        self.ip = ip_int(NIC_IP)
        self.host = self.device         # what ModelWire services between slices
        self.wire = ModelWire(self, mac=MODEL_MAC, ip=MODEL_IP, seed=seed + 1, delay=delay,
                              config=config, **(impair or {}))
        self.stack = self.wire.model
        self.endpoint = FrameEndpoint(self.stack)
        self.captured = []
        self.wire.to_model.on_frame = lambda t, frame: self.captured.append((t, "nic", frame))
        self.wire.to_nic.on_frame = lambda t, frame: self.captured.append((t, "model", frame))

    @property
    def cycle(self):
        """The NIC's clock cycles since reset."""
        return self.h.cycle

    @property
    def now(self):
        """Simulated seconds since reset (the model's clock follows it)."""
        return self.h.cycle / self.clock_hz

    def step(self, cycles):
        """Run both ends for one slice of ``cycles`` NIC cycles."""
        self.wire.step(cycles)

    def connect(self, qp, conn, port=4791, **options):
        """The NIC's queue pair ``qp`` connects (MPA ``options``) to a model responder,
        ``conn``, listening on ``port``; returns the model's link once both are in RTS."""
        links = []
        self.endpoint.listen(port, lambda: conn, links.append)
        qp.connect(ip_int(MODEL_IP), port, 40000 + qp.qp_num, **options)
        self._established(qp, conn, lambda: links[0] if links else None)
        return links[0]

    def accept(self, qp, conn, port=4792, **options):
        """A model initiator, ``conn``, connects to the NIC's queue pair ``qp`` listening on
        ``port`` (MPA ``options``); returns the model's link once both are in RTS."""
        qp.listen(port, **options)
        link = self.endpoint.connect(NIC_IP, port, conn)
        self._established(qp, conn, lambda: link)
        return link

    def _established(self, qp, conn, link):
        self.run_until(lambda: qp.state != QpState.RTR and conn.state in _SETTLED,
                       timeout_cycles=2_000_000)
        if qp.state != QpState.RTS:
            raise AssertionError(f"{qp!r}: {qp.reason}")
        if conn.state != ConnState.ESTABLISHED:
            raise AssertionError(f"the model's connection is {conn.state.name}: {conn.reason}")
        assert link() is not None

    def write_pcap(self, path):
        """Write :attr:`captured` to ``path`` as a pcap (simulated timestamps)."""
        with PcapWriter(path) as pcap:
            for t, _, frame in self.captured:
                pcap.write(frame, round(t * 1e9))

    def close(self):
        self.h.close()
