"""Width-exact operators, so the Verilog of every block passes ``verilator -Wall``.

No protocol here. Verilator wants both operands of an operator equally wide and every ``case``
complete, but Amaranth writes a constant operand with only the bits its value needs (a constant
whose top bit is set is written full width), and an ``m.FSM`` whose state count is not a power of
two gives an incomplete ``case`` (so does an ``m.Switch`` whose ``Default`` assigns nothing to
some signal). Comparisons and additions with constants therefore go through the complement when
the constant's top bit is clear, and state machines are chains of exclusive ``m.If`` blocks.
"""

from contextlib import contextmanager

from amaranth import Cat, Const, Mux, Signal, Value

__all__ = ["mask", "eq", "one_of", "same", "ne", "lt", "gt", "add", "add_counts", "sub",
           "wrap_add", "wrap_sub", "is_zero", "select", "Machine", "wire", "shift_right",
           "widened"]


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


def one_of(a, values):
    """``a`` equals one of the ints ``values``."""
    return Cat(eq(a, v) for v in values).any()


def same(a, b):
    """``a == b`` for two values of one width, as a reduction of their XOR: it stays lint-clean
    when synthesis finds one side constant (``a == 0`` would be written as a logical not of a
    vector, which Verilator rejects)."""
    return ~(a ^ b).any()


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


def add_counts(m, counter, strobes, name):
    """``counter`` plus the one-bit ``strobes``, modulo ``2**len(counter)``, ``len(counter)``
    bits wide. The strobes are summed first and :func:`widened`, so the counter gets one adder
    of equal-width operands (as with :func:`add`), not a chain of them."""
    total = strobes[0]
    for strobe in strobes[1:]:
        total = total + strobe
    w = len(counter)
    return (counter + widened(m, total, w, name))[:w]


def sub(a, value):
    """``a - value`` modulo ``2**len(a)``, ``len(a)`` bits wide."""
    return add(a, -value)


def _inverted(m, b, width, name):
    """``~b`` extended to ``width`` bits (by sign for a signed ``b``, else zero), as a Signal:
    its extension bits are ones, which the Verilog writer keeps (it trims zeros)."""
    b = Value.cast(b)
    fill = b[-1] if b.shape().signed else Const(0, 1)
    inv = Signal(width, name=name)
    m.d.comb += inv.eq(~Cat(b, fill.replicate(width - len(b))))
    return inv


def widened(m, value, width, name):
    """The unsigned ``value`` as a ``width``-bit expression that the Verilog keeps that wide (the
    complement of :func:`_inverted`: a zero-extended operand would be written at its own width,
    and Verilator rejects the mixed widths)."""
    return ~_inverted(m, value, width, name)


def wrap_add(m, a, b, width, name):
    """``a + b`` modulo ``2**width`` for a ``width``-bit ``a`` and any ``b`` no wider, computed
    as ``a - ~b - 1`` so that every operator has ``width``-bit operands (Verilator's ``-Wall``
    rejects mixed widths, and a zero-extended ``b`` would be trimmed back)."""
    out = Signal(width, name=name)
    m.d.comb += out.eq(add((a - _inverted(m, b, width, f"{name}_inv"))[:width], -1))
    return out


def wrap_sub(m, a, b, width, name):
    """``a - b`` modulo ``2**width``, as ``a + ~b + 1`` (see :func:`wrap_add`)."""
    out = Signal(width, name=name)
    m.d.comb += out.eq(add((a + _inverted(m, b, width, f"{name}_inv"))[:width], 1))
    return out


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
    state); ``machine.goto("NAME")`` moves to a state at the next clock edge (the last
    ``goto`` executed in a cycle wins). The state register ``reg`` is binary, or with
    ``onehot=True`` one bit per state: a state's body then depends on one flip-flop, and each
    bit's next value only on the states that go to it (the ``goto`` of a state choose among
    themselves, not among every ``goto`` of the machine). A one-hot machine's ``goto`` must be
    inside a ``state`` body, and :meth:`done` must follow the last one.
    """

    def __init__(self, m, names, name, *, onehot=False):
        self._m = m
        self._names = list(names)
        self._onehot = onehot
        self._next = {}             # one-hot: a state's choice of the next state
        self._current = None
        if onehot:
            self.reg = Signal(len(self._names), name=name, init=1)
        else:
            self.reg = Signal(range(len(self._names)), name=name)

    @contextmanager
    def state(self, name):
        index = self._names.index(name)
        if not self._onehot:
            with self._m.If(eq(self.reg, index)):
                yield
            return
        with self._m.If(self.reg[index]):
            if name not in self._next:
                self._next[name] = Signal(len(self._names), name=f"{self.reg.name}_{name}_next")
            self._m.d.comb += self._next[name].eq(Const(1 << index, len(self._names)))
            outer, self._current = self._current, name
            try:
                yield
            finally:
                self._current = outer

    def goto(self, name):
        index = self._names.index(name)
        if not self._onehot:
            self._m.d.sync += self.reg.eq(index)
            return
        if self._current is None:
            raise RuntimeError("a one-hot Machine's goto must be inside a state body")
        self._m.d.comb += self._next[self._current].eq(Const(1 << index, len(self._names)))

    def done(self):
        """One-hot only: the register takes the choice of the state it is in."""
        if self._onehot:
            n = len(self._names)
            self._m.d.sync += self.reg.eq(Cat(*(
                Cat(*(self.reg[self._names.index(s)] & nxt[k]
                      for s, nxt in self._next.items())).any() for k in range(n))))


def wire(m, value, name):
    """A Signal driven by ``value``: the Verilog then writes the logic once, not per use."""
    out = Signal(len(value), name=name)
    m.d.comb += out.eq(value)
    return out


def shift_right(m, value, amount, unit, name):
    """``value`` shifted right by ``amount * unit`` bits, as a log shifter of width-exact
    2:1 muxes; the result is ``unit * (2**len(amount) - 1)`` bits narrower than ``value``."""
    for k, bit in enumerate(amount):
        step = unit << k
        value = wire(m, Mux(bit, value[step:], value[:len(value) - step]), f"{name}{k}")
    return value
