"""The memory target (``iwarp_nic.apps.target``, run by :class:`iwarp_tb.target.ScriptedTarget`
in place of the driver) as a memory to be written and read by a peer with no help from its
host (RFC 5040 sections 5.3 and 5.4: tagged Writes and Reads placed and answered by the NIC
alone), the model's whole NIC on the wire as that peer (:class:`~iwarp_tb.nicmodel.
NicModelRig`). rping, the host's own work, runs against Linux siw in
``tb/siw/test_nic_vs_siw.py``.

* Writes of random octets anywhere in the data region, then Reads of the whole region back,
  eight outstanding at once (the target's IRD); the octets read and the target's RAM are
  checked octet for octet against the writes (the scenario is
  :class:`iwarp_tb.target_peer.TargetPeer`'s, which the boards' simulations run too).
* The rings and buffers below the data region are no peer's: a Write there (the data
  region's STag, an offset below its base) gets RFC 5040's Terminate (DDP, tagged, base or
  bounds violation), the RAM below the data region is unchanged, the target aborts the
  connection and listens again, and the next connection reads and writes as the first did.
  The NIC's shadow-memory checker sees no write outside the plan's writable regions.
"""

import random

from iwarp_model.engine import ConnState
from iwarp_nic.apps.target import DATA, TargetPlan
from iwarp_tb.nicmodel import NIC_IP, NicModelRig
from iwarp_tb.target import ScriptedTarget
from iwarp_tb.target_peer import TargetPeer, run

PLAN = TargetPlan()
TIMEOUT = 3_000_000


def test_peer_writes_and_reads_the_data_region():
    rig = NicModelRig(8, seed=71)
    try:
        target = ScriptedTarget(rig.h, PLAN, mac=rig.device.mac, ip=rig.device.ip,
                                keys=random.Random(71).getrandbits(160))
        rig.host = target
        rng = random.Random(72)
        peer = TargetPeer(rig.endpoint, NIC_IP, PLAN.ram_bytes - DATA)
        below = target.memory.read(0, DATA)
        host, buffer, conn = run(rig, peer.write_and_read(rng), timeout_cycles=TIMEOUT)
        assert target.memory.read(DATA, peer.span) == bytes(peer.expect)
        run(rig, peer.write_below(host, buffer, conn), timeout_cycles=TIMEOUT)
        rig.run_until(lambda: target.connections == 1, timeout_cycles=TIMEOUT)
        assert target.log[:3] == ["accepted", "FAULT 0x1101", "ended: CLOSED"], target.log
        assert target.memory.read(0, DATA) == below
        run(rig, peer.write_and_read(rng), timeout_cycles=TIMEOUT)   # the next connection
        assert target.log[3] == "accepted", target.log
        assert target.memory.read(DATA, peer.span) == bytes(peer.expect)
        assert conn.state == ConnState.TERMINATED
    finally:
        rig.close()
