"""Applications over the model's verbs API, independent of the transport: a perftest-style
bandwidth and latency test, and rping- and ucmatose-compatible clients and servers.

Each application takes a :class:`Host` (device, PD, CQs and a QP in INIT, as ``rdma_cm``'s
``rdma_create_qp`` leaves it) and is built *before* the connection, because it posts its first
receives then; its ``run`` coroutines need the connection established and wait with
:meth:`CQ.wait <iwarp_model.verbs.CQ.wait>`. A connection that ends shows up as flushed
receives (``IBV_WC_WR_FLUSH_ERR``, RFC 5040 section 6), which is how a server learns that the
client has gone.

rping (librdmacm ``examples/rping.c``), per ping: the client writes its start buffer with the
rping pattern (``"rdma-ping-%d: "``, then the letters ``A``..``z`` from a start letter that moves
one on per ping, a NUL last) and Sends a 16-byte :class:`BufferInfo` {``__be64 buf``,
``__be32 rkey``, ``__be32 size``} naming it; the server RDMA-Reads ``size`` bytes of it into its
own buffer and Sends a "go ahead" (16 bytes: rping sends its never-written info buffer, zeros);
the client Sends the info of its RDMA buffer; the server RDMA-Writes ``strlen + 1`` bytes of its
buffer there and Sends "go ahead"; the client compares the two buffers and prints
``ping data: ...``. The server never learns the count: it loops until the connection ends. The
server's buffer is its own ``size`` (default 64), so a client with a larger size makes the
server's Read fail with a local protection error, as in rping. rping asks for IRD = ORD = 1.

ucmatose (``examples/cmatose.c``): each side posts ``message_count`` receives of
``message_size`` bytes (defaults 10 and 100) on one buffer before connecting, with separate
send and receive CQs and every send signaled; the server Sends ``message_count`` messages,
reaps their completions, then waits for as many receives; the client waits for its receives,
then Sends its replies. The server sends first, so with this engine (which holds a responder's
first FPDU until the initiator's, RFC 5044 section 7.1.2) the connection must use the
peer-to-peer RTR of RFC 6581 (``p2p=True``); Linux siw sends regardless.

The perf test (:class:`PerfClient`, :class:`PerfServer`): the client's MPA Request carries a
:class:`PerfRequest` (op, size, iterations) as private data; the server registers a buffer for
it, posts the receives a Send test needs, and accepts with its :class:`BufferInfo` as the
Reply's private data, or rejects with a reason. The client then keeps ``depth`` requests in
flight; Write and Send tests end with a zero-length RDMA Read, whose response proves every
earlier message was placed at the server. The clock runs from the first post to the last
completion.
"""

import asyncio
import random
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .engine import Connection
from .mr import Access
from .verbs import (
    SGE,
    WC,
    Device,
    DeviceAttr,
    QpState,
    RecvWR,
    SendFlags,
    SendWR,
    WcOpcode,
    WcStatus,
    WrOpcode,
)

__all__ = ["AppError", "CompletionError", "Disconnected", "Host", "Buffer", "BufferInfo",
           "Completions", "PerfRequest", "PerfResult", "PerfClient", "PerfServer", "OPS",
           "perf_table", "rping_pattern", "RpingClient", "RpingServer", "Ucmatose",
           "RPING_PORT", "RPING_MIN_SIZE", "RPING_MAX_SIZE", "UCMATOSE_PORT"]

RPING_PORT = 7174
RPING_DEFAULT_SIZE = 64
#: rping's bounds: ``sizeof("2147483647") + sizeof("rdma-ping-%d: ")`` .. ``64 KiB - 1``.
RPING_MIN_SIZE = 26
RPING_MAX_SIZE = 64 * 1024 - 1
UCMATOSE_PORT = 7471
OPS = ("write", "read", "send", "atomic")
#: The most iterations a Send test may ask for (the server posts one receive per message).
MAX_SEND_ITERS = 1 << 16
#: The largest perf buffer a server registers.
MAX_PERF_SIZE = 1 << 28
_RW = Access.LOCAL_WRITE | Access.REMOTE_READ | Access.REMOTE_WRITE
_FLUSH = WcStatus.WR_FLUSH_ERR
_RECV_OPCODES = frozenset({WcOpcode.RECV, WcOpcode.RECV_RDMA_WITH_IMM})


