"""A C header from a :class:`~.regmap.RegisterMap` and in-memory descriptor layouts, for C users
of the NIC (the Python driver reads the same map and layouts directly).

Registers: ``#define <MAP>_<REG>`` byte offsets (``_LO``/``_HI`` for the words of a 64-bit
value), ``_WIDTH``; for an array ``_COUNT``, ``_STRIDE`` and ``_ADDR(i)``; per field ``_SHIFT``,
``_WIDTH`` and ``_MASK`` (the field's bits in place in the register value, ``ull`` when they
pass bit 31), with ``<MAP>_FIELD_GET``/``_FIELD_PREP`` to use them.

Descriptors: an ``amaranth.lib.data.StructLayout`` laid over little-endian memory, fields packed
from bit 0 of byte 0 upwards (the layout's own order: a field at bit ``b`` is bit ``b % 8`` of
byte ``b // 8``). Nested structs and arrays are flattened to ``<PARENT>_<CHILD>`` and
``<PARENT>_<INDEX>``; fields named ``_...`` are reserved and get no macros. Each field gets
``_BIT`` (its first bit in the descriptor) and ``_WIDTH``, for the generic
``<MAP>_DESC_GET``/``_DESC_SET`` accessors on a byte array; and, when it fits one 64-bit
little-endian load, ``_BYTE`` (where to load), ``_SHIFT`` and ``_MASK`` (in place in that
load). A field wider than 64 bits is given as 64-bit pieces ``<FIELD>_0``, ``<FIELD>_1``, ...
from its low end. ``<MAP>_<DESC>_SIZE`` is the descriptor's size in bytes.
"""

import re
from pathlib import Path

from amaranth.lib.data import ArrayLayout, Layout, StructLayout

from .regmap import RegisterMap

__all__ = ["c_header", "write_header", "descriptor_fields"]

_C_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _hex(value, wide=False):
    return f"0x{value:x}{'ull' if wide or value >> 32 else 'u'}"


def descriptor_fields(layout, prefix=""):
    """``[(name, bit, width)]`` of the leaf fields of ``layout`` (a StructLayout or
    ArrayLayout, nested ones flattened), by bit offset; names joined with ``_``. Fields whose
    name begins with ``_`` (reserved) are left out."""
    if not isinstance(layout, StructLayout | ArrayLayout):
        raise ValueError(f"descriptor layout must be a StructLayout or ArrayLayout, not "
                         f"{layout!r}")
    out = []
    for key, field in layout:
        if str(key).startswith("_"):
            continue
        name = f"{prefix}_{key}" if prefix else str(key)
        if not _C_NAME.match(name):
            raise ValueError(f"descriptor field name {name!r} is not a C identifier")
        if isinstance(field.shape, Layout):
            out += [(n, field.offset + bit, width)
                    for n, bit, width in descriptor_fields(field.shape, name)]
        else:
            out.append((name, field.offset, field.width))
    return sorted(out, key=lambda f: f[1])


