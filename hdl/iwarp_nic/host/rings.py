"""Work queue rings in host memory, the state the NIC keeps of each (RFC 5040 section 5: a
queue pair's send and receive queues, worked in order).

A ring is ``2 ** log2_entries`` entries of ``entry_bytes`` octets at ``base``. Indexes are
free-running 16-bit counts: entry ``i`` is at ``base + (i mod entries) * entry_bytes``. The
driver's doorbell gives the index after the last entry it posted (its tail); the NIC keeps the
index of the next entry it reads.
"""

from amaranth import Cat, Signal
from amaranth.lib.data import StructLayout

from ..exact import add, eq, mask, same, select, widened

__all__ = ["Ring", "ReceiveRing", "Doorbell", "Rings"]

#: A queue made afresh (a queue pair created): its ring, no entry posted.
Ring = StructLayout({"base": 64, "log2_entries": 4})


def ReceiveRing(srqs):
    """A queue pair's receives: ``srq`` 0 for a receive queue of its own, the ring (made
    afresh, nothing posted); ``srq`` s + 1 to take them from shared receive queue s of
    ``srqs`` (the ring unused)."""
    return StructLayout({**dict(Ring.members), "srq": srqs.bit_length()})


#: The driver's doorbell: the index after the last entry posted.
Doorbell = StructLayout({"tail": 16})


class Rings:
    """The ring state of ``conns`` queues (one per connection), as registers: each queue's
    base, size, next index and tail. ``name`` prefixes the signals."""

    def __init__(self, conns, entry_bytes, name):
        if entry_bytes & (entry_bytes - 1):
            raise ValueError(f"entry_bytes must be a power of two, not {entry_bytes!r}")
        self.conns, self.name, self.shift = conns, name, entry_bytes.bit_length() - 1

        def regs(what, width):
            return [Signal(width, name=f"{name}_{what}{k}") for k in range(conns)]
        self.base, self.log2 = regs("base", 64), regs("log2_entries", 4)
        self.next, self.tail = regs("next", 16), regs("tail", 16)

    def posted(self):
        """One bit per queue: it has entries posted that the NIC has not read."""
        return Cat(~same(n, t) for n, t in zip(self.next, self.tail))

    def entry(self, m, conn):
        """``(addr, index)`` of queue ``conn``'s next entry (combinational)."""
        name = self.name
        base = select(m, conn, self.base, 64, f"{name}_chosen_base")
        index = select(m, conn, self.next, 16, f"{name}_chosen_next")
        log2 = select(m, conn, self.log2, 4, f"{name}_chosen_log2")
        slot = index & select(m, log2, {j: mask(j) for j in range(16)}, 16, f"{name}_slot_mask")
        offset = widened(m, slot << self.shift, 64, f"{name}_offset")
        return (base + offset)[:64], index

    def advance(self, m, k):
        """Queue ``k``'s next entry is read (in the ``with m.If`` of the caller)."""
        m.d.sync += self.next[k].eq(add(self.next[k], 1))

    def update(self, m, ring, doorbell, opened=lambda k: []):
        """Take ``ring`` (a stream of ``with_conn(Ring, conns)``) and ``doorbell`` (of
        ``with_conn(Doorbell, conns)``), always ready. Call it after the caller's own updates
        of the registers: a doorbell sets the tail and a ring made afresh overrides every
        other update of its queue in that cycle, with ``opened(k)``'s statements."""
        m.d.comb += [ring.ready.eq(1), doorbell.ready.eq(1)]
        for k in range(self.conns):
            with m.If(doorbell.valid & eq(doorbell.payload.conn, k)):
                m.d.sync += self.tail[k].eq(doorbell.payload.tail)
            with m.If(ring.valid & eq(ring.payload.conn, k)):
                m.d.sync += [self.base[k].eq(ring.payload.base),
                             self.log2[k].eq(ring.payload.log2_entries),
                             self.next[k].eq(0), self.tail[k].eq(0), *opened(k)]
