"""The host's end of a QEMU ``-netdev socket`` wire.

QEMU's socket netdev carries each Ethernet frame on a TCP stream as a 4-byte big-endian length
followed by the frame from the destination MAC on (no preamble, no FCS). A :class:`SocketNetdev`
speaks that framing on 127.0.0.1, either connecting to a guest started with ``netdev="listen"`` or
listening for a guest started with ``netdev="connect"``.
"""

import socket
import struct
import time

MIN_FRAME = 60  # Ethernet minimum without the FCS; shorter frames are padded by send_frame
MAX_FRAME = 65535  # what the framing allows; the guest's MTU of 1500 means 1514 on its side


class SocketNetdev:
    """One end of a socket-netdev stream. Use :meth:`connect` or :meth:`listen`."""

    def __init__(self, sock: socket.socket | None = None, server: socket.socket | None = None):
        self._sock = sock
        self._server = server
        self._buf = b""
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @classmethod
    def connect(cls, port: int, *, host: str = "127.0.0.1", timeout: float = 30.0):
        """Connect to a listening QEMU, retrying until ``timeout`` while it starts."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return cls(socket.create_connection((host, port), timeout=5))
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    @classmethod
    def listen(cls, port: int = 0, *, host: str = "127.0.0.1"):
        """Listen for one QEMU (``port`` 0 picks a free one: see :attr:`port`)."""
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((host, port))
        server.listen(1)
        return cls(server=server)

    @property
    def port(self) -> int:
        return (self._server or self._sock).getsockname()[1]

    def accept(self, timeout: float | None = None) -> None:
        """Wait for the QEMU that connects to this listener."""
        if self._sock is not None:
            return
        self._server.settimeout(timeout)
        sock, _ = self._server.accept()
        self._server.close()
        self._server = None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock

    def send_frame(self, frame: bytes, *, pad: bool = True) -> None:
        """Send one Ethernet frame (without FCS), padded to 60 bytes unless ``pad`` is false."""
        if self._sock is None:
            self.accept()
        frame = bytes(frame)
        if pad and len(frame) < MIN_FRAME:
            frame += bytes(MIN_FRAME - len(frame))
        if len(frame) > MAX_FRAME:
            raise ValueError(f"frame of {len(frame)} bytes")
        self._sock.sendall(struct.pack(">I", len(frame)) + frame)

    def recv_frame(self, timeout: float | None = None) -> bytes | None:
        """The next frame, or ``None`` after ``timeout`` seconds. EOFError when QEMU is gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._sock is None:
            try:
                self.accept(timeout)
            except TimeoutError:
                return None
        while True:
            if len(self._buf) >= 4:
                (n,) = struct.unpack(">I", self._buf[:4])
                if len(self._buf) >= 4 + n:
                    frame, self._buf = self._buf[4:4 + n], self._buf[4 + n:]
                    return frame
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            self._sock.settimeout(left)
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                return None
            if not data:
                raise EOFError("the socket netdev peer closed the stream")
            self._buf += data

    def close(self) -> None:
        for s in (self._sock, self._server):
            if s is not None:
                s.close()
        self._sock = self._server = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
