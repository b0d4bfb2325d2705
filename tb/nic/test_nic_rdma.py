"""Two NICs back to back (:class:`~iwarp_tb.nicpair.NicPair`, natively under Verilator) doing
RDMA through the verbs driver (:mod:`iwarp_tb.driver`), against the model.

Both NICs' queue pairs connect (TCP, then the MPA exchange the driver plays), then each posts
work on the other at once, every opcode the NIC offloads: Writes, Sends (with Solicited
Event), Reads, atomics (masked too), Write with Immediate Data and Immediate Data alone,
with the receives for them. Host memory answers after random latencies with random stalls.
The oracle is the same work between two model ends (:func:`iwarp_tb.traffic.exchange`): each
NIC's host memory must end as its model end's, its completions must be the same (opcode,
``wr_id``, status, length), and the shadow-memory checker must have seen no write outside a
registered, writable region (nor any AXI protocol fault). Neither NIC may lose a frame the
other sent (their counter registers).

Then all 16 connections at once, messages of 0 octets and of 4 MiB, many small Sends each
way at once, and large Writes each way (ACKs on data segments, whole FPDUs in each), through
:class:`~iwarp_tb.rdma_run.RdmaRun` (the workload of ``make sim``), under the same checks.
"""

import random

import pytest
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether

from iwarp_model.verbs import QpState
from iwarp_model.wire.fpdu import Deframer
from iwarp_tb.nicpair import NODES, NicPairRig
from iwarp_tb.rdma_run import OPS, RdmaRun
from iwarp_tb.sim import retransmissions
from iwarp_tb.traffic import EVERY, End, exchange, kinds, nic_end, plan


def open_ends(rig, models):
    """Each NIC's end: a protection domain, a completion queue, a queue pair and one region
    holding its model end's first content at the model's tagged offsets."""
    ends = {}
    for nic, model in models.items():
        qp, cq, mr = nic_end(rig.devices[nic], model)
        ends[nic] = {"qp": qp, "cq": cq, "mr": mr, "wcs": []}
    return ends


def _random_memory(rig, rng, seed):
    for k, device in enumerate(rig.devices.values()):
        device.memory.configure(latency=rng.randrange(1, 40), stall=0.2, seed=seed + k)


@pytest.mark.cocotb
@pytest.mark.parametrize("width", [8])
def test_rdma_between_nics(width, seed=5, count=60):
    models = {"a": End("a", seed), "b": End("b", seed + 1)}
    rng = random.Random(seed + 2)
    a_sends, b_recvs = plan(rng, models["a"], models["b"], count, kinds=EVERY)
    b_sends, a_recvs = plan(rng, models["b"], models["a"], count, kinds=EVERY)
    work = {"a": (a_sends, a_recvs), "b": (b_sends, b_recvs)}
    exchange(models["a"], models["b"], (work["a"], work["b"]))
    wanted = {nic: models[nic].cq.poll_cq(1 << 12) for nic in NODES}

    rig = NicPairRig(width, seed=seed)
    try:
        _random_memory(rig, rng, seed)
        ends = open_ends(rig, models)
        rig.connect({nic: end["qp"] for nic, end in ends.items()})
        for nic in NODES:
            ends[nic]["qp"].post_recv(work[nic][1])
        for nic in NODES:
            ends[nic]["qp"].post_send(work[nic][0])

        def done():
            for end in ends.values():
                end["wcs"] += end["cq"].poll_cq(64)
            return all(len(ends[nic]["wcs"]) >= len(wanted[nic]) for nic in NODES)

        rig.run_until(done, timeout_cycles=4_000_000)
        assert rig.losses() == {nic: {} for nic in NODES}
        for nic in NODES:
            device, end, model = rig.devices[nic], ends[nic], models[nic]
            assert end["qp"].state == QpState.RTS, (nic, end["qp"].reason)
            assert kinds(end["wcs"]) == kinds(wanted[nic]), nic
            assert end["cq"].poll_cq(64) == [], f"{nic}: more completions than the model's"
            mr = end["mr"]
            assert device.memory.read(mr.addr, mr.length) == bytes(model.memory), \
                f"{nic}: host memory differs from the model's"
            assert device.memory.violations() == [], nic
            assert device.memory.faults() == [], nic
    finally:
        rig.close()


