"""Round-robin choice among requesters, for every arbiter of the design: no protocol here.

The grant is the first requester after the last one served, wrapping around, found with the
two's-complement trick (``x & -x`` keeps the lowest set bit of ``x``) twice: once among the
requesters after the last grant, once among all of them. That is two carry chains of
``len(requests)`` bits, where a priority chain written as nested conditions grows with the
square of the number of requesters.
"""

from amaranth import Cat, Mux, Signal

from .exact import add, sub

__all__ = ["round_robin", "merge"]


def _lowest(x):
    """``x`` with every set bit but the lowest cleared."""
    return x & add(~x, 1)


def round_robin(m, requests, served, name):
    """The one-hot grant (a Signal as wide as ``requests``) of the first set bit of
    ``requests`` after the last grant ``served`` was 1 for, wrapping around; 0 when no bit is
    set. Combinational from ``requests``; the state (one register of the same width) moves on
    in the cycle ``served`` is 1."""
    n = len(requests)
    after = Signal(n, name=f"{name}_after")      # the bits after the last grant served
    grant = Signal(n, name=f"{name}_grant")
    later = requests & after
    m.d.comb += grant.eq(Mux(later.any(), _lowest(later), _lowest(requests)))
    with m.If(served):
        m.d.sync += after.eq(~(grant | sub(grant, 1)))
    return grant


def merge(m, sources, records, out, room, name):
    """Take one of the streams ``sources`` at a time, round robin, while ``room``: the one
    granted is ready, and its record (``records[k]``, a value of ``out``'s shape) drives
    ``out``. Returns ``(offered, taken)``: some source is granted; and it is taken (``room``
    with it)."""
    taken = Signal(name=f"{name}_taken")
    grant = round_robin(m, Cat(s.valid for s in sources), taken, name)
    for k, (source, record) in enumerate(zip(sources, records)):
        with m.If(grant[k]):
            m.d.comb += out.eq(record)
        m.d.comb += source.ready.eq(grant[k] & room)
    offered = grant.any()
    m.d.comb += taken.eq(offered & room)
    return offered, taken
