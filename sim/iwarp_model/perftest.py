"""Linux perftest's ``-R`` (rdma_cm) protocol for ``ib_write_bw``, ``ib_read_bw`` and
``ib_send_bw`` (unidirectional, one QP), as perftest 4.5-0.17 (version "6.06") speaks it, so the
model's client and server interoperate with those tools on Linux siw.

The protocol (facts from perftest's sources, summarised in the project's notes):

* Two rdma_cm connections to the same port (:data:`PORT`, 18515), both initiated by the client:
  first the *comm* connection, then, after handshake K1, the *test* connection. No private data
  on either. The server must already listen for the test connection when it answers K1.
* On comm, every message is one signaled Send received into a single posted 56-byte receive
  (posted before the connection is made). Strict lock-step: the client sends, then waits for the
  reply; the server waits, reposts its receive, then replies. The exchanges, in order:

  - X1 version: 16 octets, ``"6.06"`` and NULs (the peer's must be at least ``5.70``);
  - X2 cycle buffer (page size) and X3 cache line, 4 octets each, big-endian; each side then
    uses the larger of its own and the peer's;
  - X4 MTU: the ``ibv_mtu`` enum in ASCII decimal and a NUL, 2 octets (``"3\\0"``: 1024);
  - K1, K2 (around the test connection) and K3, K4, K5: 56-octet handshakes (:class:`Dest`,
    big-endian: rkey at offset 16, vaddr at 24). K5's rkey/vaddr name the server's buffer for
    write/read; for send both sides advertise their credit buffer instead;
  - write/read: the client's traffic, then K6, the report R1-R5 (8 octets each: size and
    iterations as u64, peak and average bandwidth in MB/s of 2**20 octets and the message
    rate in Mpps as IEEE doubles, all big-endian; the server prints the client's), and K7;
  - send: K6 is the start signal (the server has posted its receives), then the traffic, K7.
* Addresses: a message of at most half the cycle buffer moves through it, both locally and
  at the peer, in steps of its size rounded up to the cache line; a larger one always uses
  the same addresses. The advertised region therefore holds max(size, cycle buffer) octets.
* ``ib_send_bw`` on iWARP (no RNR retry): the server RDMA-Writes the count of receives it has
  completed (a little-endian u32) into the client's 4-octet credit buffer whenever
  ``(count % rx_depth) % (rx_depth // 3) == 0``; the client posts only while
  ``posted + 1 - credit < rx_depth``. ``rx_depth`` = min(512, iterations), made even.
* Teardown: after K7 nothing more is sent. perftest's client closes the test connection once
  its K7 Send has completed and the reply arrived; perftest's server closes both once its
  reply has completed, without waiting. siw completes a Send some time after its FPDU is on
  the wire, and a connection closed by the peer in between fails that completion
  (``IBV_WC_LOC_QP_OP_ERR``, "Bad wc status 2", perftest exits 1): seen with the model's
  client closing comm right after the K7 reply arrived, and with the model's server closing
  right after its reply (once in 12 runs each). So the model's client closes the test
  connection and leaves comm to the server; the model's server closes both once the client
  has closed the test connection.

The applications are transport-independent, like :mod:`.apps`: they get their connections from
a *connection manager* with two calls (the model's: :class:`FrameCm`; the simulated NIC can
provide its own)::

    await cm.connect(port, prepare=..., **resources) -> Attached
    cm.listen(port) -> listener;  listener.accept(prepare=..., **resources) -> Future[Attached]

``resources`` are :class:`~.apps.Host`'s keywords (``ird``, ``ord``, ``send_wr``, ``recv_wr``,
``cqe``); ``prepare(host)`` is called on the new host before its MPA exchange can complete
(to post the receives the peer may fill at once). ``connect`` retries while the port refuses
(perftest's server listens for the test connection only after K1). ``listen`` listens at once;
``accept`` registers, at once, the resources of the next connection to arrive. An
:class:`Attached` is the connected ``host`` with ``close()`` (``rdma_disconnect``) and
``closed()`` (await the transport's end).
"""

import asyncio
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from .apps import AppError, Buffer, Completions, Disconnected, Host, pattern
from .engine import Connection
from .mr import Access
from .transport.frames import FrameEndpoint, FrameLink
from .transport.sockets import ConnectionClosed, LinkError
from .verbs import RecvWR, SendFlags, SendWR, WcOpcode, WrOpcode

