"""FPDU fuzzing: an attacker's stream of FPDUs, one of them mutated at the MPA, DDP or RDMAP
layer, and the model's reaction to it as the oracle of the NIC's.

The layers (RFC 5044 section 4 for the FPDU: ULPDU_Length, ULPDU, pad, CRC; RFC 5041 section
4 for the DDP headers, tagged and untagged; RFC 5040 section 4 for RDMAP's control field and
the Read Request header) are mutated as :data:`MUTATIONS` says: header bits and octets,
fields (STag, TO, QN, MSN, MO, the Read Request's) set to values near their edges, every
opcode, the ULPDU cut short or made longer with the CRC made good, and, with the CRC left as
it was, any bit of the FPDU or its ULPDU_Length. Some cases are left clean, as controls.

A case (:func:`make_case`) is one attacker, one victim and the work between them, the FPDU
of the attacker's stream to mutate and how. The work is either the attacker's (Sends, Writes,
Writes and Sends with Immediate Data into the victim's region and receives; no Reads or
atomics, whose answers would race the victim's Terminate) or the victim's (Reads and atomics
on the attacker's region: the attacker's stream is their answers, Read Responses and Atomic
Responses, in the order asked).
:class:`Tap` stands in for the attacker connection's ``transmit`` once it is established and
mutates that FPDU on its way out, so the same :class:`~iwarp_model.engine.Connection` makes
the stream whether its peer is the model (:func:`oracle`) or the NIC. Markers are off: the
mutations move FPDU boundaries, and markers would have to move with them.
"""

import random
from dataclasses import dataclass

from iwarp_model.engine import Connection
from iwarp_model.transport.memory import MemoryPair
from iwarp_model.verbs import WcStatus
from iwarp_model.wire.fpdu import HEADER_SIZE, Framer, fpdu_length
from iwarp_nic.core import NicCore
from iwarp_tb.traffic import kinds, plan

__all__ = ["MUTATIONS", "Case", "Tap", "make_case", "oracle", "Outcome", "outcome", "unflushed"]

#: The work an attacker does: everything whose completions do not race a Terminate.
WORK_KINDS = ("write", "send", "write_imm", "send_imm")
#: The work a victim does, the attacker answering.
READ_KINDS = ("read", "atomic", "masked_atomic")
TAGGED = 0x80
#: Octets of a ULPDU that hold headers: DDP's untagged header (18) and the Read Request's (28).
HEADERS = 46
#: ``(offset, size)`` of the DDP and RDMAP fields (RFC 5041 sections 4.2-4.3, RFC 5040
#: section 4.4): tagged: STag and TO; untagged: Invalidate STag or Immediate Data, QN, MSN,
#: MO, then a Read Request's sink STag and TO, size, source STag and TO.
TAGGED_FIELDS = ((2, 4), (6, 8))
UNTAGGED_FIELDS = ((2, 4), (6, 4), (10, 4), (14, 4), (18, 4), (22, 8), (30, 4), (34, 4),
                   (38, 8))


def frame(ulpdu, crc):
    """The FPDU of ``ulpdu`` (no markers), its CRC good if ``crc`` (else zero)."""
    return Framer(crc=crc, markers=False).frame(bytes(ulpdu))


def ulpdu_of(fpdu):
    return fpdu[HEADER_SIZE:HEADER_SIZE + int.from_bytes(fpdu[:HEADER_SIZE], "big")]


def _edge(rng, value, bits, stags):
    mask = (1 << bits) - 1
    choices = [0, mask, (value + 1) & mask, (value - 1) & mask,
               value ^ 1 << rng.randrange(bits), rng.getrandbits(bits),
               (value + (1 << rng.randrange(bits))) & mask]
    if bits == 32:
        choices.append(rng.choice(stags))
    return rng.choice(choices)


