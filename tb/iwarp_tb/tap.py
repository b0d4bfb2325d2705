"""Linux's network stack as a peer of a simulated NIC: a TAP device in a network namespace.

``with Tap() as tap:`` makes a namespace of its own with a TAP device in it (address
:attr:`Tap.peer_ip`/24, link up, ``lo`` up, IPv6 off so the link stays quiet) and removes both
on the way out, whatever happened. Frames go in and out through the TAP file descriptor
(non-blocking); commands run inside the namespace with :meth:`Tap.run` / :meth:`Tap.popen`
(``ip netns exec``). :func:`bridge` joins the TAP device to a :class:`~iwarp_tb.harness.Harness`
whose PHY stands for the NIC's wire, and records every frame it passes in a pcap.

Needs root, ``/dev/net/tun`` and iproute2 (``iwarp_tb.facilities.linux_peer``). Only link-local
addresses (169.254.0.0/16) are used. See ``shared/recipes/linux-tcp-tap.md``.
"""

import fcntl
import itertools
import os
import random
import struct
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from iwarp_model.pcap import PcapWriter
from iwarp_model.transport.impair import Link

__all__ = ["netem_available", "Tap", "bridge", "BridgeStats"]

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
MAX_FRAME = 65536
_serial = itertools.count()


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Tap:
    """A TAP device in a fresh network namespace (see the module docstring).

    Parameters
    ----------
    subnet : int or None
        ``x`` of 169.254.x.0/24 (1..254); by default one picked from the process id, so
        parallel tests differ (they could share one: each namespace has its own stack).

    Attributes
    ----------
    namespace, device : str
        Names of the namespace and of the TAP device in it.
    peer_ip : str
        169.254.x.1, Linux's address on the link.
    nic_ip : str
        169.254.x.2, the address for the simulated NIC.
    mac : bytes
        The TAP device's MAC address, 02:00:a9:fe:x:01 (Linux's side of the link).
    """

    def __init__(self, subnet=None):
        serial = next(_serial)
        self.subnet = subnet if subnet is not None else 1 + (os.getpid() + serial) % 254
        if not 1 <= self.subnet <= 254:
            raise ValueError(f"subnet must be in 1..254, not {self.subnet}")
        self.namespace = f"iwarp-{os.getpid()}-{serial}"
        self.device = f"iwt{os.getpid()}x{serial}"[:15]
        self.peer_ip = f"169.254.{self.subnet}.1"
        self.nic_ip = f"169.254.{self.subnet}.2"
        self.mac = bytes([0x02, 0x00, 0xA9, 0xFE, self.subnet, 0x01])
        self.fd = None
        self._namespace_made = False

    def __enter__(self):
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _open(self):
        self.fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        fcntl.ioctl(self.fd, TUNSETIFF,
                    struct.pack("16sH", self.device.encode(), IFF_TAP | IFF_NO_PI))
        _ip("netns", "add", self.namespace)
        self._namespace_made = True
        # No IPv6 in the namespace: no router solicitations or MLD reports on the link.
        self.run(["sh", "-c", "for f in /proc/sys/net/ipv6/conf/*/disable_ipv6; "
                              "do echo 1 > $f; done"], check=False)
        _ip("link", "set", self.device, "netns", self.namespace)
        mac = ":".join(f"{b:02x}" for b in self.mac)
        _ip("-n", self.namespace, "link", "set", self.device, "address", mac)
        _ip("-n", self.namespace, "addr", "add", f"{self.peer_ip}/24", "dev", self.device)
        _ip("-n", self.namespace, "link", "set", self.device, "up")
        _ip("-n", self.namespace, "link", "set", "lo", "up")

    def close(self):
        """Close the TAP device (which removes it) and delete the namespace."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self._namespace_made:
            subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True)
            self._namespace_made = False

    def read_frames(self):
        """Every frame Linux has sent since the last call (no FCS), without waiting."""
        frames = []
        while True:
            try:
                frames.append(os.read(self.fd, MAX_FRAME))
            except BlockingIOError:
                return frames

    def write_frame(self, frame):
        """Hand Linux one frame (from the destination MAC on, no FCS)."""
        os.write(self.fd, bytes(frame))

    def command(self, args):
        """``args`` to run inside the namespace."""
        return ["ip", "netns", "exec", self.namespace, *args]

    def run(self, args, **kw):
        """Run ``args`` inside the namespace to the end (``subprocess.run``, text output
        captured unless told otherwise)."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self.command(args), **kw)

    def popen(self, args, **kw):
        """Start ``args`` inside the namespace (``subprocess.Popen``, text stdout piped and
        stderr joined to it unless told otherwise)."""
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.STDOUT)
        kw.setdefault("text", True)
        return subprocess.Popen(self.command(args), **kw)