__all__ = ["PORT", "VERSION", "MIN_VERSION", "OPS", "Dest", "BwReport", "PerftestError",
           "ProtocolError", "Attached", "ConnectionManager", "Listener", "PerftestClient",
           "PerftestServer", "ClientResult", "ServerResult", "FrameCm", "rx_depth",
           "tx_depth", "version_message"]

PORT = 18515
#: The version string perftest 4.5-0.17 sends (its ``configure.ac``), and the oldest it accepts.
VERSION = "6.06"
MIN_VERSION = 5.70
OPS = ("write", "read", "send")
VERSION_SIZE = 16
CYCLE_BUFFER = 4096  # the page size
CACHE_LINE = 64
MTU_ENUM = 3  # IBV_MTU_1024: the model's 1500-octet Ethernet, as siw reports it
COMM_RESOURCES = {"ird": 0, "ord": 0, "send_wr": 1, "recv_wr": 1, "cqe": 4}
MAX_TX_DEPTH = 128  # perftest's DEF_TX_BW
MAX_RX_DEPTH = 512  # perftest's DEF_RX_SEND
COMM_WR_ID = 5  # perftest's SYNC_SPEC_ID
_MTU_MESSAGE = f"{MTU_ENUM}\0".encode()


class PerftestError(AppError):
    """A perftest run failed (a completion error, a connection that ended early)."""


class ProtocolError(PerftestError):
    """The peer broke perftest's protocol: a bad version, a message of the wrong size or
    content."""


def version_message(version: str = VERSION) -> bytes:
    """X1: the version string, NUL-padded to 16 octets."""
    return version.encode().ljust(VERSION_SIZE, b"\0")


def _version(message: bytes) -> float:
    """The peer's version as C's ``atof`` reads it (a leading decimal number, else 0)."""
    text = message.split(b"\0", 1)[0].decode("latin-1").strip()
    number = ""
    for char in text:
        if not (char.isdigit() or (char == "." and "." not in number)):
            break
        number += char
    try:
        return float(number)
    except ValueError:
        return 0.0


def tx_depth(iters: int) -> int:
    """The work requests a perftest client keeps outstanding: 128, or fewer iterations."""
    return min(MAX_TX_DEPTH, iters)


def rx_depth(iters: int) -> int:
    """``ib_send_bw``'s receive depth: 512, or fewer iterations, rounded up to even."""
    depth = min(MAX_RX_DEPTH, iters)
    return depth + depth % 2


