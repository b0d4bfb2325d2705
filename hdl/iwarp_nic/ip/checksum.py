"""The Internet checksum in gateware: ones' complement sums of big-endian 16-bit words.

Implements RFC 1071 section 2 (the ones' complement sum, as a tree of 16-bit end-around-carry
adders, section 2 (A) "associative" and (B) "commutative") and RFC 1624 section 3 (incremental
update, eqn. 3: ``HC' = ~(~HC + ~m + m')``).

Everything here is combinational logic added to the caller's module ``m`` (each adder's result
is a named Signal, so a tree of them is elaborated once, not re-expanded per use). Every adder
has two 16-bit operands (Verilog lint wants equal widths), and a carry out of one is added back
in (end-around carry). A correct packet sums to 0xFFFF ("negative zero").
"""

from amaranth import Cat, Const, Mux, Signal, Value

__all__ = ["words", "ones_add", "ones_reduce", "ones_sum", "checksum", "lane_words"]


def words(wire, length):
    """The big-endian 16-bit words of ``length`` header bytes in lane order (byte ``i`` in bits
    ``[8*i, 8*i+8)``), an odd last byte padded with zero as RFC 1071 asks."""
    wire = Value.cast(wire)
    out = []
    for i in range(0, length, 2):
        low = wire[8 * (i + 1):8 * (i + 2)] if i + 1 < length else Const(0, 8)
        out.append(Cat(low, wire[8 * i:8 * (i + 1)]))
    return out


def ones_add(m, a, b, name):
    """A Signal: the 16-bit ones' complement sum of two 16-bit values."""
    total = Signal(17, name=f"{name}_total")
    out = Signal(16, name=name)
    m.d.comb += total.eq(a + b)
    # With a carry, the low half is at most 0xFFFE: adding the carry back cannot overflow.
    m.d.comb += out.eq(Mux(total[16], (total[:16] + 1)[:16], total[:16]))
    return out


def ones_reduce(m, values, name, levels=None):
    """The partial sums left after ``levels`` levels (all of them if None) of :func:`ones_sum`'s
    tree over 16-bit ``values``: a list, ``ceil(len(values) / 2**levels)`` long. Registering
    them splits a long sum over pipeline stages; :func:`ones_sum` finishes the tree."""
    values = list(values)
    level = 0
    while len(values) > 1 and (levels is None or level < levels):
        pairs = [ones_add(m, values[i], values[i + 1], f"{name}_l{level}_{i // 2}")
                 for i in range(0, len(values) - 1, 2)]
        values = pairs + values[len(values) - len(values) % 2:]
        level += 1
    return values


def ones_sum(m, values, name):
    """The ones' complement sum of 16-bit ``values``, by a balanced tree of :func:`ones_add`."""
    return ones_reduce(m, values, name)[0]


def checksum(m, wire, length, name):
    """The checksum field value for ``length`` header bytes whose checksum field is zero."""
    return ~ones_sum(m, words(wire, length), name)


def lane_words(data, keep, odd=None):
    """The big-endian words of one beat, lanes masked by ``keep``, for a beat that starts at an
    even stream offset. A 1-byte beat has no partner lane: ``odd`` (1 bit) says whether its byte
    is a low (odd offset) byte; it is required for 1-byte beats only."""
    n = len(keep)
    lanes = [data[8 * j:8 * j + 8] & keep[j].replicate(8) for j in range(n)]
    if n == 1:
        return [Cat(lanes[0] & odd.replicate(8), lanes[0] & (~odd).replicate(8))]
    return [Cat(lanes[j + 1], lanes[j]) for j in range(0, n, 2)]
