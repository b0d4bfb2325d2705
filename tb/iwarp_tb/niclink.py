"""Two NICs on an impaired wire: a test fixture.

:class:`NicLinkRig` holds two :class:`~iwarp_nic.core.NicCore` (``a`` and ``b``), each built
natively with its PHY on its own harness's pins (:func:`~iwarp_tb.nicmodel.one_nic`: the
module :class:`~iwarp_tb.nicmodel.NicModelRig` uses, where
:class:`~iwarp_tb.nicpair.NicPairRig` joins two instances inside one module by a plain
wire), and each NIC's frames reach the other through a
:class:`~iwarp_model.transport.impair.Link`, which may lose, reorder, duplicate, corrupt or
resegment them. The harnesses run in step, slice by slice; the frames a NIC sent in a slice
enter the link at the slice's end.
"""

import random

from iwarp_model.transport.impair import Link, VirtualClock

from .nicmodel import Sliced, one_nic
from .nicpair import TwoNics
from .tcppair import NODES
from .tcprig import CLOCK_HZ, ip_int

__all__ = ["NicLinkRig"]


class NicLinkRig(TwoNics, Sliced):
    """NICs ``a`` and ``b`` of ``width`` bytes (with NicCore parameters ``core``), host memory
    of ``memory_bytes`` each (:attr:`devices`, their drivers, by letter), on a wire of
    ``delay`` seconds each way impaired as ``impair`` says (keyword arguments of
    :class:`~iwarp_model.transport.impair.Link`, both ways). :attr:`links` carries each NIC's
    frames to the other (``links["a"]``: what ``a`` sends) and counts what it did to them.
    :attr:`ips` are the NICs' IPv4 addresses (integers)."""

    def __init__(self, width=8, *, seed=1, memory_bytes=1 << 24, delay=2e-6, impair=None,
                 core=None):
        super().__init__()
        self.clock_hz = CLOCK_HZ[width]
        self.clock = VirtualClock()
        self.hs, self.devices, self.ips = {}, {}, {}
        for k, nic in enumerate(NODES):
            ip = f"169.254.50.{k + 1}"
            self.hs[nic], self.devices[nic] = one_nic(
                width, ip=ip, mac=f"02:00:00:00:05:{k + 1:02x}", seed=seed + k,
                memory_bytes=memory_bytes, **(core or {}))
            self.ips[nic] = ip_int(ip)
        self.links = {nic: Link(self.hs[peer].send_frame, clock=self.clock,
                                rng=random.Random(seed + 10 + k), delay=delay, **(impair or {}))
                      for k, (nic, peer) in enumerate(zip(NODES, reversed(NODES)))}
        self.cycle = 0

    def step(self, cycles):
        """Service both drivers, run both NICs to ``cycles`` past the last step (register
        accesses move a harness's clock, so each runs what it lacks), service them again, then
        put each NIC's frames on its link and deliver what is due."""
        self.cycle += cycles
        for nic, h in self.hs.items():
            self.devices[nic].service()
            h.run(max(0, self.cycle - h.cycle))
            self.devices[nic].service()
        self.cycle = max(h.cycle for h in self.hs.values())
        self.clock.now = self.cycle / self.clock_hz
        for nic, h in self.hs.items():
            for frame in h.frames():
                assert not frame.err, f"NIC {nic} sent a bad frame: {frame.reasons}"
                self.links[nic].send(bytes(frame))
        for link in self.links.values():
            link.poll()

    def close(self):
        for h in self.hs.values():
            h.close()
