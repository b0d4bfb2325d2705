"""The engine over the model's own TCP/IP (:mod:`.rawtcp`), on raw Ethernet frames.

RFC 5044 section 2 needs a reliable byte stream under MPA; here that is a
:class:`~.rawtcp.TcpConnection` of a :class:`~.rawtcp.RawStack` (RFC 9293), so the whole NIC,
Ethernet to RDMAP, is the model's. Three parts:

* :class:`FrameLink` glues one TCP connection to one engine :class:`Connection`: TCP bytes in
  go to :meth:`Connection.receive`; :meth:`Connection.transmit` goes to
  :meth:`TcpConnection.send` as far as the send buffer has room (``TcpConfig.snd_buffer``),
  so a Send or Write completes when its last FPDU is in a bounded buffer, as on a socket,
  not far ahead of the wire, and the ``"sent"`` event takes up the rest; the peer's FIN or a
  reset is :meth:`Connection.connection_lost` (RFC 5040 section 6); once the connection
  :attr:`~Connection.wants_close` and has nothing left, TCP closes with a FIN. Sans-IO and
  clock-free: it works under :class:`.impair.Pipe`'s virtual clock as well as in real time.
* :class:`FrameEndpoint` owns a RawStack's event callback and makes links: :meth:`connect`
  (initiator) and :meth:`listen` (a responder per accepted connection).
* :func:`run_stack` runs a RawStack in asyncio with the monotonic clock against a frame pipe,
  ``recv_frame()`` (a coroutine returning one frame, None at the end); outgoing frames leave
  through the ``send_frame`` the stack was built with. :class:`QemuSocketNetdev` is such a
  pipe: QEMU's ``-netdev socket`` framing, a 4-byte big-endian length then the Ethernet frame
  (no FCS), on a TCP socket. Frames can be recorded with :class:`~iwarp_model.pcap.PcapWriter`
  (``pcap=``).
"""

import asyncio
import time
from collections.abc import Awaitable, Callable

from ..engine import Connection, ConnState
from ..pcap import PcapWriter
from .rawtcp import RawStack, TcpConnection, TcpState
from .sockets import Link

__all__ = ["FrameLink", "FrameEndpoint", "run_stack", "recording", "QemuSocketNetdev",
           "MAX_FRAME"]

#: The largest frame QEMU's socket netdev carries (no segmentation offload on that backend).
MAX_FRAME = 1514


class FrameLink(Link):
    """``conn`` carried by ``tcp``. The engine starts when TCP is established;
    :meth:`pump` moves whatever is ready both ways (called on every TCP event and on the
    engine's ``on_output``; re-entrant calls are folded into the running one)."""

    def __init__(self, conn: Connection, tcp: TcpConnection, *,
                 on_pump: Callable[[], None] | None = None):
        super().__init__(conn)
        self.tcp = tcp
        self._on_pump = on_pump
        self._pumping = self._again = False
        self._fin_sent = False
        previous = conn.on_output

        def on_output(c):
            if previous is not None:
                previous(c)
            self.pump()
        conn.on_output = on_output
        if tcp.state is not TcpState.SYN_SENT:
            self._start()

    def _start(self) -> None:
        if self.conn.state == ConnState.IDLE:
            self.conn.start()

    def _kick(self) -> None:
        self.pump()

    def tcp_event(self, kind: str) -> None:
        """A RawStack event for this link's TCP connection."""
        if kind == "established":
            self._start()
        self.pump()

    def pump(self) -> None:
        if self._pumping:
            self._again = True
            return
        self._pumping = True
        try:
            self._again = True
            while self._again:
                self._again = False
                self._pump_once()
        finally:
            self._pumping = False
        if self._on_pump is not None:
            self._on_pump()
        self.changed()

    def _pump_once(self) -> None:
        tcp, conn = self.tcp, self.conn
        if conn.state == ConnState.IDLE:
            if tcp.state is TcpState.CLOSED:  # refused, reset or timed out before established
                conn.connection_lost()
                self.transport_closed = True
            return
        data = tcp.recv()
        if data:
            conn.receive(data)
        if tcp.state is TcpState.CLOSED or tcp.eof:
            conn.connection_lost()
        drained = True
        if not self._fin_sent and tcp.state in (TcpState.ESTABLISHED, TcpState.CLOSE_WAIT):
            room = tcp.room
            out = conn.transmit(room) if room else b""
            if out:
                tcp.send(out)
            drained = len(out) < room
        else:
            conn.transmit()  # nowhere to go
        if conn.wants_close and drained and not self._fin_sent:
            self._fin_sent = True
            tcp.close()
        if tcp.state is TcpState.CLOSED or (self._fin_sent and tcp.state is TcpState.TIME_WAIT):
            self.transport_closed = True