class AppError(Exception):
    """An application-level failure (bad message, data mismatch)."""


class CompletionError(AppError):
    """A work request completed with an error status; ``wc`` is the completion."""

    def __init__(self, wc: WC, what: str = "work request"):
        super().__init__(f"{what} wr_id {wc.wr_id} completed with "
                         f"IBV_WC_{WcStatus(wc.status).name}")
        self.wc = wc


class Disconnected(AppError):
    """The connection ended (a flushed work request) before the application was done."""


class Buffer:
    """A registered buffer: ``memory`` (a bytearray) at virtual address ``addr``, MR ``mr``."""

    def __init__(self, memory: bytearray, mr):
        self.memory, self.mr = memory, mr

    @property
    def addr(self) -> int:
        return self.mr.iova

    def sge(self, offset: int = 0, length: int | None = None) -> SGE:
        length = len(self.memory) - offset if length is None else length
        return SGE(self.addr + offset, length, self.mr.lkey)

    def info(self, size: int | None = None) -> "BufferInfo":
        return BufferInfo(self.addr, self.mr.rkey, len(self.memory) if size is None else size)


class Host:
    """One endpoint's verbs resources: a :class:`Device`, a PD, one CQ (or a send and a
    receive CQ with ``separate_cqs``) and an RC QP in INIT with the given IRD, ORD and queue
    depths. :meth:`register` allocates and registers buffers at distinct virtual addresses."""

    def __init__(self, name: str = "iwarp0", *, ird: int = 16, ord: int = 16,
                 send_wr: int = 64, recv_wr: int = 64, cqe: int = 1 << 12,
                 separate_cqs: bool = False, sq_sig_all: bool = False):
        depth = max(4096, send_wr, recv_wr)
        self.device = Device(name, DeviceAttr(max_qp_wr=depth, max_cqe=max(1 << 16, cqe)))
        self.pd = self.device.alloc_pd()
        self.send_cq = self.device.create_cq(cqe)
        self.recv_cq = self.device.create_cq(cqe) if separate_cqs else self.send_cq
        self.qp = self.device.create_qp(self.pd, self.send_cq, self.recv_cq,
                                        max_send_wr=send_wr, max_recv_wr=recv_wr,
                                        max_send_sge=1, max_recv_sge=1, max_rd_atomic=ord,
                                        max_dest_rd_atomic=ird, sq_sig_all=sq_sig_all)
        self.qp.modify(QpState.INIT)
        self._next_iova = 0x7F00_0000_0000

    def register(self, size: int, access: Access = Access.LOCAL_WRITE,
                 data: bytes | None = None) -> Buffer:
        """A new zeroed (or ``data``-filled) buffer of ``size`` bytes, registered page-aligned."""
        memory = bytearray(size) if data is None else bytearray(data)
        mr = self.device.reg_mr(self.pd, memory, access, iova=self._next_iova)
        self._next_iova += (size + 0xFFF) // 0x1000 * 0x1000 + 0x1000
        return Buffer(memory, mr)


@dataclass(frozen=True)
class BufferInfo:
    """rping's ``struct rping_rdma_info``: a buffer's address, rkey and size, big-endian."""

    addr: int
    rkey: int
    size: int

    SIZE = 16
    _STRUCT = struct.Struct(">QII")

    def encode(self) -> bytes:
        return self._STRUCT.pack(self.addr, self.rkey, self.size)

    @classmethod
    def decode(cls, data: bytes) -> "BufferInfo":
        if len(data) != cls.SIZE:
            raise AppError(f"buffer info of {len(data)} bytes, expected {cls.SIZE}")
        return cls(*cls._STRUCT.unpack(data))


