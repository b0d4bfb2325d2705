"""The reference model on a siw guest's wire: the model's own TCP/IP (:mod:`iwarp_model.transport.
rawtcp`) speaking raw Ethernet frames on the guest's QEMU socket netdev, every frame recorded.

::

    port = free_port()
    with SiwGuest("stock", "iwarp.role=rping-server", netdev="listen", port=port,
                  ip=f"{GUEST_IP}/24") as guest:
        async with ModelPeer(port, "run.pcap") as peer:
            link = peer.endpoint.connect(GUEST_IP, 7174, Connection(qp, active=True))
            await link.established()

:class:`ModelPeer` connects to the guest's listening netdev (QEMU takes the first connection as
its peer, so nothing else may connect), builds a :class:`~iwarp_model.transport.rawtcp.RawStack`
at :data:`MODEL_IP` whose frames go to the netdev through a
:class:`~iwarp_model.pcap.PcapWriter`, and runs it (:func:`~iwarp_model.transport.frames.
run_stack`) as an asyncio task until :meth:`ModelPeer.close`. Engine connections are made with
its :class:`~iwarp_model.transport.frames.FrameEndpoint` (``peer.endpoint``).
"""

import asyncio
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from iwarp_model.engine import Connection
from iwarp_model.pcap import PcapWriter, read_pcap
from iwarp_model.transport.frames import (
    FrameEndpoint,
    FrameLink,
    QemuSocketNetdev,
    recording,
    run_stack,
)
from iwarp_model.transport.rawtcp import RawStack
from iwarp_model.transport.sockets import ConnectionClosed
from iwarp_model.wire import mpa
from iwarp_model.wire.fpdu import crc_field, fpdu_length
from iwarp_model.wire.net import (
    ETHERTYPE_IPV4,
    PROTO_TCP,
    SYN,
    EthernetFrame,
    IPv4Packet,
    TcpSegment,
    ipv4_str,
)

from .guest import GuestResult, SiwGuest, connect_netdev

__all__ = ["ModelPeer", "MODEL_IP", "MODEL_MAC", "GUEST_IP", "guest_result", "guest_ready",
           "Stream", "Fpdu", "tcp_streams"]

MODEL_IP = "169.254.1.1"
MODEL_MAC = "02:00:a9:fe:01:01"
GUEST_IP = "169.254.1.2"


class ModelPeer:
    """The model's network stack on the guest's netdev at 127.0.0.1:``port``.

    ``pcap`` is the path of the capture (every frame both ways, wall-clock timestamps); ``seed``
    seeds the stack's ISNs and ports. Use as an async context manager, or :meth:`start` and
    :meth:`close`. After :meth:`start`: ``stack`` (the RawStack), ``endpoint`` (its
    FrameEndpoint, for ``listen``) and ``pcap_writer``; :meth:`connect` retries an initiator
    until the guest's tool listens.
    """

    def __init__(self, port: int, pcap: str | os.PathLike, *, ip: str = MODEL_IP,
                 mac: str = MODEL_MAC, seed: int = 1):
        self.port, self.pcap_path, self.ip, self.mac, self.seed = port, pcap, ip, mac, seed
        self.netdev: QemuSocketNetdev | None = None
        self.pcap_writer: PcapWriter | None = None
        self.stack: RawStack | None = None
        self.endpoint: FrameEndpoint | None = None
        self._task: asyncio.Task | None = None

    async def start(self, timeout: float = 10.0) -> "ModelPeer":
        """Connect to the guest's netdev (retrying until ``timeout`` while QEMU comes up) and
        start the stack."""
        self.netdev = await connect_netdev(self.port, timeout)
        self.pcap_writer = PcapWriter(self.pcap_path)
        self.stack = RawStack(self.mac, self.ip,
                              send_frame=recording(self.netdev.send_frame, self.pcap_writer),
                              clock=time.monotonic, rng=random.Random(self.seed))
        self.endpoint = FrameEndpoint(self.stack)
        self._task = asyncio.get_running_loop().create_task(
            run_stack(self.stack, self.netdev.recv_frame, endpoint=self.endpoint,
                      pcap=self.pcap_writer))
        return self

    async def connect(self, ip: str, port: int, make_connection: Callable[[], Connection], *,
                      timeout: float = 30.0, interval: float = 0.3) -> FrameLink:
        """Connect a fresh ``make_connection()`` (an initiator) to ``ip``:``port`` until one
        is established, retrying every ``interval`` s while TCP is refused or closes before
        the MPA exchange ends (the guest's tool may not listen yet). Returns the established
        link; other link errors (a reject, a Terminate) are raised at once, and the last
        :class:`ConnectionClosed` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            link = self.endpoint.connect(ip, port, make_connection())
            try:
                await asyncio.wait_for(link.established(), max(0.1, deadline - time.monotonic()))
                return link
            except ConnectionClosed:
                if time.monotonic() + interval > deadline:
                    raise
            except TimeoutError:
                raise ConnectionClosed(f"no iWARP connection to {ip}:{port} within "
                                       f"{timeout:.0f} s") from None
            await asyncio.sleep(interval)

    async def close(self) -> None:
        """Stop the stack, close the netdev stream and the capture (idempotent)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self.netdev is not None:
            self.netdev.close()
            self.netdev = None
        if self.pcap_writer is not None:
            self.pcap_writer.close()

    async def __aenter__(self) -> "ModelPeer":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()


