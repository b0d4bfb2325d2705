"""Model to model over the kernel's TCP on 127.0.0.1 (transport.sockets): every opcode, message
sizes from 0 B to 16 MiB, CRC and markers on and off, MPA revisions 1 and 2, data checked by
hash; and the errors a consumer sees (refused, rejected, Terminate)."""

import asyncio
import hashlib
import random

import pytest

from iwarp_model.apps import Host
from iwarp_model.engine import Connection, ConnState
from iwarp_model.mr import Access
from iwarp_model.transport import sockets
from iwarp_model.verbs import RecvWR, SendFlags, SendWR, WcFlags, WcOpcode, WcStatus, WrOpcode

ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
SIG = SendFlags.SIGNALED
MIB = 1 << 20


def digest(data) -> str:
    return hashlib.sha256(bytes(data)).hexdigest()


class Side:
    def __init__(self, name, size, **conn_options):
        self.host = Host(name, send_wr=256, recv_wr=256)
        self.buf = self.host.register(size, ALL)
        self.qp = self.host.qp
        self.conn_options = conn_options

    def connection(self, active):
        return Connection(self.qp, active=active, **self.conn_options)

    def sge(self, offset, length):
        return self.buf.sge(offset, length)

    async def completions(self, n, timeout=30):
        got = []
        while len(got) < n:
            got += self.host.send_cq.poll_cq(n - len(got))
            if len(got) < n:
                await asyncio.wait_for(self.host.send_cq.wait(), timeout)
        return got


async def pair(size, *, a=None, b=None, **common):
    """A (initiator) and B (responder) connected over a real socket; returns the links."""
    A, B = Side("a", size, **common, **(a or {})), Side("b", size, **common, **(b or {}))
    accepted = asyncio.get_running_loop().create_future()

    async def handler(link):
        accepted.set_result(link)
        await link.closed()

    server = await sockets.serve("127.0.0.1", 0, lambda: B.connection(False), handler)
    port = server.sockets[0].getsockname()[1]
    link_a = await sockets.connect("127.0.0.1", port, A.connection(True))
    await link_a.established()
    link_b = await accepted
    await link_b.established()
    return A, B, link_a, link_b, server


async def finish(link_a, link_b, server):
    link_a.close()
    await asyncio.wait_for(link_a.closed(), 10)
    await asyncio.wait_for(link_b.closed(), 10)
    server.close()
    await server.wait_closed()


def run(coro):
    asyncio.run(asyncio.wait_for(coro, 60))


OPTIONS = [dict(revision=r, crc=c, markers=m) for r in (1, 2) for c in (False, True)
           for m in (False, True)]


@pytest.mark.parametrize("options", OPTIONS,
                         ids=lambda o: f"rev{o['revision']}-crc{int(o['crc'])}-"
                                       f"markers{int(o['markers'])}")
