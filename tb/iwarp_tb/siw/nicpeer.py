"""The simulated NIC on a siw guest's wire: a Verilated :class:`~iwarp_nic.core.NicCore` whose
Ethernet port is the guest's QEMU socket netdev, driven by the verbs driver, with the model's
applications (:mod:`iwarp_model.apps`: rping, perftest, ucmatose) running on it unchanged.

::

    nic = NicPeer("run.pcap")           # builds the NIC first: the guest does not wait
    port = free_port()
    with SiwGuest("stock", "iwarp.role=rping-server", netdev="listen", port=port,
                  ip=f"{GUEST_IP}/24") as guest:
        async with nic.attached(port):
            host = await nic.connect(GUEST_IP, apps.RPING_PORT, ird=1, ord=1)
            pings = await apps.RpingClient(host, count=5).run()

:class:`NicPeer` builds the NIC (a Verilator build the first time: minutes), then connects to
the guest's listening netdev (QEMU takes the first connection as its peer) and runs the NIC as
an asyncio task: frames from the guest are put on the NIC's PHY,
the simulation runs ``slice_cycles`` cycles, the driver services the NIC's events, and the
frames the NIC sent go to the guest; then the task yields. The NIC's clock is simulated (its
TCP timers run in cycles), the guest's is real: the NIC simply answers more slowly than a real
one, some 60 000 cycles per second of this machine at 8 bytes. Every frame both ways is
written to the capture, with wall-clock timestamps, as its sender sent it.

With ``impair`` (:class:`~iwarp_model.transport.impair.Link` arguments), each way of the
wire goes through a Link of its own that loses, reorders, duplicates, corrupts or cuts frames
(``links``: ``"to_nic"``, ``"to_guest"``, with their counters). Its delays run in wall time,
the guest's clock; a NIC for such a wire needs its TCP timers scaled to the simulation's speed
(``core``: :data:`iwarp_tb.impairment.CORE`).
"""

import asyncio
import contextlib
import random
import time

from iwarp_model.apps import Buffer
from iwarp_model.mr import Access
from iwarp_model.pcap import PcapWriter
from iwarp_model.transport.impair import Link
from iwarp_model.verbs import QpState

from ..driver import HostBytes
from ..nicmodel import one_nic
from ..tcprig import ip_int
from .guest import connect_netdev

__all__ = ["NicPeer", "NicHost", "NicCm", "NIC_IP", "NIC_MAC"]

NIC_IP = "169.254.1.1"
NIC_MAC = "02:00:a9:fe:01:01"


class NicHost:
    """One endpoint's verbs resources on the NIC, as :class:`iwarp_model.apps.Host` has them
    on the model (the applications take either): ``device``, ``pd``, ``send_cq`` and
    ``recv_cq`` (one CQ, or two with ``separate_cqs``), and a queue pair ``qp`` with the
    given IRD, ORD, depths and ``sq_sig_all``.
    :meth:`register` gives buffers in the NIC's host memory."""

    def __init__(self, device, *, ird=1, ord=1, send_wr=16, recv_wr=16, cqe=64,
                 separate_cqs=False, sq_sig_all=False):
        self.device, self.pd = device, device.alloc_pd()
        self.send_cq = device.create_cq(cqe)
        self.recv_cq = device.create_cq(cqe) if separate_cqs else self.send_cq
        self.qp = device.create_qp(self.pd, self.send_cq, self.recv_cq, max_send_wr=send_wr,
                                   max_recv_wr=recv_wr, max_rd_atomic=ord,
                                   max_dest_rd_atomic=ird, sq_sig_all=sq_sig_all)

    def register(self, size, access=Access.LOCAL_WRITE, data=None):
        """A new zeroed (or ``data``-filled) buffer of ``size`` octets in host memory,
        registered for ``access``: an :class:`~iwarp_model.apps.Buffer` whose ``memory`` is a
        :class:`~iwarp_tb.driver.HostBytes`."""
        addr = self.device.alloc(max(size, 1))
        self.device.memory.write(addr, bytes(size) if data is None else bytes(data))
        mr = self.device.reg_mr(self.pd, addr, size, access)
        return Buffer(HostBytes(self.device.memory, addr, size), mr)


