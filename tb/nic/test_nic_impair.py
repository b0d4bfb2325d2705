"""The impairment suite: RDMA of every kind both ways at once, scored against a model run of
the same work (:mod:`iwarp_tb.model_run`), over a wire that loses, reorders, duplicates,
corrupts or resegments the frames each way (:class:`~iwarp_model.transport.impair.Link`):
between the NIC and the reference model (:class:`~iwarp_tb.nicmodel.NicModelRig`), and
between two NICs (:class:`~iwarp_tb.niclink.NicLinkRig`).

Every octet must land as the oracle's did and every completion must be the oracle's, with the
queue pairs still in RTS: TCP (RFC 9293, RFC 6298) recovers losses, reordering and duplicates;
the IPv4 and TCP checksums catch the one flipped bit of a corrupted frame, which is then a
loss; MPA (RFC 5044 section 4.1) finds its FPDUs in any segmentation. Splitting every segment
in two, at an offset one further each time, cuts FPDUs at every offset of their MPA length,
DDP and RDMAP headers and CRC; resegmenting to 97 octets cuts every full segment into 16.

The NICs here have the TCP timers scaled down (:data:`iwarp_tb.impairment.CORE`). Each
case checks that its impairment happened both ways and that each NIC saw it
(:func:`~iwarp_tb.impairment.check_seen`).
"""

import random

import pytest

from iwarp_tb import model_run
from iwarp_tb.impairment import CORE, check_seen
from iwarp_tb.model_run import Ends
from iwarp_tb.traffic import End

#: Each case: the Link impairments (both ways), the work requests each way, and the longest
#: message.
CASES = {
    "loss-1%": ({"loss": 0.01}, 200, 4096),
    "loss-5%": ({"loss": 0.05}, 200, 4096),
    "reorder": ({"reorder": 0.05}, 200, 4096),
    "duplicate": ({"duplicate": 0.05}, 200, 4096),
    "corrupt": ({"corrupt": 0.03}, 200, 4096),
    "split": ({"split": 1.0}, 200, 4096),
    "resegment-97": ({"resegment": 97}, 60, 1000),
    "everything": ({"loss": 0.02, "reorder": 0.03, "duplicate": 0.03, "corrupt": 0.02,
                    "split": 0.3}, 200, 4096),
}

#: The cases run between two NICs.
NIC_CASES = ("loss-5%", "corrupt", "split", "resegment-97", "everything")


def work_for(case, seed):
    """The case's oracle ends and work: every opcode both ways."""
    _, count, longest = CASES[case]
    ends = Ends(End, seed)
    rng = random.Random(seed + 2)
    return ends, model_run.both_ways(ends, rng, count, max_length=longest)


def check(case, result):
    """The run matched the oracle, and the case's impairments happened both ways and were
    seen by each NIC."""
    impair = CASES[case][0]
    links = result.links
    print(f"{case}: {result.cycles} cycles; wire {dict(links['to_nic'].counters)} to the "
          f"NIC, {dict(links['to_peer'].counters)} to the peer")
    assert result.errors == []
    check_seen(impair, links, {"to_nic" if end == "nic" else "to_peer": counters
                               for end, counters in result.nic_counters.items()})


@pytest.mark.cocotb
@pytest.mark.parametrize("case", CASES)
def test_nic_and_model(case):
    """Every opcode both ways between the NIC and the model, the NIC the MPA Initiator in
    half the cases and the Responder in the others, over the case's impaired wire."""
    seed = 102 + list(CASES).index(case)
    ends, work = work_for(case, seed)
    check(case, model_run.run(ends, work, nic_connects=seed % 2 == 0, seed=seed + 3,
                              impair=CASES[case][0], core=CORE, timeout_cycles=10_000_000))


@pytest.mark.cocotb
@pytest.mark.parametrize("case", NIC_CASES)
def test_two_nics(case):
    """Every opcode both ways between two NICs over the case's impaired wire."""
    seed = 200 + list(CASES).index(case)
    ends, work = work_for(case, seed)
    check(case, model_run.run_nics(ends, work, seed=seed + 3, impair=CASES[case][0],
                                   core=CORE, timeout_cycles=10_000_000))