def test_every_opcode_and_size(options):
    sizes = [0, 1, 4096, MIB] if not options["crc"] else [0, 1, 4096, 64 * 1024]

    async def main():
        span = max(sizes)
        A, B, la, lb, server = await pair(4 * span + 4096, **options)
        assert la.conn.negotiated.crc == options["crc"]
        assert la.conn.negotiated.revision == options["revision"]
        rng = random.Random(repr(options))
        base_b = B.buf.addr
        for size in sizes:
            data = rng.randbytes(size)
            A.buf.memory[:size] = data
            # Send, Send with SE, Send with Invalidate (of an STag B holds, invalidatable)
            mw = B.host.device.alloc_mr(B.host.pd)
            fr_mem = bytearray(16)
            B.qp.post_send(SendWR(50, WrOpcode.REG_MR, send_flags=SIG, mr=mw, key=7,
                                  access=Access.LOCAL_WRITE, memory=fr_mem, iova=0x1000))
            [reg] = await B.completions(1)
            assert (reg.opcode, reg.status) == (WcOpcode.REG_MR, WcStatus.SUCCESS)
            for i in range(3):
                B.qp.post_recv(RecvWR(i, [B.sge(i * span, span)]))
            stag = mw.stag
            A.qp.post_send([
                SendWR(1, WrOpcode.SEND, [A.sge(0, size)], SIG),
                SendWR(2, WrOpcode.SEND, [A.sge(0, size)], SIG | SendFlags.SOLICITED),
                SendWR(3, WrOpcode.SEND_WITH_INV, [A.sge(0, size)], SIG,
                       invalidate_rkey=stag)])
            wcs = await A.completions(3)
            assert [w.status for w in wcs] == [WcStatus.SUCCESS] * 3
            recvs = []
            while len(recvs) < 3:
                recvs += [w for w in B.host.recv_cq.poll_cq(16) if w.opcode == WcOpcode.RECV]
                if len(recvs) < 3:
                    await B.host.recv_cq.wait()
            assert [(w.wr_id, w.status, w.byte_len) for w in recvs] == [
                (i, WcStatus.SUCCESS, size) for i in range(3)]
            assert recvs[2].wc_flags & WcFlags.WITH_INV and recvs[2].invalidated_rkey == stag
            for i in range(3):
                assert digest(B.buf.memory[i * span:i * span + size]) == digest(data)
            # Write, Write with Immediate, Immediate Data (Send with Imm), Read
            B.qp.post_recv([RecvWR(10, [B.sge(0, 0)]), RecvWR(11, [B.sge(0, 0)])])
            A.qp.post_send([
                SendWR(4, WrOpcode.RDMA_WRITE, [A.sge(0, size)], SIG,
                       remote_addr=base_b + 3 * span, rkey=B.buf.mr.rkey),
                SendWR(5, WrOpcode.RDMA_WRITE_WITH_IMM, [A.sge(0, size)], SIG,
                       remote_addr=base_b + 2 * span, rkey=B.buf.mr.rkey,
                       imm_data=0x1122334455667788),
                SendWR(6, WrOpcode.SEND_WITH_IMM, [], SIG, imm_data=0xCAFE),
                SendWR(7, WrOpcode.RDMA_READ, [A.sge(span, size)], SIG,
                       remote_addr=base_b + 3 * span, rkey=B.buf.mr.rkey)])
            wcs = await A.completions(4)
            assert [(w.wr_id, w.status) for w in wcs] == [(i, WcStatus.SUCCESS)
                                                         for i in range(4, 8)]
            imms = []
            while len(imms) < 2:
                imms += B.host.recv_cq.poll_cq(16)
                if len(imms) < 2:
                    await B.host.recv_cq.wait()
            assert [(w.wr_id, w.imm_data, bool(w.wc_flags & WcFlags.WITH_IMM))
                    for w in imms] == [(10, 0x1122334455667788, True), (11, 0xCAFE, True)]
            assert imms[0].opcode == WcOpcode.RECV_RDMA_WITH_IMM
            assert digest(B.buf.memory[3 * span:3 * span + size]) == digest(data)
            assert digest(B.buf.memory[2 * span:2 * span + size]) == digest(data)
            assert digest(A.buf.memory[span:span + size]) == digest(data)
        # FetchAdd and CmpSwap on 8 aligned bytes of B
        B.buf.memory[0:8] = (41).to_bytes(8, "little")
        A.qp.post_send([
            SendWR(8, WrOpcode.ATOMIC_FETCH_AND_ADD, [A.sge(0, 8)], SIG,
                   remote_addr=base_b, rkey=B.buf.mr.rkey, compare_add=1),
            SendWR(9, WrOpcode.ATOMIC_CMP_AND_SWP, [A.sge(8, 8)], SIG,
                   remote_addr=base_b, rkey=B.buf.mr.rkey, compare_add=42, swap=7)])
        wcs = await A.completions(2)
        assert [(w.opcode, w.status) for w in wcs] == [
            (WcOpcode.FETCH_ADD, WcStatus.SUCCESS), (WcOpcode.COMP_SWAP, WcStatus.SUCCESS)]
        assert int.from_bytes(A.buf.memory[0:8], "little") == 41
        assert int.from_bytes(A.buf.memory[8:16], "little") == 42
        assert int.from_bytes(B.buf.memory[0:8], "little") == 7
        await finish(la, lb, server)
        assert la.conn.state == lb.conn.state == ConnState.CLOSED

    run(main())


