"""One NIC (NicCore natively under Verilator, driven by :mod:`iwarp_tb.driver`) against the
reference model's whole NIC (its TCP/IP, MPA, DDP and RDMAP, with the model's verbs) on one
wire (:class:`~iwarp_tb.nicmodel.NicModelRig`), doing RDMA both ways.

The oracle is the same work between two model ends over an in-memory stream, and
:func:`iwarp_tb.model_run.run` the comparison: the NIC's host memory and completions must be
its oracle end's, the model peer's memory and completions the other oracle end's; the NIC's
shadow-memory checker must have seen no write outside a registered, writable region nor any
AXI protocol fault. Host memory answers after random latencies with random stalls.

* Every opcode the NIC offloads (:data:`~iwarp_tb.traffic.EVERY`: Writes, Sends with and
  without Solicited Event, Reads, atomics and masked atomics, Write with Immediate Data,
  Immediate Data alone), both ways at once, with the NIC as the MPA Initiator (it connects)
  and as the Responder (it listens). Every frame is captured both ways.
* Writes, Sends and Reads of 0 octets both ways, then of 4 MiB: a Write and a Read by the
  NIC, a Send and a Read by the model.
"""

import random

import pytest

from iwarp_model import verbs
from iwarp_model.pcap import read_pcap
from iwarp_model.verbs import SGE, RecvWR, SendFlags, SendWR, WrOpcode
from iwarp_tb import model_run
from iwarp_tb.model_run import Ends
from iwarp_tb.traffic import ALL, EVERY, End, plan

SIGNALED = SendFlags.SIGNALED


class BigEnd:
    """An end like :class:`~iwarp_tb.traffic.End` whose region has 5 parts of ``part``
    octets: Writes land in part 0, Sends in part 1, Reads come from part 2 into part 3,
    payloads come from part 4."""

    def __init__(self, name, seed, part):
        rng = random.Random(seed)
        self.part = part
        self.dev = verbs.Device(name)
        self.pd = self.dev.alloc_pd()
        self.cq = self.dev.create_cq(64)
        self.qp = self.dev.create_qp(self.pd, self.cq, self.cq, max_send_wr=64, max_recv_wr=64,
                                     max_rd_atomic=8, max_dest_rd_atomic=8)
        self.initial = rng.randbytes(5 * part)
        self.memory = bytearray(self.initial)
        self.region = self.dev.reg_mr(self.pd, self.memory, ALL, iova=rng.getrandbits(40) & ~7)

    def at(self, part, offset=0):
        return self.region.iova + part * self.part + offset


def sized(local, remote, ops, length, first_id):
    """Work requests of ``local`` on ``remote``, one per op of ``ops`` (``"write"``,
    ``"send"``, ``"read"``) of ``length`` octets, ``wr_id`` from ``first_id``, and the
    receives ``remote`` posts for the Sends."""
    wrs, recvs = [], []
    source = [SGE(local.at(4), length, local.region.lkey)] if length else []
    for k, op in enumerate(ops, first_id):
        if op == "write":
            wrs.append(SendWR(k, WrOpcode.RDMA_WRITE, source, SIGNALED,
                              remote_addr=remote.at(0), rkey=remote.region.rkey))
        elif op == "send":
            recvs.append(RecvWR(k, [SGE(remote.at(1), length, remote.region.lkey)]
                                if length else []))
            wrs.append(SendWR(k, WrOpcode.SEND, source, SIGNALED))
        else:
            sink = [SGE(local.at(3), length, local.region.lkey)] if length else []
            wrs.append(SendWR(k, WrOpcode.RDMA_READ, sink, SIGNALED,
                              remote_addr=remote.at(2), rkey=remote.region.rkey))
    return wrs, recvs


def run(ends, work, *, nic_connects, seed, pcap=None):
    """:func:`iwarp_tb.model_run.run` at 8 bytes with random host-memory latency and stalls:
    every check must pass; returns the frames captured."""
    result = model_run.run(ends, work, nic_connects=nic_connects, seed=seed, pcap=pcap)
    assert result.errors == []
    return result.captured


@pytest.mark.cocotb
@pytest.mark.parametrize("nic_connects", [True, False], ids=["nic-initiator", "nic-responder"])
def test_every_opcode_with_model(nic_connects, tmp_path, seed=21, count=60):
    """``count`` work requests of every kind each way; the capture has frames from both
    ends, none longer than Ethernet allows, and its pcap holds them all."""
    ends = Ends(End, seed)
    rng = random.Random(seed + 2)
    nic_sends, peer_recvs = plan(rng, ends.nic, ends.peer, count, kinds=EVERY)
    peer_sends, nic_recvs = plan(rng, ends.peer, ends.nic, count, kinds=EVERY)
    work = {"nic": (nic_sends, nic_recvs), "peer": (peer_sends, peer_recvs)}
    pcap = tmp_path / "nic_model.pcap"
    captured = run(ends, work, nic_connects=nic_connects, seed=seed + 3, pcap=pcap)
    senders = {sender for _, sender, _ in captured}
    assert senders == {"nic", "model"}, senders
    assert [frame for _, frame in read_pcap(pcap)[1]] == [f for _, _, f in captured]
    assert all(len(frame) <= 1514 for _, _, frame in captured)


@pytest.mark.cocotb
def test_message_sizes_with_model(seed=31, size=4 << 20):
    """0-octet Writes, Sends and Reads both ways, then ``size`` octets (4 MiB, the largest
    message the system tests carry), all at once: the NIC Writes and Reads, the model Sends and
    Reads, with random host-memory latency and stalls."""
    ends = Ends(lambda name, s: BigEnd(name, s, size), seed)
    nic_zero, peer_zero_recvs = sized(ends.nic, ends.peer, ("write", "send", "read"), 0, 1)
    peer_zero, nic_zero_recvs = sized(ends.peer, ends.nic, ("write", "send", "read"), 0, 11)
    nic_big, _ = sized(ends.nic, ends.peer, ("write", "read"), size, 4)
    peer_big, nic_big_recvs = sized(ends.peer, ends.nic, ("send", "read"), size, 14)
    work = {"nic": (nic_zero + nic_big, nic_zero_recvs + nic_big_recvs),
            "peer": (peer_zero + peer_big, peer_zero_recvs)}
    run(ends, work, nic_connects=True, seed=seed + 3)
