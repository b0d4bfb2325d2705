"""The engine over the kernel's TCP: asyncio streams on real sockets.

RFC 5044 section 2 asks of the layer below MPA only a reliable, ordered byte stream; here it is
the host's own TCP. :class:`SocketLink` pumps bytes between an asyncio stream and a sans-IO
:class:`~iwarp_model.engine.Connection` (RFC 5044 section 7 for who speaks first, RFC 5040
section 6 for what a closed or reset stream means to the QP):

* TCP_NODELAY is set: FPDUs are sized to the MSS by the engine and must not wait for Nagle.
* The sender wakes on ``on_output``, writes whatever :meth:`Connection.transmit` returns and
  waits for the socket buffer to drain (back-pressure on the engine).
* End of stream or a reset from the peer is :meth:`Connection.connection_lost`; once the
  connection :attr:`~Connection.wants_close` and nothing is left to send, the socket is closed.

:func:`connect` and :func:`serve` make links; :class:`Link` is the transport-independent part
(waiting for establishment or the end, the errors), shared with the raw-frame transport of
:mod:`.frames`.

Captures: with a pcap path, every chunk written or read is recorded through
:class:`~iwarp_model.capture.StreamCapture` as it goes; the first MPA frame of each direction
(Request, Reply) is cut out into a capture call of its own so each starts a TCP segment, as
Wireshark's MPA dissector needs.
"""

import asyncio
import os
import socket
import time
from collections.abc import Awaitable, Callable

from ..capture import StreamCapture
from ..engine import Connection, ConnState
from ..wire import mpa

__all__ = ["Link", "SocketLink", "connect", "serve", "LinkError", "MpaRejected",
           "TerminateReceived", "TerminateSent", "ConnectionClosed"]

CHUNK = 1 << 16
LINGER = 2.0  # seconds to wait for the peer's FIN after ours


class LinkError(ConnectionError):
    """The iWARP connection did not come up, or ended abnormally."""


class MpaRejected(LinkError):
    """The responder rejected the MPA Request; ``reason`` is the Reply's private data."""

    def __init__(self, reason: bytes):
        super().__init__(f"the peer rejected the MPA Request: {reason!r}")
        self.reason = reason


class TerminateReceived(LinkError):
    """The peer sent a Terminate (RFC 5040 section 7); ``terminate`` is the decoded message."""

    def __init__(self, terminate, reason: str):
        super().__init__(reason)
        self.terminate = terminate


class TerminateSent(LinkError):
    """This end found a protocol error and sent a Terminate; ``terminate`` is that message."""

    def __init__(self, terminate, reason: str):
        super().__init__(f"protocol error, Terminate sent: {reason}")
        self.terminate = terminate


class ConnectionClosed(LinkError):
    """The connection closed before it was established (``reason`` says why)."""


def link_error(conn: Connection) -> LinkError:
    """The exception that describes how ``conn`` ended (CLOSED or TERMINATED)."""
    if conn.terminate_received is not None:
        return TerminateReceived(conn.terminate_received, conn.reason)
    if conn.terminate_sent is not None:
        return TerminateSent(conn.terminate_sent, conn.reason)
    if conn.active and conn.reject_reason is not None:
        return MpaRejected(conn.reject_reason)
    return ConnectionClosed(conn.reason or "the connection closed")


class Link:
    """A :class:`Connection` carried by some transport, with awaitable milestones.

    Chains (never replaces) the connection's ``on_established``, ``on_rejected``,
    ``on_terminated`` and ``on_closed`` callbacks. The transport calls :meth:`changed` whenever
    something may have happened and sets :attr:`transport_closed` when its stream is gone.
    Futures are created only when awaited, so a link may be built outside a running loop.
    """

    def __init__(self, conn: Connection):
        self.conn = conn
        self.transport_closed = False
        self._waiters: list[asyncio.Future] = []
        for name in ("on_established", "on_rejected", "on_terminated", "on_closed"):
            setattr(conn, name, self._chain(getattr(conn, name)))

    def _chain(self, previous: Callable | None) -> Callable:
        def callback(*args):
            if previous is not None:
                previous(*args)
            self.changed()
        return callback

    def changed(self) -> None:
        """Wake every coroutine waiting in :meth:`established` or :meth:`closed`."""
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)

    async def _wait(self) -> None:
        future = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        await future

    async def established(self) -> Connection:
        """Return the connection once established; raise the :class:`LinkError` that says
        why if it ended first (even if it was established before and ended since)."""
        while True:
            state = self.conn.state
            if state == ConnState.ESTABLISHED:
                return self.conn
            if state in (ConnState.CLOSED, ConnState.TERMINATED):
                raise link_error(self.conn)
            if self.transport_closed:
                raise ConnectionClosed("the transport closed during the MPA exchange")
            await self._wait()

    async def closed(self) -> None:
        """Return once the transport has closed its stream (after a close from either end)."""
        while not self.transport_closed:
            await self._wait()

    def close(self) -> None:
        """End the connection (``rdma_disconnect``): the QP enters ERR, the stream closes once
        everything queued is sent."""
        self.conn.close()
        self.changed()
        self._kick()

    def _kick(self) -> None:
        """Make the transport look at the connection again (overridden by transports)."""


