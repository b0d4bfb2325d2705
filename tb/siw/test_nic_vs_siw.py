"""The simulated NIC against Linux siw in the QEMU guest: a Verilated NicCore on the guest's
socket netdev (:class:`iwarp_tb.siw.nicpeer.NicPeer`), running the model's applications
(:mod:`iwarp_model.apps`) through the verbs driver, against each siw build (as shipped, CRC
required, MPA revision 1, peer-to-peer RTRs offered).

* rping, the NIC as client (it asks for CRCs; it validates each of 5 pings, and siw's
  ``rping -s -v -C 5`` prints the 5 it served) and as server (siw's ``rping -c -v -C 5``
  prints 5 pings, the NIC's server prints the same data).
* The memory target's host (``test_rping_target_vs_siw_client``): the board's plan
  (:mod:`iwarp_nic.apps.target`) run by :class:`~iwarp_tb.target.ScriptedTarget` with
  register and memory accesses only, in place of the driver, serves siw's ``rping -c -v -C
  5``: 5 pings at the client, the MPA exchange it must give, the last ping's buffer in its
  data region.
* ucmatose (10 messages of 100 octets each way), the NIC as client (siw's responder sends its
  messages right behind the MPA Reply) and as server against the p2p build (its client's RTR
  comes first; without one the exchange deadlocks by RFC 5044 7.1.2: docs/siw.md).
* tshark reads each capture: the MPA exchange each build must give, a good CRC on every FPDU
  where CRCs are on, and the RDMAP messages of the run.
* perftest ``-R`` (``ib_write_bw``, ``ib_read_bw``, ``ib_send_bw``): the model's
  perftest-compatible client and server (:mod:`iwarp_model.perftest`) on the NIC
  (:class:`~iwarp_tb.siw.nicpeer.NicCm`: the comm and test connections are two queue pairs),
  against the guest's tool, 100 operations of 4 KiB; what :mod:`iwarp_tb.siw.perfcheck` asks
  (the tool's exit and row, the report both ways, the data, and tshark's reading of the
  capture: exactly the run's RDMAP messages, a Good CRC32 on every FPDU). ``make test`` runs
  siw as shipped; ``make interop`` every build (``IWARP_INTEROP_ALL=1``).
* Impairments (``test_rping_nic_client_vs_siw_server_impaired``): the wire between the NIC and
  siw loses 1% or 5% of the frames each way, reorders, duplicates or corrupts them, or cuts
  every segment in two at an offset one further each time, as between two NICs
  (``tb/nic/test_nic_impair.py``); 40 rping exchanges of 4 KiB must each arrive intact at
  both ends (Linux's TCP and the NIC's recover; a corrupted frame fails its checksum and is
  a loss), and the impairments must have happened both ways and been seen by the NIC.

``make interop`` runs this file and writes the README's interop matrix from it
(:mod:`iwarp_tb.siw.matrix`).
"""

import asyncio
import dataclasses
import os
import random

import pytest

from iwarp_model import apps, perftest
from iwarp_nic.apps.target import DATA, TargetPlan
from iwarp_nic.apps.target_host import MemoryTarget
from iwarp_tb import tshark
from iwarp_tb.harness import Harness
from iwarp_tb.impairment import CORE, check_seen
from iwarp_tb.siw import image
from iwarp_tb.siw.guest import run_attached
from iwarp_tb.siw.modelpeer import GUEST_IP, guest_ready, guest_result
from iwarp_tb.siw.nicpeer import NIC_IP, NIC_MAC, NicCm, NicPeer
from iwarp_tb.siw.perfcheck import check_capture, check_client, check_server
from iwarp_tb.target import ScriptedTarget
from iwarp_tb.tcprig import ip_int, mac_int

pytestmark = [pytest.mark.siw, pytest.mark.tshark, pytest.mark.xdist_group(name="siw")]

RUNS = image.SIW_BUILD / "runs" / "nic-vs-siw"
COUNT = 5


