"""What the impairment suites share (``tb/nic/test_nic_impair.py``, the NIC against the model
and against another NIC; the impaired cases of ``tb/siw/test_nic_vs_siw.py``, the NIC against
Linux siw): the NicCore they run, and the check that a case's impairments really happened on
every way of the wire and that each NIC saw them.

The wire is :class:`~iwarp_model.transport.impair.Link`, one per way, which counts what it
did. A NIC shows what it saw in its counters (:meth:`iwarp_tb.driver.NicDevice.counters`):
retransmissions after losses of its segments (RFC 6298, RFC 5681), checksum drops after
corruption (RFC 791, RFC 9293 section 3.1: a flipped bit makes the frame a loss), more
segments taken than were sent after cutting.
"""

from .tcprig import CLOCK_HZ, NicTimers

__all__ = ["CORE", "COUNTED", "SPLIT_COVERS", "CHECKSUM_DROPS", "check_seen"]

#: The NicCore of the impairment suites: RFC 6298's timers scaled down further than the TCP
#: tests' (a retransmission timeout of 0.5 ms at least, still ten round trips of the
#: simulation), since the simulation runs some 20,000 to 60,000 cycles a second and losses at
#: the end of the work wait for it. One build serves every suite.
CORE = {"tcp": NicTimers(rto_initial=0.001, rto_min=0.0005).engine_params(CLOCK_HZ[8])}

#: The Link counter each impairment moves.
COUNTED = {"loss": "lost", "reorder": "reordered", "duplicate": "duplicated",
           "corrupt": "corrupted", "split": "split", "resegment": "resegmented"}

#: Split every segment, each way: the offsets the cuts must cover. A NIC's segment starts
#: with an FPDU, whose MPA, DDP and RDMAP headers end by octet 48 (a Read Request's): every
#: offset in them, and in the CRC of every FPDU of up to 99 octets.
SPLIT_COVERS = set(range(1, 100))

#: The NIC's counters of received frames whose checksums failed.
CHECKSUM_DROPS = ("ip_rx_bad_checksum", "tcp_rx_front_bad_checksum", "ip_icmp_bad_checksum")


def check_seen(impair, links, nics):
    """Each of ``impair``'s impairments (Link arguments) happened on both ``links`` (way name:
    Link), a split of every segment cut at every offset of :data:`SPLIT_COVERS`; and each NIC
    of ``nics`` (the name of the way into it: its counters) saw them. A NIC sees a loss by
    retransmitting: only when a segment of its own that took sequence numbers was lost (the
    other way's ``lost_sequenced``); a lost bare acknowledgement needs nothing sent again."""
    for way, link in links.items():
        for impairment in impair:
            assert link.counters[COUNTED[impairment]] > 0, f"{way}: no {impairment}"
        if impair.get("split") == 1.0:
            missed = sorted(SPLIT_COVERS - link.split_offsets)
            assert not missed, f"{way}: not cut at offsets {missed}"
    for way, nic in nics.items():
        (way_out,) = set(links) - {way}
        if "loss" in impair and links[way_out].counters["lost_sequenced"]:
            assert nic["tcp_retransmits"] + nic["tcp_fast_retransmits"] > 0, \
                f"{way_out}: {links[way_out].counters['lost_sequenced']} segments lost, " \
                "none retransmitted"
        if "corrupt" in impair:
            assert sum(nic[name] for name in CHECKSUM_DROPS) > 0, way
        if "split" in impair or "resegment" in impair:
            assert nic["tcp_rx_segments"] > links[way].counters["sent"], way
