"""A simulated NIC's network stack (:class:`~iwarp_nic.node.TcpNode` in a native
:class:`~iwarp_tb.harness.Harness`) with its host, and a wire from it to the model's raw-frame
TCP (:class:`~iwarp_model.transport.rawtcp.RawStack`) with the model's impairments.

Time: the NIC's clock is the harness cycle count at the PHY's nominal clock (125 MHz for GMII,
156.25 MHz for XGMII); the model runs on a :class:`~iwarp_model.transport.impair.VirtualClock`
set from it, so both ends see one simulated time, however fast the host machine is.
"""

import hashlib
import random
from dataclasses import dataclass

from iwarp_model.transport.impair import Link, VirtualClock
from iwarp_model.transport.rawtcp import RawStack, TcpConfig
from iwarp_nic.node import TcpNode

from .harness import Harness
from .tcphost import TcpHost

__all__ = ["NicTimers", "NicRig", "ModelWire", "PHY_BY_WIDTH", "ip_int", "MODEL_TCP"]

PHY_BY_WIDTH = {1: "gmii", 8: "xgmii"}
CLOCK_HZ = {1: 125_000_000, 8: 156_250_000}

#: Model TCP timers scaled to simulation (seconds of simulated time).
MODEL_TCP = TcpConfig(rto_initial=0.004, rto_min=0.002, rto_max=0.1, delayed_ack=0.0002,
                      time_wait=0.002, clock_granularity=0.0001, invalid_ack_interval=0.001)


def ip_int(text):
    a, b, c, d = (int(x) for x in text.split("."))
    return a << 24 | b << 16 | c << 8 | d


def mac_int(text):
    return int(text.replace(":", ""), 16)


@dataclass(frozen=True)
class NicTimers:
    """The engine's timers in simulated seconds (scaled down from RFC 6298's for simulation,
    where a second is 10^8 cycles)."""

    tick_cycles: int = 256
    rto_initial: float = 0.004
    rto_min: float = 0.002
    rto_max: float = 0.1
    delayed_ack: float = 0.0002
    time_wait: float = 0.002
    max_retries: int = 10

    def engine_params(self, clock_hz):
        def ticks(seconds):
            return max(1, round(seconds * clock_hz / self.tick_cycles))
        return dict(clock_hz=clock_hz, tick_cycles=self.tick_cycles,
                    rto_initial=ticks(self.rto_initial), rto_min=ticks(self.rto_min),
                    rto_max=ticks(self.rto_max), dack_ticks=ticks(self.delayed_ack),
                    time_wait_ticks=ticks(self.time_wait), max_retries=self.max_retries)


class NicRig:
    """A :class:`TcpNode` of ``width`` bytes with ``conns`` slots, built natively, and its host.

    ``mac``/``ip`` are the NIC's addresses (text). The engine's keys are drawn from ``seed``.
    ``cut_slots`` and ``ack_with_data`` go to :class:`~iwarp_nic.tcp.control.TcpControl`: by
    default segments hold whole chunks of at most the MSS and ACKs wait for data to ride on,
    as in :class:`~iwarp_nic.core.NicCore`.
    """

    def __init__(self, width, *, conns=16, ring_bytes=1 << 16, rx_buffer_bytes=1 << 16,
                 mac="02:00:00:00:00:01", ip="169.254.10.2", timers=NicTimers(), trace=None,
                 seed=1, chunk=2048, cut_slots=64, ack_with_data=True):
        self.width = width
        self.clock_hz = CLOCK_HZ[width]
        self.mac, self.ip = mac, ip
        self.conns = conns
        engine = dict(conns=conns, ring_bytes=ring_bytes, rx_buffer_bytes=rx_buffer_bytes,
                      cut_slots=cut_slots, ack_with_data=ack_with_data,
                      **timers.engine_params(self.clock_hz))
        params = ("TcpNode", width, sorted(engine.items()))
        name = f"iwarp_tcp_node_w{width}_" + hashlib.sha256(repr(params).encode()).hexdigest()[:8]
        self.h = Harness(name, TcpNode(width, engine=engine), phy=PHY_BY_WIDTH[width],
                         trace=trace, seed=seed, params=params)
        rng = random.Random(seed)
        self.h.set("mac", mac_int(mac))
        self.h.set("ip", ip_int(ip))
        self.h.set("isn_key", rng.getrandbits(128))
        self.h.set("hash_key", rng.getrandbits(32))
        self.host = TcpHost(self.h, conns, chunk=min(chunk, ring_bytes))

    @property
    def now(self):
        """Simulated seconds since reset."""
        return self.h.cycle / self.clock_hz

    def counters(self, *names):
        return {name: self.h.get(name) for name in names}

    def close(self):
        self.h.close()


class ModelWire:
    """The NIC of ``rig`` and a model host on one Ethernet segment.

    Each direction is a :class:`~iwarp_model.transport.impair.Link` (``impair`` keyword
    arguments apply to both, ``to_nic``/``to_model`` to one), with ``delay`` seconds of wire.
    With ``capture``, ``captured`` keeps every frame the NIC sends, in order.
    """

    def __init__(self, rig, *, mac="02:00:00:00:00:02", ip="169.254.10.1", seed=2,
                 delay=2e-6, config=MODEL_TCP, to_nic=None, to_model=None, capture=False,
                 **impair):
        self.rig = rig
        self.captured = [] if capture else None
        self.clock = VirtualClock()
        rng = random.Random(seed)
        self.to_nic = Link(rig.h.send_frame, clock=self.clock, rng=random.Random(seed + 1),
                           delay=delay, **{**impair, **(to_nic or {})})
        self.model = RawStack(mac, ip, send_frame=self.to_nic.send, clock=self.clock, rng=rng,
                              config=config)
        self.to_model = Link(self.model.receive_frame, clock=self.clock,
                             rng=random.Random(seed + 2), delay=delay,
                             **{**impair, **(to_model or {})})
        self.ip = ip

    def step(self, cycles=2000):
        """Run the NIC ``cycles`` cycles, then move frames and run the model's due timers."""
        rig = self.rig
        rig.host.service()
        rig.h.run(cycles)
        rig.host.service()
        self.clock.now = rig.now
        for frame in rig.h.frames():
            assert not frame.err, f"NIC sent a bad frame: {frame.reasons}"
            if self.captured is not None:
                self.captured.append(bytes(frame))
            self.to_model.send(bytes(frame))
        self.to_model.poll()
        self.to_nic.poll()
        self.model.poll()

    def run(self, until, *, timeout=1.0, cycles=2000):
        """Step until ``until()`` is true; AssertionError after ``timeout`` simulated seconds."""
        end = self.rig.now + timeout
        while not until():
            if self.rig.now > end:
                raise AssertionError(f"not done after {timeout} s simulated")
            self.step(cycles)