def boot(name, role, scenario, variant="stock", *, timeout=180, setup=None, **nic_options):
    """Boot ``variant`` with ``role``, put the NIC (a :class:`NicPeer` with
    ``nic_options``, given to ``setup(nic)`` first) on its wire and return ``await
    scenario(nic, guest)``'s value with the guest's result and the capture's path, all
    within ``timeout`` seconds."""
    workdir = RUNS / name
    pcap = workdir / "nic.pcap"
    nic = NicPeer(pcap, **nic_options)     # built before the guest boots: it does not wait
    if setup is not None:
        setup(nic)

    async def main(port, guest):
        async with nic.attached(port):
            value = await scenario(nic, guest)
            return value, await guest_result(guest, timeout=60)

    value, result = run_attached(variant, role, workdir, main, timeout=timeout,
                                 ip=f"{GUEST_IP}/24")
    return value, result, pcap


def pings(prefix, count=COUNT, size=64):
    """The lines rping prints for ``count`` pings of ``size`` octets."""
    return [f"{prefix}{apps.rping_pattern(i, size)[:size - 1].decode()}" for i in range(count)]


def rdmap(pcap):
    """tshark's CRC checks and RDMAP opcode counts of the capture."""
    root, _ = tshark.decode(pcap)
    return ([f.get("showname") for f in tshark.fields(root, "iwarp_mpa.crc_check")],
            tshark.rdmap_opcodes(root))


#: Per ping: the client's two Sends, the server's Read, its two Sends and its Write.
RPING = {"Send": 4 * COUNT, "Read Request": COUNT, "Read Response": COUNT, "Write": COUNT}
#: The siw builds (docs/siw.md): as shipped; requiring CRCs (``mpa_crc_required``); MPA
#: revision 1; offering RFC 6581's peer-to-peer RTRs.
VARIANTS = ("stock", "crc", "rev1", "p2p")


def rping_messages(variant):
    """The RDMAP messages of the run: with peer-to-peer, the initiator's RTR (a zero-length
    RDMA Write, the type the NIC prefers and the p2p build offers) comes first."""
    return {**RPING, "Write": COUNT + (variant == "p2p")}


def exchange(pcap):
    """The MPA Request's and Reply's revision, C flag and private data, as tshark reads them."""
    root, _ = tshark.decode(pcap)
    frames = []
    for packet in root.iter("packet"):
        rev, crc, data = ([f.get("value") for f in tshark.fields(packet, f"iwarp_mpa.{name}")]
                          for name in ("rev", "crc_flag", "privatedata"))
        if rev:
            frames.append((rev[0], crc[0], data[0] if data else ""))
    return frames


#: The RFC 6581 private data of rping's IRD and ORD of 1 (no peer-to-peer).
RPING_IRD_ORD = "00010001"


def check_exchange(pcap, variant, *, nic_initiator):
    """The MPA exchange the variant must give. The NIC asks for CRCs as initiator and sets them
    as responder. As responder, siw answers the Request's revision whatever it was built for
    (``mpa_version`` only sets its own Request's), so rev 1 needs siw as initiator. The p2p
    build sends a Request with P2P and both RTR types offered (IRD 0x8001, ORD 0xc001), and
    the NIC takes the Write RTR (ORD 0x8001); the NIC offers only that one."""
    rev = "01" if variant == "rev1" and not nic_initiator else "02"
    data = "" if rev == "01" else RPING_IRD_ORD
    if nic_initiator:
        data = "80018001" if variant == "p2p" else data
        want = [(rev, "1", data), (rev, "1", data)]
    else:
        crc = "1" if variant == "crc" else "0"
        want = [(rev, crc, "8001c001" if variant == "p2p" else data),
                (rev, "1", "80018001" if variant == "p2p" else data)]
    assert exchange(pcap) == want


def check_crcs(pcap, variant):
    """Every FPDU has a good CRC, and tshark counts rping's messages."""
    checks, opcodes = rdmap(pcap)
    assert opcodes == rping_messages(variant)
    assert len(checks) == sum(opcodes.values())      # one FPDU per message: 64 octets
    assert all("(Good CRC32)" in check for check in checks), checks


