"""RDMA between two NICs (a :class:`~iwarp_tb.nicpair.NicPairRig`), timed in cycles and checked
octet by octet: the workload of ``make sim`` and of the RDMA benchmarks.

:class:`RdmaRun` opens ``flows`` connections between the NICs, each with a queue pair and
buffers on both sides, then runs batches of one operation (:meth:`RdmaRun.batch`) in one or
both directions at once, and single 8-byte operations on an idle line
(:meth:`RdmaRun.latency`).

What is timed (cycles of the NICs' clock, from the harness):

* A batch: from the cycle its first doorbell write starts to the cycle its last completion is
  seen: the receiver's (a Write batch starts and ends with a Write with Immediate Data, whose
  receive completes once every Write before it is placed, RFC 5040 section 5.4; a Send's
  receive), or the Reader's (a Read's end). Completions are looked for every ``slice``
  cycles, so a batch's cycles are exact to a slice.
* A batch's steady rate: in each direction, the octets of the messages after the first over
  the cycles from the first message's completion where its data lands (the receiver's for a
  Write, whose first carries Immediate Data, and for a Send; the Reader's for a Read) to the
  direction's end. The pipeline's fill (doorbell to that completion) is left out, so this is
  the rate a long stream of such messages keeps; the latency records measure the fill alone.
* Latency: from the cycle the doorbell write starts to the cycle the last octet is in the
  target's host memory (the peer's for a Write or a Send, this end's for a Read): memory is
  looked at every cycle.

Every octet moved is checked against its source, every completion's status and length.
"""

import random
from dataclasses import dataclass

from iwarp_model.verbs import SGE, RecvWR, SendFlags, SendWR, WcOpcode, WcStatus, WrOpcode

from .traffic import ALL

__all__ = ["RdmaRun", "OPS", "Batch"]

#: The operations a batch can be made of.
OPS = ("write", "read", "send", "atomic", "imm")
_PEER = {"a": "b", "b": "a"}
_DEPTH = 256            # send and receive queue entries of each queue pair
_RECEIVES = (WcOpcode.RECV, WcOpcode.RECV_RDMA_WITH_IMM)


@dataclass
class Batch:
    """What a batch moved and how long it took."""

    op: str
    size: int
    count: int
    directions: tuple
    cycles: int
    payload: int            # octets moved, every direction together
    #: Octets per cycle of every direction together, each direction from its first message's
    #: completion to its end (see the module docstring); None for a batch of one message.
    steady: float | None = None

    @property
    def bytes_per_cycle(self):
        return self.payload / self.cycles


class _Side:
    """One NIC's end of a flow: queue pair, completion queue, and a region holding a source
    buffer of random octets, a sink buffer and two atomic words."""

    def __init__(self, device, pd, size, rng):
        self.device = device
        self.cq = device.create_cq(4 * _DEPTH)
        self.qp = device.create_qp(pd, self.cq, self.cq, max_send_wr=_DEPTH,
                                   max_recv_wr=_DEPTH)
        span = 2 * max(size, 64) + 64
        self.base = device.alloc(span)
        self.src, self.dst = self.base, self.base + max(size, 64)
        self.word, self.result = self.dst + max(size, 64), self.dst + max(size, 64) + 8
        self.payload = rng.randbytes(size)
        device.memory.write(self.src, self.payload)
        self.mr = device.reg_mr(pd, self.base, span, ALL)
        self.sent, self.received = [], []

    def sge(self, addr, length):
        return [SGE(addr, length, self.mr.lkey)] if length else []

    def poll(self):
        """Take the completion queue's entries: the send queue's to :attr:`sent`, the
        receive queue's to :attr:`received`."""
        for wc in self.cq.poll_cq(4 * _DEPTH):
            (self.received if wc.opcode in _RECEIVES else self.sent).append(wc)