class NicPeer:
    """A NicCore of ``width`` bytes at :data:`NIC_IP`, built at once: ``device`` (the driver's
    :class:`~iwarp_tb.driver.NicDevice`) and ``h`` (the harness). ``pcap`` is the capture's
    path, ``seed`` the NIC's TCP keys.

    :meth:`attached` (an async context manager), or :meth:`start` and :meth:`close`, put it on
    a guest's netdev. ``impair``: the Link arguments of both ways of the wire (their random
    draws from ``seed``); ``core``: NicCore parameters. ``made``: ``(harness, host)`` in place
    of the NicCore and its driver, ``host`` anything with a ``service()`` called between
    slices (a board's top that is its own host: a no-op).
    """

    def __init__(self, pcap, *, width=8, seed=1, slice_cycles=1000, impair=None, core=None,
                 made=None):
        self.pcap_path, self.slice_cycles = pcap, slice_cycles
        self.impair, self.seed = impair, seed
        self.h, self.device = made or one_nic(width, ip=NIC_IP, mac=NIC_MAC, seed=seed,
                                              **(core or {}))
        self.links = {}
        self.netdev = self.pcap_writer = None
        self._tasks = []
        self.frames = {"in": 0, "out": 0}

    @contextlib.asynccontextmanager
    async def attached(self, port):
        """The NIC on the guest's netdev at 127.0.0.1:``port`` while the block runs; closed
        after it."""
        await self.start(port)
        try:
            yield self
        finally:
            await self.close()

    async def start(self, port, timeout=10.0):
        """Connect to the guest's netdev at 127.0.0.1:``port`` (retrying until ``timeout``
        while QEMU comes up) and start running the NIC."""
        self.netdev = await connect_netdev(port, timeout)
        self.pcap_writer = PcapWriter(self.pcap_path)
        if self.impair:
            self.links = {way: Link(deliver, clock=time.monotonic,
                                    rng=random.Random(self.seed + k), **self.impair)
                          for k, (way, deliver) in enumerate((
                              ("to_nic", self.h.send_frame),
                              ("to_guest", self.netdev.send_frame)))}
        inbox = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._receive(inbox)), loop.create_task(self._run(inbox))]
        return self

    async def _receive(self, inbox):
        while (frame := await self.netdev.recv_frame()) is not None:
            inbox.put_nowait(frame)

    async def _run(self, inbox):
        h, device = self.h, self.device
        to_nic = self.links["to_nic"].send if self.links else h.send_frame
        to_guest = self.links["to_guest"].send if self.links else self.netdev.send_frame
        while True:
            for link in self.links.values():
                link.poll()
            while not inbox.empty():
                frame = inbox.get_nowait()
                self.pcap_writer.write(frame, round(time.time() * 1e9))
                to_nic(frame)
                self.frames["in"] += 1
            device.service()
            h.run(self.slice_cycles)
            device.service()
            for frame in h.frames():
                if frame.err:
                    raise AssertionError(f"the NIC sent a bad frame: {frame.reasons}")
                self.pcap_writer.write(bytes(frame), round(time.time() * 1e9))
                to_guest(bytes(frame))
                self.frames["out"] += 1
            try:
                await self.netdev.writer.drain()
            except ConnectionError:
                return          # the guest has powered off: the wire is gone
            await asyncio.sleep(0)

    def host(self, **resources):
        """A :class:`NicHost` on this NIC (``resources`` as its keywords)."""
        return NicHost(self.device, **resources)

    async def connect(self, ip, port, *, prepare=None, timeout=30.0, interval=0.3, options=None,
                      **resources):
        """A :class:`NicHost` (``resources`` as its keywords) whose queue pair is connected
        to ``ip``:``port`` (MPA ``options`` as :meth:`~iwarp_tb.driver.NicQp.connect`'s) and
        in RTS; ``prepare(host)`` is called before it connects (to post receives that must
        be there before the peer's first message). While the connection is refused (the
        guest's tool may not listen yet), a fresh host tries again every ``interval``
        seconds, each on a queue pair of its own; an :exc:`AssertionError` with the reason
        after ``timeout`` or on any other failure."""
        deadline = time.monotonic() + timeout
        while True:
            host = self.host(**resources)
            if prepare is not None:
                prepare(host)
            qp = host.qp
            qp.connect(ip_int(ip), port, 40000 + qp.qp_num, **(options or {}))
            try:
                await self._established(qp, f"connected to {ip}:{port}",
                                        deadline - time.monotonic())
                return host
            except AssertionError:
                if qp.reason != "TCP RESET" or time.monotonic() + interval > deadline:
                    raise
            await asyncio.sleep(interval)

    async def accept(self, qp, port, *, timeout=60.0, **options):
        """Have ``qp`` accept one connection to TCP ``port`` (MPA ``options`` as
        :meth:`~iwarp_tb.driver.NicQp.listen`'s) and wait until it is in RTS, as
        :meth:`connect`."""
        qp.listen(port, **options)
        await self._established(qp, f"connected on port {port}", timeout)

    async def _established(self, qp, what, timeout):
        deadline = time.monotonic() + timeout
        while qp.state != QpState.RTS:
            if qp.state == QpState.ERR or time.monotonic() > deadline:
                raise AssertionError(f"{qp!r} not {what}: {qp.reason}")
            await asyncio.sleep(0.01)
        self._check()

    def _check(self):
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()

    async def close(self):
        """Stop the NIC, close the netdev stream and the capture (idempotent)."""
        for task in self._tasks:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._tasks = []
        if self.netdev is not None:
            self.netdev.close()
            self.netdev = None
        if self.pcap_writer is not None:
            self.pcap_writer.close()
            self.pcap_writer = None
        if self.h is not None:
            self.h.close()
            self.h = None


