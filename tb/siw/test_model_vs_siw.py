"""The reference model against Linux siw in the QEMU guest, on the guest's Ethernet.

The model's own TCP/IP (``RawStack``, 169.254.1.1) speaks raw frames on the guest's socket
netdev (:class:`iwarp_tb.siw.modelpeer.ModelPeer`); the guest (169.254.1.2) runs rping or
ucmatose. Every frame is recorded to ``build/siw/runs/model-vs-siw/<run>/model.pcap``, next to
the guest's serial log. Each guest boot is a module-scoped fixture (one boot per scenario,
under ``build/siw/run.lock`` like the self-check); the tests assert on what it recorded:

* rping, MPA rev 2, stock siw: the model as client (5 pings validated, siw's server prints 5)
  and as server (siw's ``rping -c -v -C 5`` prints 5 ``ping data:`` lines).
* CRC: the model asks for it against stock siw (the Reply sets C, every FPDU both ways carries
  a correct, non-zero CRC32c); the model does not ask against the ``crc`` variant (siw's
  ``mpa_crc_required`` is not applied by a responder: C stays 0, no CRCs, rping works).
* ucmatose (10 messages of 100 bytes): the model as client takes siw's Sends right behind
  the MPA Reply; the model as server against stock siw deadlocks (RFC 5044 7.1.2 holds the
  responder's Sends, cmatose's client waits for them: no FPDU either way until the guest's
  timeout); against the ``p2p`` variant (siw offers RFC 6581 RTRs) it works.
* tshark decodes the rping captures to the expected RDMAP messages, Good CRC32 on the CRC run.

See docs/siw.md.
"""

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from iwarp_model import apps
from iwarp_model.engine import Connection, ConnState
from iwarp_model.transport.frames import FrameLink
from iwarp_model.wire.rdmap import Opcode, decode_segment
from iwarp_tb import tshark
from iwarp_tb.siw import image
from iwarp_tb.siw.guest import GuestResult, SiwGuest, run_attached
from iwarp_tb.siw.modelpeer import (
    GUEST_IP,
    MODEL_IP,
    ModelPeer,
    Stream,
    guest_ready,
    guest_result,
    tcp_streams,
)

pytestmark = [pytest.mark.siw, pytest.mark.xdist_group(name="siw")]

RUNS = image.SIW_BUILD / "runs" / "model-vs-siw"
COUNT = 5  # rping pings
MESSAGES = 10  # ucmatose messages (its default), of 100 bytes
CRC_SIZE = 3000  # rping size of the CRC run: siw's Write spans several FPDUs
MODEL, GUEST = f"{MODEL_IP}:", f"{GUEST_IP}:"
#: How long the model's initiator waits after the MPA Reply before its first FPDU. siw's
#: responder (``siw_accept``, Linux 6.1) sends the Reply and only then hands the socket's
#: receive upcall to the QP; an FPDU that lands in between is acknowledged by TCP but never read
#: (the CM's upcall ignores data in RDMA mode), and the rping server waits until it is killed.
#: Under TCG that window lasts milliseconds: 2 of 12 runs hung with the first Send 1.4 ms after
#: the Reply. A real rping client is slower than this anyway (the application's turn after the
#: ESTABLISHED event). docs/siw.md, "Data behind the MPA Reply".
AFTER_REPLY = 0.2


@dataclass
class Run:
    """One boot: the guest's result, the model's links and what its application returned
    (a count, or the exception it raised), its output lines, the capture and the wall time."""

    guest: GuestResult
    pcap: Path
    links: list[FrameLink]
    value: object
    lines: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def streams(self) -> tuple[Stream, Stream]:
        """(model to guest, guest to model) of the run's single iWARP connection (the TCP
        connections refused while the guest's tool was not listening yet carry no data)."""
        streams = [s for s in tcp_streams(self.pcap).values() if s.data]
        out = [s for s in streams if s.src.startswith(MODEL)]
        back = [s for s in streams if s.src.startswith(GUEST)]
        assert len(out) == len(back) == 1, sorted(streams)
        return out[0], back[0]