@pytest.mark.parametrize("variant", VARIANTS)
def test_rping_nic_client_vs_siw_server(variant):
    """The NIC's validating rping client (CRC asked for; RTRs offered to the p2p build)
    against siw's ``rping -s -v -C 5``: 5 pings checked at both ends."""
    lines = []
    options = {"crc": True, "p2p": variant == "p2p"}

    async def scenario(nic, guest):
        await guest_ready(guest)
        host = await nic.connect(GUEST_IP, apps.RPING_PORT, options=options, ird=1, ord=1)
        client = apps.RpingClient(host, size=64, count=COUNT, verbose=True, out=lines.append)
        done = await asyncio.wait_for(client.run(), 120)
        host.qp.disconnect()
        return done

    done, result, pcap = boot(f"rping-client-{variant}", f"iwarp.role=rping-server "
                              f"iwarp.count={COUNT} iwarp.size=64", scenario, variant)
    assert done == COUNT
    assert [line for line in lines if line.startswith("ping data: ")] == pings("ping data: ")
    assert result.rc == 0, result.transcript
    assert result.pings == COUNT
    for line in pings("server ping data: "):
        assert line in result.output
    check_exchange(pcap, variant, nic_initiator=True)
    check_crcs(pcap, variant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_rping_nic_server_vs_siw_client(variant):
    """siw's ``rping -c -v -C 5`` against the NIC's rping server (which sets CRCs, and takes
    the p2p build's RTR): 5 pings at both ends."""
    lines = []

    async def scenario(nic, guest):
        host = nic.host(ird=1, ord=1)
        server = apps.RpingServer(host, verbose=True, out=lines.append)
        await nic.accept(host.qp, apps.RPING_PORT, p2p=variant == "p2p")
        serving = asyncio.ensure_future(server.run())
        await guest_result(guest, timeout=60)
        # The driver does not flush a closed queue pair's receives, so the server's run()
        # is still waiting for the next ping: what it served is counted.
        serving.cancel()
        return server.pings

    served, result, pcap = boot(
        f"rping-server-{variant}",
        f"iwarp.role=rping-client iwarp.count={COUNT} iwarp.peer={NIC_IP}", scenario, variant)
    assert result.rc == 0, result.transcript
    assert result.pings == COUNT and result.fields["attempts"] == "1"
    for line in pings("ping data: "):
        assert line in result.output
    assert served == COUNT
    assert [line for line in lines if line.startswith("server ping data: ")] == \
        pings("server ping data: ")
    check_exchange(pcap, variant, nic_initiator=False)
    check_crcs(pcap, variant)


def target_exchange(variant):
    """The MPA exchange with the memory target (:mod:`iwarp_nic.apps.target`): siw's Request
    as :func:`check_exchange` has it, the Reply in the Request's revision with CRCs, and with
    revision 2 an IRD of 8 and an ORD of 1 (the Write RTR taken from the p2p build)."""
    request = {"stock": ("02", "0", RPING_IRD_ORD), "crc": ("02", "1", RPING_IRD_ORD),
               "rev1": ("01", "0", ""), "p2p": ("02", "0", "8001c001")}[variant]
    reply = {"rev1": ("01", "1", ""), "p2p": ("02", "1", "80088001")}.get(
        variant, ("02", "1", "00080001"))
    return [request, reply]


@pytest.mark.parametrize("variant", VARIANTS)
def test_rping_target_vs_siw_client(variant):
    """The memory target's host (:class:`~iwarp_tb.target.ScriptedTarget`: the plan the
    board's gateware follows, run with 32-bit register and 8-octet memory accesses only, in
    place of the driver) against siw's ``rping -c -v -C 5``: 5 pings validated by the
    client, served by the target, the last one's buffer read into its data region."""
    targets = []

    def setup(nic):
        nic.device = ScriptedTarget(nic.h, TargetPlan(), mac=nic.device.mac, ip=nic.device.ip,
                                    keys=random.Random(variant).getrandbits(160))
        targets.append(nic.device)

    async def scenario(nic, guest):
        await guest_result(guest, timeout=60)
        return nic.device.memory.read(DATA, 64)         # while the NIC is there

    data, result, pcap = boot(
        f"rping-target-{variant}",
        f"iwarp.role=rping-client iwarp.count={COUNT} iwarp.peer={NIC_IP}", scenario, variant,
        setup=setup)
    [target] = targets
    assert result.rc == 0, result.transcript
    assert result.pings == COUNT and result.fields["attempts"] == "1"
    for line in pings("ping data: "):
        assert line in result.output
    assert target.pings == COUNT and target.log[0] == "accepted", target.log
    assert data == apps.rping_pattern(COUNT - 1, 64)
    assert exchange(pcap) == target_exchange(variant)
    check_crcs(pcap, variant)


class _OwnHost:
    """The host of a top that is its own host: nothing to do between slices."""

    def service(self):
        return 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_rping_memory_target_vs_siw_client(variant):
    """The memory target in gateware (:class:`~iwarp_nic.apps.target_host.MemoryTarget`:
    NicCore, block RAM and the host's state machine, no driver at all) against siw's ``rping
    -c -v -C 5``: 5 pings validated by the client, counted by the target, the MPA exchange as
    the plan gives it."""
    top = MemoryTarget(8, mac=mac_int(NIC_MAC), ip=ip_int(NIC_IP),
                       keys=random.Random(1).getrandbits(160))
    made = (Harness("iwarp_memory_target_w8", top, phy="xgmii", clock_mhz=156.25, seed=1,
                    params=("MemoryTarget", 8, NIC_MAC, NIC_IP, 1)), _OwnHost())

    async def scenario(nic, guest):
        await guest_result(guest, timeout=60)
        return nic.h.get("pings"), nic.h.get("connected")

    (pings_served, _), result, pcap = boot(
        f"rping-memory-target-{variant}",
        f"iwarp.role=rping-client iwarp.count={COUNT} iwarp.peer={NIC_IP}", scenario, variant,
        made=made)
    assert result.rc == 0, result.transcript
    assert result.pings == COUNT and result.fields["attempts"] == "1"
    for line in pings("ping data: "):
        assert line in result.output
    assert pings_served == COUNT
    assert exchange(pcap) == target_exchange(variant)
    check_crcs(pcap, variant)


MESSAGES = 10       # ucmatose's default, of 100 octets


@pytest.mark.parametrize("variant", VARIANTS)
def test_ucmatose_nic_client_vs_siw_server(variant):
    """The NIC's ucmatose client against siw's ``ucmatose -C 10``. As shipped, siw's responder
    sends its 10 Sends right behind the MPA Reply (its client asked for no RTR), so the NIC
    must take FPDUs that follow the Reply at once; with the p2p build the NIC's Write RTR goes
    first. Then the NIC sends its 10."""
    sides = []

    async def scenario(nic, guest):
        await guest_ready(guest)
        await nic.connect(GUEST_IP, apps.UCMATOSE_PORT,
                          options={"crc": False, "p2p": variant == "p2p"},
                          prepare=lambda host: sides.append(apps.Ucmatose(host, data=b"M" * 100)),
                          send_wr=MESSAGES, recv_wr=MESSAGES, separate_cqs=True,
                          sq_sig_all=True)
        await asyncio.wait_for(sides[-1].run_client(), 30)
        return sides[-1].received

    received, result, pcap = boot(f"ucmatose-client-{variant}",
                                  f"iwarp.role=ucmatose-server iwarp.count={MESSAGES}", scenario,
                                  variant)
    assert len(received) == MESSAGES
    assert result.rc == 0, result.transcript
    assert result.fields["complete"] == "1"
    _, opcodes = rdmap(pcap)
    assert opcodes == {"Send": 2 * MESSAGES, **({"Write": 1} if variant == "p2p" else {})}


@pytest.mark.parametrize("variant", ["p2p"])
def test_ucmatose_nic_server_vs_siw_client(variant):
    """siw's ``ucmatose -s`` (the p2p build: it sends a Write RTR once it has the Reply)
    against the NIC's ucmatose server, which sends its 10 messages once the RTR has come, then
    takes siw's 10. (Against siw as shipped this cannot work: its Request offers no RTR, so the
    responder waits for the initiator's first FPDU under RFC 5044 7.1.2, and cmatose's client
    waits for the server's messages; docs/siw.md.)"""

    async def scenario(nic, guest):
        host = nic.host(send_wr=MESSAGES, recv_wr=MESSAGES, separate_cqs=True, sq_sig_all=True)
        side = apps.Ucmatose(host, data=b"N" * 100)
        await nic.accept(host.qp, apps.UCMATOSE_PORT, p2p=True)
        await asyncio.wait_for(side.run_server(), 30)
        host.qp.disconnect()        # cmatose's client waits for the server to disconnect
        return len(side.received)

    received, result, pcap = boot(
        f"ucmatose-server-{variant}",
        f"iwarp.role=ucmatose-client iwarp.count={MESSAGES} iwarp.peer={NIC_IP}", scenario,
        variant)
    assert received == MESSAGES
    assert result.rc == 0, result.transcript
    assert result.fields["complete"] == "1"
    _, opcodes = rdmap(pcap)
    assert opcodes == {"Send": 2 * MESSAGES, "Write": 1}


#: The impaired wires between the NIC and siw (Link arguments, each way), as between two NICs.
IMPAIRED = {
    "loss-1%": {"loss": 0.01},
    "loss-5%": {"loss": 0.05},
    "reorder": {"reorder": 0.05},
    "duplicate": {"duplicate": 0.05},
    "corrupt": {"corrupt": 0.03},
    "split": {"split": 1.0},
}
#: rping exchanges over an impaired wire, and their size: each is a Send and a Read Response
#: of this size the NIC sends, a Write siw sends, and their Sends; at 4 KiB a Read Response
#: or Write is three full segments, so 40 of them cut at 120 offsets or more.
IMPAIRED_PINGS, IMPAIRED_SIZE = 40, 4096


@pytest.mark.parametrize("case", IMPAIRED)
def test_rping_nic_client_vs_siw_server_impaired(case):
    """The NIC's validating rping client against siw's ``rping -s -v`` (as shipped), 40
    exchanges of 4 KiB over a wire impaired both ways: every ping's data intact at both ends,
    the impairment seen both ways and by the NIC. CRCs are asked for, except where segments
    are cut: siw (Linux 6.1) puts each piece of a CRC field split across segments at the
    field's start, and so fails good FPDUs (docs/siw.md, "A CRC field split across segments")."""
    lines = []
    impair = IMPAIRED[case]

    async def scenario(nic, guest):
        await guest_ready(guest)
        host = await nic.connect(GUEST_IP, apps.RPING_PORT, options={"crc": "split" not in impair},
                                 ird=1, ord=1)
        client = apps.RpingClient(host, size=IMPAIRED_SIZE, count=IMPAIRED_PINGS, verbose=True,
                                  out=lines.append)
        done = await asyncio.wait_for(client.run(), 400)
        host.qp.disconnect()
        return done, nic.device.counters(), nic.links

    (done, counters, links), result, _ = boot(
        f"rping-impaired-{case}", f"iwarp.role=rping-server iwarp.count={IMPAIRED_PINGS} "
        f"iwarp.size={IMPAIRED_SIZE} iwarp.timeout=420", scenario, timeout=480,
        impair=impair, core=CORE, seed=7 + list(IMPAIRED).index(case))
    print(f"{case}: wire {dict(links['to_nic'].counters)} to the NIC, "
          f"{dict(links['to_guest'].counters)} to siw")
    assert done == IMPAIRED_PINGS
    assert [line for line in lines if line.startswith("ping data: ")] == \
        pings("ping data: ", IMPAIRED_PINGS, IMPAIRED_SIZE)
    assert result.rc == 0, result.transcript
    assert result.pings == IMPAIRED_PINGS
    for line in pings("server ping data: ", IMPAIRED_PINGS, IMPAIRED_SIZE):
        assert line in result.output
    check_seen(impair, links, {"to_nic": counters})


#: perftest runs on the NIC: operations and their size (4 KiB: three FPDUs each).
PERF_ITERS, PERF_SIZE = 100, 4096
#: The siw builds perftest runs against: as shipped in ``make test``, all in ``make interop``.
PERF_VARIANTS = VARIANTS if os.environ.get("IWARP_INTEROP_ALL") else ("stock",)


def kept(result):
    """``result`` with its buffer's octets copied out of the NIC's host memory, to be read
    once the NIC has gone."""
    memory = bytearray(result.buffer.memory)
    return dataclasses.replace(result, buffer=apps.Buffer(memory, result.buffer.mr))


def perftest_on_nic(op, variant, *, client):
    """The model's perftest client (``client``) or server on the NIC against ``ib_<op>_bw
    -R`` as the other end in the guest, each of :data:`PERF_ITERS` operations of
    :data:`PERF_SIZE` octets."""
    async def scenario(nic, guest):
        cm = NicCm(nic, GUEST_IP, options={"crc": True, "p2p": variant == "p2p"})
        app = perftest.PerftestClient if client else perftest.PerftestServer
        if client:
            await guest_ready(guest)
        run = app(cm, op, size=PERF_SIZE, iters=PERF_ITERS, out_reads=nic.device.max_ird).run()
        return kept(await asyncio.wait_for(run, 240))

    role = f"ib_{op}_bw-{'server' if client else 'client'}"
    peer = "" if client else f" iwarp.peer={NIC_IP}"
    value, guest, pcap = boot(
        f"{role}-{variant}", f"iwarp.role={role} iwarp.count={PERF_ITERS} iwarp.size={PERF_SIZE}"
        f" iwarp.timeout=240{peer}", scenario, variant, timeout=300)
    (check_client if client else check_server)(op, PERF_SIZE, PERF_ITERS, guest, value)
    check_capture(pcap, op, PERF_ITERS, crc=True, rtrs=2 if variant == "p2p" else 0)


@pytest.mark.parametrize("variant", PERF_VARIANTS)
def test_ib_write_bw_nic_client_vs_siw_server(variant):
    """The NIC's Writes into ``ib_write_bw -R``'s buffer; its report printed by perftest."""
    perftest_on_nic("write", variant, client=True)


@pytest.mark.parametrize("variant", PERF_VARIANTS)
def test_ib_write_bw_nic_server_vs_siw_client(variant):
    """``ib_write_bw -R``'s Writes into the NIC's host memory."""
    perftest_on_nic("write", variant, client=False)


@pytest.mark.parametrize("variant", PERF_VARIANTS)
def test_ib_read_bw_nic_client_vs_siw_server(variant):
    """The NIC's Reads of ``ib_read_bw -R``'s buffer."""
    perftest_on_nic("read", variant, client=True)


@pytest.mark.parametrize("variant", [v for v in PERF_VARIANTS if v != "rev1"])
def test_ib_read_bw_nic_server_vs_siw_client(variant):
    """``ib_read_bw -R``'s Reads of the NIC's host memory, answered by the NIC alone. Not
    against the rev1 build: MPA revision 1 carries no IRD and ORD, so siw's client keeps up to
    its own 128 Reads outstanding, beyond the NIC's IRD of 8, and the NIC ends the stream with
    the Terminate RFC 5040 asks for (DDP, MSN range not valid: docs/siw.md)."""
    perftest_on_nic("read", variant, client=False)


@pytest.mark.parametrize("variant", PERF_VARIANTS)
def test_ib_send_bw_nic_client_vs_siw_server(variant):
    """The NIC's Sends under perftest's credit window, siw's credits Written back."""
    perftest_on_nic("send", variant, client=True)


@pytest.mark.parametrize("variant", PERF_VARIANTS)
def test_ib_send_bw_nic_server_vs_siw_client(variant):
    """``ib_send_bw -R``'s Sends into the NIC's receives, the NIC Writing the credits."""
    perftest_on_nic("send", variant, client=False)
