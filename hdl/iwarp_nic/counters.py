"""Event counters kept whole in one memory, each block holding only a few bits of its count: no
protocol here.

A block's event counter wraps at ``2**bits``; what it adds between two looks is its *advance*
(the new value minus the one seen before, modulo ``2**bits``), which a wider count takes in
with one addition. :func:`counted` is that step; :class:`~.eth.cdc.CountCrossing` takes it once
a cycle for a count from another clock, and :class:`CounterMemory` for many counters at once,
one a cycle in turn, with the wide counts and the values seen in a memory.
"""

from amaranth import Module, Mux, Signal
from amaranth.lib import memory, wiring
from amaranth.lib.data import ArrayLayout, StructLayout
from amaranth.lib.wiring import In, Out

from .exact import add, eq, select, wrap_add, wrap_sub

__all__ = ["counted", "WordRead", "CounterMemory"]


def counted(m, total, value, seen, name):
    """``total`` (any width, wrapping) plus the advance of the narrow count ``value`` since
    ``seen`` (both ``len(value)`` bits, modulo ``2**len(value)``)."""
    bits = len(value)
    advance = wrap_sub(m, value, seen, bits, f"{name}_advance")
    return wrap_add(m, total, advance, len(total), f"{name}_total")


def WordRead(count, width=32):
    """A read of one of ``count`` words of a memory, from the reader's side: ``addr`` and
    ``en`` in one cycle, ``data`` (``width`` bits) in the next."""
    return wiring.Signature({"addr": Out(range(count)), "en": Out(1), "data": In(width)})


class CounterMemory(wiring.Component):
    """``count`` event counters of ``width`` bits, kept in one memory and read one at a time.

    Ports
    -----
    sources : In(ArrayLayout(bits, count))
        Each counter's events, counted by its block modulo ``2**bits`` (the low bits of a
        wider count serve: what is not read, synthesis removes), 0 at reset.
    read : In(WordRead(count, width))
        ``en`` with ``addr`` in one cycle: ``data`` is that counter in the next (not held
        after it).

    How: a memory word per counter holds its ``width``-bit total and the source value its last
    visit saw. A visitor takes the counters in turn, one a cycle: it reads the word, and in the
    next cycle writes it back with :func:`counted`'s sum and the value it now sees. A read
    has the memory's read port before the visitor, which then waits a cycle. After reset the
    visitor first writes every word with zeros (``count`` cycles; reads answer 0 meanwhile),
    as the sources are 0 too.

    Contract: between two visits of a counter (``count`` cycles apart, and one more for every
    cycle a read takes the port), and from reset to its first visit (``count`` more), its
    source advances by less than ``2**bits``: with reads at most every other cycle, less
    than ``2**bits / (3 * count + 2)`` events a cycle. A value read is the counter's total at
    its last visit: never ahead of its events, and behind them by the events of at most a
    visit's interval and two cycles. One read a cycle.
    """

    def __init__(self, count, bits, *, width=32):
        if not isinstance(count, int) or count < 2:
            raise ValueError(f"count must be an integer of 2 or more, not {count!r}")
        if not isinstance(bits, int) or not 1 <= bits <= width:
            raise ValueError(f"bits must be an integer from 1 to width ({width}), not {bits!r}")
        self.count, self.bits, self.width = count, bits, width
        super().__init__({"sources": In(ArrayLayout(bits, count)),
                          "read": In(WordRead(count, width))})

    def elaborate(self, platform):
        m = Module()
        n, k = self.count, self.bits
        word = StructLayout({"total": self.width, "seen": k})
        m.submodules.words = words = memory.Memory(shape=word, depth=n, init=[])
        port = words.read_port()
        write = words.write_port()
        clearing = Signal(init=1)       # after reset: zeros into every word, one a cycle
        at = Signal(range(n))           # the next word the visitor (or the clearing) takes
        last = eq(at, n - 1)
        visited = Signal()              # the port's data is the visitor's read of `was`
        was = Signal(range(n))
        answered_zero = Signal()        # a read made while clearing

        visits = ~self.read.en & ~clearing
        m.d.comb += [port.addr.eq(Mux(self.read.en, self.read.addr, at)), port.en.eq(1),
                     self.read.data.eq(Mux(answered_zero, 0, port.data.total))]
        m.d.sync += [visited.eq(visits), was.eq(at), answered_zero.eq(clearing)]
        with m.If(visits | clearing):
            m.d.sync += at.eq(Mux(last, 0, add(at, 1)))
        with m.If(clearing & last):
            m.d.sync += clearing.eq(0)

        value = select(m, was, [self.sources[i] for i in range(n)], k, "visit_value")
        with m.If(clearing):
            m.d.comb += [write.addr.eq(at), write.en.eq(1), write.data.eq(0)]
        with m.Elif(visited):
            m.d.comb += [write.addr.eq(was), write.en.eq(1), write.data.seen.eq(value),
                         write.data.total.eq(counted(m, port.data.total, value,
                                                     port.data.seen, "visit"))]
        return m
