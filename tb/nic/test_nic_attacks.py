"""RFC 5042 attacks on the NIC as system tests: the reference model's whole NIC, on the wire
to a NicCore (:class:`~iwarp_tb.nicmodel.NicModelRig`), is the attacker.

The remote attacks of RFC 5042 section 5 go through one connection, the victim's, while a
second connection of the same NIC does ordinary work (every opcode both ways): STag guessing
(an STag never registered, and a registered STag's index under another key), a Write beyond
the region's bounds, a Write whose Tagged Offset wraps past 2^64, a Read whose source is out
of bounds, the STag of a region of another protection domain (the other connection's), and
a flood of Read Requests beyond the IRD the NIC agreed (the attacker ignores its ORD).

Each attack also runs between two model ends, the oracle: the NIC must send the Terminate the
oracle's victim sent (layer, error type, code and the copied headers, RFC 5040 section 7 and
RFC 6580), its victim queue pair must end in error with that code, the attacker must see the
oracle attacker's completions, and nothing may be written: the NIC's host memory stays the
oracle victim's, its shadow-memory checker sees no write outside a writable region. The
other connection's work must end exactly as its own oracle's (RFC 5042 section 5: one
stream's failure never disturbs another).

Spoofing (RFC 5961, RFC 9293 section 3.10.7): an RST, a SYN and a segment carrying a
Terminate, each with a sequence number the connection does not expect, reach the NIC on an
established connection before its work; the connection must carry on and the work end as the
oracle's, with the RST and SYN that fall in the window answered by challenge ACKs.
"""

import random

import pytest

from iwarp_model import verbs
from iwarp_model.engine import Connection, ConnState
from iwarp_model.verbs import SGE, QpState, SendFlags, SendWR, WcStatus, WrOpcode
from iwarp_model.wire.fpdu import Framer
from iwarp_model.wire.mpa import HEADER_SIZE, KEY_REQUEST
from iwarp_model.wire.net import (
    ACK,
    ETH_MIN_FRAME,
    ETHERTYPE_IPV4,
    PROTO_TCP,
    PSH,
    RST,
    SYN,
    EthernetFrame,
    IPv4Packet,
    TcpSegment,
    ipv4,
    mac,
)
from iwarp_model.wire.rdmap import Opcode, Segment
from iwarp_model.wire.terminate import ErrorCode, Terminate
from iwarp_tb import model_run
from iwarp_tb.model_run import Ends
from iwarp_tb.nicmodel import MODEL_IP, MODEL_MAC, NIC_IP, NIC_MAC, NicModelRig
from iwarp_tb.traffic import EVERY, PART, PARTS, End, exchange, kinds, nic_end, plan

SIGNALED = SendFlags.SIGNALED
IRD = 8                 # the victim's (End's and the driver's default)
ATTACKER_ORD = 32


def write(attacker, addr, length, rkey):
    """An RDMA Write of ``length`` octets of the attacker's part 5 to ``addr`` under ``rkey``."""
    return SendWR(1, WrOpcode.RDMA_WRITE, [SGE(attacker.at(5), length, attacker.region.lkey)],
                  SIGNALED, remote_addr=addr, rkey=rkey)


def read(attacker, addr, length, rkey, wr_id=1):
    """An RDMA Read of ``length`` octets at ``addr`` under ``rkey`` into the attacker's part 3."""
    return SendWR(wr_id, WrOpcode.RDMA_READ, [SGE(attacker.at(3), length, attacker.region.lkey)],
                  SIGNALED, remote_addr=addr, rkey=rkey)


def unregistered(victim, other):
    """An STag index neither region has, under the victim's key."""
    index = max(victim.region.rkey, other.region.rkey) >> 8
    return (index + 7) << 8 | victim.region.rkey & 0xFF


#: Each attack: the attacker's work requests, given the attacker, the victim and the other
#: connection's NIC end (all :class:`~iwarp_tb.traffic.End`).
ATTACKS = {
    "stag-never-registered": lambda a, v, o: [write(a, v.at(0), 64, unregistered(v, o))],
    "stag-wrong-key": lambda a, v, o: [write(a, v.at(0), 64, v.region.rkey ^ 0x5A)],
    "write-out-of-bounds": lambda a, v, o: [write(a, v.at(PARTS) - 32, 64, v.region.rkey)],
    "write-to-wraps": lambda a, v, o: [write(a, (1 << 64) - 32, 64, v.region.rkey)],
    "read-out-of-bounds": lambda a, v, o: [read(a, v.at(PARTS) - 100, 200, v.region.rkey)],
    "foreign-pd": lambda a, v, o: [write(a, o.at(0), 64, o.region.rkey)],
    "read-flood": lambda a, v, o: [read(a, v.at(2), PART, v.region.rkey, k)
                                   for k in range(IRD + 1)],
}


