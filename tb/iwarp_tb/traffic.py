"""RDMA traffic whose outcome does not depend on timing, and the model run that is its oracle:
shared by the engine's tests (the gateware engine against a model peer) and the whole NIC's
(two NICs, or a NIC and the model).

Each end has one region of :data:`PARTS` parts of :data:`PART` octets, random at first. The
work of one end on the other (:func:`plan`) keeps each kind on its own part: Writes into part
0, Sends into receives in part 1, Reads of part 2 into part 3, atomics on part 4 with their
results at the end of part 3, payloads from part 5. So two runs of the same work, whatever
their interleaving, end with the same memory and the same completions (:func:`kinds`).
"""

import random

from iwarp_model import verbs
from iwarp_model.engine import Connection, ConnState
from iwarp_model.mr import Access
from iwarp_model.transport.memory import MemoryPair
from iwarp_model.verbs import SGE, RecvWR, SendFlags, SendWR, WrOpcode

__all__ = ["ALL", "PART", "PARTS", "KINDS", "EVERY", "End", "plan", "kinds", "exchange",
           "nic_end"]

ALL = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
PART = 4096                     # octets of each part of a region
PARTS = 8                       # writes, receives, read sources, read sinks, atomics, spare

#: The kinds of work :func:`plan` draws from: those of the engine's tests, and with ``every``
#: the rest of the verbs the NIC offloads.
KINDS = ("write", "send", "read", "atomic", "write_imm")
EVERY = KINDS + ("send_imm", "masked_atomic")


class End:
    """One end's device: a region of PARTS parts, a QP, and its work (the same on both runs:
    the gateware end's mirror and the model end, or the peer and its copy). ``initial`` is the
    region's first content."""

    def __init__(self, name, seed, *, ird=8, ord_=8, dev=None):
        rng = random.Random(seed)
        self.dev = dev or verbs.Device(name)
        self.pd = self.dev.alloc_pd()
        self.cq = self.dev.create_cq(1024)
        self.qp = self.dev.create_qp(self.pd, self.cq, self.cq, max_send_wr=256,
                                     max_recv_wr=256, max_rd_atomic=ord_,
                                     max_dest_rd_atomic=ird)
        self.initial = rng.randbytes(PARTS * PART)
        self.memory = bytearray(self.initial)
        self.region = self.dev.reg_mr(self.pd, self.memory, ALL,
                                      iova=rng.getrandbits(40) & ~7)

    def at(self, part, offset=0):
        return self.region.iova + part * PART + offset