def header_bit(rng, fpdu, crc, stags):
    ulpdu = bytearray(ulpdu_of(fpdu))
    bit = rng.randrange(8 * min(len(ulpdu), HEADERS))
    ulpdu[bit // 8] ^= 0x80 >> bit % 8
    return frame(ulpdu, crc)


def header_octet(rng, fpdu, crc, stags):
    ulpdu = bytearray(ulpdu_of(fpdu))
    ulpdu[rng.randrange(min(len(ulpdu), HEADERS))] = rng.getrandbits(8)
    return frame(ulpdu, crc)


def field(rng, fpdu, crc, stags):
    ulpdu = bytearray(ulpdu_of(fpdu))
    fields = TAGGED_FIELDS if ulpdu[0] & TAGGED else UNTAGGED_FIELDS
    at, size = rng.choice([f for f in fields if f[0] + f[1] <= len(ulpdu)])
    value = int.from_bytes(ulpdu[at:at + size], "big")
    ulpdu[at:at + size] = _edge(rng, value, 8 * size, stags).to_bytes(size, "big")
    return frame(ulpdu, crc)


def opcode(rng, fpdu, crc, stags):
    """Any opcode, tagged or not, with RDMAP version 1 (the DDP control's L flag and
    version kept)."""
    ulpdu = bytearray(ulpdu_of(fpdu))
    ulpdu[0] = ulpdu[0] & 0x7F | rng.choice((0, TAGGED))
    ulpdu[1] = 0x40 | rng.randrange(16)
    return frame(ulpdu, crc)


def payload_bit(rng, fpdu, crc, stags):
    """A bit of the data (a mutation the protocol cannot see: it is placed as it came)."""
    ulpdu = bytearray(ulpdu_of(fpdu))
    start = 14 if ulpdu[0] & TAGGED else 18
    if len(ulpdu) <= start:
        return fpdu
    bit = rng.randrange(8 * start, 8 * len(ulpdu))
    ulpdu[bit // 8] ^= 0x80 >> bit % 8
    return frame(ulpdu, crc)


def truncate(rng, fpdu, crc, stags):
    ulpdu = ulpdu_of(fpdu)
    return frame(ulpdu[:rng.randrange(len(ulpdu))], crc)


def extend(rng, fpdu, crc, stags):
    return frame(ulpdu_of(fpdu) + rng.randbytes(rng.randint(1, 64)), crc)


def stale_crc(rng, fpdu, crc, stags):
    """A bit of the ULPDU, pad or CRC flipped, the CRC not made again."""
    out = bytearray(fpdu)
    bit = rng.randrange(8 * HEADER_SIZE, 8 * len(out))
    out[bit // 8] ^= 0x80 >> bit % 8
    return bytes(out)


def length(rng, fpdu, crc, stags):
    """ULPDU_Length changed, nothing else: the FPDU's end is misplaced."""
    old = int.from_bytes(fpdu[:HEADER_SIZE], "big")
    new = rng.choice((old + rng.randint(1, 8), max(0, old - rng.randint(1, 8)),
                      rng.getrandbits(16), 0))
    return new.to_bytes(HEADER_SIZE, "big") + fpdu[HEADER_SIZE:]


#: Every mutation: ``(rng, fpdu, crc, stags) -> bytes``, the FPDU (without markers, its CRC
#: good if ``crc``) made into what goes on instead; ``stags`` are the STags in use, a choice
#: for the STag fields.
MUTATIONS = {f.__name__.replace("_", "-"): f for f in (
    header_bit, header_octet, field, opcode, payload_bit, truncate, extend, stale_crc, length)}
#: The longest ULPDU the NIC takes in (its gather ring holds one FPDU); a longer ULPDU_Length
#: ends the stream.
NIC_MAX_RX_ULPDU = NicCore(8).max_rx_ulpdu
#: One case in this many is left clean.
CLEAN_ONE_IN = 8


@dataclass
class Case:
    """One attacker on one victim: the work ``sends`` (the victim's Reads and atomics if
    ``victim_reads``, else the attacker's) and the victim's ``receives``
    (:func:`~iwarp_tb.traffic.plan`'s, on the ends made from ``seed``), CRCs or not, and the
    ``index``-th FPDU of the attacker's stream mutated by ``mutation`` (None: clean) with
    ``seed``."""

    seed: int
    crc: bool
    p2p: bool
    victim_reads: bool
    sends: list
    receives: list
    index: int
    mutation: str | None


def make_case(seed, fresh, stags=()):
    """A case drawn from ``seed`` for the :class:`~iwarp_tb.traffic.End` pair ``fresh()``
    makes (attacker, victim; a new pair, alike, on every call); the FPDU to mutate is one of
    those of the stream as a clean run makes it."""
    rng = random.Random(seed)
    crc = rng.random() < 0.75
    victim_reads = rng.random() < 0.3
    p2p = victim_reads or rng.random() < 0.3
    attacker, victim = fresh()
    if victim_reads:
        sends, receives = plan(rng, victim, attacker, rng.randint(1, 4), kinds=READ_KINDS)
    else:
        sends, receives = plan(rng, attacker, victim, rng.randint(1, 4), kinds=WORK_KINDS)
    mutation = None if rng.randrange(CLEAN_ONE_IN) == 0 else rng.choice(list(MUTATIONS))
    clean = Case(seed, crc, p2p, victim_reads, sends, receives, 0, None)
    fpdus = oracle(clean, *fresh(), stags)[2].fpdus
    return Case(seed, crc, p2p, victim_reads, sends, receives, rng.randrange(fpdus), mutation)


class Tap:
    """``conn.transmit`` with the case's FPDU mutated: install once ``conn`` is established.
    :attr:`fpdus` counts the FPDUs sent; :attr:`mutated` is the FPDU as it went, if it did."""

    def __init__(self, conn, case, stags):
        self.case, self.stags = case, stags
        self.rng = random.Random(case.seed ^ 0x5EED)
        self.fpdus, self.mutated = 0, None
        self._transmit = conn.transmit
        conn.transmit = self

    def __call__(self, max_bytes=None):
        data = self._transmit(max_bytes)
        out, at = bytearray(), 0
        while at < len(data):
            end = at + fpdu_length(int.from_bytes(data[at:at + HEADER_SIZE], "big"))
            fpdu = data[at:end]
            if self.fpdus == self.case.index and self.case.mutation is not None:
                fpdu = MUTATIONS[self.case.mutation](self.rng, fpdu, self.case.crc, self.stags)
                self.mutated = fpdu
            out += fpdu
            self.fpdus += 1
            at = end
        return bytes(out)


def connections(case):
    """The attacker's (the MPA Initiator) and the NIC victim's connection options."""
    both = {"crc": case.crc, "p2p": case.p2p}
    return both, both


def oracle_victim(case):
    """The oracle victim's connection options: the NIC's, and its longest ULPDU taken in."""
    return {**connections(case)[1], "max_rx_ulpdu": NIC_MAX_RX_ULPDU}


def oracle(case, attacker, victim, stags=()):
    """Run ``case`` between two model ends; returns ``(attacker connection, victim
    connection, tap)`` once nothing more happens."""
    a = Connection(attacker.qp, active=True, **connections(case)[0])
    v = Connection(victim.qp, active=False, **oracle_victim(case))
    pair = MemoryPair(a, v)
    pair.start()
    tap = Tap(a, case, stags)
    for wr in case.receives:
        victim.qp.post_recv(wr)
    for wr in case.sends:
        (victim if case.victim_reads else attacker).qp.post_send(wr)
    pair.pump()
    return a, v, tap


@dataclass
class Outcome:
    """What a case came to: the Terminate the victim sent (its 16 bits of layer, error type
    and code), whether the victim's queue pair is in error, the Terminate the attacker
    received (whole), the two ends' completions (:func:`~iwarp_tb.traffic.kinds`; the
    victim's flushed receives left out) and memories."""

    victim_terminate: int | None
    victim_failed: bool
    attacker_terminate: object
    victim_completions: list
    attacker_completions: list
    victim_memory: bytes
    attacker_memory: bytes


def unflushed(completions):
    """The completions of work that was done (not flushed by the queue pair's error)."""
    return [wc for wc in completions if wc.status != WcStatus.WR_FLUSH_ERR]


def outcome(victim_terminate, victim_failed, attacker_conn, victim_wcs, attacker_wcs,
            victim_memory, attacker_memory):
    """The :class:`Outcome` of what the two ends show: ``victim_terminate`` the victim's
    Terminate as its 16 bits of layer, type and code (None if it sent none)."""
    return Outcome(victim_terminate, victim_failed, attacker_conn.terminate_received,
                   kinds(unflushed(victim_wcs)), kinds(attacker_wcs), bytes(victim_memory),
                   bytes(attacker_memory))
