"""RDMA between one NIC and the reference model's whole NIC, scored against a model run: the
workload of ``make sim``'s second part and of the NIC-to-model system tests.

The work is :mod:`iwarp_tb.traffic`'s, whose outcome does not depend on timing. It runs
first between two model ends over an in-memory stream (:func:`~iwarp_tb.traffic.exchange`):
that run is the oracle. Then it runs between a NicCore (:class:`~iwarp_tb.nicmodel.NicModelRig`,
its driver's end made by :func:`~iwarp_tb.traffic.nic_end` with the oracle end's memory and
STag) and a live copy of the model peer, over the model's raw-frame TCP/IP. :func:`run` then
compares: the completions of each end (as :func:`~iwarp_tb.traffic.kinds`), the NIC's host
memory with its oracle end's, the live peer's memory with the oracle peer's, the queue pair
and connection states, and the NIC's shadow-memory checker (no write outside a registered,
writable region, no AXI protocol fault). Every difference is one line of
:attr:`ModelRun.errors`.
"""

import random
from dataclasses import dataclass, field

from iwarp_model.engine import Connection, ConnState
from iwarp_model.verbs import QpState

from .nicmodel import NicModelRig
from .traffic import exchange, kinds, nic_end

__all__ = ["Ends", "ModelRun", "run"]


class Ends:
    """The NIC's oracle end ``nic`` and the model peer's ``peer`` (ends like
    :class:`~iwarp_tb.traffic.End`), made by ``make(name, seed)``; the live peer is another
    ``make`` of the peer's seed, so its memory and STags start as its oracle's."""

    def __init__(self, make, seed):
        self.make, self.seed = make, seed
        self.nic, self.peer = make("nic", seed), make("peer", seed + 1)

    def live_peer(self):
        return self.make("peer", self.seed + 1)


@dataclass
class ModelRun:
    """What :func:`run` saw: the frames on the wire (:attr:`NicModelRig.captured`), the NIC
    cycles from the queue pairs' posting to the last completion, the completions of each end
    (``{"nic": n, "peer": n}``), and every difference from the oracle (empty when none)."""

    captured: list
    cycles: int
    completions: dict
    errors: list = field(default_factory=list)


def run(ends, work, *, nic_connects, seed, width=8, latency_cycles=None, pcap=None,
        timeout_cycles=4_000_000):
    """Run ``work`` (``{"nic": (sends, receives), "peer": ...}``) between a NIC of ``width``
    bytes and a model peer, the NIC the MPA Initiator if ``nic_connects``, and score both
    against the model oracle. Host memory answers after ``latency_cycles``, or, if None,
    after random latencies with random stalls (from ``seed``). The frames go to ``pcap`` if
    given. :exc:`TimeoutError` if the completions are not all in after ``timeout_cycles``."""
    first, second = ("nic", "peer") if nic_connects else ("peer", "nic")
    exchange(getattr(ends, first), getattr(ends, second), (work[first], work[second]))
    wanted = {"nic": ends.nic.cq.poll_cq(1 << 12), "peer": ends.peer.cq.poll_cq(1 << 12)}
    oracle = ends.nic
    peer = ends.live_peer()
    if peer.region.rkey != ends.peer.region.rkey:
        raise AssertionError("the live peer's STag is not its oracle's")
    rng = random.Random(seed)
    rig = NicModelRig(width, seed=seed, memory_bytes=len(oracle.initial) + (1 << 24))
    try:
        device = rig.device
        if latency_cycles is None:
            device.memory.configure(latency=rng.randrange(1, 40), stall=0.2, seed=seed)
        else:
            device.memory.configure(latency=latency_cycles, seed=seed)
        qp, cq, mr = nic_end(device, oracle)
        conn = Connection(peer.qp, active=not nic_connects)
        link = rig.connect(qp, conn) if nic_connects else rig.accept(qp, conn)
        start = rig.h.cycle
        for wr in work["peer"][1]:
            peer.qp.post_recv(wr)
        qp.post_recv(work["nic"][1])
        qp.post_send(work["nic"][0])
        for wr in work["peer"][0]:
            peer.qp.post_send(wr)
        got = {"nic": [], "peer": []}

        def done():
            got["nic"] += cq.poll_cq(64)
            got["peer"] += peer.cq.poll_cq(64)
            return all(len(got[end]) >= len(wanted[end]) for end in got)

        rig.run_until(done, timeout_cycles=timeout_cycles)
        result = ModelRun(rig.captured, rig.h.cycle - start,
                          {end: len(wcs) for end, wcs in got.items()})
        rig.run(20_000)
        got["nic"] += cq.poll_cq(64)
        got["peer"] += peer.cq.poll_cq(64)
        errors = result.errors
        if qp.state != QpState.RTS:
            errors.append(f"NIC QP {qp.qp_num} is {qp.state.name}: {qp.reason}")
        if conn.state != ConnState.ESTABLISHED:
            errors.append(f"the model's connection is {conn.state.name}: {conn.reason}")
        if link.transport_closed:
            errors.append("the model's TCP connection closed")
        for end, name in (("nic", "NIC"), ("peer", "model peer")):
            if kinds(got[end]) != kinds(wanted[end]):
                errors.append(f"{name} completions differ from the oracle's: "
                              f"{len(got[end])} against {len(wanted[end])}")
        if device.memory.read(mr.addr, mr.length) != bytes(oracle.memory):
            errors.append("the NIC's host memory differs from the oracle's")
        if peer.memory != ends.peer.memory:
            errors.append("the model peer's memory differs from the oracle's")
        errors += [f"NIC host memory: {v}" for v in device.memory.violations()[:5]]
        errors += [f"NIC host memory: {f}" for f in device.memory.faults()[:5]]
        if pcap is not None:
            rig.write_pcap(pcap)
        return result
    finally:
        rig.close()