class _NicAttached:
    """A connected :class:`NicHost` for :mod:`iwarp_model.perftest`: :meth:`close` closes
    its TCP connection in order, :meth:`closed` returns once the connection has ended (the
    queue pair has left RTS: the peer's FIN or RST, or its own close completed)."""

    def __init__(self, host):
        self.host = host

    def close(self):
        if self.host.qp.state == QpState.RTS:
            self.host.qp.disconnect()

    async def closed(self):
        while self.host.qp.state == QpState.RTS:
            await asyncio.sleep(0.01)


class _NicListener:
    """Connections to ``port`` on the NIC: each :meth:`accept` makes a host, calls
    ``prepare`` on it and has its queue pair listen on the port at once (the NIC listens
    per queue pair), returning a future of the connected host."""

    def __init__(self, nic, port, options):
        self.nic, self.port, self.options = nic, port, options
        self._accepting = set()

    def accept(self, *, prepare, **resources):
        host = self.nic.host(**resources)
        prepare(host)
        task = asyncio.ensure_future(self._accepted(host))
        self._accepting.add(task)
        task.add_done_callback(self._accepting.discard)
        return task

    async def _accepted(self, host):
        await self.nic.accept(host.qp, self.port, **self.options)
        return _NicAttached(host)

    def close(self):
        """Stop waiting for connections no one has made yet."""
        for task in list(self._accepting):
            task.cancel()


class NicCm:
    """:mod:`iwarp_model.perftest`'s connection manager on a :class:`NicPeer`: connections
    to ``remote_ip`` with MPA ``options`` (as :meth:`~iwarp_tb.driver.NicQp.connect`'s, for
    a listener :meth:`~iwarp_tb.driver.NicQp.listen`'s), each returned ``settle`` seconds
    after it reached RTS (Linux 6.1's siw responder may miss an FPDU that follows its Reply
    within milliseconds: docs/siw.md)."""

    def __init__(self, nic, remote_ip, *, options=None, settle=0.2, timeout=30.0):
        self.nic, self.remote_ip, self.options = nic, remote_ip, dict(options or {})
        self.settle, self.timeout = settle, timeout

    async def connect(self, port, *, prepare, **resources):
        host = await self.nic.connect(self.remote_ip, port, prepare=prepare,
                                      options=self.options, timeout=self.timeout, **resources)
        await asyncio.sleep(self.settle)
        return _NicAttached(host)

    def listen(self, port):
        return _NicListener(self.nic, port, self.options)