def boot(name: str, variant: str, role: str, scenario: Callable) -> Run:
    """Boot ``variant`` with ``role`` (its ``iwarp.*`` arguments), attach the model and run
    ``await scenario(peer, guest, lines)``, which returns ``(links, value)``; then wait for
    the guest's result. The run's directory is ``RUNS/name`` (emptied first)."""
    workdir = RUNS / name
    pcap = workdir / "model.pcap"
    lines: list[str] = []

    async def main(port: int, guest: SiwGuest) -> tuple[GuestResult, list[FrameLink], object]:
        start = time.monotonic()
        async with ModelPeer(port, pcap) as peer:
            links, value = await scenario(peer, guest, lines)
            result = await guest_result(guest, timeout=60)
            await asyncio.sleep(0.2)  # the last ACKs and FINs into the capture
            return result, links, value, time.monotonic() - start

    result, links, value, seconds = run_attached(variant, role, workdir, main, timeout=120,
                                                 ip=f"{GUEST_IP}/24")
    return Run(result, pcap, links, value, lines, seconds)


async def outcome(coro) -> object:
    """``await coro``'s value, or the exception it raised (asserted on by the tests)."""
    try:
        return await coro
    except Exception as error:  # noqa: BLE001 - the test asserts on which one
        return error


# -- rping ------------------------------------------------------------------------------------

def rping_host() -> apps.Host:
    return apps.Host("model", ird=1, ord=1, send_wr=16, recv_wr=2, cqe=32)


def rping_model_client(name: str, variant: str, *, crc: bool, size: int = 64) -> Run:
    """The model's rping client (validating) against the guest's ``rping -s -v -C 5``."""
    role = f"iwarp.role=rping-server iwarp.count={COUNT} iwarp.size={size}"

    async def scenario(peer: ModelPeer, guest: SiwGuest, lines: list[str]):
        await guest_ready(guest)
        clients = []

        def make() -> Connection:
            host = rping_host()
            clients.append(apps.RpingClient(host, size=size, count=COUNT, verbose=True,
                                            out=lines.append))
            return Connection(host.qp, active=True, crc=crc)

        link = await peer.connect(GUEST_IP, apps.RPING_PORT, make)
        await asyncio.sleep(AFTER_REPLY)
        pings = await outcome(asyncio.wait_for(clients[-1].run(), 60))
        link.close()
        await asyncio.wait_for(link.closed(), 10)
        return [link], pings

    return boot(name, variant, role, scenario)


def rping_model_server(name: str, variant: str) -> Run:
    """The model's rping server against the guest's ``rping -c -v -C 5``."""
    role = f"iwarp.role=rping-client iwarp.count={COUNT} iwarp.peer={MODEL_IP}"

    async def scenario(peer: ModelPeer, guest: SiwGuest, lines: list[str]):
        links, served = [], []

        def make() -> Connection:
            host = rping_host()
            server = apps.RpingServer(host, verbose=True, out=lines.append)
            served.append(asyncio.ensure_future(outcome(server.run())))
            return Connection(host.qp, active=False)

        peer.endpoint.listen(apps.RPING_PORT, make, links.append)
        await guest_ready(guest)
        await guest_result(guest, timeout=60)
        values = [await asyncio.wait_for(task, 10) for task in served]
        return links, values

    return boot(name, variant, role, scenario)


@pytest.fixture(scope="module")
def rping_client_run() -> Run:
    return rping_model_client("rping-model-client", "stock", crc=False)


@pytest.fixture(scope="module")
def rping_server_run() -> Run:
    return rping_model_server("rping-model-server", "stock")


@pytest.fixture(scope="module")
def rping_crc_run() -> Run:
    return rping_model_client("rping-model-client-crc", "stock", crc=True, size=CRC_SIZE)


