"""Parallel CRC-32 engines: one beat of any width per cycle.

The two CRCs of the stack:

* CRC32c (Castagnoli, generator 0x1EDC6F41): the iSCSI digest of RFC 3720 (section 12.1,
  examples in appendix B.4), used by MPA for the CRC of every FPDU (RFC 5044 section 4);
* CRC-32 (generator 0x04C11DB7): the Ethernet frame check sequence, IEEE 802.3 clause 3.2.9.

A CRC is linear over GF(2): processing a beat of ``8 * data_bytes`` bits maps the 32-bit state
``S`` to ``A·S xor B·D``. The matrices ``A`` and ``B``, and the inverses that undo the zero bytes
padding a partial last beat, are computed in Python at elaboration time by running a bit-serial
CRC over unit vectors, so the gateware is XOR trees and a few muxes.
"""

import functools
import operator
from dataclasses import dataclass

from amaranth import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .stream import BeatStream, SkidBuffer, check_data_bytes

__all__ = ["CRCParams", "CRC32C", "CRC32", "CRCEngine", "CRC32CEngine", "CRC32Engine"]

_WIDTH = 32
_MASK = (1 << _WIDTH) - 1
#: Data bytes per XOR tree in the data stage: wider beats are split into registered partial sums.
_PART_BYTES = 16


def _reverse(value):
    return int(f"{value:032b}"[::-1], 2)


