"""The model's perftest ``-R`` client against its server (:mod:`iwarp_model.perftest`), both on
the model's raw-frame TCP/IP (two RawStacks joined in memory, the :class:`FrameCm` used against
siw), for write, read and send: the data moved (the server's buffer after write_bw, the
client's after read_bw, the last Send and the credits of send_bw; 700 Sends need the credit
Writes, the window being 512), the report reached the server, and every comm message has the
size and layout perftest 4.5-0.17 uses (checked on the wire: the Sends of the comm connection
decoded from the frames), and tshark reads the capture as perftest's."""

import asyncio
import random
import struct
import time

import pytest

from iwarp_model import perftest
from iwarp_model.apps import pattern
from iwarp_model.pcap import PcapWriter
from iwarp_model.transport.frames import FrameEndpoint, run_stack
from iwarp_model.transport.rawtcp import RawStack
from iwarp_model.wire.fpdu import fpdu_length
from iwarp_model.wire.mpa import HEADER_SIZE
from iwarp_model.wire.net import ETHERTYPE_IPV4, EthernetFrame, IPv4Packet, TcpSegment
from iwarp_model.wire.rdmap import Opcode, decode_segment
from iwarp_tb.siw.perfcheck import check_capture, credits

CLIENT_IP, SERVER_IP = "169.254.7.1", "169.254.7.2"


class Wire:
    """Two RawStacks in one event loop, every frame recorded (``frames``: (sender, frame))."""

    def __init__(self):
        self.frames: list[tuple[str, bytes]] = []
        self.queues = {"c": asyncio.Queue(), "s": asyncio.Queue()}

        def sender(me: str, other: str):
            def send(frame: bytes) -> None:
                self.frames.append((me, frame))
                self.queues[other].put_nowait(frame)
            return send

        self.stacks = {
            "c": RawStack("02:00:00:00:07:01", CLIENT_IP, send_frame=sender("c", "s"),
                          clock=time.monotonic, rng=random.Random(1)),
            "s": RawStack("02:00:00:00:07:02", SERVER_IP, send_frame=sender("s", "c"),
                          clock=time.monotonic, rng=random.Random(2))}
        self.endpoints = {k: FrameEndpoint(v) for k, v in self.stacks.items()}
        self.tasks = [asyncio.ensure_future(run_stack(self.stacks[k], self.queues[k].get,
                                                      endpoint=self.endpoints[k]))
                      for k in self.stacks]

    def streams(self, sender: str) -> dict[int, bytes]:
        """``sender``'s TCP payload per connection (keyed by the client's port), in order
        (the in-memory wire neither loses nor reorders)."""
        out: dict[int, bytes] = {}
        for who, raw in self.frames:
            if who != sender:
                continue
            eth = EthernetFrame.decode(raw)
            if eth.ethertype != ETHERTYPE_IPV4:
                continue
            ip = IPv4Packet.decode(eth.payload, verify=False)
            seg = TcpSegment.decode(ip.payload, ip.src, ip.dst, verify=False)
            key = seg.sport if sender == "c" else seg.dport
            out[key] = out.get(key, b"") + seg.payload
        return out

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()


def sends(stream: bytes) -> list[bytes]:
    """The Send payloads of one direction of a connection (after its MPA frame, no CRC or
    markers: the model asks for neither)."""
    offset = HEADER_SIZE + int.from_bytes(stream[18:20], "big")
    out = []
    while offset < len(stream):
        ulpdu = int.from_bytes(stream[offset:offset + 2], "big")
        segment = decode_segment(stream[offset + 2:offset + 2 + ulpdu])
        end = offset + fpdu_length(ulpdu)
        if segment.opcode == Opcode.SEND:
            out.append(segment.payload)
        offset = end
    return out


def run_pair(op: str, size: int, iters: int):
    async def main():
        wire = Wire()
        server = perftest.PerftestServer(perftest.FrameCm(wire.endpoints["s"]), op, size=size,
                                         iters=iters, seed=7)
        client = perftest.PerftestClient(perftest.FrameCm(wire.endpoints["c"], SERVER_IP), op,
                                         size=size, iters=iters, seed=9)
        served = asyncio.ensure_future(server.run())
        await asyncio.sleep(0)
        result = await client.run()
        try:
            return await asyncio.wait_for(served, 20), result, wire
        finally:
            wire.close()

    return asyncio.run(asyncio.wait_for(main(), 60))


EXPECTED_SIZES = {
    "write": [16, 4, 4, 2] + [56] * 6 + [8] * 5 + [56],
    "read": [16, 4, 4, 2] + [56] * 6 + [8] * 5 + [56],
    "send": [16, 4, 4, 2] + [56] * 7,
}


@pytest.mark.parametrize("op,size,iters", [("write", 4096, 100), ("write", 100, 300),
                                           ("read", 65536, 20), ("read", 64, 200),
                                           ("send", 4096, 100), ("send", 1000, 700)])