def ignore_ird(attack, conn):
    """The flooding attacker's connection takes the ORD of its queue pair, whatever IRD the
    NIC agreed (RFC 6581's exchange lowered it)."""
    if attack == "read-flood":
        conn.ord = ATTACKER_ORD


def nic_ends(seed):
    """The victim's and the other connection's NIC ends, on one model device so that their
    STags are those the NIC's driver gives the two regions in the same order."""
    dev = verbs.Device("nic")
    return End("victim", seed, dev=dev), End("other", seed + 1, dev=dev)


def answered_reads(got, wanted):
    """The flood's Reads that the NIC answered before it refused one beyond its IRD (the
    oracle's victim saw the whole flood before it answered any): those complete with
    success, the rest as the oracle's all did. Returns how many were answered."""
    got, wanted = sorted(got, key=lambda wc: wc.wr_id), sorted(wanted, key=lambda wc: wc.wr_id)
    answered = sum(1 for wc in got if wc.status == WcStatus.SUCCESS)
    assert answered < len(wanted), "every Read of the flood was answered"
    assert kinds(got[answered:]) == kinds(wanted[answered:])
    assert [wc.wr_id for wc in got[:answered]] == list(range(answered))
    return answered


@pytest.mark.cocotb
@pytest.mark.parametrize("attack", ATTACKS)
def test_attack(attack, seed=61):
    """The attack on one connection while the other does every opcode both ways: the NIC's
    Terminate is the oracle victim's, nothing is written, the other work ends as its
    oracle's."""
    # The oracle: the attack between two model ends, the other work between two more.
    victim, other = nic_ends(seed)
    attacker, peer = End("attacker", seed + 2, ord_=ATTACKER_ORD), End("peer", seed + 3)
    wrs = ATTACKS[attack](attacker, victim, other)
    _, victim_conn = exchange(attacker, victim, ((wrs, []), ([], [])),
                              established=lambda a, _: ignore_ird(attack, a))
    rng = random.Random(seed)
    other_sends, peer_recvs = plan(rng, other, peer, 30, kinds=EVERY)
    peer_sends, other_recvs = plan(rng, peer, other, 30, kinds=EVERY)
    exchange(peer, other, ((peer_sends, peer_recvs), (other_sends, other_recvs)))
    wanted = {"attacker": attacker.cq.poll_cq(64), "other": other.cq.poll_cq(1 << 12),
              "peer": peer.cq.poll_cq(1 << 12)}
    oracle_terminate = victim_conn.terminate_sent
    assert oracle_terminate is not None, f"{attack}: the oracle's victim sent no Terminate"

    # The same against the NIC.
    live = {"victim": nic_ends(seed), "attacker": End("attacker", seed + 2, ord_=ATTACKER_ORD),
            "peer": End("peer", seed + 3)}
    live_victim, live_other = live["victim"]
    rig = NicModelRig(8, seed=seed, memory_bytes=1 << 24)
    try:
        device = rig.device
        device.memory.configure(latency=20, stall=0.2, seed=seed)
        qp, cq, mr = nic_end(device, live_victim)
        other_qp, other_cq, other_mr = nic_end(device, live_other)
        attacker_conn = Connection(live["attacker"].qp, active=True)
        peer_conn = Connection(live["peer"].qp, active=True)
        rig.accept(qp, attacker_conn, port=4792)
        rig.accept(other_qp, peer_conn, port=4793)
        ignore_ird(attack, attacker_conn)
        for wr in peer_recvs:
            live["peer"].qp.post_recv(wr)
        other_qp.post_recv(other_recvs)
        other_qp.post_send(other_sends)
        for wr in peer_sends:
            live["peer"].qp.post_send(wr)
        for wr in ATTACKS[attack](live["attacker"], live_victim, live_other):
            live["attacker"].qp.post_send(wr)
        got = {"attacker": [], "other": [], "peer": []}

        def done():
            got["attacker"] += live["attacker"].cq.poll_cq(64)
            got["other"] += other_cq.poll_cq(64)
            got["peer"] += live["peer"].cq.poll_cq(64)
            return (qp.state != QpState.RTS and attacker_conn.state == ConnState.TERMINATED
                    and len(got["other"]) >= len(wanted["other"])
                    and len(got["peer"]) >= len(wanted["peer"]))

        rig.run_until(done, timeout_cycles=4_000_000)
        rig.run(20_000)
        done()
        print(f"{attack}: the NIC sent Terminate {qp.terminate_sent:#06x} ({qp.reason}); "
              f"the attacker got {[(wc.wr_id, wc.status.name) for wc in got['attacker']]}")
        assert qp.terminate_sent == oracle_terminate.error_bits, qp.reason
        assert attacker_conn.terminate_received == oracle_terminate
        for end in ("other", "peer"):
            assert kinds(got[end]) == kinds(wanted[end]), end
        if attack == "read-flood":
            answered = answered_reads(got["attacker"], wanted["attacker"])
            if answered:        # their data: the victim's part 2 in the attacker's part 3
                attacker.memory[3 * PART:4 * PART] = victim.memory[2 * PART:3 * PART]
        else:
            assert kinds(got["attacker"]) == kinds(wanted["attacker"])
        assert live["attacker"].memory == attacker.memory
        assert device.memory.read(mr.addr, mr.length) == bytes(victim.memory)
        assert device.memory.read(other_mr.addr, other_mr.length) == bytes(other.memory)
        assert live["peer"].memory == peer.memory
        assert other_qp.state == QpState.RTS and peer_conn.state == ConnState.ESTABLISHED
        assert device.memory.violations() == [] and device.memory.faults() == []
    finally:
        rig.close()



