"""Ordering host memory accesses after writes: AXI4 orders nothing between a write and a later
read, nor makes a write visible before its response (ARM IHI 0022, A6: a write is observable
once its response is given). A completion must not reach the host before the data it
completes (RFC 5040 section 5.4, "Completion of a message is signaled only after its data is
placed"), and a Read Response must read what the Writes before it placed (RFC 5040 section
5.5: an RDMA Read following an RDMA Write sees its data).
"""

from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..exact import select, wrap_add, wrap_sub

__all__ = ["WriteFence"]

_COUNT = 16     # bits of the free-running write counts


def _plus_ones(m, count, bits, name):
    """``count`` plus the number of set bits of ``bits``, modulo ``2 ** _COUNT``."""
    ones = select(m, bits, {v: bin(v).count("1") for v in range(1 << len(bits))}, _COUNT,
                  f"{name}_ones")
    return wrap_add(m, count, ones, _COUNT, name)


class WriteFence(wiring.Component):
    """Hold each transfer of a stream until the host memory writes issued before it are done.

    Ports
    -----
    i, o : In(stream.Signature(shape)), Out(stream.Signature(shape))
        The stream held.
    issued, done : In(writers), In(writers)
        Per write client, one cycle high when that client issues a write (its command is
        taken) and when one of its writes is done (the DMA engine's ``done``, after its
        write responses). Each client's writes are done in the order issued.

    The transfer at the head of ``i`` waits until as many writes are done as had been issued
    by the cycle it arrived (that cycle's included): it passes the cycle after it arrived if
    none of them is outstanding, otherwise the cycle after the last of them is done; then the
    next transfer arrives. A transfer every two cycles at most. Only registers decide whether
    it passes, so no combinational path runs from ``issued`` or ``i.valid`` to ``o.valid`` or
    ``i.ready``. At most 32767 writes may be outstanding (the counts are 16 bits, compared
    modulo 2**16).
    """

    def __init__(self, shape, *, writers=1):
        if not isinstance(writers, int) or writers < 1:
            raise ValueError(f"writers must be a positive integer, not {writers!r}")
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape)),
                          "issued": In(writers), "done": In(writers)})

    def elaborate(self, platform):
        m = Module()
        issued, done = Signal(_COUNT), Signal(_COUNT)   # writes issued and done so far
        issued_now = Signal(_COUNT)                     # with this cycle's
        m.d.comb += issued_now.eq(_plus_ones(m, issued, self.issued, "issued_next"))
        m.d.sync += [issued.eq(issued_now), done.eq(_plus_ones(m, done, self.done, "done_next"))]
        armed, ticket = Signal(), Signal(_COUNT)        # the head's writes to wait for
        reached = armed & ~wrap_sub(m, done, ticket, _COUNT, "ahead")[_COUNT - 1]
        m.d.comb += [self.o.payload.eq(self.i.payload), self.o.valid.eq(self.i.valid & reached),
                     self.i.ready.eq(self.o.ready & reached)]
        with m.If(self.i.valid & ~armed):
            m.d.sync += [armed.eq(1), ticket.eq(issued_now)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += armed.eq(0)
        return m