class Completions:
    """The completions of ``qp``'s CQs (one shared or two), sorted into send and receive
    queues, with waits. Errors are raised: a flushed request as :class:`Disconnected`, any
    other failure as :class:`CompletionError`."""

    def __init__(self, qp):
        self.cqs = [qp.send_cq] if qp.send_cq is qp.recv_cq else [qp.send_cq, qp.recv_cq]
        self.sends: deque[WC] = deque()
        self.recvs: deque[WC] = deque()

    def poll(self) -> None:
        """Move every completion waiting in the CQs to the send and receive queues."""
        for cq in self.cqs:
            for wc in cq.poll_cq(len(cq)):
                (self.recvs if wc.opcode in _RECV_OPCODES else self.sends).append(wc)

    async def _wait(self) -> None:
        if len(self.cqs) == 1:
            await self.cqs[0].wait()
            return
        waits = [asyncio.ensure_future(cq.wait()) for cq in self.cqs]
        _done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()

    async def _take(self, queue: deque) -> list[WC]:
        while True:
            self.poll()
            if queue:
                wcs = list(queue)
                queue.clear()
                for wc in wcs:
                    check(wc)
                return wcs
            await self._wait()

    async def send_batch(self) -> list[WC]:
        """Every send completion now waiting (at least one; waits for it)."""
        return await self._take(self.sends)

    async def recv(self) -> WC:
        """The next receive completion."""
        while True:
            self.poll()
            if self.recvs:
                return check(self.recvs.popleft(), "receive")
            await self._wait()

    async def send_op(self, opcode: WcOpcode) -> WC:
        """The next send completion with ``opcode``; other send completions before it are
        checked and dropped (rping's completion handler does the same)."""
        while True:
            self.poll()
            while self.sends:
                wc = check(self.sends.popleft())
                if wc.opcode == opcode:
                    return wc
            await self._wait()

    def drain_sends(self) -> None:
        """Check and drop the send completions waiting."""
        self.poll()
        while self.sends:
            check(self.sends.popleft())


def check(wc: WC, what: str = "work request") -> WC:
    """``wc`` if it succeeded; :class:`Disconnected` if flushed; else :class:`CompletionError`."""
    if wc.status == WcStatus.SUCCESS:
        return wc
    if wc.status == _FLUSH:
        raise Disconnected(f"{what} wr_id {wc.wr_id} flushed: the connection ended")
    raise CompletionError(wc, what)


# -- perftest ---------------------------------------------------------------------------------

def pattern(size: int, seed: int = 0) -> bytes:
    """``size`` deterministic pseudo-random bytes (the perf test's payload)."""
    return random.Random(seed).randbytes(size)


@dataclass(frozen=True)
class PerfRequest:
    """What a perf client will do, sent as its MPA Request's private data:
    ``"IWPF" | version (1) | op index (1) | 0 (2) | size (4) | iterations (4)``, big-endian."""

    op: str
    size: int
    iters: int

    MAGIC = b"IWPF"
    VERSION = 1
    _STRUCT = struct.Struct(">4sBBxxII")

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"operation {self.op!r}: one of {', '.join(OPS)}")
        if not 0 <= self.size < 1 << 32 or not 1 <= self.iters < 1 << 32:
            raise ValueError(f"size {self.size} or iterations {self.iters} out of range")
        if self.op == "atomic" and self.size != 8:
            raise ValueError("atomics are 8 bytes: --size 8")

    def encode(self) -> bytes:
        return self._STRUCT.pack(self.MAGIC, self.VERSION, OPS.index(self.op), self.size,
                                 self.iters)

    @classmethod
    def decode(cls, data: bytes) -> "PerfRequest":
        if len(data) != cls._STRUCT.size or data[:4] != cls.MAGIC:
            raise AppError("not a perf test request")
        _magic, version, op, size, iters = cls._STRUCT.unpack(data)
        if version != cls.VERSION or op >= len(OPS):
            raise AppError(f"perf request version {version}, op {op}: not understood")
        try:
            return cls(OPS[op], size, iters)
        except ValueError as error:
            raise AppError(str(error)) from None


@dataclass(frozen=True)
class PerfResult:
    """One perf run: ``bytes`` moved in ``seconds``; ``mb_per_sec`` in MB of 2**20 bytes as
    perftest counts them; ``latency_us`` the mean time from posting a request to its
    completion (a Write or Send completes when its last FPDU is handed to TCP, a Read or
    atomic when its response is in)."""

    op: str
    size: int
    iterations: int
    bytes: int
    seconds: float
    latency_us: float

    @property
    def mb_per_sec(self) -> float:
        return self.bytes / self.seconds / (1 << 20) if self.seconds > 0 else 0.0


