"""RDMA between one NIC and the reference model's whole NIC, or between two NICs on an
impaired wire, scored against a model run: the workload of ``make sim``'s second part, of the
NIC-to-model system tests and of the impairment suite.

The work is :mod:`iwarp_tb.traffic`'s, whose outcome does not depend on timing. It runs
first between two model ends over an in-memory stream (:func:`~iwarp_tb.traffic.exchange`):
that run is the oracle. Then it runs between a NicCore (:class:`~iwarp_tb.nicmodel.NicModelRig`,
its driver's end made by :func:`~iwarp_tb.traffic.nic_end` with the oracle end's memory and
STag) and a live copy of the model peer, over the model's raw-frame TCP/IP. :func:`run` then
compares: the completions of each end (as :func:`~iwarp_tb.traffic.kinds`), the NIC's host
memory with its oracle end's, the live peer's memory with the oracle peer's, the queue pair
and connection states, and the NIC's shadow-memory checker (no write outside a registered,
writable region, no AXI protocol fault). Every difference is one line of
:attr:`ModelRun.errors`. :func:`run_nics` runs the same work between two NICs
(:class:`~iwarp_tb.niclink.NicLinkRig`), each standing for one oracle end, and scores each
as :func:`run` scores the one.
"""

import random
from dataclasses import dataclass, field

from iwarp_model.engine import Connection, ConnState
from iwarp_model.verbs import QpState

from .niclink import NicLinkRig
from .nicmodel import NicModelRig
from .traffic import EVERY, exchange, kinds, nic_end, plan

__all__ = ["Ends", "ModelRun", "both_ways", "run", "run_nics"]


class Ends:
    """The NIC's oracle end ``nic`` and the model peer's ``peer`` (ends like
    :class:`~iwarp_tb.traffic.End`), made by ``make(name, seed)``; the live peer is another
    ``make`` of the peer's seed, so its memory and STags start as its oracle's."""

    def __init__(self, make, seed):
        self.make, self.seed = make, seed
        self.nic, self.peer = make("nic", seed), make("peer", seed + 1)

    def live_peer(self):
        return self.make("peer", self.seed + 1)


def both_ways(ends, rng, count, **options):
    """``count`` work requests each way between ``ends`` of every kind (:func:`plan` with
    ``options``, from ``rng``): the work of :func:`run` and :func:`run_nics`."""
    nic_sends, peer_recvs = plan(rng, ends.nic, ends.peer, count, kinds=EVERY, **options)
    peer_sends, nic_recvs = plan(rng, ends.peer, ends.nic, count, kinds=EVERY, **options)
    return {"nic": (nic_sends, nic_recvs), "peer": (peer_sends, peer_recvs)}


@dataclass
class ModelRun:
    """What :func:`run` or :func:`run_nics` saw: the frames on the wire
    (:attr:`NicModelRig.captured`, as sent, before any impairment; none between two NICs),
    the NIC cycles from the queue pairs' posting to the last completion (or to the last frame
    of the rig's sources, if later), the completions of
    each end (``{"nic": n, "peer": n}``), the wire's two directions (``{"to_nic": Link,
    "to_peer": Link}``, each :class:`~iwarp_model.transport.impair.Link` with its counters of
    what it did to the frames), each NIC's counter registers at the end (``{"nic": {...}}``,
    and ``"peer"`` when the peer is a NIC), and every difference from the oracle (empty when
    none)."""

    captured: list
    cycles: int
    completions: dict
    links: dict = field(default_factory=dict)
    nic_counters: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)


def _oracle(ends, work, nic_connects):
    """Run ``work`` between the two model ends; return each end's completions."""
    first, second = ("nic", "peer") if nic_connects else ("peer", "nic")
    exchange(getattr(ends, first), getattr(ends, second), (work[first], work[second]))
    return {"nic": ends.nic.cq.poll_cq(1 << 12), "peer": ends.peer.cq.poll_cq(1 << 12)}


def _host_memory(device, seed, latency_cycles):
    """Host memory answering after ``latency_cycles``, or random latencies with stalls."""
    if latency_cycles is None:
        latency = random.Random(seed).randrange(1, 40)
        device.memory.configure(latency=latency, stall=0.2, seed=seed)
    else:
        device.memory.configure(latency=latency_cycles, seed=seed)


def _completed(rig, cqs, wanted, timeout_cycles, start):
    """Run ``rig`` until each end's completion queue of ``cqs`` (by end name) holds as many
    completions as ``wanted`` and the rig's sources have put all their frames on the wire,
    then 20,000 cycles more for anything unexpected; returns ``(cycles since start,
    completions)``."""
    got = {end: [] for end in cqs}

    def done():
        for end, cq in cqs.items():
            got[end] += cq.poll_cq(64)
        return (all(len(got[end]) >= len(wanted[end]) for end in got)
                and not any(source.pending for source in rig.sources))

    rig.run_until(done, timeout_cycles=timeout_cycles)
    cycles = rig.cycle - start
    rig.run(20_000)
    done()
    return cycles, got