@pytest.fixture(scope="module")
def rping_crc_variant_run() -> Run:
    return rping_model_client("rping-crc-variant", "crc", crc=False)


def ping_lines(lines: list[str], prefix: str = "ping data: ") -> list[str]:
    return [line for line in lines if line.startswith(prefix)]


def test_rping_model_client_vs_siw_server(rping_client_run):
    run = rping_client_run
    assert run.value == COUNT, run.value  # the model validated every ping (rping -V)
    assert len(ping_lines(run.lines)) == COUNT
    assert run.guest.rc == 0, run.guest.transcript
    assert run.guest.pings == COUNT  # siw's "server ping data:" lines
    assert run.guest.output.count("server ping data: rdma-ping-") == COUNT
    for i in range(COUNT):
        text = apps.rping_pattern(i, 64)[:63].decode()
        assert f"server ping data: {text}" in run.guest.output
    (link,) = run.links
    conn = link.conn
    assert conn.negotiated.revision == 2 and not conn.negotiated.crc
    assert conn.reply.enhanced is not None  # siw answers with RFC 6581 IRD/ORD
    assert (conn.reply.enhanced.ird, conn.reply.enhanced.ord) == (1, 1)
    assert not conn.reply.enhanced.peer_to_peer
    # per ping: 2 Sends and a Read Response from the model; a Read Request, a Write and 2 Sends
    # from siw
    assert (conn.stats["fpdus_tx"], conn.stats["fpdus_rx"]) == (3 * COUNT, 4 * COUNT)
    out, back = run.streams()
    assert [f.crc for f in out.fpdus(reply=False)] == [bytes(4)] * 3 * COUNT
    assert [f.crc for f in back.fpdus(reply=True)] == [bytes(4)] * 4 * COUNT  # sent as zero


def test_rping_model_server_vs_siw_client(rping_server_run):
    run = rping_server_run
    assert run.guest.rc == 0, run.guest.transcript
    assert run.guest.output.count("ping data: rdma-ping-") == COUNT
    assert run.guest.pings == COUNT and run.guest.fields["attempts"] == "1"
    assert run.value == [COUNT]  # one connection; the model served 5 pings until siw left
    assert len(ping_lines(run.lines, "server ping data: ")) == COUNT
    (link,) = run.links
    request = link.conn.request
    assert (request.revision, request.crc, request.markers) == (2, False, False)
    assert (request.enhanced.ird, request.enhanced.ord) == (1, 1)
    assert not request.enhanced.peer_to_peer
    assert link.conn.state == ConnState.CLOSED  # siw's rdma_disconnect: a FIN, no Terminate
    assert link.conn.terminate_received is None and link.conn.terminate_sent is None


# -- CRC --------------------------------------------------------------------------------------

def test_model_asks_crc_of_stock_siw(rping_crc_run):
    run = rping_crc_run
    assert run.value == COUNT, run.value
    assert run.guest.rc == 0 and run.guest.pings == COUNT, run.guest.transcript
    out, back = run.streams()
    assert out.mpa_frame(reply=False).crc
    reply = back.mpa_frame(reply=True)
    assert reply.crc and not reply.markers and reply.revision == 2  # siw turns CRC on
    sent, received = out.fpdus(reply=False), back.fpdus(reply=True)
    # 3000-byte Read Responses and Writes: 3 FPDUs each at an MSS of 1460
    assert len(sent) == 2 * COUNT + 3 * COUNT and len(received) == 3 * COUNT + 3 * COUNT
    for fpdu in sent + received:
        assert fpdu.crc != bytes(4) and fpdu.crc_ok(), fpdu.raw[:16].hex()
    # siw sizes FPDUs to the MSS and starts every TCP segment with one
    assert max(len(f.raw) for f in received) <= 1460
    assert all(f.aligned for f in received)


