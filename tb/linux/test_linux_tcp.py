"""The TCP engine (TcpNode: MAC + IP + TCP, generated Verilog in the native harness) against
Linux's TCP through a TAP device (iwarp_tb.tap), at 1 byte (GMII) and 8 bytes (XGMII).

Linux runs tb/linux/peer.py (plain sockets) in the test's namespace. Every connection carries a
pattern each way, keyed by its client port; the NIC's bytes are compared with Linux's pattern
here, and Linux reports a SHA-256 of what it got. Cases: Linux connects to the NIC, the NIC
connects to Linux, 4 MiB each way (1 MiB at 1 byte); ``tc netem`` loss (1%, 5%),
reordering and duplication on Linux's side; Linux's RST and FIN; 16 connections at once.
Pcaps go to build/linux/.
"""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from iwarp_nic.tcp.engine import COUNTERS as TCP_COUNTERS
from iwarp_nic.tcp.layouts import EventKind
from iwarp_tb import toolchain
from iwarp_tb.tap import Tap, bridge, netem_available
from iwarp_tb.tcphost import ENDED
from iwarp_tb.tcprig import NicRig, ip_int

pytestmark = pytest.mark.linux_peer

PEER = Path(__file__).with_name("peer.py")
PCAPS = toolchain.BUILD / "linux"
PORT = 5001
MiB = 1 << 20
SEED = 7

sys.path.insert(0, str(PEER.parent))
from peer import pattern  # noqa: E402


def session(width, name, *, nic_role, conns=1, size=MiB, netem=None, abort=False,
            timeout_s=600):
    """Run ``conns`` connections of ``size`` bytes each way, the NIC as ``nic_role``
    ("server" or "client"); return (rig, Linux's results, the NIC's slots). The rig's
    simulation is closed by then: its engine counters are kept in ``rig.final``."""
    with Tap() as tap:
        rig = NicRig(width, conns=16, ip=tap.nic_ip)
        try:
            impair = None
            if netem and netem_available(tap):
                tap.run(["tc", "qdisc", "add", "dev", tap.device, "root", "netem", *netem[0]],
                        check=True)
            elif netem:
                impair = dict(netem[1])     # no sch_netem in this kernel: same faults, bridged
            linux = ["server", "--port", str(PORT)] if nic_role == "client" else \
                ["client", "--host", tap.nic_ip, "--port", str(PORT)]
            linux += ["--conns", str(conns), "--size", str(size), "--seed", str(SEED)]
            if nic_role == "server":
                for slot in range(conns):
                    rig.host.listen(slot, PORT)
                rig.h.run(100)
            proc = tap.popen([sys.executable, str(PEER), *linux, *(["--abort"] if abort else [])])
            if nic_role == "client":
                assert '"listening"' in proc.stdout.readline()
                for slot in range(conns):
                    rig.host.connect(slot, 40000 + slot, ip_int(tap.peer_ip), PORT)
            ports, closing = {}, set()     # slot -> client port, once established

            def until():
                rig.host.service()
                for slot in range(conns):
                    s = rig.host.slots[slot]
                    if s.peer and slot not in ports:
                        ports[slot] = s.peer[1] if nic_role == "server" else 40000 + slot
                        rig.host.send(slot, pattern(SEED, ports[slot], size, "nic"))
                    if (slot in ports and slot not in closing and not abort
                            and rig.host.unsent(slot) == 0
                            and rig.h.pending("s_axis_tx_header") == 0):
                        closing.add(slot)
                        rig.host.close(slot)
                return proc.poll() is not None and all(
                    rig.host.slots[slot].last_event in ENDED for slot in range(conns))

            try:
                bridge(rig.h, tap, until, timeout_s, pcap=PCAPS / f"{name}_w{width}.pcap",
                       impair=impair)
            finally:
                proc.kill()
            drain(rig)
            out = proc.communicate()[0].strip().splitlines()
            results = json.loads(out[-1])
            rig.final = rig.counters(*(f"tcp_{name}" for name in TCP_COUNTERS))
            return rig, results, ports
        finally:
            rig.close()


def drain(rig, cycles=4000):
    """Run the NIC on its own until it has nothing left to pass on: a connection's end event
    does not wait for the bytes received before it to leave the shared receive buffer (a
    peer's RST in TIME-WAIT, answering our ACK of a late duplicate, ends the slot at once),
    and those bytes still come out on ``o_rx``. Done when a round of ``cycles`` brings no
    byte (a buffer that holds bytes passes a chunk, at most an MSS, in fewer cycles)."""
    while True:
        before = sum(len(slot.received) for slot in rig.host.slots)
        rig.h.run(cycles)
        rig.host.service()
        if sum(len(slot.received) for slot in rig.host.slots) == before:
            return


def check_transfers(rig, results, ports, size):
    assert len(results) == len(ports)
    for slot, port in ports.items():
        got = rig.host.slots[slot].received
        assert len(got) == size, f"slot {slot}: NIC got {len(got)} of {size} bytes"
        assert got == pattern(SEED, port, size, "linux"), f"slot {slot}: NIC got bad bytes"
        mine = pattern(SEED, port, size, "nic")
        theirs = results[str(port)]
        assert theirs["received"] == size, f"slot {slot}: Linux got {theirs['received']}"
        assert theirs["sha256"] == hashlib.sha256(mine).hexdigest(), f"slot {slot}: bad bytes"
        assert rig.host.slots[slot].events[-1] == EventKind.CLOSED