async def guest_ready(guest: SiwGuest, timeout: float = 60.0) -> str:
    """:meth:`SiwGuest.wait_ready` without blocking the event loop."""
    return await asyncio.to_thread(guest.wait_ready, timeout)


async def guest_result(guest: SiwGuest, timeout: float = 60.0) -> GuestResult:
    """:meth:`SiwGuest.result` without blocking the event loop (the model keeps running)."""
    return await asyncio.to_thread(guest.result, timeout)


@dataclass
class Fpdu:
    """One FPDU of a stream (no markers: siw never uses them): ``raw`` from ULPDU_Length to
    the CRC field, ``index`` its position among the capture's TCP segments with payload
    (the first segment that carries any of it), ``aligned`` whether it starts that segment."""

    raw: bytes
    index: int
    aligned: bool

    @property
    def ulpdu(self) -> bytes:
        return self.raw[2:2 + int.from_bytes(self.raw[:2], "big")]

    @property
    def crc(self) -> bytes:
        return self.raw[-4:]

    def crc_ok(self) -> bool:
        """Whether the CRC field is the CRC32c of the rest (RFC 5044 4.4; no markers)."""
        return crc_field(self.raw[:-4]) == self.crc


@dataclass
class Stream:
    """One direction of one TCP connection in a capture: ``src``/``dst`` as ``"ip:port"``,
    ``data`` the reassembled payload, ``segments`` the (capture segment index, payload length)
    of each segment carrying new bytes, in order."""

    src: str
    dst: str
    data: bytes = b""
    segments: list[tuple[int, int]] = field(default_factory=list)

    def mpa_frame(self, *, reply: bool) -> mpa.MpaFrame:
        """The MPA Request (or Reply) the stream starts with."""
        reader = mpa.MpaFrameReader(reply=reply)
        frame = reader.feed(self.data)
        if frame is None:
            raise ValueError(f"{self.src} -> {self.dst}: no complete MPA frame")
        return frame

    def fpdus(self, *, reply: bool) -> list[Fpdu]:
        """The FPDUs after the leading MPA frame; a torn last FPDU is left out."""
        offset = mpa.HEADER_SIZE + self.mpa_frame(reply=reply).pd_length
        out = []
        while offset + 2 <= len(self.data):
            end = offset + fpdu_length(int.from_bytes(self.data[offset:offset + 2], "big"))
            if end > len(self.data):
                break
            out.append(Fpdu(self.data[offset:end], *self._segment_at(offset)))
            offset = end
        return out

    def _segment_at(self, offset: int) -> tuple[int, bool]:
        start = 0
        for index, length in self.segments:
            if offset < start + length:
                return index, offset == start
            start += length
        raise ValueError(f"offset {offset} beyond the stream")


def tcp_streams(pcap: str | os.PathLike) -> dict[tuple[str, str], Stream]:
    """Every TCP direction in ``pcap`` by ``(src, dst)`` (``"ip:port"``), reassembled from
    its SYN on (retransmitted bytes are taken once; a direction without its SYN is left out).
    Segment indexes count the capture's TCP segments with payload, in capture order."""
    streams: dict[tuple[str, str], Stream] = {}
    next_seq: dict[tuple[str, str], int] = {}
    index = 0
    for _time, raw in read_pcap(pcap)[1]:
        eth = EthernetFrame.decode(raw)
        if eth.ethertype != ETHERTYPE_IPV4:
            continue
        ip = IPv4Packet.decode(eth.payload, verify=False)
        if ip.proto != PROTO_TCP:
            continue
        seg = TcpSegment.decode(ip.payload, ip.src, ip.dst, verify=False)
        key = (f"{ipv4_str(ip.src)}:{seg.sport}", f"{ipv4_str(ip.dst)}:{seg.dport}")
        if seg.flags & SYN:
            streams[key] = Stream(*key)
            next_seq[key] = (seg.seq + 1) & 0xFFFF_FFFF
        if not seg.payload:
            continue
        index += 1
        if key not in streams:
            continue
        skip = (next_seq[key] - seg.seq) & 0xFFFF_FFFF
        if skip >= len(seg.payload):
            continue  # a retransmission of bytes already taken (or a gap: not expected here)
        new = seg.payload[skip:]
        stream = streams[key]
        stream.data += new
        stream.segments.append((index - 1, len(new)))
        next_seq[key] = (next_seq[key] + len(new)) & 0xFFFF_FFFF
    return streams