def _clean(rig, run):
    assert run.errors == []
    assert rig.losses() == {nic: {} for nic in NODES}
    for nic, device in rig.devices.items():
        assert device.memory.violations() == [], nic
        assert device.memory.faults() == [], nic
    for sides in run.flows:
        for side in sides.values():
            assert side.qp.state == QpState.RTS, side.qp.reason


@pytest.mark.cocotb
def test_sixteen_queue_pairs(seed=11):
    """Every connection the NIC has (16), each doing Writes (the last with Immediate Data),
    Sends, Reads, fetch-and-adds and Immediate Data, in both directions at once; every octet,
    completion and fetch-and-add total checked on each (:class:`~iwarp_tb.rdma_run.RdmaRun`)."""
    rng = random.Random(seed)
    rig = NicPairRig(8, seed=seed)
    try:
        _random_memory(rig, rng, seed)
        run = RdmaRun(rig, flows=16, size=3000, seed=seed)
        for op in OPS:
            run.batch(op, 3, directions=("a", "b"))
        _clean(rig, run)
    finally:
        rig.close()


@pytest.mark.cocotb
def test_message_sizes(seed=12):
    """Writes, Sends and Reads of 0 octets, both directions at once, then of 4 MiB (2900
    segments each): a Write from ``a``, a Send from ``b``, a Read by ``a``."""
    rng = random.Random(seed)
    size = 4 << 20
    rig = NicPairRig(8, seed=seed, memory_bytes=3 * size)
    try:
        _random_memory(rig, rng, seed)
        run = RdmaRun(rig, flows=1, size=size, seed=seed)
        for op in ("write", "send", "read"):
            run.batch(op, 1, length=0, directions=("a", "b"))
        for op, nic in (("write", "a"), ("send", "b"), ("read", "a")):
            run.batch(op, 1, length=size, directions=(nic,))
        _clean(rig, run)
    finally:
        rig.close()


@pytest.mark.cocotb
def test_small_sends_each_way(seed=8):
    """128 Sends of 64 octets each way at once, then 128 of 512, host memory at 100 ns: each
    NIC reads payloads for its Sends while it places the other's, which take receive queue
    entries read from host memory in between. Every octet and completion checked, and no
    segment sent twice (both NICs once stopped here: a payload read waiting for its segment
    to be taken held the entry read behind it, and the received stream waited for the
    entry)."""
    rig = NicPairRig(8, seed=seed)
    try:
        rig.host_latency(100)
        run = RdmaRun(rig, flows=1, size=1 << 16, seed=seed, slice_cycles=64)
        for size in (64, 512):
            run.batch("send", 128, length=size, directions=("a", "b"), timeout_cycles=400_000)
        _clean(rig, run)
        assert retransmissions(rig.frames()) == 0
    finally:
        rig.close()


@pytest.mark.cocotb
def test_segments_carry_acks_and_whole_fpdus(seed=9):
    """16 Writes of 64 KiB each way at once, host memory at 100 ns. Each NIC's ACKs ride on
    its data segments: an ACK due waits while a chunk goes into the send ring, so the line
    carries almost no pure ACK (before, nearly every data segment drew one: PSH is on each
    segment that empties the ring, and is ACKed at once; 5% of the line). And each data
    segment holds whole FPDUs, as NicCore's TCP plans its segments: the model's deframer,
    given the segment's payload alone (scapy finds it), returns ULPDUs with good CRCs and
    keeps no octet back."""
    rig = NicPairRig(8, seed=seed)
    try:
        rig.host_latency(100)
        run = RdmaRun(rig, flows=1, size=1 << 16, seed=seed, slice_cycles=64)
        rig.frames()
        run.batch("write", 16, directions=("a", "b"))
        frames = rig.frames()
        _clean(rig, run)
    finally:
        rig.close()
    kinds = {"data": 0, "pure": 0}
    for frame in frames:
        p = Ether(bytes(frame))
        if TCP not in p or p[TCP].flags.S or p[TCP].flags.F:
            continue
        payload = bytes(p[TCP].payload)[:p[IP].len - 4 * p[IP].ihl - 4 * p[TCP].dataofs]
        kinds["data" if payload else "pure"] += 1
        deframer = Deframer(crc=True, markers=False)
        assert deframer.feed(payload) or not payload
        assert deframer.buffered == 0, f"a segment of {len(payload)} octets cuts an FPDU"
    assert kinds["data"] > 2 * 16 * 45 and kinds["pure"] <= kinds["data"] // 50, kinds
