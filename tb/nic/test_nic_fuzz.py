"""Fuzzing the NIC with mutated frames while it carries traffic (``make fuzz``; a chunk of it
in ``make test``).

Each round is one NIC against the reference model's whole NIC
(:class:`~iwarp_tb.nicmodel.NicModelRig`). One connection carries 200 work requests of every
opcode each way, scored against a model run (:func:`iwarp_tb.model_run.run`: memory,
completions, queue pair states, the shadow-memory checker). A second connection, the
*target*, stays idle. Once both are up, :class:`~iwarp_tb.fuzz.Injector` puts mutated frames
on the wire into the NIC, a few before each slice of 1000 cycles, beside the traffic's: frames
at every layer below RDMA (:mod:`iwarp_tb.fuzz`: bad FCS, runts, other MACs and EtherTypes,
bad ARP, every IPv4 header check, ICMP, TCP header checks, segments to no connection, and
segments on the target outside its window or spoofing an RST or a SYN inside it), made from
well-formed frames by bit flips, random header octets, header fields set with the checksums
made good, truncation, a corrupted FCS or cutting to a runt.

Each round must show:

* no hang: the traffic completes, and every frame is taken, within the time limit;
* no stray write and the traffic unaffected: the traffic's run equals its oracle's;
* every drop explained: each drop counter of the NIC (and the ARP replies and RSTs it answers
  with) moved by exactly what :func:`iwarp_tb.fuzz.expected` says of the frames sent: no
  frame dropped for a reason other than its own, none lost for lack of room. Echo requests
  are answered or found bad as it says, except those refused for want of room for their
  replies (``ip_icmp_busy``), and ARP requests for the NIC answered, except those that find
  the previous reply still waiting (``ip_arp_reply_busy``); both must be few;
* the target connection still up at both ends, in RTS and ESTABLISHED.

The size: ``IWARP_FUZZ_FRAMES`` frames in all (default :data:`CI_FRAMES`), in rounds of at most
:data:`ROUND_FRAMES`, each round its own seed. ``make fuzz`` runs the documented full campaign,
:data:`FULL_FRAMES`.
"""

import os
import random

import pytest

from iwarp_model.engine import Connection, ConnState
from iwarp_model.verbs import QpState
from iwarp_model.wire.net import ipv4, mac
from iwarp_tb import model_run
from iwarp_tb.fuzz import (
    ARP_REPLY_COUNTERS,
    BASES,
    DROP_COUNTERS,
    ECHO_COUNTERS,
    REPLY_COUNTERS,
    STRATEGIES,
    Fuzzer,
    Injector,
    Target,
)
from iwarp_tb.model_run import Ends
from iwarp_tb.nicmodel import MODEL_IP, MODEL_MAC, NIC_IP, NIC_MAC
from iwarp_tb.traffic import End

CI_FRAMES = 8_000
ROUND_FRAMES = 25_000
FULL_FRAMES = 1_000_000
PER_SLICE = 8               # frames put on the wire before each slice of 1000 cycles
TRAFFIC_PORT, TARGET_PORT = 4792, 4793