def spoofed(tcp):
    """Segments from the model's end of connection ``tcp`` (its TcpConnection) that it did not
    send: an RST beyond the NIC's window, an RST inside it but not at its next octet, a SYN,
    and a Terminate FPDU beyond the window, all with the model's addresses and ports."""
    nxt = tcp.snd_nxt

    def frame(seq, flags, payload=b"", ack=0):
        segment = TcpSegment(tcp.local_port, tcp.remote_port, seq & 0xFFFF_FFFF, ack, flags,
                             0xFFFF, payload)
        packet = IPv4Packet(ipv4(MODEL_IP), ipv4(NIC_IP), PROTO_TCP,
                            segment.encode(ipv4(MODEL_IP), ipv4(NIC_IP)))
        return EthernetFrame(mac(NIC_MAC), mac(MODEL_MAC), ETHERTYPE_IPV4,
                             packet.encode()).encode(min_size=ETH_MIN_FRAME)

    terminate = Segment(Opcode.TERMINATE, msn=1,
                        header=Terminate.for_error(ErrorCode.RDMAP_UNEXPECTED_OPCODE)).encode()
    fpdu = Framer(crc=True, markers=False).frame(terminate)
    return {"rst-beyond-window": frame(nxt + (1 << 31), RST),
            "rst-in-window": frame(nxt + 1000, RST),
            "syn": frame(nxt + 5, SYN),
            "terminate-beyond-window": frame(nxt + (1 << 30), ACK | PSH, fpdu, tcp.rcv_nxt)}


@pytest.mark.cocotb
def test_spoofing(seed=71):
    """RST, SYN and Terminate spoofing on an established connection before its work: the
    connection carries on and the work ends as the oracle's; the two segments inside the
    window (the RST and the SYN) draw challenge ACKs, the others are dropped."""
    ends = Ends(End, seed)
    rng = random.Random(seed)
    work = model_run.both_ways(ends, rng, 40)
    seen = {}

    def spoof(rig, qp, link):
        before = rig.device.counters()
        for frame in spoofed(link.tcp).values():
            rig.h.send_frame(frame)
        rig.run(50_000)
        after = rig.device.counters()
        seen.update({name: after[name] - before[name] for name in after})
        assert qp.state == QpState.RTS, qp.reason

    result = model_run.run(ends, work,
                           nic_connects=False, seed=seed + 3, established=spoof)
    assert result.errors == []
    assert seen["tcp_rx_challenged"] == 2, seen
    assert seen["tcp_resets"] == 0 and seen["tcp_rx_segments"] >= 4, seen


@pytest.mark.cocotb
def test_oversized_private_data(seed=81):
    """An MPA Request whose PD_Length is 600 (RFC 5044 section 7.1.1: at most 512) reaching a
    listening queue pair: the model's Responder, given the same octets, ends the connection
    ("bad MPA frame"); the NIC's queue pair must fail with the same reason, its host memory
    untouched, and close the TCP connection."""
    request = KEY_REQUEST + bytes([0x40, 2]) + (600).to_bytes(2, "big") + bytes(range(256)) * 3
    request = request[:HEADER_SIZE + 600]
    oracle = Connection(End("oracle", seed).qp, active=False)
    oracle.start()
    oracle.receive(request)
    assert oracle.state == ConnState.CLOSED and "PD_Length" in oracle.reason, oracle.reason

    victim = End("victim", seed)
    rig = NicModelRig(8, seed=seed)
    try:
        qp, _, mr = nic_end(rig.device, victim)
        qp.listen(4792)
        tcp = rig.stack.connect(NIC_IP, 4792)
        rig.run_until(lambda: tcp.state.name == "ESTABLISHED", timeout_cycles=200_000)
        tcp.send(request)
        rig.run_until(lambda: qp.state == QpState.ERR and tcp.eof, timeout_cycles=1_000_000)
        print(f"the NIC's queue pair: {qp.reason}; the attacker's TCP: {tcp.state.name}")
        assert "bad startup frame" in qp.reason and "PD_Length" in qp.reason, qp.reason
        assert rig.device.memory.read(mr.addr, mr.length) == victim.initial
        assert rig.device.memory.violations() == []
    finally:
        rig.close()