def _nic_errors(name, qp, got, wanted, device, mr, oracle):
    """What differs between a NIC end (its queue pair, completions ``got``, driver and
    region) and its ``oracle`` end, which completed ``wanted``."""
    errors = []
    if qp.state != QpState.RTS:
        errors.append(f"{name} QP {qp.qp_num} is {qp.state.name}: {qp.reason}")
    if kinds(got) != kinds(wanted):
        errors.append(f"{name} completions differ from the oracle's: "
                      f"{len(got)} against {len(wanted)}")
    if device.memory.read(mr.addr, mr.length) != bytes(oracle.memory):
        errors.append(f"{name}'s host memory differs from the oracle's")
    errors += [f"{name} host memory: {v}" for v in device.memory.violations()[:5]]
    errors += [f"{name} host memory: {f}" for f in device.memory.faults()[:5]]
    return errors


def run(ends, work, *, nic_connects, seed, width=8, latency_cycles=None, pcap=None,
        timeout_cycles=4_000_000, impair=None, core=None, established=None):
    """Run ``work`` (``{"nic": (sends, receives), "peer": ...}``) between a NIC of ``width``
    bytes (with NicCore parameters ``core``) and a model peer, the NIC the MPA Initiator if
    ``nic_connects``, on a wire impaired as ``impair`` says (:class:`NicModelRig`'s), and
    score both against the model oracle. Host memory answers after ``latency_cycles``, or, if
    None, after random latencies with random stalls (from ``seed``). The frames go to
    ``pcap`` if given. :exc:`TimeoutError` if the completions are not all in after
    ``timeout_cycles``. ``established(rig, qp, link)``, if given, is called once the
    connection is up, before any work is posted, with the rig, the NIC's queue pair and the
    model's link."""
    wanted = _oracle(ends, work, nic_connects)
    oracle = ends.nic
    peer = ends.live_peer()
    if peer.region.rkey != ends.peer.region.rkey:
        raise AssertionError("the live peer's STag is not its oracle's")
    rig = NicModelRig(width, seed=seed, memory_bytes=len(oracle.initial) + (1 << 24),
                      impair=impair, core=core)
    try:
        device = rig.device
        _host_memory(device, seed, latency_cycles)
        qp, cq, mr = nic_end(device, oracle)
        conn = Connection(peer.qp, active=not nic_connects)
        link = rig.connect(qp, conn) if nic_connects else rig.accept(qp, conn)
        if established is not None:
            established(rig, qp, link)
        start = rig.cycle
        for wr in work["peer"][1]:
            peer.qp.post_recv(wr)
        qp.post_recv(work["nic"][1])
        qp.post_send(work["nic"][0])
        for wr in work["peer"][0]:
            peer.qp.post_send(wr)
        cycles, got = _completed(rig, {"nic": cq, "peer": peer.cq}, wanted, timeout_cycles,
                                 start)
        result = ModelRun(rig.captured, cycles, {end: len(wcs) for end, wcs in got.items()},
                          {"to_nic": rig.wire.to_nic, "to_peer": rig.wire.to_model},
                          {"nic": device.counters()})
        errors = result.errors
        errors += _nic_errors("NIC", qp, got["nic"], wanted["nic"], device, mr, oracle)
        if conn.state != ConnState.ESTABLISHED:
            errors.append(f"the model's connection is {conn.state.name}: {conn.reason}")
        if link.transport_closed:
            errors.append("the model's TCP connection closed")
        if kinds(got["peer"]) != kinds(wanted["peer"]):
            errors.append(f"model peer completions differ from the oracle's: "
                          f"{len(got['peer'])} against {len(wanted['peer'])}")
        if peer.memory != ends.peer.memory:
            errors.append("the model peer's memory differs from the oracle's")
        if pcap is not None:
            rig.write_pcap(pcap)
        return result
    finally:
        rig.close()


def run_nics(ends, work, *, seed, width=8, latency_cycles=None, timeout_cycles=4_000_000,
             impair=None, core=None):
    """Run ``work`` as :func:`run` does, between two NICs (:class:`NicLinkRig`'s ``a``
    playing the oracle's ``nic`` end as the MPA Initiator, ``b`` its ``peer`` end), and score
    both NICs against the oracle in the same way."""
    wanted = _oracle(ends, work, True)
    oracles = {"nic": ends.nic, "peer": ends.peer}
    letters = {"nic": "a", "peer": "b"}
    rig = NicLinkRig(width, seed=seed, impair=impair, core=core,
                     memory_bytes=len(ends.nic.initial) + (1 << 24))
    try:
        sides = {}
        for k, (end, letter) in enumerate(letters.items()):
            device = rig.devices[letter]
            _host_memory(device, seed + k, latency_cycles)
            sides[end] = (device, *nic_end(device, oracles[end]))
        rig.connect({letters[end]: side[1] for end, side in sides.items()})
        start = rig.cycle
        for end in ("peer", "nic"):
            sides[end][1].post_recv(work[end][1])
        for end in ("nic", "peer"):
            sides[end][1].post_send(work[end][0])
        cycles, got = _completed(rig, {end: side[2] for end, side in sides.items()}, wanted,
                                 timeout_cycles, start)
        result = ModelRun([], cycles, {end: len(wcs) for end, wcs in got.items()},
                          {"to_nic": rig.links["b"], "to_peer": rig.links["a"]},
                          {end: side[0].counters() for end, side in sides.items()})
        for end, (device, qp, _, mr) in sides.items():
            result.errors += _nic_errors(f"NIC {letters[end]}", qp, got[end], wanted[end],
                                         device, mr, oracles[end])
        return result
    finally:
        rig.close()
