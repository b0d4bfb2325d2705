"""Wireshark's iWARP dissectors as the oracle of socket runs' captures (recipes/tshark.md):
each end's pcap of a model-to-model run over 127.0.0.1, CRC on and off, markers off, MPA
revisions 1 and 2, decodes to exactly the FPDUs and RDMAP messages sent, with ``Good CRC32``
on every FPDU when CRC is on and no malformed packet or error in the expert info."""

import asyncio
import re
from collections import Counter

import pytest

from iwarp_model.apps import Host
from iwarp_model.engine import Connection
from iwarp_model.mr import Access
from iwarp_model.transport import sockets
from iwarp_model.verbs import RecvWR, SendFlags, SendWR, WrOpcode
from iwarp_tb.tshark import decode, fields, rdmap_opcodes

SIG = SendFlags.SIGNALED
ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
# tshark 4.0 predates RFC 6581: a rev 2 frame's IRD/ORD bytes draw these two warnings.
REV2_WARNINGS = {"Res field is NOT set to zero as required by RFC 5044",
                 "Rev field is NOT set to one as required by RFC 5044"}
# What the run below sends, in RDMAP messages (DDP segments) per opcode as tshark names them,
# with the EMSS of 1460: 1440 bytes of a Write or Read Response per segment. Immediate Data
# (RFC 7306, opcode 0x8) is "Unknown" to tshark 4.0.
EXPECTED = Counter({"Send": 1, "Send with SE": 1, "Write": 3, "Read Request": 1, "Read Response": 2,
                    "Unknown": 1, "Atomic Request": 1, "Atomic Response": 1})


async def traffic(client_pcap, server_dir, **options):
    A, B = Host("a"), Host("b")
    buf_a, buf_b = A.register(1 << 16, ALL), B.register(1 << 16, ALL)
    accepted = asyncio.get_running_loop().create_future()

    async def handler(link):
        accepted.set_result(link)
        await link.closed()

    server = await sockets.serve("127.0.0.1", 0,
                                 lambda: Connection(B.qp, active=False, **options), handler,
                                 capture_dir=server_dir)
    link = await sockets.connect("127.0.0.1", server.sockets[0].getsockname()[1],
                                 Connection(A.qp, active=True, **options), capture=client_pcap)
    await link.established()
    B.qp.post_recv([RecvWR(i, [buf_b.sge(0, 4096)]) for i in range(3)])
    A.qp.post_send([
        SendWR(1, WrOpcode.SEND, [buf_a.sge(0, 100)], SIG),
        SendWR(2, WrOpcode.SEND, [buf_a.sge(0, 7)], SIG | SendFlags.SOLICITED),
        SendWR(3, WrOpcode.RDMA_WRITE, [buf_a.sge(0, 3000)], SIG, remote_addr=buf_b.addr,
               rkey=buf_b.mr.rkey),
        SendWR(4, WrOpcode.RDMA_READ, [buf_a.sge(8192, 2000)], SIG, remote_addr=buf_b.addr,
               rkey=buf_b.mr.rkey),
        SendWR(5, WrOpcode.SEND_WITH_IMM, [], SIG, imm_data=5),
        SendWR(6, WrOpcode.ATOMIC_FETCH_AND_ADD, [buf_a.sge(0, 8)], SIG,
               remote_addr=buf_b.addr, rkey=buf_b.mr.rkey, compare_add=1)])
    wcs = []
    while len(wcs) < 6:
        wcs += A.send_cq.poll_cq(8)
        if len(wcs) < 6:
            await asyncio.wait_for(A.send_cq.wait(), 10)
    assert all(wc.status == 0 for wc in wcs)
    peer = await accepted
    fpdus = link.conn.stats["fpdus_tx"] + peer.conn.stats["fpdus_tx"]
    link.close()
    await link.closed()
    await peer.closed()
    server.close()
    await server.wait_closed()
    return fpdus


@pytest.mark.tshark
@pytest.mark.parametrize("revision", [1, 2])
@pytest.mark.parametrize("crc", [False, True])
def test_tshark_decodes_socket_runs(tmp_path, revision, crc):
    server_dir = tmp_path / "server"
    server_dir.mkdir()
    fpdus = asyncio.run(traffic(tmp_path / "client.pcap", server_dir, revision=revision,
                                crc=crc))
    assert fpdus == sum(EXPECTED.values())
    (server_pcap,) = server_dir.iterdir()
    for pcap in (tmp_path / "client.pcap", server_pcap):
        root, expert = decode(pcap)
        assert len(fields(root, "iwarp_mpa.req")) == len(fields(root, "iwarp_mpa.rep")) == 1
        assert len(fields(root, "iwarp_mpa.fpdu")) == fpdus
        assert rdmap_opcodes(root) == EXPECTED
        checks = [f.get("showname") for f in fields(root, "iwarp_mpa.crc_check")]
        if crc:
            assert len(checks) == fpdus
            assert all("(Good CRC32)" in check for check in checks), checks
        assert not any("Bad CRC32" in check for check in checks)
        assert not fields(root, "_ws.malformed")
        assert not re.search(r"^Errors \(", expert, re.M), expert
        warnings = re.search(r"^Warns \(\d+\)\n=+\n.*?\n((?:.+\n)*)", expert, re.M)
        summaries = set()
        if warnings:
            summaries = {line.split("IWARP_MPA", 1)[-1].strip()
                         for line in warnings.group(1).splitlines() if line.strip()}
        assert summaries <= (REV2_WARNINGS if revision == 2 else set()), expert