@pytest.mark.parametrize("width", (1, 8))
@pytest.mark.parametrize("nic_role", ("server", "client"))
def test_bulk_each_way(width, nic_role):
    """4 MiB each way at once at 8 bytes a beat (1 MiB at 1, where each octet is a cycle of
    the simulator), Linux connecting to the NIC and the NIC to Linux."""
    size = 4 * MiB if width == 8 else MiB
    rig, results, ports = session(width, f"bulk_{nic_role}", nic_role=nic_role, size=size)
    check_transfers(rig, results, ports, size)


#: Linux's egress faults: ``tc netem`` arguments, and the same faults as the bridge's
#: :class:`~iwarp_model.transport.impair.Link` arguments for kernels without ``sch_netem``.
NETEM = {
    "loss1": (["loss", "1%"], {"loss": 0.01}),
    "loss5": (["loss", "5%"], {"loss": 0.05}),
    "reorder": (["delay", "1ms", "reorder", "75%", "50%"],
                {"reorder": 0.25, "reorder_delay": 0.001}),
    "duplicate": (["duplicate", "5%"], {"duplicate": 0.05}),
}


def sack_blocks(pcap, nic_ip):
    """tshark's decode of ``pcap``: whether the NIC's SYN-ACK offered SACK, and the (ACK, left,
    right, TCP length) of each segment from the NIC with a SACK block, absolute numbers."""
    fields = ["tcp.flags.syn", "tcp.options.sack_perm", "tcp.ack", "tcp.options.sack_le",
              "tcp.options.sack_re", "tcp.len"]
    done = subprocess.run(
        ["tshark", "-n", "-r", str(pcap), "-o", "tcp.relative_sequence_numbers:FALSE",
         "-Y", f"ip.src == {nic_ip} && (tcp.flags.syn == 1 || tcp.options.sack_le)",
         "-T", "fields", "-E", "separator=/t", *(f for name in fields for f in ("-e", name))],
        capture_output=True, text=True, check=True)
    offered, blocks = None, []
    for line in done.stdout.splitlines():
        syn, perm, ack, left, right, length = (line.split("\t") + [""] * 6)[:6]
        if syn in ("1", "True"):
            offered = bool(perm)
        else:
            blocks.append((int(ack), int(left), int(right), int(length)))
    return offered, blocks


def serial_before(a, b):
    """RFC 1982: sequence number ``a`` comes before ``b``."""
    return 0 < (b - a) % (1 << 32) < 1 << 31


@pytest.mark.tshark
@pytest.mark.parametrize("width", (1, 8))
@pytest.mark.parametrize("impair", NETEM)
def test_netem(width, impair):
    """Linux's egress impaired by ``tc netem`` (or, where the kernel has no ``sch_netem``, by
    the bridge with the same faults): still byte-exact both ways. Where segments were lost or
    late, tshark finds the parked run reported to Linux in SACK blocks on pure ACKs, each past
    the ACK it rides on and covering at most ``park_segments`` full segments."""
    size = MiB if width == 8 else MiB // 2
    rig, results, ports = session(width, f"netem_{impair}", nic_role="server", size=size,
                                  netem=NETEM[impair])
    check_transfers(rig, results, ports, size)
    # The faults reached the NIC: segments past a hole (kept for later), or old duplicates.
    seen = "tcp_rx_dropped" if impair == "duplicate" else "tcp_rx_parked"
    assert rig.final[seen] > 0, f"{impair}: the NIC saw no fault ({seen} is 0)"
    offered, blocks = sack_blocks(PCAPS / f"netem_{impair}_w{width}.pcap", rig.ip)
    assert offered, "the NIC's SYN-ACK did not offer SACK to Linux, whose SYN did"
    if impair != "duplicate":
        assert blocks, f"{impair}: the NIC parked segments but sent no SACK block"
    for ack, left, right, length in blocks:
        assert length == 0, f"a SACK block on a segment with data: {ack, left, right}"
        assert serial_before(ack, left) and serial_before(left, right), (ack, left, right)
        assert (right - left) % (1 << 32) <= 32 * 1460, (ack, left, right)   # park_segments


@pytest.mark.parametrize("width", (1, 8))
def test_sixteen_connections(width):
    """16 Linux connections to 16 listening slots at once."""
    size = 256 * 1024
    rig, results, ports = session(width, "conns16", nic_role="server", conns=16, size=size)
    check_transfers(rig, results, ports, size)


@pytest.mark.parametrize("width", (1, 8))
def test_linux_reset(width):
    """Linux takes the NIC's bytes, then resets (SO_LINGER 0) with its own maybe still
    unsent: the NIC reports RESET, and what it delivered is an exact prefix of Linux's bytes."""
    size = 64 * 1024
    rig, results, ports = session(width, "reset", nic_role="server", size=size, abort=True)
    (slot, port), = ports.items()
    got = bytes(rig.host.slots[slot].received)
    assert got == pattern(SEED, port, size, "linux")[:len(got)]
    mine = pattern(SEED, port, size, "nic")
    assert results[str(port)] == {"received": size,
                                  "sha256": hashlib.sha256(mine).hexdigest()}
    assert rig.host.slots[slot].last_event == EventKind.RESET
    assert rig.final["tcp_resets"] == 1