_RULE = "-" * 79


def perf_table(result: PerfResult) -> str:
    """The result as ib_write_bw prints its table."""
    return "\n".join(line.rstrip() for line in [
        _RULE,
        f" {'#bytes':<10} {'#iterations':<14} {'BW average[MB/sec]':<21} "
        f"{'t_avg[usec]':<12}",
        f" {result.size:<10} {result.iterations:<14} {result.mb_per_sec:<21.2f} "
        f"{result.latency_us:<12.2f}",
        _RULE,
    ])


class PerfClient:
    """The active side of the perf test; ``private_data`` goes into the MPA Request."""

    def __init__(self, host: Host, request: PerfRequest, *, depth: int = 16):
        if not 1 <= depth < host.qp.max_send_wr:
            raise ValueError(f"depth {depth}: 1..{host.qp.max_send_wr - 1} (the send queue)")
        self.host, self.request, self.depth = host, request, depth
        data = pattern(request.size) if request.op in ("write", "send") else None
        self.buffer = host.register(request.size, _RW, data)
        self.private_data = request.encode()
        self.completions = Completions(host.qp)

    def _wr(self, index: int, remote: BufferInfo) -> SendWR:
        op, size = self.request.op, self.request.size
        if op == "write":
            return SendWR(index, WrOpcode.RDMA_WRITE, [self.buffer.sge(0, size)],
                          SendFlags.SIGNALED, remote_addr=remote.addr, rkey=remote.rkey)
        if op == "read":
            return SendWR(index, WrOpcode.RDMA_READ, [self.buffer.sge(0, size)],
                          SendFlags.SIGNALED, remote_addr=remote.addr, rkey=remote.rkey)
        if op == "send":
            return SendWR(index, WrOpcode.SEND, [self.buffer.sge(0, size)], SendFlags.SIGNALED)
        return SendWR(index, WrOpcode.ATOMIC_FETCH_AND_ADD, [self.buffer.sge(0, 8)],
                      SendFlags.SIGNALED, remote_addr=remote.addr, rkey=remote.rkey,
                      compare_add=1)

    async def run(self, remote: BufferInfo) -> PerfResult:
        """Run the test against the server's buffer ``remote`` (the Reply's private data)."""
        qp, iters, size = self.host.qp, self.request.iters, self.request.size
        if remote.size < size:
            raise AppError(f"the server's buffer holds {remote.size} bytes, not {size}")
        posted_at: dict[int, float] = {}
        posted = completed = 0
        latency = 0.0
        start = time.perf_counter()
        while completed < iters:
            batch = []
            while posted + len(batch) < iters and posted + len(batch) - completed < self.depth:
                batch.append(self._wr(posted + len(batch), remote))
            if batch:
                now = time.perf_counter()
                for wr in batch:
                    posted_at[wr.wr_id] = now
                qp.post_send(batch)
                posted += len(batch)
            wcs = await self.completions.send_batch()
            now = time.perf_counter()
            for wc in wcs:
                latency += now - posted_at.pop(wc.wr_id)
            completed += len(wcs)
        if self.request.op in ("write", "send"):
            qp.post_send(SendWR(iters, WrOpcode.RDMA_READ, [], SendFlags.SIGNALED,
                                remote_addr=remote.addr, rkey=remote.rkey))
            await self.completions.send_op(WcOpcode.RDMA_READ)
        seconds = time.perf_counter() - start
        return PerfResult(self.request.op, size, iters, size * iters, seconds,
                          latency / iters * 1e6)


