"""The memory target (``iwarp_nic.apps.target``, run by :class:`iwarp_tb.target.ScriptedTarget`
in place of the driver) as a memory to be written and read by a peer with no help from its
host (RFC 5040 sections 5.3 and 5.4: tagged Writes and Reads placed and answered by the NIC
alone), the model's whole NIC on the wire as that peer (:class:`~iwarp_tb.nicmodel.
NicModelRig`). rping, the host's own work, runs against Linux siw in
``tb/siw/test_nic_vs_siw.py``.

* Writes of random octets anywhere in the data region, then Reads of them back, eight
  outstanding at once (the target's IRD); the target's RAM is checked octet for octet
  against the writes.
* The rings and buffers below the data region are no peer's: a Write there (the data
  region's STag, an offset below its base) gets RFC 5040's Terminate (DDP, tagged, base or
  bounds violation), the RAM below the data region is unchanged, the target aborts the
  connection and listens again, and the next connection reads and writes as the first did.
  The NIC's shadow-memory checker sees no write outside the plan's writable regions.
"""

import random

from iwarp_model.apps import Host
from iwarp_model.engine import Connection, ConnState
from iwarp_model.mr import Access
from iwarp_model.verbs import SendFlags, SendWR, WcStatus, WrOpcode
from iwarp_model.wire.terminate import ErrorCode
from iwarp_nic.apps.target import DATA, DATA_STAG, RPING_PORT, TargetPlan
from iwarp_tb.nicmodel import NIC_IP, NicModelRig
from iwarp_tb.target import ScriptedTarget

PLAN = TargetPlan()
SPAN = PLAN.ram_bytes - DATA
TIMEOUT = 3_000_000
SETTLED = (ConnState.ESTABLISHED, ConnState.CLOSED, ConnState.TERMINATED)


def connect(rig):
    """A model initiator (CRCs asked for, IRD and ORD 16) connected to the target; returns
    its host, a buffer as large as the data region, and its connection."""
    host = Host("peer", ird=16, ord=16)
    buffer = host.register(SPAN, Access.LOCAL_WRITE)
    conn = Connection(host.qp, active=True, crc=True)
    rig.endpoint.connect(NIC_IP, RPING_PORT, conn)
    rig.run_until(lambda: conn.state in SETTLED, timeout_cycles=TIMEOUT)
    assert conn.state == ConnState.ESTABLISHED, (conn.state, conn.reason)
    return host, buffer, conn


def completions(rig, host, count):
    got = []
    rig.run_until(lambda: got.extend(host.send_cq.poll_cq(count - len(got))) or
                  len(got) == count, timeout_cycles=TIMEOUT)
    return got


def write_and_read(rig, target, rng):
    """Eight random Writes into the data region, then eight Reads of the same ranges at
    once: every completion good, the RAM and the octets read equal to the writes."""
    host, buffer, conn = connect(rig)
    spans, at = [], 0
    for _ in range(8):
        at += rng.randrange(200)
        length = rng.randint(1, SPAN // 8 - 200)
        spans.append((at, length))
        at += length
    expect = bytearray(target.memory.read(DATA, SPAN))
    for offset, length in spans:
        data = rng.randbytes(length)
        buffer.memory[offset:offset + length] = data
        expect[offset:offset + length] = data
    host.qp.post_send([SendWR(k, WrOpcode.RDMA_WRITE, [buffer.sge(offset, length)],
                              SendFlags.SIGNALED, remote_addr=DATA + offset, rkey=DATA_STAG)
                       for k, (offset, length) in enumerate(spans)])
    assert [w.status for w in completions(rig, host, 8)] == [WcStatus.SUCCESS] * 8
    buffer.memory[:] = bytes(SPAN)
    host.qp.post_send([SendWR(10 + k, WrOpcode.RDMA_READ, [buffer.sge(offset, length)],
                              SendFlags.SIGNALED, remote_addr=DATA + offset, rkey=DATA_STAG)
                       for k, (offset, length) in enumerate(spans)])
    assert [w.status for w in completions(rig, host, 8)] == [WcStatus.SUCCESS] * 8
    assert target.memory.read(DATA, SPAN) == bytes(expect)
    for offset, length in spans:
        assert bytes(buffer.memory[offset:offset + length]) == expect[offset:offset + length]
    return host, buffer, conn


def test_peer_writes_and_reads_the_data_region():
    rig = NicModelRig(8, seed=71)
    try:
        target = ScriptedTarget(rig.h, PLAN, mac=rig.device.mac, ip=rig.device.ip,
                                keys=random.Random(71).getrandbits(160))
        rig.host = target
        rng = random.Random(72)
        below = target.memory.read(0, DATA)
        host, buffer, conn = write_and_read(rig, target, rng)
        # A Write below the data region: the rings are in no region a peer may name.
        host.qp.post_send(SendWR(99, WrOpcode.RDMA_WRITE, [buffer.sge(0, 64)],
                                 SendFlags.SIGNALED, remote_addr=DATA - 0x200,
                                 rkey=DATA_STAG))
        rig.run_until(lambda: conn.state == ConnState.TERMINATED and target.connections == 1,
                      timeout_cycles=TIMEOUT)
        assert conn.terminate_received.code == ErrorCode.DDP_TAGGED_BASE_BOUNDS, \
            conn.terminate_received
        assert target.log[:3] == ["accepted", "FAULT 0x1101", "ended: ABORTED"], target.log
        assert target.memory.read(0, DATA) == below
        write_and_read(rig, target, rng)                          # the next connection
        assert target.log[3] == "accepted", target.log
    finally:
        rig.close()