def _pieces(name, bit, width):
    """A field split into pieces of at most 64 bits (itself when it fits)."""
    if width <= 64:
        return [(name, bit, width)]
    return [(f"{name}_{k}", bit + 64 * k, min(64, width - 64 * k))
            for k in range(-(-width // 64))]


def _helpers(p, lp):
    return f"""
/* Field of a register value: F is the field's macro prefix (F##_MASK, F##_SHIFT). */
#define {p}_FIELD_GET(F, value) (((value) & F##_MASK) >> F##_SHIFT)
#define {p}_FIELD_PREP(F, value) (((value) << F##_SHIFT) & F##_MASK)

/* Descriptor fields on a little-endian byte array, any alignment, up to 64 bits. */
static inline uint64_t {lp}_get_bits(const uint8_t *p, unsigned bit, unsigned width)
{{
    uint64_t value = 0;
    for (unsigned i = 0; i < width; i++)
        value |= (uint64_t)(p[(bit + i) >> 3] >> ((bit + i) & 7u) & 1u) << i;
    return value;
}}

static inline void {lp}_set_bits(uint8_t *p, unsigned bit, unsigned width, uint64_t value)
{{
    for (unsigned i = 0; i < width; i++) {{
        uint8_t m = (uint8_t)(1u << ((bit + i) & 7u));
        if (value >> i & 1u)
            p[(bit + i) >> 3] |= m;
        else
            p[(bit + i) >> 3] &= (uint8_t)~m;
    }}
}}

#define {p}_DESC_GET(buf, F) {lp}_get_bits((buf), F##_BIT, F##_WIDTH)
#define {p}_DESC_SET(buf, F, value) {lp}_set_bits((buf), F##_BIT, F##_WIDTH, (uint64_t)(value))
"""


class _Defines:
    def __init__(self):
        self.lines, self.names = [], set()

    def comment(self, text):
        text = text.replace("*/", "* /")
        self.lines.append(f"/* {text} */" if text else "")

    def define(self, name, value):
        if name in self.names:
            raise ValueError(f"C header: the macro {name} would be defined twice")
        self.names.add(name)
        self.lines.append(f"#define {name} {value}")


def c_header(regmap, layouts=None):
    """The text of a C header for ``regmap`` and the descriptor ``layouts``
    (``{name: StructLayout}``); macros are prefixed with the map's name in capitals."""
    if not isinstance(regmap, RegisterMap):
        raise TypeError(f"regmap must be a RegisterMap, not {regmap!r}")
    p, lp = regmap.name.upper(), regmap.name
    d = _Defines()
    d.comment(f"Registers of {regmap.name}: byte offsets on the AXI4-Lite bus (32-bit words).")
    d.define(f"{p}_REGS_END", _hex(regmap.end))
    for reg in regmap:
        shape = f"{reg.count} x {reg.width} bits, stride {reg.stride}" if reg.count > 1 \
            else f"{reg.width} bits"
        d.comment("")
        notes = [reg.doc.rstrip(".")] if reg.doc else []
        if reg.wide and reg.access == "RO":
            notes.append("Read _LO first: it latches _HI")
        d.comment(f"{reg.name} ({reg.access}, {shape}){': ' if notes else ''}"
                  + ". ".join(notes))
        r = f"{p}_{reg.name.upper()}"
        d.define(r, _hex(reg.offset))
        if reg.wide:
            d.define(f"{r}_LO", _hex(reg.addr(0, 0)))
            d.define(f"{r}_HI", _hex(reg.addr(0, 1)))
        d.define(f"{r}_WIDTH", f"{reg.width}u")
        if reg.count > 1:
            d.define(f"{r}_COUNT", f"{reg.count}u")
            d.define(f"{r}_STRIDE", _hex(reg.stride))
            d.define(f"{r}_ADDR(i)", f"({r} + (uint32_t)(i) * {r}_STRIDE)")
        for f in reg.fields:
            if f.doc:
                d.comment(f"{reg.name}.{f.name}: {f.doc}")
            d.define(f"{r}_{f.name.upper()}_SHIFT", f"{f.shift}u")
            d.define(f"{r}_{f.name.upper()}_WIDTH", f"{f.width}u")
            d.define(f"{r}_{f.name.upper()}_MASK", _hex(f.mask, reg.width > 32))
    for name, layout in (layouts or {}).items():
        if not _C_NAME.match(name):
            raise ValueError(f"descriptor name {name!r} is not a C identifier")
        desc = f"{p}_{name.upper()}"
        size = -(-layout.size // 8)
        d.comment("")
        d.comment(f"Descriptor {name}: {size} bytes, little-endian, fields from bit 0 of byte 0.")
        d.define(f"{desc}_SIZE", f"{size}u")
        for field, bit, width in descriptor_fields(layout):
            for piece, pbit, pwidth in _pieces(field, bit, width):
                f = f"{desc}_{piece.upper()}"
                d.define(f"{f}_BIT", f"{pbit}u")
                d.define(f"{f}_WIDTH", f"{pwidth}u")
                if pbit % 8 + pwidth <= 64:
                    d.define(f"{f}_BYTE", f"{pbit // 8}u")
                    d.define(f"{f}_SHIFT", f"{pbit % 8}u")
                    d.define(f"{f}_MASK", _hex(((1 << pwidth) - 1) << pbit % 8, True))
    guard = f"{p}_H"
    body = "\n".join(d.lines)
    return (f"/* Generated by iwarp_nic.host.cheader from the register map {regmap.name!r}: "
            f"do not edit. */\n#ifndef {guard}\n#define {guard}\n\n#include <stdint.h>\n\n"
            f"{body}\n{_helpers(p, lp)}\n#endif /* {guard} */\n")


def write_header(path, regmap, layouts=None):
    """Write :func:`c_header` to ``path`` (folders made as needed); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(c_header(regmap, layouts))
    return path