def test_one_16_mib_write_and_read():
    async def main():
        size = 16 * MIB
        A, B, la, lb, server = await pair(2 * size)
        data = random.Random(16).randbytes(size)
        A.buf.memory[:size] = data
        A.qp.post_send([
            SendWR(1, WrOpcode.RDMA_WRITE, [A.sge(0, size)], SIG,
                   remote_addr=B.buf.addr, rkey=B.buf.mr.rkey),
            SendWR(2, WrOpcode.RDMA_READ, [A.sge(size, size)], SIG,
                   remote_addr=B.buf.addr, rkey=B.buf.mr.rkey)])
        wcs = await A.completions(2)
        assert [w.status for w in wcs] == [WcStatus.SUCCESS] * 2
        assert digest(B.buf.memory[:size]) == digest(A.buf.memory[size:]) == digest(data)
        assert la.conn.stats["fpdus_tx"] > size // 1460
        await finish(la, lb, server)

    run(main())


def test_connection_refused_is_an_oserror():
    async def main():
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = probe.sockets[0].getsockname()[1]
        probe.close()
        await probe.wait_closed()
        with pytest.raises(ConnectionRefusedError):
            await sockets.connect("127.0.0.1", port, Side("a", 64).connection(True))

    run(main())


def test_reject_and_terminate_raise_specific_errors():
    async def main():
        B = Side("b", 64)

        def rejecting():
            conn = B.connection(False)
            conn.on_request = lambda c: c.reject(b"not today")
            return conn

        server = await sockets.serve("127.0.0.1", 0, rejecting)
        port = server.sockets[0].getsockname()[1]
        link = await sockets.connect("127.0.0.1", port, Side("a", 64).connection(True))
        with pytest.raises(sockets.MpaRejected) as info:
            await link.established()
        assert info.value.reason == b"not today"
        await asyncio.wait_for(link.closed(), 10)
        server.close()
        await server.wait_closed()

        # A Write to an STag B does not have: B sends a Terminate, A reports it.
        A, B, la, lb, server = await pair(4096)
        A.qp.post_send(SendWR(1, WrOpcode.RDMA_WRITE, [A.sge(0, 16)], SIG,
                              remote_addr=B.buf.addr, rkey=B.buf.mr.rkey ^ 0x100))
        await asyncio.wait_for(la.closed(), 10)
        with pytest.raises(sockets.TerminateReceived) as term:
            await la.established()
        assert term.value.terminate == lb.conn.terminate_sent
        with pytest.raises(sockets.TerminateSent):
            await lb.established()
        server.close()
        await server.wait_closed()

    run(main())


# -- the raw-frame transport (transport.frames) ----------------------------------------------

def frame_pair(endpoint_a, endpoint_b, ip_b, size, port=7000, **options):
    """Engine connections A -> B over two FrameEndpoints; returns sides and links."""
    A, B = Side("a", size, **options), Side("b", size, **options)
    links = []
    endpoint_b.listen(port, lambda: B.connection(False), links.append)
    link_a = endpoint_a.connect(ip_b, port, A.connection(True))
    return A, B, link_a, links