class FrameEndpoint:
    """Engine connections on ``stack``'s TCP. Takes over ``stack.on_event``."""

    def __init__(self, stack: RawStack, *, on_pump: Callable[[], None] | None = None):
        self.stack = stack
        self.links: dict[TcpConnection, FrameLink] = {}
        self._listeners: dict[int, tuple] = {}
        self._on_pump = on_pump
        stack.on_event = self._on_event

    def connect(self, remote_ip, remote_port: int, conn: Connection) -> FrameLink:
        """Open TCP to ``remote_ip``:``remote_port``; ``conn`` (the initiator) starts once
        TCP is established."""
        tcp = self.stack.connect(remote_ip, remote_port)
        link = FrameLink(conn, tcp, on_pump=self._on_pump)
        self.links[tcp] = link
        return link

    def listen(self, port: int, make_connection: Callable[[], Connection],
               on_link: Callable[[FrameLink], None] | None = None) -> None:
        """Accept on ``port``: every established TCP connection gets ``make_connection()``
        (a responder) and is announced through ``on_link(link)``."""
        self._listeners[port] = (self.stack.listen(port), make_connection, on_link)

    def _on_event(self, tcp: TcpConnection, kind: str) -> None:
        link = self.links.get(tcp)
        if link is None and kind == "established" and tcp.local_port in self._listeners:
            listener, make_connection, on_link = self._listeners[tcp.local_port]
            link = FrameLink(make_connection(), tcp, on_pump=self._on_pump)
            self.links[tcp] = link
            if on_link is not None:
                on_link(link)
        for listener, _make, _on in self._listeners.values():
            while listener.accept() is not None:
                pass  # links are made at the "established" event; drain the accept queue
        if link is None:
            return
        link.tcp_event(kind)
        if link.transport_closed:
            self.links.pop(tcp, None)


async def run_stack(stack: RawStack, recv_frame: Callable[[], Awaitable[bytes | None]], *,
                    endpoint: FrameEndpoint | None = None,
                    pcap: PcapWriter | None = None) -> None:
    """Run ``stack`` in real time until ``recv_frame()`` returns None (or the task is
    cancelled): received frames go to :meth:`RawStack.receive_frame`, timers run at
    :meth:`RawStack.next_deadline`. ``stack.clock`` must be :func:`time.monotonic`.
    ``endpoint``, if given, is told to re-check its timers after each of its pumps; ``pcap``
    records received frames (wrap ``send_frame`` with :func:`recording` for the others)."""
    kick = asyncio.Event()
    if endpoint is not None:
        endpoint._on_pump = kick.set
        for link in endpoint.links.values():
            link._on_pump = kick.set

    async def timers():
        while True:
            deadline = stack.next_deadline()
            kick.clear()
            timeout = None if deadline is None else max(0.0, deadline - stack.clock())
            try:
                await asyncio.wait_for(kick.wait(), timeout)
            except TimeoutError:
                pass
            stack.poll()

    timer_task = asyncio.get_running_loop().create_task(timers())
    try:
        while True:
            frame = await recv_frame()
            if frame is None:
                return
            if pcap is not None:
                pcap.write(frame, time.time_ns())
            stack.receive_frame(frame)
            kick.set()
    finally:
        timer_task.cancel()


def recording(send_frame: Callable[[bytes], None], pcap: PcapWriter) -> Callable[[bytes], None]:
    """``send_frame`` that also writes each frame to ``pcap`` (wall-clock timestamps)."""
    def send(frame: bytes) -> None:
        pcap.write(frame, time.time_ns())
        send_frame(frame)
    return send


class QemuSocketNetdev:
    """One end of QEMU's ``-netdev socket`` stream: frames as ``length (4, big-endian) |
    Ethernet frame``. Make it with :meth:`connect` (QEMU listens) or :meth:`accept` (QEMU
    connects); :meth:`send_frame` writes one frame, :meth:`recv_frame` reads one (None at
    the end of the stream). A length over :data:`MAX_FRAME` or of zero is a ValueError."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, port: int, host: str = "127.0.0.1") -> "QemuSocketNetdev":
        return cls(*await asyncio.open_connection(host, port))

    @classmethod
    async def accept(cls, port: int, host: str = "127.0.0.1") -> "QemuSocketNetdev":
        """Listen on ``port`` for one connection (QEMU's ``connect=``) and return it."""
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        server = await asyncio.start_server(
            lambda r, w: ready.done() or ready.set_result((r, w)), host, port)
        try:
            return cls(*await ready)
        finally:
            server.close()

    def send_frame(self, frame: bytes) -> None:
        if not 0 < len(frame) <= MAX_FRAME:
            raise ValueError(f"frame of {len(frame)} bytes: 1..{MAX_FRAME}")
        self.writer.write(len(frame).to_bytes(4, "big") + frame)

    async def recv_frame(self) -> bytes | None:
        try:
            length = int.from_bytes(await self.reader.readexactly(4), "big")
            if not 0 < length <= MAX_FRAME:
                raise ValueError(f"netdev frame length {length}: 1..{MAX_FRAME}")
            return await self.reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None

    def close(self) -> None:
        self.writer.close()