FRAMES = int(os.environ.get("IWARP_FUZZ_FRAMES", CI_FRAMES))
ROUNDS = [min(ROUND_FRAMES, FRAMES - start) for start in range(0, FRAMES, ROUND_FRAMES)]
if len(ROUNDS) == 1 and FRAMES > 1:     # two rounds at least, one per CI worker
    ROUNDS = [FRAMES // 2, FRAMES - FRAMES // 2]


def fuzz_round(seed, frames):
    """One round of ``frames`` mutated frames; returns ``(run, fuzzer, seen, target)``: the
    traffic's :class:`~iwarp_tb.model_run.ModelRun`, the :class:`~iwarp_tb.fuzz.Fuzzer`,
    each counter's change from the fuzz's start to the end, and the target connection's
    ``(queue pair, model connection, model link)``."""
    ends = Ends(End, seed)
    rng = random.Random(seed)
    work = model_run.both_ways(ends, rng, 200)
    state = {}

    def start(rig, qp, link):
        device = rig.device
        cq = device.create_cq(16)
        target_qp = device.create_qp(device.alloc_pd(), cq, cq, max_send_wr=16, max_recv_wr=16)
        conn = Connection(End("target", seed + 7).qp, active=True)
        target_link = rig.accept(target_qp, conn, port=TARGET_PORT)
        tcp = target_link.tcp
        target = Target(nic_mac=mac(NIC_MAC), nic_ip=ipv4(NIC_IP), src_mac=mac(MODEL_MAC),
                        src_ip=ipv4(MODEL_IP), sport=tcp.local_port, dport=tcp.remote_port,
                        rcv_nxt=tcp.snd_nxt, busy=frozenset({TRAFFIC_PORT, TARGET_PORT}))
        state["fuzzer"] = Fuzzer(target, seed)
        state["target"] = (target_qp, conn, target_link)
        state["before"] = device.counters()
        rig.sources.append(Injector(state["fuzzer"], frames, PER_SLICE))

    run = model_run.run(ends, work,
                        nic_connects=False, seed=seed + 3, established=start,
                        timeout_cycles=frames * 1000 // PER_SLICE + 4_000_000)
    after = run.nic_counters["nic"]
    seen = {name: (after[name] - state["before"][name]) & 0xFFFF_FFFF for name in after}
    return run, state["fuzzer"], seen, state["target"]


@pytest.mark.cocotb
@pytest.mark.parametrize("round_", range(len(ROUNDS)))
def test_fuzz(round_):
    """One round of the campaign: the traffic as its oracle's, every drop explained, the
    target connection up."""
    frames = ROUNDS[round_]
    run, fuzzer, seen, (target_qp, conn, link) = fuzz_round(9000 + round_, frames)
    made_by_base = {b: sum(n for (base, _), n in fuzzer.made.items() if base == b) for b in BASES}
    made_by_strategy = {s: sum(n for (_, strategy), n in fuzzer.made.items() if strategy == s)
                        for s in STRATEGIES}
    print(f"round {round_}: {frames} frames ({fuzzer.unsettled} made again) in {run.cycles} "
          f"cycles; by base {made_by_base}; by mutation {made_by_strategy}")
    print("counters: " + ", ".join(f"{name} {seen[name]} (expected {fuzzer.expected[name]})"
                                   for name in DROP_COUNTERS + REPLY_COUNTERS + ECHO_COUNTERS
                                   + ARP_REPLY_COUNTERS if seen[name] or fuzzer.expected[name]))
    assert run.errors == []
    assert sum(fuzzer.made.values()) == frames
    assert all(made_by_base.values()) and all(made_by_strategy.values())
    wrong = {name: (seen[name], fuzzer.expected[name]) for name in DROP_COUNTERS + REPLY_COUNTERS
             if seen[name] != fuzzer.expected[name]}
    assert wrong == {}, f"counter: (seen, expected): {wrong}"
    answered, bad, busy = (seen[name] for name in ECHO_COUNTERS)
    assert answered <= fuzzer.expected["ip_icmp_replies"]
    assert bad <= fuzzer.expected["ip_icmp_bad_checksum"]
    assert answered + bad + busy == sum(fuzzer.expected[name] for name in ECHO_COUNTERS)
    assert busy <= answered // 10, f"{busy} echo requests refused, {answered} answered"
    answered, busy = (seen[name] for name in ARP_REPLY_COUNTERS)
    assert answered + busy == fuzzer.expected["ip_arp_tx_reply"]
    assert busy <= answered // 10, f"{busy} ARP requests unanswered, {answered} answered"
    assert target_qp.state == QpState.RTS, target_qp.reason
    assert conn.state == ConnState.ESTABLISHED and not link.transport_closed