def _step(size: int, cycle: int, cache: int) -> tuple[int, int]:
    """(address step, posts per cycle): small messages move through the cycle buffer in
    steps of their size rounded up to the cache line; larger ones all use one address."""
    if size > cycle // 2:
        return 0, 1
    inc = -(-max(size, 1) // cache) * cache
    return inc, cycle // inc


@dataclass(frozen=True)
class Dest:
    """perftest's 56-octet handshake (``struct pingpong_dest``), big-endian: lid, out_reads,
    qpn, psn, rkey, 4 octets of padding, vaddr (u64), the 16-octet GID, srqn, gid_index.
    With ``-R`` the peer uses only ``rkey`` and ``vaddr``."""

    rkey: int = 0
    vaddr: int = 0
    qpn: int = 0
    psn: int = 0
    out_reads: int = 0
    lid: int = 0
    gid: bytes = bytes(16)
    srqn: int = 0
    gid_index: int = 0

    SIZE = 56
    _STRUCT = struct.Struct(">IIIII4xQ16sII")

    def encode(self) -> bytes:
        return self._STRUCT.pack(self.lid, self.out_reads, self.qpn, self.psn, self.rkey,
                                 self.vaddr, self.gid, self.srqn, self.gid_index)

    @classmethod
    def decode(cls, data: bytes) -> "Dest":
        if len(data) != cls.SIZE:
            raise ProtocolError(f"handshake of {len(data)} octets, expected {cls.SIZE}")
        lid, out_reads, qpn, psn, rkey, vaddr, gid, srqn, gid_index = cls._STRUCT.unpack(data)
        return cls(rkey, vaddr, qpn, psn, out_reads, lid, gid, srqn, gid_index)


@dataclass(frozen=True)
class BwReport:
    """R1-R5: what a bandwidth client measured (``bw_*`` in MB/s of 2**20 octets,
    ``msg_rate`` in millions of messages per second)."""

    size: int
    iters: int
    bw_peak: float
    bw_avg: float
    msg_rate: float

    def messages(self) -> list[bytes]:
        """The five 8-octet report messages, big-endian."""
        return [struct.pack(">Q", self.size), struct.pack(">Q", self.iters),
                struct.pack(">d", self.bw_peak), struct.pack(">d", self.bw_avg),
                struct.pack(">d", self.msg_rate)]

    @classmethod
    def from_messages(cls, messages: list[bytes]) -> "BwReport":
        (size,), (iters,) = struct.unpack(">Q", messages[0]), struct.unpack(">Q", messages[1])
        return cls(size, iters, *(struct.unpack(">d", m)[0] for m in messages[2:]))


# -- connection management --------------------------------------------------------------------

class Attached(Protocol):
    """A connected host: ``host`` (device, PD, CQs, QP in RTS), :meth:`close` ends the
    connection, :meth:`closed` returns once its transport has gone."""

    host: Host

    def close(self) -> None: ...

    async def closed(self) -> None: ...


class Listener(Protocol):
    """A port being listened on: :meth:`accept` says, at once, what the next connection to
    arrive gets (a host of ``resources``, ``prepare(host)`` before its MPA exchange ends) and
    returns a future of its :class:`Attached`; a connection no accept waits for is refused.
    :meth:`close` refuses every later one."""

    def accept(self, *, prepare: Callable[[Host], None], **resources) -> asyncio.Future: ...

    def close(self) -> None: ...


class ConnectionManager(Protocol):
    """How the applications get connections: :meth:`connect` to the peer's ``port`` (a host
    of ``resources``, ``prepare(host)`` first; retried while refused), :meth:`listen` on
    ``port`` (listening when it returns)."""

    async def connect(self, port: int, *, prepare: Callable[[Host], None],
                      **resources) -> Attached: ...

    def listen(self, port: int) -> Listener: ...


@dataclass
class _FrameAttached:
    host: Host
    link: FrameLink

    def close(self) -> None:
        self.link.close()

    async def closed(self) -> None:
        await self.link.closed()


class _FrameListener:
    """Responders for the connections to ``port``, each taking the oldest waiting
    :meth:`accept`'s resources; one that no accept waits for is rejected in MPA."""

    def __init__(self, endpoint: FrameEndpoint, port: int):
        self._waiting: list[tuple[asyncio.Future, Callable, dict]] = []
        self._made: dict[int, tuple[asyncio.Future, Host]] = {}
        self._tasks: set[asyncio.Task] = set()  # held: the loop keeps only weak references
        self._closed = False
        endpoint.listen(port, self._make, self._on_link)

    def accept(self, *, prepare: Callable[[Host], None], **resources) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((future, prepare, resources))
        return future

    def close(self) -> None:
        self._closed = True

    def _make(self) -> Connection:
        if self._closed or not self._waiting:
            conn = Connection(Host("perftest-refused").qp, active=False, auto_accept=False)
            conn.on_request = lambda c: c.reject(b"not accepting")
            return conn
        future, prepare, resources = self._waiting.pop(0)
        host = Host("perftest", **resources)
        prepare(host)
        conn = Connection(host.qp, active=False)
        self._made[id(conn)] = (future, host)
        return conn

    def _on_link(self, link: FrameLink) -> None:
        if id(link.conn) not in self._made:
            return
        future, host = self._made.pop(id(link.conn))

        async def established():
            try:
                await link.established()
                future.done() or future.set_result(_FrameAttached(host, link))
            except LinkError as error:
                future.done() or future.set_exception(error)
        task = asyncio.ensure_future(established())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class FrameCm:
    """The model's connection manager on its raw-frame TCP/IP (a :class:`FrameEndpoint`):
    connections to ``remote_ip``; ``connect`` retries every ``interval`` seconds for up to
    ``timeout`` while TCP is refused or closes during the MPA exchange, and returns
    ``settle`` seconds after the MPA Reply (Linux 6.1's siw responder may miss an FPDU that
    follows its Reply within milliseconds: it reads the socket as a QP only after sending
    the Reply)."""

    def __init__(self, endpoint: FrameEndpoint, remote_ip: str | None = None, *,
                 timeout: float = 30.0, interval: float = 0.1, settle: float = 0.0):
        self.endpoint, self.remote_ip = endpoint, remote_ip
        self.timeout, self.interval, self.settle = timeout, interval, settle

    async def connect(self, port: int, *, prepare: Callable[[Host], None],
                      **resources) -> _FrameAttached:
        deadline = time.monotonic() + self.timeout
        while True:
            host = Host("perftest", **resources)
            prepare(host)
            link = self.endpoint.connect(self.remote_ip, port, Connection(host.qp, active=True))
            try:
                await asyncio.wait_for(link.established(),
                                       max(0.1, deadline - time.monotonic()))
                await asyncio.sleep(self.settle)
                return _FrameAttached(host, link)
            except ConnectionClosed:
                if time.monotonic() + self.interval > deadline:
                    raise
            except TimeoutError:
                raise ConnectionClosed(f"no iWARP connection to {self.remote_ip}:{port} "
                                       f"within {self.timeout:.0f} s") from None
            await asyncio.sleep(self.interval)

    def listen(self, port: int) -> _FrameListener:
        return _FrameListener(self.endpoint, port)


# -- the comm channel -------------------------------------------------------------------------

class _Comm:
    """One side of the comm connection: a 56-octet receive buffer (its receive posted by
    :meth:`prepare`) and a send buffer; :meth:`exchange` does one lock-step exchange."""

    def __init__(self, *, server: bool, version: str):
        self.server, self.version = server, version
        self.attached: Attached | None = None
        self.exchanges = 0

    def prepare(self, host: Host) -> None:
        self.recv = host.register(Dest.SIZE, Access.LOCAL_WRITE)
        self.send = host.register(Dest.SIZE, Access.LOCAL_WRITE)
        self._post_recv(host)

    def _post_recv(self, host: Host) -> None:
        host.qp.post_recv(RecvWR(COMM_WR_ID, [self.recv.sge()]))

    def attach(self, attached: Attached) -> None:
        self.attached = attached
        self.completions = Completions(attached.host.qp)

    async def exchange(self, message: bytes, what: str, *, last: bool = False) -> bytes:
        """Send ``message`` and take the peer's of the same size (the server the other way
        round); :class:`ProtocolError` if the peer's is of another size. The receive is
        posted again after each message but the ``last`` (the peer may close the connection
        right after it, and a queue pair out of RTS may refuse the post)."""
        try:
            if self.server:
                reply = await self._receive(len(message), what, repost=not last)
                await self._send(message)
            else:
                await self._send(message)
                reply = await self._receive(len(message), what, repost=not last)
        except Disconnected as error:
            raise PerftestError(f"comm connection ended during {what}: {error}") from None
        self.exchanges += 1
        return reply

    async def _send(self, message: bytes) -> None:
        self.send.memory[:len(message)] = message
        self.attached.host.qp.post_send(SendWR(COMM_WR_ID, WrOpcode.SEND,
                                               [self.send.sge(0, len(message))],
                                               SendFlags.SIGNALED))
        await self.completions.send_op(WcOpcode.SEND)

    async def _receive(self, size: int, what: str, *, repost: bool) -> bytes:
        wc = await self.completions.recv()
        data = bytes(self.recv.memory[:wc.byte_len])
        if repost:
            self._post_recv(self.attached.host)
        if wc.byte_len != size:
            raise ProtocolError(f"{what}: a message of {wc.byte_len} octets, expected {size}")
        return data

    async def handshake(self, dest: Dest, what: str, *, last: bool = False) -> Dest:
        return Dest.decode(await self.exchange(dest.encode(), what, last=last))

    async def parameters(self) -> tuple[float, int, int]:
        """X1-X4: (the peer's version, cycle buffer, cache line), the last two the larger of
        ours and the peer's."""
        version = _version(await self.exchange(version_message(self.version),
                                                "version exchange"))
        if version < MIN_VERSION:
            raise ProtocolError(f"peer version {version:.2f}: perftest needs at least "
                                f"{MIN_VERSION:.2f}")
        cycle = struct.unpack(">i", await self.exchange(struct.pack(">i", CYCLE_BUFFER),
                                                       "cycle buffer exchange"))[0]
        cache = struct.unpack(">i", await self.exchange(struct.pack(">i", CACHE_LINE),
                                                       "cache line exchange"))[0]
        mtu = await self.exchange(_MTU_MESSAGE, "MTU exchange")
        if mtu[-1:] != b"\0" or not mtu[:-1].isdigit():
            raise ProtocolError(f"MTU message {mtu!r}: not a decimal number and a NUL")
        if cycle <= 0 or cache <= 0:
            raise ProtocolError(f"cycle buffer {cycle} or cache line {cache} not positive")
        return version, max(cycle, CYCLE_BUFFER), max(cache, CACHE_LINE)


def _check_args(op: str, size: int, iters: int) -> None:
    if op not in OPS:
        raise ValueError(f"operation {op!r}: one of {', '.join(OPS)}")
    if not 1 <= size < 1 << 31 or not 1 <= iters < 1 << 31:
        raise ValueError(f"size {size} or iterations {iters} out of range")


def _test_resources(op: str, iters: int, out_reads: int, *, server: bool) -> dict:
    depth = tx_depth(iters)
    reads = out_reads if op == "read" else 0
    recv = rx_depth(iters) if op == "send" and server else 1
    return {"ird": reads, "ord": reads, "send_wr": depth, "recv_wr": recv,
            "cqe": 2 * depth + recv}


def _region_size(size: int, cycle: int, cache: int) -> int:
    """The octets perftest's peer may touch from the advertised address."""
    return -(-max(size, cycle) // cache) * cache


# -- client -----------------------------------------------------------------------------------

@dataclass
class ClientResult:
    """What the client did: its ``report`` (as sent in R1-R5 for write/read), the server's
    ``remote`` handshake (K5), the ``peer_version``, ``seconds`` of traffic and the number
    of comm ``exchanges``; ``buffer`` is the local data buffer (read: what was read)."""

    op: str
    report: BwReport
    remote: Dest
    peer_version: float
    seconds: float
    exchanges: int
    buffer: Buffer = field(repr=False)


class _Side:
    """What the client and the server share: ``cm``, the operation, ``size`` and ``iters``,
    the ``port``, ``out_reads``, the data's ``seed``, ``linger`` and the comm connection's
    end (announcing ``version``)."""

    server = False

    def __init__(self, cm: ConnectionManager, op: str, *, size: int = 65536, iters: int = 1000,
                 port: int = PORT, out_reads: int = 16, seed: int = 0, linger: float = 2.0,
                 version: str = VERSION):
        _check_args(op, size, iters)
        self.cm, self.op, self.size, self.iters, self.port = cm, op, size, iters, port
        self.out_reads, self.seed, self.linger = out_reads, seed, linger
        self.comm = _Comm(server=self.server, version=version)


class PerftestClient(_Side):
    """``ib_<op>_bw -R -n iters -s size <server>``: :meth:`run` makes both connections through
    ``cm``, does every exchange and the traffic, closes the test connection after K7, waits
    up to ``linger`` seconds for the server to close the comm connection, closes it and
    returns a :class:`ClientResult`.
    ``out_reads``: the ORD asked for read_bw (perftest asks the device's maximum, 128 on
    siw). ``seed`` seeds the data written or sent; ``version`` is the one announced (tests
    only)."""

    async def run(self) -> ClientResult:
        comm = self.comm
        comm.attach(await self.cm.connect(self.port, prepare=comm.prepare, **COMM_RESOURCES))
        test = None
        try:
            version, cycle, cache = await comm.parameters()
            await comm.handshake(Dest(), "K1")
            test = await self.cm.connect(
                self.port, prepare=lambda host: None,
                **_test_resources(self.op, self.iters, self.out_reads, server=False))
            await comm.handshake(Dest(), "K2")
            host = test.host
            region = _region_size(self.size, cycle, cache)
            access = (Access.LOCAL_WRITE | Access.REMOTE_READ | Access.REMOTE_WRITE
                      if self.op == "read" else Access.LOCAL_WRITE)
            data = pattern(region, self.seed) if self.op != "read" else None
            buffer = host.register(region, access, data)
            credit = host.register(4, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
            advertised = credit if self.op == "send" else buffer
            mine = Dest(advertised.mr.rkey, advertised.addr, host.qp.qp_num,
                        out_reads=self.out_reads if self.op == "read" else 1)
            await comm.handshake(mine, "K3")
            await comm.handshake(mine, "K4")
            remote = await comm.handshake(mine, "K5")
            if self.op == "send":
                await comm.handshake(mine, "K6")
                seconds, window = await self._traffic(test, buffer, remote, cycle, cache,
                                                      credit)
            else:
                seconds, window = await self._traffic(test, buffer, remote, cycle, cache,
                                                      None)
                await comm.handshake(mine, "K6")
            report = self._report(seconds, window)
            if self.op != "send":
                for i, message in enumerate(report.messages()):
                    await comm.exchange(message, f"report R{i + 1}")
            await comm.handshake(mine, "K7", last=True)
            # the server closes comm once its K7 reply has completed (module doc: teardown)
            test.close()
            await _bounded(comm.attached.closed(), self.linger)
        finally:
            for attached in (test, comm.attached):
                if attached is not None:
                    attached.close()
        await _bounded(test.closed(), self.linger)
        return ClientResult(self.op, report, remote, version, seconds, comm.exchanges, buffer)

    def _report(self, seconds: float, window: float) -> BwReport:
        """The R1-R5 figures: the average over the run, and as peak the average over the
        fastest ``tx_depth`` consecutive operations (``window`` seconds from the first's post
        to the last's completion)."""
        total = self.size * self.iters
        avg = total / seconds / (1 << 20) if seconds > 0 else 0.0
        peak = self.size * tx_depth(self.iters) / window / (1 << 20) if window > 0 else avg
        rate = self.iters / seconds / 1e6 if seconds > 0 else 0.0
        return BwReport(self.size, self.iters, max(peak, avg), avg, rate)

    async def _traffic(self, test: Attached, buffer: Buffer, remote: Dest, cycle: int,
                       cache: int, credit: Buffer | None) -> tuple[float, float]:
        """Post ``iters`` operations, at most tx_depth outstanding (send: also within the
        credit window); (seconds from the first post to the last completion, the shortest
        time from a post to the completion of the operation tx_depth - 1 later)."""
        qp, size, iters = test.host.qp, self.size, self.iters
        depth, window = tx_depth(iters), rx_depth(iters)
        inc, per_cycle = _step(size, cycle, cache)
        opcode = {"write": WrOpcode.RDMA_WRITE, "read": WrOpcode.RDMA_READ,
                  "send": WrOpcode.SEND}[self.op]
        completions = Completions(qp)
        posted_at: list[float] = []
        done_at: dict[int, float] = {}
        posted = completed = 0
        start = time.perf_counter()
        while completed < iters:
            credits = (int.from_bytes(bytes(credit.memory[:4]), "little")
                       if credit is not None else 0)
            batch = []
            while (posted + len(batch) < iters and posted + len(batch) - completed < depth
                   and (credit is None
                        or (posted + len(batch) + 1 - credits) & 0xFFFF_FFFF < window)):
                n = posted + len(batch)
                offset = (n % per_cycle) * inc
                batch.append(SendWR(n, opcode, [buffer.sge(offset, size)], SendFlags.SIGNALED,
                                    remote_addr=remote.vaddr + offset, rkey=remote.rkey))
            if batch:
                now = time.perf_counter()
                posted_at += [now] * len(batch)
                qp.post_send(batch)
                posted += len(batch)
            try:
                if posted == completed:  # held by the credit window: poll the credit buffer
                    await asyncio.sleep(0.001)
                    continue
                wcs = await completions.send_batch()
            except Disconnected as error:
                raise PerftestError(f"test connection ended after {completed} of {iters} "
                                    f"completions: {error}") from None
            now = time.perf_counter()
            for wc in wcs:
                done_at[wc.wr_id] = now
            completed += len(wcs)
        seconds = time.perf_counter() - start
        return seconds, min(done_at[i + depth - 1] - posted_at[i]
                            for i in range(iters - depth + 1))


# -- server -----------------------------------------------------------------------------------

@dataclass
class ServerResult:
    """What the server saw: the client's ``report`` (R1-R5; None for send), its
    ``remote`` handshake (K5), ``received`` Sends, ``credits`` Written back, the number of
    comm ``exchanges`` and ``buffer`` (write: what was written; send: the last message)."""

    op: str
    report: BwReport | None
    remote: Dest
    peer_version: float
    received: int
    credits: int
    exchanges: int
    buffer: Buffer = field(repr=False)


class PerftestServer(_Side):
    """``ib_<op>_bw -R -n iters -s size``: :meth:`run` listens on ``port`` through ``cm``
    (keeping the listener open for the test connection), answers every exchange, serves the
    traffic (read: its buffer holds ``pattern(region, seed)``; send: receives and credit
    Writes), after K7 waits up to ``linger`` seconds for the client to close the test
    connection, closes both, waits as long for their transports to finish and returns a
    :class:`ServerResult`. Listening
    starts before :meth:`run`'s first await, so a client may be started right after it is
    scheduled. ``version`` is the one announced (tests only)."""

    server = True

    async def run(self) -> ServerResult:
        listener = self.cm.listen(self.port)
        comm, test = self.comm, None
        try:
            comm.attach(await listener.accept(prepare=comm.prepare, **COMM_RESOURCES))
            version, cycle, cache = await comm.parameters()
            accepting = listener.accept(
                prepare=lambda host: None,
                **_test_resources(self.op, self.iters, self.out_reads, server=True))
            await comm.handshake(Dest(), "K1")
            test = await accepting
            listener.close()
            await comm.handshake(Dest(), "K2")
            host = test.host
            region = _region_size(self.size, cycle, cache)
            if self.op == "send":
                buffer = host.register(self.size, Access.LOCAL_WRITE)
                credit = host.register(4, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
                mine = Dest(credit.mr.rkey, credit.addr, host.qp.qp_num, out_reads=1)
            else:
                access = Access.LOCAL_WRITE | Access.REMOTE_WRITE | (
                    Access.REMOTE_READ if self.op == "read" else Access(0))
                data = pattern(region, self.seed) if self.op == "read" else None
                buffer = host.register(region, access, data)
                credit = None
                mine = Dest(buffer.mr.rkey, buffer.addr, host.qp.qp_num,
                            out_reads=self.out_reads if self.op == "read" else 1)
            target = await comm.handshake(mine, "K3")  # send: the client's credit buffer
            await comm.handshake(mine, "K4")
            remote = await comm.handshake(mine, "K5")
            report, received, credits = None, 0, 0
            if self.op == "send":
                depth = rx_depth(self.iters)
                host.qp.post_recv([RecvWR(i, [buffer.sge()]) for i in range(depth)])
                await comm.handshake(mine, "K6")
                received, credits = await self._receive(test, buffer, credit, target, depth)
            else:
                await comm.handshake(mine, "K6")
                messages = [await comm.exchange(m, f"report R{i + 1}") for i, m in
                            enumerate(BwReport(self.size, self.iters, 0.0, 0.0, 0.0)
                                      .messages())]
                report = BwReport.from_messages(messages)
            await comm.handshake(mine, "K7", last=True)
            await _bounded(test.closed(), self.linger)  # the client's K7 Send has completed
        finally:
            listener.close()
            for attached in (test, comm.attached):
                if attached is not None:
                    attached.close()
        await _bounded(asyncio.gather(test.closed(), comm.attached.closed()), self.linger)
        return ServerResult(self.op, report, remote, version, received, credits,
                            comm.exchanges, buffer)

    async def _receive(self, test: Attached, buffer: Buffer, credit: Buffer, target: Dest,
                       depth: int) -> tuple[int, int]:
        """Take ``iters`` Sends, reposting while fewer than ``iters`` receives were posted,
        and Write the count into the client's credit buffer every ``depth // 3``; then wait
        for those Writes. (received, credit Writes)."""
        qp, iters = test.host.qp, self.iters
        every = max(1, depth // 3)
        completions = Completions(qp)
        posted, received, credits, credits_done = depth, 0, 0, 0
        try:
            while received < iters:
                wc = await completions.recv()
                if wc.byte_len != self.size:
                    raise ProtocolError(f"Send {received} of {wc.byte_len} octets, expected "
                                        f"{self.size}")
                received += 1
                if posted < iters:
                    qp.post_recv(RecvWR(posted, [buffer.sge()]))
                    posted += 1
                if (received % depth) % every == 0:
                    credit.memory[:4] = received.to_bytes(4, "little")
                    qp.post_send(SendWR(credits, WrOpcode.RDMA_WRITE, [credit.sge()],
                                        SendFlags.SIGNALED, remote_addr=target.vaddr,
                                        rkey=target.rkey))
                    credits += 1
                    completions.poll()
                    credits_done += len(completions.sends)
                    completions.drain_sends()
            while credits_done < credits:
                credits_done += len(await completions.send_batch())
        except Disconnected as error:
            raise PerftestError(f"test connection ended after {received} of {iters} "
                                f"Sends: {error}") from None
        return received, credits


async def _bounded(awaitable, seconds: float) -> None:
    """Await ``awaitable`` for at most ``seconds`` (a peer that has vanished never answers a
    close: perftest exits, the guest powers off)."""
    try:
        await asyncio.wait_for(awaitable, seconds)
    except TimeoutError:
        pass