def test_frames_under_one_percent_loss_byte_exact():
    from iwarp_model.transport.frames import FrameEndpoint
    from iwarp_model.transport.impair import Pipe

    pipe = Pipe(seed=5, loss=0.01)
    ea, eb = FrameEndpoint(pipe.a), FrameEndpoint(pipe.b)
    size = 256 * 1024
    A, B, la, links = frame_pair(ea, eb, Pipe.IP_B, 2 * size, crc=True)
    assert pipe.run(lambda: la.conn.state == ConnState.ESTABLISHED and links, timeout=30)
    lb = links[0]
    assert lb.conn.state == ConnState.ESTABLISHED
    rng = random.Random(1)
    for round_ in range(3):
        data = rng.randbytes(size)
        A.buf.memory[:size] = data
        A.qp.post_send([
            SendWR(1, WrOpcode.RDMA_WRITE, [A.sge(0, size)], SIG,
                   remote_addr=B.buf.addr + round_, rkey=B.buf.mr.rkey),
            SendWR(2, WrOpcode.RDMA_READ, [A.sge(size, size)], SIG,
                   remote_addr=B.buf.addr + round_, rkey=B.buf.mr.rkey)])
        wcs = []
        assert pipe.run(lambda wcs=wcs: wcs.extend(A.host.send_cq.poll_cq(4)) or len(wcs) == 2,
                        timeout=120)
        assert [w.status for w in wcs] == [WcStatus.SUCCESS] * 2
        assert digest(B.buf.memory[round_:round_ + size]) == digest(data)
        assert digest(A.buf.memory[size:]) == digest(data)
    assert pipe.ab.counters["lost"] + pipe.ba.counters["lost"] > 10
    retransmits = sum(conn.counters["retransmissions"] for conn in
                      pipe.a.connections + pipe.b.connections)
    assert retransmits > 0
    la.close()
    assert pipe.run(lambda: la.transport_closed and lb.transport_closed, timeout=30)
    assert lb.conn.state == ConnState.CLOSED and B.qp.state.name == "ERR"


def test_frames_writes_complete_within_the_send_buffer():
    """The link hands FPDUs to TCP only as far as ``snd_buffer`` has room, so a Write
    completes when its last FPDU is in that bounded buffer, not ahead of the wire: at each of
    four 256 KiB Writes' completions the peer has acknowledged all but a buffer and an FPDU
    of the octets before it, and at no time does more than that wait in TCP."""
    from iwarp_model.transport.frames import FrameEndpoint
    from iwarp_model.transport.impair import Pipe
    from iwarp_model.transport.rawtcp import TcpConfig

    config = TcpConfig(snd_buffer=64 * 1024)
    pipe = Pipe(seed=7, config=config)
    ea, eb = FrameEndpoint(pipe.a), FrameEndpoint(pipe.b)
    size, count = 256 * 1024, 4
    A, B, la, links = frame_pair(ea, eb, Pipe.IP_B, count * size)
    assert pipe.run(lambda: la.conn.state == ConnState.ESTABLISHED and links, timeout=30)
    data = random.Random(2).randbytes(count * size)
    A.buf.memory[:] = data
    base = la.tcp.snd_una
    A.qp.post_send([SendWR(n, WrOpcode.RDMA_WRITE, [A.sge(n * size, size)], SIG,
                           remote_addr=B.buf.addr + n * size, rkey=B.buf.mr.rkey)
                    for n in range(count)])
    fpdu, queued, done = 2 * config.mss, [], []

    def watch():
        queued.append(la.tcp.unacked)
        done.extend((wc.wr_id, wc.status, la.tcp.snd_una - base)
                    for wc in A.host.send_cq.poll_cq(count))
        return len(done) == count

    assert pipe.run(watch, timeout=60)
    assert max(queued) <= config.snd_buffer + fpdu
    assert [(n, status) for n, status, _ in done] == [(n, WcStatus.SUCCESS)
                                                      for n in range(count)]
    for n, _, acked in done:
        assert acked >= (n + 1) * size - config.snd_buffer - fpdu, (n, acked)
    assert pipe.run(lambda: bytes(B.buf.memory) == data, timeout=30)