class _FirstFrame:
    """Pass a direction's bytes to ``emit``, its leading MPA frame in one call of its own."""

    def __init__(self, emit: Callable[[bytes], None]):
        self._emit, self._buf, self._done = emit, bytearray(), False

    def feed(self, data: bytes) -> None:
        if self._done:
            self._emit(data)
            return
        self._buf += data
        if len(self._buf) < mpa.HEADER_SIZE:
            return
        total = mpa.HEADER_SIZE + int.from_bytes(self._buf[18:20], "big")
        if len(self._buf) < total:
            return
        self._done = True
        buf, self._buf = bytes(self._buf), bytearray()
        self._emit(buf[:total])
        if len(buf) > total:
            self._emit(buf[total:])

    def flush(self) -> None:
        if self._buf:
            buf, self._buf = bytes(self._buf), bytearray()
            self._emit(buf)


class SocketLink(Link):
    """Pump bytes between an asyncio (``reader``, ``writer``) pair and ``conn``.

    :meth:`start` calls ``conn.start()`` and runs the pump as a task; ``capture`` is a pcap path
    or None. The pump ends when the socket is closed by either side; exceptions of the socket
    (reset, broken pipe) count as the stream closing.
    """

    def __init__(self, conn: Connection, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, *, capture: str | os.PathLike | None = None):
        super().__init__(conn)
        self._reader, self._writer = reader, writer
        self._wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.local = writer.get_extra_info("sockname")[:2]
        self.peer = writer.get_extra_info("peername")[:2]
        self.capture: StreamCapture | None = None
        if capture is not None:
            self.capture = StreamCapture(capture, self.local, self.peer, active=conn.active,
                                         clock_ns=time.time_ns)
            self._cap_tx = _FirstFrame(self.capture.sent)
            self._cap_rx = _FirstFrame(self.capture.received)
        previous = conn.on_output

        def on_output(c):
            if previous is not None:
                previous(c)
            self._wake.set()
        conn.on_output = on_output

    def start(self) -> "SocketLink":
        """Start the connection (an initiator sends its MPA Request) and the pump."""
        self.conn.start()
        self.task = asyncio.get_running_loop().create_task(self._run())
        return self

    def _kick(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        receiver = asyncio.get_running_loop().create_task(self._receive_loop())
        try:
            await self._send_loop()
            # An orderly close: FIN first, then read (and drop) until the peer's FIN, so no
            # unread data turns the close into a reset that could destroy the last bytes sent.
            try:
                if self._writer.can_write_eof():
                    self._writer.write_eof()
                await asyncio.wait_for(asyncio.shield(receiver), LINGER)
            except (OSError, TimeoutError):
                pass
        finally:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError:
                pass
            receiver.cancel()
            try:
                await receiver
            except asyncio.CancelledError:
                pass
            self.conn.connection_lost()
            if self.capture is not None:
                self._cap_tx.flush()
                self._cap_rx.flush()
                self.capture.close()
            self.transport_closed = True
            self.changed()

    async def _send_loop(self) -> None:
        while True:
            data = self.conn.transmit(CHUNK)
            if data:
                if self.capture is not None:
                    self._cap_tx.feed(data)
                try:
                    self._writer.write(data)
                    await self._writer.drain()
                except OSError:
                    self.conn.connection_lost()
                    return
                continue
            if self.conn.wants_close:
                return
            self._wake.clear()
            await self._wake.wait()

    async def _receive_loop(self) -> None:
        while True:
            try:
                data = await self._reader.read(CHUNK)
            except OSError:
                data = b""
            if not data:
                self.conn.connection_lost()
                self._wake.set()
                return
            if self.capture is not None:
                self._cap_rx.feed(data)
            self.conn.receive(data)


async def connect(host: str, port: int, conn: Connection, *,
                  capture: str | os.PathLike | None = None) -> SocketLink:
    """Open a TCP connection to ``host``:``port`` and start ``conn`` (the initiator) over it.

    Returns the running :class:`SocketLink`; await :meth:`Link.established` for the MPA
    exchange. OSError (``ConnectionRefusedError`` ...) if TCP cannot connect.
    """
    reader, writer = await asyncio.open_connection(host, port)
    return SocketLink(conn, reader, writer, capture=capture).start()


async def serve(host: str, port: int, make_connection: Callable[[], Connection],
                handler: Callable[[SocketLink], Awaitable[None]] | None = None, *,
                capture_dir: str | os.PathLike | None = None,
                capture_prefix: str = "") -> asyncio.Server:
    """Listen on ``host``:``port``; every TCP connection gets its own responder
    ``make_connection()`` and, if given, ``handler(link)`` runs alongside its pump (without
    one, the connection lives until the peer closes it).

    When the handler returns or raises, the connection is closed (the exception then goes to
    the event loop's exception handler, like any failed connection callback). With
    ``capture_dir`` each connection is recorded to ``<capture_prefix><peer ip>-<peer port>.pcap``
    there.
    Returns the started :class:`asyncio.Server` (port 0: read the port from its sockets).
    """
    async def on_client(reader, writer):
        path = None
        if capture_dir is not None:
            peer = writer.get_extra_info("peername")
            path = os.path.join(capture_dir, f"{capture_prefix}{peer[0]}-{peer[1]}.pcap")
        link = SocketLink(make_connection(), reader, writer, capture=path).start()
        try:
            await (handler(link) if handler is not None else link.closed())
        finally:
            link.close()
            await link.task

    return await asyncio.start_server(on_client, host, port)