class PerfServer:
    """The passive side of the perf test. Use :meth:`on_request` as the responder
    connection's ``on_request`` (with ``auto_accept=False``), then await :meth:`run`."""

    def __init__(self, host: Host):
        self.host = host
        self.request: PerfRequest | None = None
        self.buffer: Buffer | None = None
        self.received = 0
        self.completions = Completions(host.qp)

    def on_request(self, conn: Connection) -> None:
        """Decode the request, set up for it and accept with the buffer's info, or reject
        with the reason as text."""
        try:
            request = PerfRequest.decode(conn.peer_private_data)
            if request.size > MAX_PERF_SIZE:
                raise AppError(f"size {request.size}: at most {MAX_PERF_SIZE}")
            if request.op == "send" and request.iters > MAX_SEND_ITERS:
                raise AppError(f"send test of {request.iters} iterations: at most "
                               f"{MAX_SEND_ITERS}")
            if request.op == "send" and request.iters + 1 > self.host.qp.max_recv_wr:
                raise AppError(f"send test of {request.iters} iterations: the receive queue "
                               f"holds {self.host.qp.max_recv_wr - 1}")
        except AppError as error:
            conn.reject(str(error).encode())
            return
        self.request = request
        access = _RW | (Access.REMOTE_ATOMIC if request.op == "atomic" else Access(0))
        data = pattern(request.size) if request.op == "read" else None
        self.buffer = self.host.register(max(request.size, 8), access, data)
        receives = request.iters if request.op == "send" else 0
        self.host.qp.post_recv([RecvWR(i, [self.buffer.sge(0, request.size)])
                                for i in range(receives)])
        # One more receive that no message takes: its flush says the client has gone.
        self.host.qp.post_recv(RecvWR(receives, [self.buffer.sge(0, 0)]))
        conn.accept(self.buffer.info().encode())

    async def run(self) -> int:
        """Count the Sends received until the client disconnects; the count is returned.
        :class:`CompletionError` if a receive fails otherwise."""
        while True:
            try:
                await self.completions.recv()
            except Disconnected:
                return self.received
            self.received += 1


# -- rping ------------------------------------------------------------------------------------

def rping_pattern(ping: int, size: int) -> bytes:
    """rping's start buffer for ping number ``ping`` (from 0): the formatted text, then the
    letters 65..122 from ``65 + ping % 58`` on, wrapping, with a NUL in the last byte."""
    if size < 1:
        raise ValueError("size must be at least 1")
    text = f"rdma-ping-{ping}: ".encode()
    c = 65 + ping % 58
    tail = bytearray()
    for _ in range(max(0, size - len(text))):
        tail.append(c)
        c = 65 if c >= 122 else c + 1
    buf = bytearray((text + bytes(tail))[:size])
    buf[size - 1] = 0
    return bytes(buf)


def _cstring(data: bytes) -> str:
    end = data.find(0)
    return data[:len(data) if end < 0 else end].decode("latin-1")


class _Rping:
    def __init__(self, host: Host, size: int, verbose: bool, out: Callable[[str], None]):
        if not RPING_MIN_SIZE <= size <= RPING_MAX_SIZE:
            raise ValueError(f"rping size {size}: {RPING_MIN_SIZE}..{RPING_MAX_SIZE}")
        self.host, self.size, self.verbose, self.out = host, size, verbose, out
        self.recv_buf = host.register(BufferInfo.SIZE, Access.LOCAL_WRITE)
        self.send_buf = host.register(BufferInfo.SIZE, Access(0))
        self.rdma_buf = host.register(size, _RW)
        self.completions = Completions(host.qp)
        self._post_recv()

    def _post_recv(self) -> None:
        self.host.qp.post_recv(RecvWR(1, [self.recv_buf.sge()]))

    async def _recv_info(self) -> bytes:
        wc = await self.completions.recv()
        if wc.byte_len != BufferInfo.SIZE:
            raise AppError(f"Received bogus data, size {wc.byte_len}")
        data = bytes(self.recv_buf.memory)
        self._post_recv()
        return data

    def _send(self, info: bytes) -> None:
        self.send_buf.memory[:] = info
        self.host.qp.post_send(SendWR(2, WrOpcode.SEND, [self.send_buf.sge()],
                                      SendFlags.SIGNALED))