class RdmaRun:
    """``flows`` connections between the NICs of ``rig``, buffers of ``size`` octets."""

    def __init__(self, rig, *, flows=1, size=4096, seed=1, slice_cycles=128):
        self.rig, self.size, self.slice = rig, size, slice_cycles
        self.rng = random.Random(seed)
        pds = {nic: device.alloc_pd() for nic, device in rig.devices.items()}
        self.flows = []
        for k in range(flows):
            sides = {nic: _Side(device, pds[nic], size, self.rng)
                     for nic, device in rig.devices.items()}
            rig.connect({nic: side.qp for nic, side in sides.items()}, port=4791 + k)
            self.flows.append(sides)
        self.errors = []

    @property
    def h(self):
        return self.rig.h

    def _work(self, op, side, peer, count, length):
        """The work requests of a batch on one flow in one direction, and the receives its
        peer posts."""
        remote = {"remote_addr": peer.dst, "rkey": peer.mr.rkey}
        if op in ("write", "send"):
            last = WrOpcode.RDMA_WRITE_WITH_IMM if op == "write" else WrOpcode.SEND
            opcode = WrOpcode.RDMA_WRITE if op == "write" else WrOpcode.SEND
            # The first and the last Write carry Immediate Data: their receives complete once
            # each is placed, which times the batch at the receiver (the steady rate's span).
            sends = [SendWR(k, opcode if 0 < k < count - 1 else last,
                            side.sge(side.src, length), SendFlags.SIGNALED, imm_data=k, **remote)
                     for k in range(count)]
            sink = [] if op == "write" else peer.sge(peer.dst, length)
            recvs = [RecvWR(k, sink) for k in range(min(count, 2) if op == "write" else count)]
            return sends, recvs
        if op == "read":
            return [SendWR(k, WrOpcode.RDMA_READ, side.sge(side.dst, length), SendFlags.SIGNALED,
                           remote_addr=peer.src, rkey=peer.mr.rkey) for k in range(count)], []
        if op == "imm":
            return [SendWR(k, WrOpcode.SEND_WITH_IMM, [], SendFlags.SIGNALED,
                           imm_data=self.rng.getrandbits(64)) for k in range(count)], \
                [RecvWR(k, []) for k in range(count)]
        return [SendWR(k, WrOpcode.ATOMIC_FETCH_AND_ADD, side.sge(side.result, 8),
                       SendFlags.SIGNALED, remote_addr=peer.word, rkey=peer.mr.rkey,
                       compare_add=1) for k in range(count)], []

    def batch(self, op, count, *, length=None, directions=("a",), timeout_cycles=None):
        """``count`` operations ``op`` of ``length`` octets (by default the buffers' size) on
        every flow, in each of ``directions`` (the NICs that start them) at once; returns the
        :class:`Batch`. Failures are appended to :attr:`errors`."""
        length = self.size if length is None else length
        if op == "atomic":
            length = 8
        if not 1 <= count < _DEPTH:
            raise ValueError(f"a batch is 1 to {_DEPTH - 1} operations, not {count}")
        plans = []
        for sides in self.flows:
            for nic in directions:
                side, peer = sides[nic], sides[_PEER[nic]]
                side.sent, side.received, peer.sent, peer.received = [], [], [], []
                if op == "atomic":
                    peer.device.memory.write(peer.word, bytes(8))
                sends, recvs = self._work(op, side, peer, count, length)
                if recvs:
                    peer.qp.post_recv(recvs)
                plans.append((side, peer, sends, recvs))
        start = self.h.cycle
        for side, _, sends, _ in plans:
            side.qp.post_send(sends)
        # Per plan, the cycle its first message's completion was seen in (the receiver's for
        # Writes and Sends, else the send queue's) and the cycle it ended.
        firsts = [peer.received if op in ("write", "send") else side.sent
                  for side, peer, _, _ in plans]
        first, last = [None] * len(plans), [None] * len(plans)

        def done():
            for side, peer, _, _ in plans:
                side.poll()
                peer.poll()
            for k, (side, peer, sends, recvs) in enumerate(plans):
                if first[k] is None and firsts[k]:
                    first[k] = self.h.cycle
                if last[k] is None and self._ended(op, side, peer, sends, recvs):
                    last[k] = self.h.cycle
            return all(k is not None for k in last)

        wire = count * (length + 64) * len(self.flows) * len(directions)
        timeout = timeout_cycles or 8 * wire // self.rig.width + 200_000
        self.rig.run_until(done, timeout_cycles=timeout, slice_cycles=self.slice)
        cycles = self.h.cycle - start
        for side, peer, sends, recvs in plans:
            self._check(op, side, peer, sends, recvs, length)
        moved = 0 if op == "imm" else length * count * len(self.flows) * len(directions)
        spans = [end - begin for begin, end in zip(first, last)]
        steady = (sum((count - 1) * length / span for span in spans)
                  if count > 1 and all(spans) else None)
        return Batch(op, length, count, tuple(directions), cycles, moved, steady)

    @staticmethod
    def _ended(op, side, peer, sends, recvs):
        return len(peer.received) >= len(recvs) and len(side.sent) >= len(sends)

    def _check(self, op, side, peer, sends, recvs, length):
        def fail(what):
            self.errors.append(f"{op} x{len(sends)} of {length} octets, "
                               f"QP {side.qp.qp_num}: {what}")

        received = peer.received
        bad = [wc for wc in side.sent + received if wc.status != WcStatus.SUCCESS]
        if bad:
            fail(f"completions with errors: {bad[:3]}")
            return
        if sorted(wc.wr_id for wc in side.sent) != [wr.wr_id for wr in sends]:
            fail(f"send completions {sorted(wc.wr_id for wc in side.sent)}")
        if sorted(wc.wr_id for wc in received) != [wr.wr_id for wr in recvs]:
            fail(f"receive completions {sorted(wc.wr_id for wc in received)}")
        if op in ("write", "send"):
            if peer.device.memory.read(peer.dst, length) != side.payload[:length]:
                fail("the peer's buffer differs from the source")
            if op == "send" and any(wc.byte_len != length for wc in received):
                fail("a receive's byte_len differs from the Send's length")
        elif op == "read":
            if side.device.memory.read(side.dst, length) != peer.payload[:length]:
                fail("the sink differs from the peer's source")
        elif op == "imm":
            if [wc.imm_data for wc in sorted(received, key=lambda wc: wc.wr_id)] != \
                    [wr.imm_data for wr in sends]:
                fail("Immediate Data differs")
        else:
            total = int.from_bytes(peer.device.memory.read(peer.word, 8), "little")
            if total != len(sends):
                fail(f"{len(sends)} fetch-and-adds of 1 left {total}")

    def latency(self, op, *, nic="a", length=8, timeout_cycles=100_000):
        """Cycles from the doorbell of one ``op`` (write, send or read) of ``length`` octets
        on the first flow, started by ``nic`` on an idle line, to its last octet in the target
        host memory."""
        side, peer = self.flows[0][nic], self.flows[0][_PEER[nic]]
        octets = self.rng.randbytes(length)
        while octets == peer.device.memory.read(peer.dst, length) or \
                octets == side.device.memory.read(side.dst, length):
            octets = self.rng.randbytes(length)
        if op == "read":
            peer.device.memory.write(peer.src, octets)
            target, addr = side.device.memory, side.dst
            wr = SendWR(1, WrOpcode.RDMA_READ, side.sge(side.dst, length), SendFlags.SIGNALED,
                        remote_addr=peer.src, rkey=peer.mr.rkey)
        else:
            side.device.memory.write(side.src, octets)
            target, addr = peer.device.memory, peer.dst
            opcode = WrOpcode.RDMA_WRITE if op == "write" else WrOpcode.SEND
            wr = SendWR(1, opcode, side.sge(side.src, length), SendFlags.SIGNALED,
                        remote_addr=peer.dst, rkey=peer.mr.rkey)
            if op == "send":
                peer.qp.post_recv(RecvWR(1, peer.sge(peer.dst, length)))
        start = self.h.cycle
        side.qp.post_send(wr)
        while target.read(addr, length) != octets:
            if self.h.cycle - start > timeout_cycles:
                raise TimeoutError(f"{op} of {length} octets not there after "
                                   f"{timeout_cycles} cycles")
            self.h.run(1)
        cycles = self.h.cycle - start

        def completed():
            side.poll()
            peer.poll()
            return side.sent and (op != "send" or peer.received)

        self.rig.run_until(completed, timeout_cycles=timeout_cycles)
        bad = [wc for wc in side.sent + peer.received if wc.status != WcStatus.SUCCESS]
        if bad:
            self.errors.append(f"latency {op}: completions with errors: {bad}")
        side.sent, side.received, peer.sent, peer.received = [], [], [], []
        return cycles