def netem_available(tap):
    """Whether the kernel can impair ``tap``'s egress with ``tc netem`` (tries and removes it)."""
    added = tap.run(["tc", "qdisc", "add", "dev", tap.device, "root", "netem", "delay", "0ms"])
    if added.returncode:
        return False
    tap.run(["tc", "qdisc", "del", "dev", tap.device, "root"])
    return True


@dataclass
class BridgeStats:
    """What :func:`bridge` passed: ``to_nic`` and ``from_nic`` frames (no FCS), the NIC's frames
    it did not pass because they were bad (:meth:`Harness.frames` ``err``), and the cycles run."""

    to_nic: list = field(default_factory=list)
    from_nic: list = field(default_factory=list)
    bad_from_nic: list = field(default_factory=list)
    cycles: int = 0


def bridge(harness, tap, until, timeout_s, *, cycles=2000, pcap=None, stats=None,
           impair=None):
    """Join ``tap`` to ``harness``'s PHY until ``until()`` is true; return :class:`BridgeStats`.

    Each round moves every frame Linux sent into :meth:`Harness.send_frame`, runs up to
    ``cycles`` clock cycles (returning early as soon as something comes out, so Linux sees the
    NIC's frames without delay), and writes the NIC's good frames to the TAP device. A bad frame
    from the NIC (bad FCS, PHY error) is kept in ``bad_from_nic`` and not passed, as a real NIC
    on the other end would drop it. ``until`` is called after every round. Raises TimeoutError
    after ``timeout_s`` seconds of wall time.

    ``pcap``: a capture of every frame passed, both ways, stamped with the simulated time
    (:attr:`Harness.time_ns`): a path (written anew) or a :class:`~iwarp_model.pcap.PcapWriter`
    to add to. ``stats``: a :class:`BridgeStats` to add to. Both are for tests that bridge in
    several spells.

    ``impair``: keyword arguments of :class:`~iwarp_model.transport.impair.Link` (``loss``,
    ``duplicate``, ``reorder``, ...) applied to Linux's frames on their way to the NIC: Linux's
    egress impaired as ``tc netem`` would, for kernels built without ``sch_netem``
    (:func:`netem_available`). Its delays run in wall time, Linux's clock, as netem's do: in
    simulated time a reorder hold of milliseconds lasts seconds of Linux's time, far beyond its
    retransmission timeout, and measures the simulator's speed rather than the NIC. The pcap
    shows the frames as Linux sent them.
    """
    stats = stats if stats is not None else BridgeStats()
    deadline = time.monotonic() + timeout_s
    writer = pcap
    if pcap is not None and not isinstance(pcap, PcapWriter):
        Path(pcap).parent.mkdir(parents=True, exist_ok=True)
        writer = PcapWriter(pcap)
    period_ns = 1000 / harness.clock_mhz
    start = harness.cycle
    deliver = harness.send_frame
    link = None
    if impair:
        link = Link(harness.send_frame, clock=time.monotonic,
                    rng=random.Random(impair.pop("seed", 0)), **impair)
        deliver = link.send
    try:
        while True:
            if link is not None:
                link.poll()
            for frame in tap.read_frames():
                deliver(frame)
                stats.to_nic.append(frame)
                if writer:
                    writer.write(frame, harness.time_ns)
            harness.run(cycles, until_output=True)
            for frame in harness.frames():
                if frame.err:
                    stats.bad_from_nic.append(frame)
                    continue
                tap.write_frame(frame)
                stats.from_nic.append(frame)
                if writer:
                    writer.write(frame, frame.cycle * period_ns)
            if until():
                return stats
            if time.monotonic() > deadline:
                raise TimeoutError(f"bridge: no end after {timeout_s} s ({len(stats.to_nic)} "
                                   f"frames to the NIC, {len(stats.from_nic)} from it)")
    finally:
        stats.cycles += harness.cycle - start
        if writer is not pcap:
            writer.close()