def test_model_without_crc_vs_crc_required_siw(rping_crc_variant_run):
    """siw's ``mpa_crc_required`` only shapes its own Request and its check of a Reply: as a
    responder it answers a Request without C with C = 0 and runs without CRCs."""
    run = rping_crc_variant_run
    assert run.guest.fields["variant"] == "crc"
    assert run.value == COUNT, run.value
    assert run.guest.rc == 0 and run.guest.pings == COUNT, run.guest.transcript
    out, back = run.streams()
    assert not out.mpa_frame(reply=False).crc
    reply = back.mpa_frame(reply=True)
    assert not reply.crc and not reply.reject
    assert [f.crc for f in back.fpdus(reply=True)] == [bytes(4)] * 4 * COUNT


# -- ucmatose ---------------------------------------------------------------------------------

def ucmatose_host() -> apps.Host:
    return apps.Host("model", send_wr=MESSAGES, recv_wr=MESSAGES, separate_cqs=True,
                     sq_sig_all=True)


@pytest.fixture(scope="module")
def ucmatose_client_run() -> Run:
    """The model's ucmatose client against the guest's ``ucmatose -C 10`` (stock siw)."""
    role = f"iwarp.role=ucmatose-server iwarp.count={MESSAGES}"

    async def scenario(peer: ModelPeer, guest: SiwGuest, lines: list[str]):
        await guest_ready(guest)
        sides = []

        def make() -> Connection:
            host = ucmatose_host()
            sides.append(apps.Ucmatose(host, data=b"M" * 100))
            return Connection(host.qp, active=True)

        link = await peer.connect(GUEST_IP, apps.UCMATOSE_PORT, make)
        side = sides[-1]
        value = await outcome(asyncio.wait_for(side.run_client(), 30))
        await asyncio.wait_for(link.closed(), 20)  # cmatose: the server disconnects
        return [link], value if isinstance(value, Exception) else len(side.received)

    return boot("ucmatose-model-client", "stock", role, scenario)


def ucmatose_model_server(name: str, variant: str, *, timeout: int) -> Run:
    """The model's ucmatose server (offering RFC 6581 RTRs) against the guest's client, one
    try, killed after ``timeout`` s."""
    role = (f"iwarp.role=ucmatose-client iwarp.count={MESSAGES} iwarp.peer={MODEL_IP} "
            f"iwarp.tries=1 iwarp.timeout={timeout}")

    async def scenario(peer: ModelPeer, guest: SiwGuest, lines: list[str]):
        links, served, sides = [], [], []

        async def serve(side: apps.Ucmatose, link: FrameLink) -> int:
            await link.established()
            await side.run_server()
            link.close()
            return len(side.received)

        def on_link(link: FrameLink) -> None:
            links.append(link)
            served.append(asyncio.ensure_future(outcome(serve(sides[-1], link))))

        def make() -> Connection:
            host = ucmatose_host()
            sides.append(apps.Ucmatose(host, data=b"S" * 100))
            return Connection(host.qp, active=False, p2p=True)

        peer.endpoint.listen(apps.UCMATOSE_PORT, make, on_link)
        await guest_ready(guest)
        await guest_result(guest, timeout=60)
        values = [await asyncio.wait_for(task, 10) for task in served]
        return links, values

    return boot(name, variant, role, scenario)


@pytest.fixture(scope="module")
def ucmatose_server_stock_run() -> Run:
    return ucmatose_model_server("ucmatose-model-server-stock", "stock", timeout=5)


@pytest.fixture(scope="module")
def ucmatose_server_p2p_run() -> Run:
    return ucmatose_model_server("ucmatose-model-server-p2p", "p2p", timeout=30)


