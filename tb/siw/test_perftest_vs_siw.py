"""The model's perftest ``-R`` client and server (:mod:`iwarp_model.perftest`) against Linux
perftest 4.5-0.17 (``ib_write_bw``, ``ib_read_bw``, ``ib_send_bw``, version 6.06) on siw in
the QEMU guest, the model on its own raw-frame TCP/IP (:class:`~iwarp_tb.siw.modelpeer.
ModelPeer`).

Each op and size (1000 and 65536 octets) runs twice, one boot each (a module fixture): the
guest as server (``ib_X_bw -R -F -n 100 -s SIZE``) facing the model's client, and the guest as
client facing the model's server. Every run must end with the guest's tool exiting 0 and
printing a result row of SIZE bytes and 100 iterations, and show what
:mod:`iwarp_tb.siw.perfcheck` asks of it, tshark's reading of its capture included (stock siw
and the model negotiate no CRC, so none is checked).
The capture of each run is ``build/siw/runs/perftest-vs-siw/<run>/model.pcap``; each run's
wall time (boot included) is printed.
"""

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from iwarp_model import perftest
from iwarp_tb.siw import image
from iwarp_tb.siw.guest import GuestResult, SiwGuest, run_attached
from iwarp_tb.siw.modelpeer import GUEST_IP, MODEL_IP, ModelPeer, guest_ready, guest_result
from iwarp_tb.siw.perfcheck import check_capture, check_client, check_server

pytestmark = [pytest.mark.siw, pytest.mark.tshark, pytest.mark.xdist_group(name="siw")]

RUNS = image.SIW_BUILD / "runs" / "perftest-vs-siw"
ITERS = 100
#: 1000 octets: perftest steps its addresses through the 4096-octet cycle buffer by 1024 (the
#: size rounded up to the cache line); 65536: every operation at one address, 16 FPDUs each.
SIZES = (1000, 65536)
#: Linux 6.1's siw responder may miss an FPDU that follows its MPA Reply within milliseconds
#: (test_model_vs_siw.AFTER_REPLY, docs/siw.md): the model's client waits this long after each
#: Reply before its first message.
SETTLE = 0.2


@dataclass
class Run:
    guest: GuestResult
    value: object  # the model's ClientResult or ServerResult, or the exception it raised
    pcap: Path
    seconds: float


def boot(name: str, role: str, scenario) -> Run:
    """Boot stock siw with ``role``, attach the model, ``await scenario(peer, guest)``, then
    wait for the guest's result."""
    workdir = RUNS / name
    pcap = workdir / "model.pcap"

    async def main(port: int, guest: SiwGuest):
        start = time.monotonic()
        async with ModelPeer(port, pcap) as peer:
            try:
                value = await scenario(peer, guest)
            except Exception as error:  # noqa: BLE001 - the tests assert on it
                value = error
            result = await guest_result(guest, timeout=90)
            await asyncio.sleep(0.2)  # the last ACKs and FINs into the capture
            return result, value, time.monotonic() - start

    result, value, seconds = run_attached("stock", role, workdir, main, timeout=150,
                                          ip=f"{GUEST_IP}/24")
    print(f"\n{name}: {seconds:.1f} s (boot and run), guest rc {result.rc} row "
          f"{result.fields.get('row')}, model {value!r:.200}")
    return Run(result, value, pcap, seconds)


def model_client(op: str, size: int) -> Run:
    """The model's client against ``ib_<op>_bw -R`` as server in the guest."""
    role = f"iwarp.role=ib_{op}_bw-server iwarp.count={ITERS} iwarp.size={size}"

    async def scenario(peer: ModelPeer, guest: SiwGuest):
        await guest_ready(guest)
        cm = perftest.FrameCm(peer.endpoint, GUEST_IP, timeout=60, interval=0.3,
                              settle=SETTLE)
        return await asyncio.wait_for(
            perftest.PerftestClient(cm, op, size=size, iters=ITERS).run(), 90)

    return boot(f"{op}-{size}-model-client", role, scenario)


def model_server(op: str, size: int) -> Run:
    """The model's server against ``ib_<op>_bw -R`` as client in the guest."""
    role = (f"iwarp.role=ib_{op}_bw-client iwarp.count={ITERS} iwarp.size={size} "
            f"iwarp.peer={MODEL_IP}")

    async def scenario(peer: ModelPeer, guest: SiwGuest):
        server = perftest.PerftestServer(perftest.FrameCm(peer.endpoint), op, size=size,
                                         iters=ITERS)
        return await asyncio.wait_for(server.run(), 120)

    return boot(f"{op}-{size}-model-server", role, scenario)


CASES = [(op, size) for size in SIZES for op in perftest.OPS]


@pytest.fixture(scope="module", params=CASES, ids=[f"{op}-{size}" for op, size in CASES])
def client_run(request) -> tuple[str, int, Run]:
    return *request.param, model_client(*request.param)


@pytest.fixture(scope="module", params=CASES, ids=[f"{op}-{size}" for op, size in CASES])
def server_run(request) -> tuple[str, int, Run]:
    return *request.param, model_server(*request.param)


def test_model_client_vs_perftest_server(client_run):
    op, size, run = client_run
    check_client(op, size, ITERS, run.guest, run.value)
    check_capture(run.pcap, op, ITERS, crc=False)


def test_model_server_vs_perftest_client(server_run):
    op, size, run = server_run
    check_server(op, size, ITERS, run.guest, run.value)
    check_capture(run.pcap, op, ITERS, crc=False)
