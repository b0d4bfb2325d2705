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
* The same with NicCore at its fewest: one connection, one completion queue, one shared
  receive queue (``NicCore(8, conns=1, cqs=1, srqs=1)``), the NIC each role in turn.
* Writes, Sends and Reads of 0 octets both ways, then of 4 MiB: a Write and a Read by the
  NIC, a Send and a Read by the model.
"""

import random

import pytest

from iwarp_model import verbs
from iwarp_model.engine import Connection
from iwarp_model.pcap import read_pcap
from iwarp_model.verbs import SGE, RecvWR, SendFlags, SendWR, WrOpcode
from iwarp_tb import model_run
from iwarp_tb.model_run import Ends
from iwarp_tb.nicmodel import NicModelRig
from iwarp_tb.traffic import ALL, End

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


def run(ends, work, *, nic_connects, seed, pcap=None, core=None):
    """:func:`iwarp_tb.model_run.run` at 8 bytes (NicCore parameters ``core``) with random
    host-memory latency and stalls: every check must pass; returns the frames captured."""
    result = model_run.run(ends, work, nic_connects=nic_connects, seed=seed, pcap=pcap,
                           core=core)
    assert result.errors == []
    return result.captured


@pytest.mark.cocotb
@pytest.mark.parametrize("nic_connects", [True, False], ids=["nic-initiator", "nic-responder"])
def test_every_opcode_with_model(nic_connects, tmp_path, seed=21, count=60):
    """``count`` work requests of every kind each way; the capture has frames from both
    ends, none longer than Ethernet allows, and its pcap holds them all."""
    ends = Ends(End, seed)
    rng = random.Random(seed + 2)
    work = model_run.both_ways(ends, rng, count)
    pcap = tmp_path / "nic_model.pcap"
    captured = run(ends, work, nic_connects=nic_connects, seed=seed + 3, pcap=pcap)
    senders = {sender for _, sender, _ in captured}
    assert senders == {"nic", "model"}, senders
    assert [frame for _, frame in read_pcap(pcap)[1]] == [f for _, _, f in captured]
    assert all(len(frame) <= 1514 for _, _, frame in captured)


@pytest.mark.cocotb
@pytest.mark.parametrize("nic_connects", [True, False], ids=["nic-initiator", "nic-responder"])
def test_one_connection(nic_connects, seed=51, count=20):
    """``count`` work requests of every kind each way with a NicCore of one connection, one
    completion queue and one shared receive queue: its register map, doorbells and queue
    state have no index (a register of one element)."""
    ends = Ends(End, seed)
    work = model_run.both_ways(ends, random.Random(seed + 2), count)
    run(ends, work, nic_connects=nic_connects, seed=seed + 3, core=dict(conns=1, cqs=1, srqs=1))


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


#: The NIC's queue pairs of test_shared_receive_queues: the receive queue each takes its
#: receives from (an SRQ's index, or "own"), and how many Sends the model sends on it.
SHARING = [(0, 14), (0, 14), (1, 12), ("own", 12)]


@pytest.mark.cocotb
def test_shared_receive_queues(seed=41, part=4096):
    """Four of the NIC's queue pairs, which the model's four connect to (the model, as MPA
    Initiator, may send first): two share SRQ 0, one has SRQ 1, one its own receive queue.
    The model sends Sends of 0 octets to ``part`` on all four at once (more segments than one
    for the larger), with random host-memory latency and stalls at the NIC.

    The oracle is the verbs' contract (RFC 5040 section 5.1, an SRQ's receives taken in the
    order posted): every Send completes at the model and at the NIC in its queue pair's
    order; each receive queue's receives are taken in the order posted, the first ones
    only, each once, across the queue pairs that share it; each Send's octets are in its
    receive's buffer and the rest of host memory is as it was; posting to a queue pair that
    has an SRQ is refused."""
    rng = random.Random(seed)
    rig = NicModelRig(8, seed=seed)
    try:
        device = rig.device
        device.memory.configure(latency=rng.randrange(1, 40), stall=0.2, seed=seed)
        pd, cq = device.alloc_pd(), device.create_cq(256)
        srqs = [device.create_srq(pd, 32), device.create_srq(pd, 16)]
        queues = {0: srqs[0], 1: srqs[1]}
        qps = []
        for which, _ in SHARING:
            qp = device.create_qp(pd, cq, cq, srq=queues.get(which), max_recv_wr=16)
            queues.setdefault(which if which != "own" else qp.qp_num, qp.rq)
            qps.append(qp)
        rings = {queue: [] for queue in queues.values()}   # each queue's receives, in order
        slots = sum(queue.entries for queue in rings)
        buffers = device.alloc(slots * part)
        initial = rng.randbytes(slots * part)
        device.memory.write(buffers, initial)
        mr = device.reg_mr(pd, buffers, len(initial), ALL)
        receives = {}               # wr_id: (its queue, its index there, its buffer's offset)
        for queue, ring in rings.items():
            for index in range(queue.entries):
                wr_id = len(receives)
                receives[wr_id] = (queue, index, wr_id * part)
                ring.append(RecvWR(wr_id, [SGE(buffers + wr_id * part, part, mr.lkey)]))
            if queue in srqs:
                queue.post_srq_recv(ring)
            else:
                qps[3].post_recv(ring)
        with pytest.raises(verbs.QpStateError, match="takes its receives from"):
            qps[0].post_recv(RecvWR(1, []))

        peer = verbs.Device("peer")
        peer_pd, peer_cq = peer.alloc_pd(), peer.create_cq(256)
        source = bytearray(rng.randbytes(part))
        region = peer.reg_mr(peer_pd, source, ALL)
        sends = []                                  # (queue pair, octets), in sending order
        peer_qps = []
        for k, qp in enumerate(qps):
            peer_qp = peer.create_qp(peer_pd, peer_cq, peer_cq, max_send_wr=64)
            rig.accept(qp, Connection(peer_qp, active=True), port=4792 + k)
            peer_qps.append(peer_qp)
        plan_ = [k for k, (_, count) in enumerate(SHARING) for _ in range(count)]
        rng.shuffle(plan_)
        for k in plan_:
            length = rng.choice([0, 1, 64, 1500, part, rng.randrange(part)])
            offset = rng.randrange(part - length + 1)
            sge = [SGE(region.iova + offset, length, region.lkey)] if length else []
            peer_qps[k].post_send(SendWR(len(sends), WrOpcode.SEND, sge, SIGNALED))
            sends.append((qps[k], bytes(source[offset:offset + length])))
        got, sent = [], []

        def done():
            got.extend(cq.poll_cq(64))
            sent.extend(peer_cq.poll_cq(64))
            return len(got) >= len(sends) and len(sent) >= len(sends)

        rig.run_until(done, timeout_cycles=4_000_000)
        rig.run(20_000)
        assert cq.poll_cq(64) == [] and peer_cq.poll_cq(64) == []
        assert sorted(wc.wr_id for wc in sent) == list(range(len(sends)))
        assert all(wc.status == verbs.WcStatus.SUCCESS for wc in sent + got)
        assert all(qp.state == verbs.QpState.RTS for qp in qps)

        expected = bytearray(initial)
        for qp in qps:
            mine = [octets for to, octets in sends if to is qp]
            wcs = [wc for wc in got if wc.qp_num == qp.qp_num]
            assert [wc.byte_len for wc in wcs] == [len(octets) for octets in mine], qp
            assert all(wc.opcode == verbs.WcOpcode.RECV for wc in wcs)
            assert all(receives[wc.wr_id][0] is qp.rq for wc in wcs), f"{qp}: another queue's"
            order = [receives[wc.wr_id][1] for wc in wcs]
            assert order == sorted(order), f"{qp}: receives out of posting order"
            for wc, octets in zip(wcs, mine):
                at = receives[wc.wr_id][2]
                expected[at:at + len(octets)] = octets
        for queue in rings:
            used = sorted(receives[wc.wr_id][1] for wc in got if receives[wc.wr_id][0] is queue)
            assert used == list(range(len(used))), f"{queue!r}: not its first receives, once each"
        assert device.memory.read(buffers, len(initial)) == bytes(expected)
        assert device.memory.violations() == [] and device.memory.faults() == []
    finally:
        rig.close()