@dataclass(frozen=True)
class CRCParams:
    """A 32-bit CRC in the usual (Rocksoft) description.

    ``poly`` is the generator without its x^32 term (normal form, must be odd), ``init`` the
    register's start value and ``xorout`` what is XORed into the result. ``reflected`` means
    reflected in and out (both CRC-32s here are): bit 0 of each byte enters first and bit 0 of the
    result is the coefficient of x^31. Otherwise bit 7 enters first and bit 31 is x^31's.

    The methods model a bit-serial register that shifts towards bit 0 (bit ``i`` holds the
    coefficient of x^(31-i), whatever ``reflected`` says); the engine's matrices come from them.
    """

    poly: int
    init: int
    xorout: int
    reflected: bool = True

    def __post_init__(self):
        for name in ("poly", "init", "xorout"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 <= value <= _MASK:
                raise ValueError(f"{name} must be an integer in 0..0xFFFFFFFF, not {value!r}")
        if not self.poly & 1:
            # Without the x^0 term a zero bit cannot be undone, and the engine relies on that.
            raise ValueError(f"poly must have its x^0 term (be odd), not {self.poly:#x}")

    @property
    def start(self):
        """The register's value before the first bit."""
        return _reverse(self.init)

    def feed(self, state, data, nbytes):
        """The register after ``nbytes`` bytes of ``data`` (byte ``i`` in bits ``8i+7..8i``)."""
        rpoly = _reverse(self.poly)
        order = range(8) if self.reflected else range(7, -1, -1)
        for i in range(nbytes):
            for bit in order:
                fb = (state ^ (data >> (8 * i + bit))) & 1
                state = (state >> 1) ^ (rpoly if fb else 0)
        return state

    def unfeed_zeros(self, state, nbytes):
        """The register before ``nbytes`` zero bytes that led to ``state`` (inverse of feed)."""
        rpoly = _reverse(self.poly)
        for _ in range(8 * nbytes):
            fb = state >> (_WIDTH - 1)  # only the feedback term reaches bit 31 (poly is odd)
            state = (((state ^ (rpoly if fb else 0)) << 1) | fb) & _MASK
        return state


CRC32C = CRCParams(poly=0x1EDC6F41, init=0xFFFF_FFFF, xorout=0xFFFF_FFFF)
CRC32 = CRCParams(poly=0x04C11DB7, init=0xFFFF_FFFF, xorout=0xFFFF_FFFF)


def _matrix(func, inputs):
    """The rows (bit masks over ``inputs`` input bits) of the GF(2)-linear map ``func``."""
    columns = [func(1 << c) for c in range(inputs)]
    return [sum(((col >> r) & 1) << c for c, col in enumerate(columns)) for r in range(_WIDTH)]


@functools.cache
def _matrices(params, data_bytes):
    """``(A, B, undo)``: one beat is ``S' = A·S xor B·D``; ``undo[j]`` removes ``2**j`` zero
    bytes from the end of the data."""
    advance = _matrix(lambda s: params.feed(s, 0, data_bytes), _WIDTH)
    data = _matrix(lambda d: params.feed(0, d, data_bytes), 8 * data_bytes)
    undo = [_matrix(lambda s, n=1 << j: params.unfeed_zeros(s, n), _WIDTH)
            for j in range(data_bytes.bit_length() - 1)]
    return advance, data, undo


def _product(m, name, rows, vector):
    """A new 32-bit Signal ``name`` driven with ``rows · vector`` over GF(2)."""
    result = Signal(_WIDTH, name=name)
    m.d.comb += result.eq(Cat((vector & Const(row, len(vector))).xor() for row in rows))
    return result


class CRCEngine(wiring.Component):
    """The CRC of each packet of a byte stream, one beat per cycle at any ``data_bytes``.

    * ``i``: packets, as :func:`~iwarp_nic.stream.BeatStream` beats (AXI-Stream rules).
    * ``o``: one transfer per packet, in packet order: its CRC as the standard integer value
      (after ``xorout``; for CRC32c of ``b"123456789"`` that is 0xE3069283).
    * Throughput: one beat per cycle, sustained, back-to-back packets of any length >= 1 byte.
    * Latency: :attr:`latency` = ``3 + log2(data_bytes)`` cycles from the cycle a packet's last
      beat is accepted to the cycle its CRC is offered on ``o`` (with ``o.ready`` high).
    * Back-pressure: ``o`` ends in a :class:`~iwarp_nic.stream.SkidBuffer` whose registered
      ``ready`` stalls the whole pipeline; ``i.ready`` falls, nothing is lost.

    Structure (every stage but the state loop is a plain pipeline register):

    1. the beat, with the lanes past ``keep`` zeroed, so a partial last beat reads as the packet
       followed by ``k`` zero bytes;
    2. ``B·D`` as partial sums of at most 16 data bytes each, and ``k`` from ``keep``;
    3. the loop ``S' = A·S xor sum(partial sums)``: only XOR trees of about 32 inputs; after a
       last beat ``S`` returns to its start value (a register reset, no mux before the trees)
       and the padded result moves on;
    4. ``log2(data_bytes)`` registered stages, stage ``j`` undoing ``2**j`` zero bytes when bit
       ``j`` of ``k`` is set (a fixed 32x32 matrix, the inverse of "advance ``2**j`` zero
       bytes"), then ``xorout`` into the skid buffer.

    Parameters
    ----------
    params : CRCParams
        Which CRC (:data:`CRC32C`, :data:`CRC32` or another).
    data_bytes : int
        Bytes per beat, one of :data:`~iwarp_nic.stream.DATA_BYTES`.
    """

    def __init__(self, params, data_bytes):
        if not isinstance(params, CRCParams):
            raise ValueError(f"params must be a CRCParams, not {params!r}")
        self.params = params
        self.data_bytes = check_data_bytes(data_bytes)
        self.latency = 3 + data_bytes.bit_length() - 1
        super().__init__({
            "i": In(BeatStream(data_bytes)),
            "o": Out(stream.Signature(unsigned(_WIDTH))),
        })

    def elaborate(self, platform):
        m = Module()
        n, params = self.data_bytes, self.params
        advance, data, undo = _matrices(params, n)

        m.submodules.o_buffer = o_buffer = SkidBuffer(unsigned(_WIDTH))
        wiring.connect(m, o_buffer.o, wiring.flipped(self.o))
        run = o_buffer.i.ready  # a register: every stage below moves only when it is high
        m.d.comb += self.i.ready.eq(run)

        # Stage 1: the beat with unused lanes zeroed.
        beat = self.i.payload
        data1 = Signal(8 * n)
        keep1 = Signal(n)
        last1 = Signal()
        valid1 = Signal()
        masked = Cat(beat.data.word_select(j, 8) & beat.keep[j].replicate(8) for j in range(n))

        # Stage 2: partial sums of B·D, and k (the zero bytes padding a partial last beat).
        bits = 8 * _PART_BYTES
        partials = [
            _product(m, f"data_part{p}", [(row >> lo) & ((1 << bits) - 1) for row in data],
                     data1[lo:lo + bits])
            for p, lo in enumerate(range(0, 8 * n, bits))]
        parts2 = [Signal(_WIDTH, name=f"part{p}") for p in range(len(partials))]
        last2 = Signal()
        valid2 = Signal()
        # keep1 is contiguous from lane 0: its one 1->0 step at lane i means k = n - i.
        steps = {n - i: keep1[i - 1] & ~keep1[i] for i in range(1, n)}
        pad = Cat(Cat(step for k, step in steps.items() if k >> j & 1).any()
                  for j in range(len(undo)))
        pad2 = Signal(len(undo) or 1)  # Verilog has no zero-width wire: 1 bit, unused, at width 1

        # Stage 3: the state loop.
        state = Signal(_WIDTH, init=params.start)
        loop = Signal(_WIDTH)
        advanced = _product(m, "advanced", advance, state)
        m.d.comb += loop.eq(functools.reduce(operator.xor, parts2, advanced))

        with m.If(run):
            m.d.sync += [
                data1.eq(masked), keep1.eq(beat.keep), last1.eq(beat.last),
                valid1.eq(self.i.valid),
                *(reg.eq(part) for reg, part in zip(parts2, partials, strict=True)),
                pad2.eq(pad), last2.eq(last1), valid2.eq(valid1),
            ]
            with m.If(valid2):
                m.d.sync += state.eq(Mux(last2, params.start, loop))

        # Stage 4: undo the padding, one power of two per registered stage.
        value, value_pad, value_valid = loop, pad2, valid2 & last2
        for j, rows in enumerate(undo):
            held = Signal(_WIDTH, name=f"held{j}")
            held_pad = Signal(len(undo), name=f"held{j}_pad")
            held_valid = Signal(name=f"held{j}_valid")
            with m.If(run):
                m.d.sync += [held.eq(value), held_pad.eq(value_pad), held_valid.eq(value_valid)]
            value = Mux(held_pad[j], _product(m, f"undone{j}", rows, held), held)
            value_pad, value_valid = held_pad, held_valid

        crc = value if params.reflected else value[::-1]
        m.d.comb += [o_buffer.i.payload.eq(crc ^ params.xorout), o_buffer.i.valid.eq(value_valid)]
        return m


class CRC32CEngine(CRCEngine):
    """:class:`CRCEngine` for CRC32c (RFC 3720 / RFC 5044), the MPA FPDU CRC."""

    def __init__(self, data_bytes):
        super().__init__(CRC32C, data_bytes)


class CRC32Engine(CRCEngine):
    """:class:`CRCEngine` for the IEEE 802.3 CRC-32, the Ethernet FCS."""

    def __init__(self, data_bytes):
        super().__init__(CRC32, data_bytes)