def test_ucmatose_model_client_takes_data_behind_the_reply(ucmatose_client_run):
    run = ucmatose_client_run
    assert run.value == MESSAGES, run.value
    assert run.guest.rc == 0, run.guest.transcript
    assert run.guest.fields["complete"] == "1"
    assert "data transfers complete" in run.guest.output
    out, back = run.streams()
    received = back.fpdus(reply=True)
    sent = out.fpdus(reply=False)
    assert len(received) == len(sent) == MESSAGES
    # siw (responder, no P2P asked) sent all its Sends before the initiator's first FPDU
    assert max(f.index for f in received) < min(f.index for f in sent)
    assert all(decode_segment(f.ulpdu).opcode == Opcode.SEND for f in received)


def test_ucmatose_model_server_vs_stock_siw_deadlocks(ucmatose_server_stock_run):
    """Stock siw offers no RTR; the model's responder holds its Sends until the initiator's
    first FPDU (RFC 5044 7.1.2) and cmatose's client sends only after receiving: nothing
    moves until the guest kills ucmatose."""
    run = ucmatose_server_stock_run
    assert run.guest.rc == 137, run.guest.transcript  # killed by iwarp.timeout
    assert run.guest.fields["complete"] == "0"
    (link,) = run.links
    assert not link.conn.request.enhanced.peer_to_peer and not link.conn.negotiated.peer_to_peer
    assert (link.conn.stats["fpdus_tx"], link.conn.stats["fpdus_rx"]) == (0, 0)
    assert link.conn.state == ConnState.CLOSED and link.conn.terminate_received is None
    assert isinstance(run.value[0], apps.Disconnected)  # its receives flushed at the close
    out, back = run.streams()
    assert out.mpa_frame(reply=True) and back.mpa_frame(reply=False)
    assert out.fpdus(reply=True) == [] and back.fpdus(reply=False) == []


def test_ucmatose_model_server_vs_p2p_siw(ucmatose_server_p2p_run):
    run = ucmatose_server_p2p_run
    assert run.guest.rc == 0, run.guest.transcript
    assert run.guest.fields["complete"] == "1"
    assert run.value == [MESSAGES]
    (link,) = run.links
    request = link.conn.request.enhanced
    assert request.peer_to_peer and request.rtr_write and request.rtr_read
    assert link.conn.rtr.value == "write"
    out, back = run.streams()
    rtr, *replies = back.fpdus(reply=False)
    segment = decode_segment(rtr.ulpdu)
    assert (segment.opcode, segment.payload) == (Opcode.WRITE, b"")  # the zero-length RTR
    sent = out.fpdus(reply=True)
    assert len(sent) == len(replies) == MESSAGES
    assert rtr.index < min(f.index for f in sent)


# -- tshark -----------------------------------------------------------------------------------

@pytest.mark.tshark
def test_tshark_decodes_rping_runs(rping_client_run, rping_crc_run):
    root, expert = tshark.decode(rping_client_run.pcap)
    assert [len(tshark.fields(root, f"iwarp_mpa.{name}")) for name in ("req", "rep")] == [1, 1]
    assert len(tshark.fields(root, "iwarp_mpa.fpdu")) == 7 * COUNT
    assert tshark.rdmap_opcodes(root) == Counter({"Send": 4 * COUNT, "Read Request": COUNT,
                                                  "Read Response": COUNT, "Write": COUNT})
    tshark.check_clean(root, expert)

    root, expert = tshark.decode(rping_crc_run.pcap)
    fpdus = 2 * COUNT + 3 * COUNT + 3 * COUNT + 3 * COUNT
    assert len(tshark.fields(root, "iwarp_mpa.fpdu")) == fpdus
    assert tshark.rdmap_opcodes(root) == Counter({"Send": 4 * COUNT, "Read Request": COUNT,
                                                  "Read Response": 3 * COUNT,
                                                  "Write": 3 * COUNT})
    checks = [f.get("showname") for f in tshark.fields(root, "iwarp_mpa.crc_check")]
    assert len(checks) == fpdus and all("(Good CRC32)" in c for c in checks), checks
    tshark.check_clean(root, expert)
