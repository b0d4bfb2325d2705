"""Width-exact operators, so the Verilog of every block passes ``verilator -Wall``.

No protocol here. Verilator wants both operands of an operator equally wide and every ``case``
complete, but Amaranth writes a constant operand with only the bits its value needs (a constant
whose top bit is set is written full width), and an ``m.FSM`` whose state count is not a power of
two gives an incomplete ``case`` (so does an ``m.Switch`` whose ``Default`` assigns nothing to
some signal). Comparisons and additions with constants therefore go through the complement when
the constant's top bit is clear, and state machines are chains of exclusive ``m.If`` blocks.
"""

from amaranth import Const, Signal

__all__ = ["mask", "eq", "ne", "lt", "gt", "add", "sub", "is_zero", "select", "Machine"]


def mask(width):
    """``width`` ones."""
    return (1 << width) - 1


def _top_set(value, width):
    return value >> (width - 1) & 1


def eq(a, value):
    """``a == value`` for an int ``value`` that fits ``a``."""
    w = len(a)
    if not 0 <= value <= mask(w):
        raise ValueError(f"{value} does not fit {w} bits")
    return a == Const(value, w) if _top_set(value, w) else ~a == Const(~value & mask(w), w)


def ne(a, value):
    """``a != value``."""
    return ~eq(a, value)


def lt(a, value):
    """``a < value`` (unsigned); ``value`` in ``[1, 2**len(a)]``."""
    w = len(a)
    if value > mask(w):
        return Const(1, 1)
    return a < Const(value, w) if _top_set(value, w) else ~a > Const(~value & mask(w), w)


def gt(a, value):
    """``a > value`` (unsigned); ``value`` in ``[0, 2**len(a) - 2]``."""
    w = len(a)
    return a > Const(value, w) if _top_set(value, w) else ~a < Const(~value & mask(w), w)


def add(a, value):
    """``a + value`` modulo ``2**len(a)``, ``len(a)`` bits wide."""
    w = len(a)
    value &= mask(w)
    if value == 1 or _top_set(value, w):
        return (a + Const(value, w))[:w]
    return (a - Const((1 << w) - value, w))[:w]


def sub(a, value):
    """``a - value`` modulo ``2**len(a)``, ``len(a)`` bits wide."""
    return add(a, -value)


def is_zero(a):
    """``a == 0``."""
    return ~a.any()


def select(m, sel, values, width, name):
    """A ``width``-bit Signal equal to ``values[sel]``: ``values`` is a list (indexed from 0)
    or a dict keyed by the values of ``sel``; the last entry also stands for every value of
    ``sel`` not listed, so the ``case`` is complete."""
    entries = list(values.items() if isinstance(values, dict) else enumerate(values))
    out = Signal(width, name=name)
    *cases, (_, fallback) = entries
    with m.Switch(sel):
        for key, value in cases:
            with m.Case(key):
                m.d.comb += out.eq(value)
        with m.Default():
            m.d.comb += out.eq(fallback)
    return out


class Machine:
    """A state machine over named states, as exclusive ``m.If`` blocks (no ``case`` statement).

    ``with machine.state("NAME"):`` opens a state's body (the first of ``names`` is the reset
    state); ``machine.goto("NAME")`` moves to a state at the next clock edge.
    """

    def __init__(self, m, names, name):
        self._m = m
        self._names = list(names)
        self.reg = Signal(range(len(self._names)), name=name)

    def state(self, name):
        return self._m.If(eq(self.reg, self._names.index(name)))

    def goto(self, name):
        self._m.d.sync += self.reg.eq(self._names.index(name))
