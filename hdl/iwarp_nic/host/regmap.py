"""The host's control/status register map, described once in plain Python (no Amaranth).

One :class:`RegisterMap` drives the gateware register bank (:class:`~.bank.RegisterBank`), gives
the Python driver its offsets and fields (:meth:`RegisterMap.offset`, :meth:`Register.encode`,
:meth:`Register.decode`) and writes the C header (:mod:`.cheader`).

The bus is 32 bits wide; every register occupies whole 32-bit words at byte offsets that are
multiples of 4. Access kinds:

``RO``
    The value comes from a gateware input. A write is an error (SLVERR) and has no effect.
    A value wider than 32 bits is split into ``<name>_lo`` / ``<name>_hi`` words: reading the
    low word also latches the high word, and reading the high word returns that latch, so a
    driver reading ``_lo`` then ``_hi`` gets one consistent 64-bit value (a counter that carries
    between the two reads is not torn).
``RW``
    Storage in the bank (reset to ``reset``), its value an output to the gateware; bytes are
    written under the write strobes. A value wider than 32 bits is two independently written
    words: the gateware sees each half change on its own write, so a driver writes both while
    the value is not in use.
``W1C``
    Status bits set by gateware event pulses (an input bit high for a cycle sets the bit),
    cleared by writing 1 to them; an event in the cycle of a clearing write wins (no event is
    lost). With ``enable="<rw register>"`` the register contributes to the bank's ``irq``
    output: high while any bit is set whose enable bit is set.
``PULSE`` (doorbell)
    A write emits the written value (bytes with a low strobe read as 0) as one transfer on a
    stream to the gateware; the write response waits until the gateware takes it. Reads return
    0. At most 32 bits. An array of them (``count`` copies ``stride`` bytes apart, e.g. one
    doorbell per QP) is one stream whose transfers carry the element ``index``.

Any kind but ``W1C`` may be an array (``count`` > 1).
"""

import copy
import keyword
import re
from dataclasses import dataclass

__all__ = ["RO", "RW", "W1C", "PULSE", "ACCESS", "WORD_BYTES", "RESERVED", "Field", "Register",
           "RegisterMap", "Word"]

RO, RW, W1C, PULSE = "RO", "RW", "W1C", "PULSE"
#: Every access kind.
ACCESS = (RO, RW, W1C, PULSE)
#: Bytes per bus word (the register granule).
WORD_BYTES = 4
WORD_BITS = 8 * WORD_BYTES
#: Names a register may not take: the bank's own ports.
RESERVED = frozenset({"s_axil", "irq"})
#: The widest register value: two words.
MAX_WIDTH = 64

_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


def _check_name(what, name):
    if not isinstance(name, str) or not _NAME.match(name) or keyword.iskeyword(name):
        raise ValueError(f"{what} name {name!r} must be a lower-case identifier "
                         f"([a-z][a-z0-9_]*, not a Python keyword)")