def test_frames_connect_refused_ends_the_link():
    """An initiator whose SYN is answered by an RST (nobody listens yet, as with a Linux peer
    whose rdma_cm listener is not up) learns it: the link closes, the QP is flushed."""
    from iwarp_model.transport.frames import FrameEndpoint
    from iwarp_model.transport.impair import Pipe

    pipe = Pipe(seed=3)
    ea, _eb = FrameEndpoint(pipe.a), FrameEndpoint(pipe.b)
    A = Side("a", 4096)
    A.qp.post_recv(RecvWR(7, [A.sge(0, 64)]))
    link = ea.connect(Pipe.IP_B, 7000, A.connection(True))
    assert pipe.run(lambda: link.transport_closed, timeout=5)
    assert link.conn.state == ConnState.CLOSED and A.qp.state.name == "ERR"
    [wc] = A.host.recv_cq.poll_cq(4)
    assert (wc.wr_id, wc.status) == (7, WcStatus.WR_FLUSH_ERR)
    assert not ea.links

    async def established():
        with pytest.raises(sockets.ConnectionClosed):
            await link.established()

    run(established())


def test_frames_in_real_time_over_the_qemu_socket_framing(tmp_path):
    import time

    from iwarp_model.pcap import PcapWriter, read_pcap
    from iwarp_model.transport.frames import (
        FrameEndpoint,
        QemuSocketNetdev,
        recording,
        run_stack,
    )
    from iwarp_model.transport.rawtcp import RawStack

    async def main():
        port_holder = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = port_holder.sockets[0].getsockname()[1]
        port_holder.close()
        await port_holder.wait_closed()
        accepting = asyncio.ensure_future(QemuSocketNetdev.accept(port))
        await asyncio.sleep(0.05)
        dev_a = await QemuSocketNetdev.connect(port)
        dev_b = await accepting
        pcap = PcapWriter(tmp_path / "frames.pcap")
        stack_a = RawStack("02:00:00:00:00:0a", "169.254.0.1",
                           send_frame=recording(dev_a.send_frame, pcap), clock=time.monotonic,
                           rng=random.Random(1))
        stack_b = RawStack("02:00:00:00:00:0b", "169.254.0.2", send_frame=dev_b.send_frame,
                           clock=time.monotonic, rng=random.Random(2))
        ea, eb = FrameEndpoint(stack_a), FrameEndpoint(stack_b)
        runners = [asyncio.ensure_future(run_stack(stack_a, dev_a.recv_frame, endpoint=ea,
                                                   pcap=pcap)),
                   asyncio.ensure_future(run_stack(stack_b, dev_b.recv_frame, endpoint=eb))]
        A, B, la, links = frame_pair(ea, eb, "169.254.0.2", 1 << 20)
        await asyncio.wait_for(la.established(), 10)
        data = random.Random(3).randbytes(1 << 19)
        A.buf.memory[:len(data)] = data
        A.qp.post_send(SendWR(1, WrOpcode.RDMA_WRITE, [A.sge(0, len(data))], SIG,
                              remote_addr=B.buf.addr, rkey=B.buf.mr.rkey))
        A.qp.post_send(SendWR(2, WrOpcode.RDMA_READ, [A.sge(1 << 19, 8)], SIG,
                              remote_addr=B.buf.addr, rkey=B.buf.mr.rkey))
        wcs = await A.completions(2, timeout=20)
        assert [w.status for w in wcs] == [WcStatus.SUCCESS] * 2
        assert digest(B.buf.memory[:len(data)]) == digest(data)
        la.close()
        await asyncio.wait_for(la.closed(), 10)
        await asyncio.wait_for(links[0].closed(), 10)
        for runner in runners:
            runner.cancel()
        dev_a.close()
        dev_b.close()
        pcap.close()

    run(main())
    _, frames = read_pcap(tmp_path / "frames.pcap")
    assert len(frames) > (1 << 19) // 1460
    assert max(len(f) for _, f in frames) <= 1514


def test_readme_verbs_example_runs_verbatim():
    import contextlib
    import io
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## The reference model", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    assert out.getvalue() == "SUCCESS b'hello'\n"