def plan(rng, local, remote, count, *, kinds=KINDS, max_length=PART // 2):
    """``count`` work requests of ``local`` on ``remote``'s memory (part 0 written, part 2
    read into local part 3, part 4 atomics), and the receives ``remote`` posts for the Sends
    and Immediate Data (into its part 1); kinds drawn from ``kinds``."""
    wrs, recvs = [], []
    recv_at = 0
    for k in range(count):
        kind = rng.choice(kinds)
        length = rng.choice([0, 1, 64, 1000, rng.randrange(max_length)])
        offset = rng.randrange(PART - length + 1)
        sge = [SGE(local.at(5, offset), length, local.region.lkey)] if length else []
        if kind in ("write", "write_imm"):
            op = WrOpcode.RDMA_WRITE_WITH_IMM if kind == "write_imm" else WrOpcode.RDMA_WRITE
            wrs.append(SendWR(k, op, sge, SendFlags.SIGNALED, imm_data=rng.getrandbits(32),
                              remote_addr=remote.at(0, offset), rkey=remote.region.rkey))
            if kind == "write_imm":
                recvs.append(RecvWR(1000 + len(recvs), []))
        elif kind == "send_imm":
            flags = SendFlags.SIGNALED | (SendFlags.SOLICITED if rng.random() < 0.5 else 0)
            wrs.append(SendWR(k, WrOpcode.SEND_WITH_IMM, [], flags,
                              imm_data=rng.getrandbits(64)))
            recvs.append(RecvWR(1000 + len(recvs), []))
        elif kind == "send":
            room = length + rng.choice([0, 5])
            if recv_at + room > PART:
                recv_at = 0
            recvs.append(RecvWR(1000 + len(recvs), [SGE(remote.at(1, recv_at), room,
                                                         remote.region.lkey)]))
            recv_at += room
            flags = SendFlags.SIGNALED | (SendFlags.SOLICITED if rng.random() < 0.5 else 0)
            wrs.append(SendWR(k, WrOpcode.SEND, sge, flags))
        elif kind == "read":
            sink = [SGE(local.at(3, offset), length, local.region.lkey)] if length else []
            wrs.append(SendWR(k, WrOpcode.RDMA_READ, sink, SendFlags.SIGNALED,
                              remote_addr=remote.at(2, offset), rkey=remote.region.rkey))
        else:
            ops = ([WrOpcode.MASKED_ATOMIC_FETCH_AND_ADD, WrOpcode.MASKED_ATOMIC_CMP_AND_SWP]
                   if kind == "masked_atomic" else
                   [WrOpcode.ATOMIC_FETCH_AND_ADD, WrOpcode.ATOMIC_CMP_AND_SWP])
            word = rng.randrange(16)
            sink = SGE(local.at(3, PART - 8 * (word + 1)), 8, local.region.lkey)
            masks = {"compare_add_mask": rng.getrandbits(64), "swap_mask": rng.getrandbits(64)}
            wrs.append(SendWR(k, rng.choice(ops), [sink], SendFlags.SIGNALED,
                              remote_addr=remote.at(4, 8 * word), rkey=remote.region.rkey,
                              compare_add=rng.getrandbits(64), swap=rng.getrandbits(64),
                              **(masks if kind == "masked_atomic" else {})))
    return wrs, recvs


def nic_end(device, model):
    """A NIC's end of the traffic of ``model`` (an end like :class:`End`) through its driver
    ``device`` (:class:`~iwarp_tb.driver.NicDevice`): a protection domain, a completion queue,
    a queue pair and one region holding the model end's first content at the model's tagged
    offsets, under the model's STag. Returns ``(qp, cq, mr)``."""
    pd = device.alloc_pd()
    cq = device.create_cq(1024)
    qp = device.create_qp(pd, cq, cq, max_send_wr=256, max_recv_wr=256)
    addr = device.alloc(len(model.initial))
    device.memory.write(addr, model.initial)
    mr = device.reg_mr(pd, addr, len(model.initial), ALL, iova=model.region.iova)
    assert mr.stag == model.region.stag, "the driver's STags are the model's"
    return qp, cq, mr


def kinds(completions):
    """The model completions ``completions``, in an order that does not depend on timing."""
    return sorted((int(wc.opcode), wc.wr_id, int(wc.status), wc.byte_len) for wc in completions)


def exchange(first, second, works, *, first_opts=None, second_opts=None, established=None):
    """Run ``works`` (for ``first`` and ``second``, each (sends, receives)) between two model
    :class:`End` over an in-memory stream, ``first`` the Initiator; returns the two
    connections once nothing more happens. ``established(a, b)``, if given, is called with
    the two connections once they are, before any work is posted."""
    a = Connection(first.qp, active=True, **(first_opts or {}))
    b = Connection(second.qp, active=False, **(second_opts or {}))
    pair = MemoryPair(a, b)
    pair.start()
    assert a.state == ConnState.ESTABLISHED, a.reason
    if established is not None:
        established(a, b)
    for end, (_, recvs) in zip((first, second), works):
        for wr in recvs:
            end.qp.post_recv(wr)
    for end, (sends, _) in zip((first, second), works):
        for wr in sends:
            end.qp.post_send(wr)
    pair.pump()
    return a, b