def _check_int(what, value, low, high=None):
    if not isinstance(value, int) or isinstance(value, bool) or value < low or \
            (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"of {low} or more"
        raise ValueError(f"{what} must be an integer {bound}, not {value!r}")


def _mask(width):
    return (1 << width) - 1


class Field:
    """``width`` bits of a register value from bit ``offset_bit`` (bit 0: the least significant
    bit of the value; a field of a 64-bit register may lie in either word or across both)."""

    def __init__(self, name, offset_bit, width=1, doc=""):
        _check_name("field", name)
        _check_int(f"field {name!r} offset_bit", offset_bit, 0)
        _check_int(f"field {name!r} width", width, 1)
        self.name, self.offset_bit, self.width, self.doc = name, offset_bit, width, doc

    @property
    def shift(self):
        return self.offset_bit

    @property
    def end_bit(self):
        """One past the field's top bit."""
        return self.offset_bit + self.width

    @property
    def mask(self):
        """The field's bits in place in the register value."""
        return _mask(self.width) << self.offset_bit

    def __repr__(self):
        return f"Field({self.name!r}, {self.offset_bit}, {self.width})"


class Register:
    """A register (or an array of ``count`` registers ``stride`` bytes apart) at byte
    ``offset`` (``None``: the next free word after the previous register of the map).

    ``width`` is the value's width in bits (1 to 64; at most 32 for ``PULSE``); a value wider
    than 32 bits takes two words. ``fields`` name parts of the value (optional: a register
    without fields is one value). ``reset`` is the reset value of an ``RW`` register.
    ``enable`` names the ``RW`` register of the same width that enables a ``W1C`` register's
    bits onto the bank's ``irq``.
    """

    def __init__(self, name, offset, access, fields=(), doc="", *, width=32, count=1,
                 stride=None, reset=0, enable=None):
        _check_name("register", name)
        if name in RESERVED:
            raise ValueError(f"register name {name!r} is reserved (a port of the bank)")
        if access not in ACCESS:
            raise ValueError(f"register {name!r}: access must be one of {ACCESS}, "
                             f"not {access!r}")
        _check_int(f"register {name!r} width", width, 1,
                   WORD_BITS if access == PULSE else MAX_WIDTH)
        _check_int(f"register {name!r} count", count, 1)
        if offset is not None:
            _check_int(f"register {name!r} offset", offset, 0)
            if offset % WORD_BYTES:
                raise ValueError(f"register {name!r}: offset {offset:#x} is not a multiple of "
                                 f"{WORD_BYTES}")
        self.name, self.offset, self.access, self.doc = name, offset, access, doc
        self.width, self.count = width, count
        self.words = -(-width // WORD_BITS)
        if stride is None:
            stride = self.words * WORD_BYTES
        _check_int(f"register {name!r} stride", stride, 1)
        if stride % WORD_BYTES or stride < self.words * WORD_BYTES:
            raise ValueError(f"register {name!r}: stride {stride} must be a multiple of "
                             f"{WORD_BYTES} and at least the register's "
                             f"{self.words * WORD_BYTES} bytes")
        self.stride = stride
        if access == W1C and count != 1:
            raise ValueError(f"register {name!r}: W1C arrays are not supported")
        if enable is not None and access != W1C:
            raise ValueError(f"register {name!r}: only a W1C register has an enable")
        self.enable = enable
        _check_int(f"register {name!r} reset", reset, 0, _mask(width))
        if reset and access != RW:
            raise ValueError(f"register {name!r}: only an RW register has a reset value")
        self.reset = reset
        self.fields = tuple(fields)
        self._check_fields()

    def _check_fields(self):
        seen = {}
        for f in self.fields:
            if not isinstance(f, Field):
                raise ValueError(f"register {self.name!r}: {f!r} is not a Field")
            if f.name in seen:
                raise ValueError(f"register {self.name!r}: two fields named {f.name!r}")
            if f.end_bit > self.width:
                raise ValueError(f"register {self.name!r}: field {f.name!r} (bits "
                                 f"{f.offset_bit}-{f.end_bit - 1}) does not fit its "
                                 f"{self.width} bits")
            for other in seen.values():
                if f.offset_bit < other.end_bit and other.offset_bit < f.end_bit:
                    raise ValueError(f"register {self.name!r}: fields {other.name!r} (bits "
                                     f"{other.offset_bit}-{other.end_bit - 1}) and {f.name!r} "
                                     f"(bits {f.offset_bit}-{f.end_bit - 1}) overlap")
            seen[f.name] = f

    @property
    def wide(self):
        """The value takes two words (``_lo`` and ``_hi``)."""
        return self.words > 1

    @property
    def size(self):
        """Bytes of one element."""
        return self.words * WORD_BYTES

    @property
    def span(self):
        """Bytes from the first word of the first element to the end of the last."""
        return (self.count - 1) * self.stride + self.size

    def word_names(self):
        """The names of one element's words: ``[name]``, or ``[name_lo, name_hi]``."""
        return [f"{self.name}_lo", f"{self.name}_hi"] if self.wide else [self.name]

    def addr(self, index=0, half=0):
        """Byte offset of word ``half`` of element ``index``."""
        if not 0 <= index < self.count:
            raise IndexError(f"register {self.name!r} has {self.count} elements, "
                             f"not index {index}")
        if not 0 <= half < self.words:
            raise IndexError(f"register {self.name!r} has {self.words} words, not {half}")
        return self.offset + index * self.stride + half * WORD_BYTES

    def field(self, name):
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"register {self.name!r} has no field {name!r}")

    def encode(self, **values):
        """The register value with each named field set (others 0)."""
        value = 0
        for name, v in values.items():
            f = self.field(name)
            if not 0 <= v <= _mask(f.width):
                raise ValueError(f"{self.name}.{name}: {v} does not fit {f.width} bits")
            value |= v << f.offset_bit
        return value

    def decode(self, value):
        """``{field: value}`` of a register value."""
        return {f.name: value >> f.offset_bit & _mask(f.width) for f in self.fields}

    def __repr__(self):
        extra = f", count={self.count}, stride={self.stride}" if self.count > 1 else ""
        return (f"Register({self.name!r}, {self.offset!r}, {self.access}, width={self.width}"
                f"{extra})")


@dataclass(frozen=True)
class Word:
    """One 32-bit word of the map: word ``half`` (0: low) of element ``index`` of
    ``register``, at byte ``offset``; it holds value bits ``lo`` to ``hi - 1``."""

    offset: int
    register: Register
    index: int
    half: int

    @property
    def lo(self):
        return self.half * WORD_BITS

    @property
    def hi(self):
        return min(self.register.width, self.lo + WORD_BITS)

    @property
    def name(self):
        return self.register.word_names()[self.half]


def _where(reg):
    return f"{reg.name!r} ({reg.offset:#06x}..{reg.offset + reg.span - 1:#06x})"


class RegisterMap:
    """The registers of one address space, checked: names unique (words too), no two words at
    one offset, every enable an ``RW`` register of its ``W1C`` register's width, and everything
    below ``2**addr_width``. Registers with ``offset=None`` are placed at the next free word
    after the register before them. ``name`` prefixes the C header's macros."""

    def __init__(self, name, registers, *, addr_width=16, doc=""):
        _check_name("map", name)
        _check_int("addr_width", addr_width, 12, 32)
        self.name, self.addr_width, self.doc = name, addr_width, doc
        self.registers = []
        names = {}
        at = 0
        for reg in registers:
            if not isinstance(reg, Register):
                raise ValueError(f"map {name!r}: {reg!r} is not a Register")
            if reg.offset is None:
                reg = copy.copy(reg)    # placed here; the caller's object is left as it was
                reg.offset = at
            for word in reg.word_names():
                if word in names:
                    raise ValueError(f"map {name!r}: the name {word!r} is used twice "
                                     f"({names[word].name!r} and {reg.name!r})")
                names[word] = reg
            names[reg.name] = reg
            at = reg.offset + reg.span
            self.registers.append(reg)
        self._by_name = {r.name: r for r in self.registers}
        self._words = {}
        for reg in self.registers:
            for index in range(reg.count):
                for half in range(reg.words):
                    word = Word(reg.addr(index, half), reg, index, half)
                    if word.offset + WORD_BYTES > 1 << addr_width:
                        raise ValueError(f"map {name!r}: register {reg.name!r} word at "
                                         f"{word.offset:#x} is beyond the {addr_width}-bit "
                                         f"address space")
                    other = self._words.get(word.offset)
                    if other is not None:
                        raise ValueError(f"map {name!r}: registers {_where(other.register)} and "
                                         f"{_where(reg)} overlap at {word.offset:#06x}")
                    self._words[word.offset] = word
        for reg in self.registers:
            if reg.enable is None:
                continue
            en = self._by_name.get(reg.enable)
            if en is None:
                raise ValueError(f"map {name!r}: register {reg.name!r} enable {reg.enable!r} "
                                 f"is not a register of the map")
            if en.access != RW or en.count != 1 or en.width != reg.width:
                raise ValueError(f"map {name!r}: register {reg.name!r} enable {reg.enable!r} "
                                 f"must be a single RW register of {reg.width} bits")

    def __iter__(self):
        return iter(self.registers)

    def __len__(self):
        return len(self.registers)

    def __getitem__(self, name):
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"map {self.name!r} has no register {name!r}") from None

    def __contains__(self, name):
        return name in self._by_name

    @property
    def has_irq(self):
        """Some ``W1C`` register has an enable: the bank has an ``irq`` output."""
        return any(r.enable is not None for r in self.registers)

    @property
    def end(self):
        """One past the last mapped byte."""
        return max((w + WORD_BYTES for w in self._words), default=0)

    def words(self):
        """Every mapped :class:`Word`, by offset."""
        return [self._words[k] for k in sorted(self._words)]

    def word_at(self, offset):
        """The :class:`Word` at byte ``offset`` (rounded down to a word), or None."""
        return self._words.get(offset - offset % WORD_BYTES)

    def offset(self, name, index=0):
        """Byte offset of register ``name`` (element ``index``), or of a word ``<name>_lo`` /
        ``<name>_hi`` of a wide register."""
        if name in self._by_name:
            return self._by_name[name].addr(index)
        for suffix, half in (("_lo", 0), ("_hi", 1)):
            reg = self._by_name.get(name.removesuffix(suffix))
            if name.endswith(suffix) and reg is not None and reg.wide:
                return reg.addr(index, half)
        raise KeyError(f"map {self.name!r} has no register or word {name!r}")

    def __repr__(self):
        return f"RegisterMap({self.name!r}, {len(self.registers)} registers)"