class RpingServer(_Rping):
    """rping -s: posts its receive at construction; :meth:`run` serves pings until the client
    disconnects and returns how many it served."""

    def __init__(self, host: Host, *, size: int = RPING_DEFAULT_SIZE, verbose: bool = False,
                 out: Callable[[str], None] = print):
        super().__init__(host, size, verbose, out)
        self.pings = 0

    async def run(self) -> int:
        qp = self.host.qp
        try:
            while True:
                source = BufferInfo.decode(await self._recv_info())
                qp.post_send(SendWR(3, WrOpcode.RDMA_READ, [self.rdma_buf.sge(0, source.size)],
                                    SendFlags.SIGNALED, remote_addr=source.addr,
                                    rkey=source.rkey))
                await self.completions.send_op(WcOpcode.RDMA_READ)
                if self.verbose:
                    self.out(f"server ping data: {_cstring(self.rdma_buf.memory)}")
                self._send(bytes(BufferInfo.SIZE))  # "go ahead": rping's unwritten info
                sink = BufferInfo.decode(await self._recv_info())
                length = self.rdma_buf.memory.find(0) + 1 or len(self.rdma_buf.memory)
                qp.post_send(SendWR(4, WrOpcode.RDMA_WRITE, [self.rdma_buf.sge(0, length)],
                                    SendFlags.SIGNALED, remote_addr=sink.addr,
                                    rkey=sink.rkey))
                await self.completions.send_op(WcOpcode.RDMA_WRITE)
                self._send(bytes(BufferInfo.SIZE))
                self.pings += 1
        except Disconnected:
            return self.pings


class RpingClient(_Rping):
    """rping -c: posts its receive at construction; :meth:`run` does ``count`` pings (0:
    until the connection fails), validating each (rping -V) and printing ``ping data: ...``
    when ``verbose``. Returns the number of pings; :class:`AppError` on a mismatch."""

    def __init__(self, host: Host, *, size: int = RPING_DEFAULT_SIZE, count: int = 0,
                 validate: bool = True, verbose: bool = False,
                 out: Callable[[str], None] = print):
        super().__init__(host, size, verbose, out)
        if count < 0:
            raise ValueError(f"Invalid count {count}")
        self.count, self.validate = count, validate
        self.start_buf = host.register(size, _RW)

    async def run(self) -> int:
        ping = 0
        while not self.count or ping < self.count:
            self.start_buf.memory[:] = rping_pattern(ping, self.size)
            self._send(self.start_buf.info(self.size).encode())
            await self._recv_info()
            self._send(self.rdma_buf.info(self.size).encode())
            await self._recv_info()
            self.completions.drain_sends()
            if self.validate and self.start_buf.memory != self.rdma_buf.memory:
                raise AppError(f"data mismatch in ping {ping}")
            if self.verbose:
                self.out(f"ping data: {_cstring(self.rdma_buf.memory)}")
            ping += 1
        return ping


# -- ucmatose ---------------------------------------------------------------------------------

class Ucmatose:
    """One side of ucmatose. The host should have ``separate_cqs=True``, ``sq_sig_all=True``
    and queues of at least ``message_count``; the receives are posted at construction.
    ``data`` is the message content sent (``message_size`` bytes; zeros by default)."""

    def __init__(self, host: Host, *, message_size: int = 100, message_count: int = 10,
                 data: bytes | None = None):
        if message_size < 0 or message_count < 0:
            raise ValueError("message size and count must not be negative")
        if not message_size:
            message_count = 0  # as cmatose: no messages of size 0
        self.host, self.size, self.count = host, message_size, message_count
        self.buffer = host.register(message_size, Access.LOCAL_WRITE, data)
        self.completions = Completions(host.qp)
        self.received: list[WC] = []
        host.qp.post_recv([RecvWR(i, [self.buffer.sge()]) for i in range(self.count)])

    def _post_sends(self) -> None:
        self.host.qp.post_send([SendWR(i, WrOpcode.SEND, [self.buffer.sge()])
                                for i in range(self.count)])

    async def _sends_done(self) -> None:
        done = 0
        while done < self.count:
            done += len(await self.completions.send_batch())

    async def _receive_all(self) -> None:
        while len(self.received) < self.count:
            wc = await self.completions.recv()
            if wc.byte_len != self.size:
                raise AppError(f"received {wc.byte_len} bytes, expected {self.size}")
            self.received.append(wc)

    async def run_server(self) -> None:
        """Send the messages, reap their completions, then receive as many."""
        if self.count:
            self._post_sends()
            await self._sends_done()
            await self._receive_all()

    async def run_client(self) -> None:
        """Receive the server's messages, then send the replies and reap their completions
        (the caller then waits for the server to disconnect, as cmatose does)."""
        if self.count:
            await self._receive_all()
            self._post_sends()
            await self._sends_done()