def test_client_against_server(op, size, iters):
    served, result, wire = run_pair(op, size, iters)
    exchanges = len(EXPECTED_SIZES[op])
    assert served.exchanges == result.exchanges == exchanges
    assert result.peer_version == served.peer_version == 6.06
    assert result.report.size == size and result.report.iters == iters
    assert result.report.bw_avg > 0 and result.report.bw_peak >= result.report.bw_avg
    assert result.report.msg_rate == pytest.approx(iters / result.seconds / 1e6)
    region = max(size, 4096)
    inc = -(-size // 64) * 64
    touched = sorted({(i % (4096 // inc)) * inc for i in range(iters)}) if size <= 2048 else [0]
    if op == "write":
        assert served.report == result.report  # R1-R5 reached the server
        data = pattern(region, 9)
        for offset in touched:  # every slot the client's steps reached holds its data
            assert served.buffer.memory[offset:offset + size] == data[offset:offset + size]
    if op == "read":
        assert served.report == result.report
        data = pattern(region, 7)
        for offset in touched:
            assert result.buffer.memory[offset:offset + size] == data[offset:offset + size]
    if op == "send":
        assert served.report is None and served.received == iters
        assert served.credits == credits(iters)
        last = touched[(iters - 1) % len(touched)]  # the slot of the last message
        assert bytes(served.buffer.memory) == pattern(region, 9)[last:last + size]
    if op != "send":  # the client's handshake names its data buffer
        assert (served.remote.rkey, served.remote.vaddr) == (result.buffer.mr.rkey,
                                                             result.buffer.addr)
    # the comm connection on the wire: the first connection of each side, Sends only
    (comm_port, *_), sizes = sorted(wire.streams("c")), EXPECTED_SIZES[op]
    out, back = sends(wire.streams("c")[comm_port]), sends(wire.streams("s")[comm_port])
    assert [len(m) for m in out] == [len(m) for m in back] == sizes
    assert out[0] == back[0] == b"6.06" + bytes(12)
    assert out[1] == back[1] == b"\0\0\x10\0" and out[2] == back[2] == b"\0\0\0\x40"
    assert out[3] == back[3] == b"3\0"
    assert out[4] == bytes(56)  # K1: the client's destination is still all zeros
    k5_client, k5_server = out[8], back[8]
    rkey, vaddr = struct.unpack_from(">I4xQ", k5_server, 16)
    assert (rkey, vaddr) == (result.remote.rkey, result.remote.vaddr)
    assert struct.unpack_from(">I4xQ", k5_client, 16) == (served.remote.rkey,
                                                          served.remote.vaddr)
    if op != "send":
        r1, r2, r3, r4, r5 = out[10:15]
        assert struct.unpack(">Q", r1)[0] == size and struct.unpack(">Q", r2)[0] == iters
        assert struct.unpack(">d", r4)[0] == result.report.bw_avg
        assert struct.unpack(">d", r5)[0] == result.report.msg_rate
        assert struct.unpack(">d", r3)[0] == result.report.bw_peak


@pytest.mark.tshark
@pytest.mark.parametrize("op", perftest.OPS)
def test_capture_read_by_tshark(op, tmp_path):
    """tshark reads the run's frames as perftest's: two MPA connections, a Send each way per
    comm exchange, the operations, send_bw's credit Writes, nothing malformed
    (:func:`iwarp_tb.siw.perfcheck.check_capture`, as on the runs against Linux perftest)."""
    _served, _result, wire = run_pair(op, 4096, 100)
    pcap = tmp_path / f"{op}.pcap"
    with PcapWriter(pcap) as out:
        for n, (_sender, frame) in enumerate(wire.frames):
            out.write(frame, n * 1000)
    check_capture(pcap, op, 100, crc=False)


def test_dest_layout():
    dest = perftest.Dest(rkey=0x11223344, vaddr=0x0102030405060708, qpn=0x55, psn=0xABCDEF,
                         out_reads=128, gid=bytes(range(16)))
    raw = dest.encode()
    assert len(raw) == 56
    assert raw[16:20] == bytes.fromhex("11223344") and raw[24:32] == bytes(range(1, 9))
    assert raw[4:8] == (128).to_bytes(4, "big") and raw[8:12] == bytes.fromhex("00000055")
    assert raw[32:48] == bytes(range(16)) and raw[48:56] == bytes(8)
    assert perftest.Dest.decode(raw) == dest
    with pytest.raises(perftest.ProtocolError):
        perftest.Dest.decode(raw[:55])


def test_version_and_depths():
    assert perftest.version_message() == b"6.06" + bytes(12)
    assert perftest._version(b"5.70\0garbage") == 5.70
    assert perftest._version(b"x") == 0.0
    assert [perftest.rx_depth(n) for n in (100, 101, 1000)] == [100, 102, 512]
    assert [perftest.tx_depth(n) for n in (5, 1000)] == [5, 128]
    report = perftest.BwReport(65536, 100, 1.5, 1.25, 0.02)
    assert perftest.BwReport.from_messages(report.messages()) == report


def test_old_version_is_refused():
    """A client that announces 5.60 is refused by the server (perftest's own rule, 5.70 or
    later); the client then finds its comm connection gone."""
    async def main():
        wire = Wire()
        server = perftest.PerftestServer(perftest.FrameCm(wire.endpoints["s"]), "write",
                                         size=64, iters=1)
        client = perftest.PerftestClient(perftest.FrameCm(wire.endpoints["c"], SERVER_IP),
                                         "write", size=64, iters=1, version="5.60")
        served = asyncio.ensure_future(server.run())
        await asyncio.sleep(0)
        try:
            with pytest.raises(perftest.PerftestError, match="comm connection ended"):
                await client.run()
            with pytest.raises(perftest.ProtocolError, match="peer version 5.60"):
                await served
        finally:
            wire.close()

    asyncio.run(asyncio.wait_for(main(), 30))
