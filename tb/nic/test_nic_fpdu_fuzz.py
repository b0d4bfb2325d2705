"""Fuzzing the NIC's MPA, DDP and RDMAP receive paths with mutated FPDUs (``make fuzz``; a
chunk of it in ``make test``), the reference model's reaction to the same stream the oracle.

Each round is one NIC (:class:`~iwarp_tb.nicmodel.NicModelRig`) with :data:`VICTIMS` queue
pairs, each listening for its own attacker, a model connection. The attackers' work, their
streams and the FPDU each mutates are :mod:`iwarp_tb.fpdu_fuzz`'s cases (one in
:data:`~iwarp_tb.fpdu_fuzz.CLEAN_ONE_IN` clean). All attack at once; each case also runs
between two model ends, the oracle. For every victim the NIC must show the oracle's outcome:

* the same Terminate sent (layer, error type and code, RFC 5040 section 7, RFC 6580), and
  the attacker must receive the Terminate the oracle's attacker did, copied headers and all;
  a victim in error where the oracle's is;
* the same receives completed (flushed ones aside) and the same host memory: nothing placed
  that the oracle did not place, nothing written outside a region (the shadow-memory
  checker);
* the attacker's completions and memory as the oracle attacker's;

and no victim's failure may change another's outcome (RFC 5042 section 5), nor hang the NIC.

The size: ``IWARP_FPDU_FUZZ_CASES`` cases in all (default :data:`CI_CASES`), in rounds of
:data:`VICTIMS`, each its own seed. ``make fuzz`` runs :data:`FULL_CASES`.
"""

import os

import pytest

from iwarp_model import verbs
from iwarp_model.engine import Connection
from iwarp_model.verbs import QpState
from iwarp_tb.fpdu_fuzz import (
    Tap,
    connections,
    make_case,
    oracle,
    outcome,
    unflushed,
)
from iwarp_tb.nicmodel import NicModelRig
from iwarp_tb.traffic import End, nic_end

VICTIMS = 14
CI_CASES = 280
FULL_CASES = 7_000
CASES = int(os.environ.get("IWARP_FPDU_FUZZ_CASES", CI_CASES))
ROUNDS = -(-CASES // VICTIMS)
PORT = 5000


def pairs(seed):
    """The rounds' attackers and victims: ``[(attacker End, victim End)]``, the victims on one
    model device so that their STags are those the NIC's driver gives in the same order."""
    dev = verbs.Device("nic")
    return [(End(f"attacker{k}", seed + 1000 + k), End(f"victim{k}", seed + k, dev=dev))
            for k in range(VICTIMS)]


def describe(case, tap):
    what = case.mutation or "clean"
    whose = "the victim's" if case.victim_reads else "the attacker's"
    return (f"case {case.seed} ({what} on FPDU {case.index} of {tap.fpdus}, crc {case.crc}, "
            f"{len(case.sends)} work requests {whose})")


def fuzz_round(seed):
    """The round of ``seed``: every victim's outcome on the NIC is its oracle's."""
    stags = [victim.region.rkey for _, victim in pairs(seed)]
    cases = [make_case(seed + k, lambda k=k: pairs(seed)[k], stags) for k in range(VICTIMS)]
    wanted = []
    for case, (attacker, victim) in zip(cases, pairs(seed)):
        a, v, _ = oracle(case, attacker, victim, stags)
        wanted.append(outcome(v.terminate_sent and v.terminate_sent.error_bits,
                              v.qp.state == QpState.ERR, a,
                              victim.cq.poll_cq(1024), attacker.cq.poll_cq(1024),
                              victim.memory, attacker.memory))

    rig = NicModelRig(8, seed=seed, memory_bytes=1 << 24)
    try:
        device = rig.device
        device.memory.configure(latency=20, stall=0.2, seed=seed)
        sides = []
        for k, (case, (attacker, victim)) in enumerate(zip(cases, pairs(seed))):
            qp, cq, mr = nic_end(device, victim)
            attacker_opts, victim_opts = connections(case)
            conn = Connection(attacker.qp, active=True, **attacker_opts)
            link = rig.accept(qp, conn, port=PORT + k, **victim_opts)
            sides.append((attacker, qp, cq, mr, conn, Tap(conn, case, stags), link))
        for case, (attacker, qp, *_) in zip(cases, sides):
            qp.post_recv(case.receives)
            if case.victim_reads:
                qp.post_send(case.sends)
            for wr in [] if case.victim_reads else case.sends:
                attacker.qp.post_send(wr)
        got = [([], []) for _ in cases]

        def settled():
            for (victim_wcs, attacker_wcs), (attacker, _, cq, *_) in zip(got, sides):
                victim_wcs += cq.poll_cq(1024)
                attacker_wcs += attacker.cq.poll_cq(1024)
            # A Write completes nowhere at the victim: its stream is done once the NIC has
            # acknowledged every octet (or the connection is gone).
            return all(len(a) >= len(want.attacker_completions)
                       and len(unflushed(v)) >= len(want.victim_completions)
                       and (want.victim_terminate is None) == (qp.terminate_sent is None)
                       and (conn.terminate_received is None) == (want.attacker_terminate is None)
                       and (link.tcp.unacked == 0 or link.transport_closed)
                       for (v, a), (_, qp, _, _, conn, _, link), want in zip(got, sides, wanted))

        try:
            rig.run_until(settled, timeout_cycles=3_000_000)
        except TimeoutError:
            pass                # what did not happen shows in the comparison below
        rig.run(30_000)
        settled()
        wrong = []
        for case, side, (victim_wcs, attacker_wcs), want in zip(cases, sides, got, wanted):
            attacker, qp, _, mr, conn, tap, _ = side
            seen = outcome(qp.terminate_sent, qp.state == QpState.ERR, conn, victim_wcs,
                           attacker_wcs, device.memory.read(mr.addr, mr.length),
                           attacker.memory)
            print(f"{describe(case, tap)}: Terminate {seen.victim_terminate} "
                  f"(oracle {want.victim_terminate}); {qp.reason}")
            if seen != want:
                differ = [name for name in vars(want) if getattr(seen, name) != getattr(
                    want, name)]
                wrong.append(f"{describe(case, tap)}: {', '.join(differ)} differ: NIC "
                             f"{[getattr(seen, n) for n in differ if 'memory' not in n]}, "
                             f"oracle {[getattr(want, n) for n in differ if 'memory' not in n]}"
                             f"; mutated FPDU {tap.mutated.hex() if tap.mutated else None}")
        print(f"round {seed}: {len(cases)} cases in {rig.cycle} cycles")
        assert wrong == [], "\n".join(wrong)
        assert device.memory.violations() == [] and device.memory.faults() == []
    finally:
        rig.close()


@pytest.mark.cocotb
@pytest.mark.parametrize("round_", range(ROUNDS))
def test_fpdu_fuzz(round_):
    """One round of the campaign."""
    fuzz_round(20_000 + 100 * round_)

