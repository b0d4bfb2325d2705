"""Byte streams: the beat layout every datapath block speaks, and register slices (a skid buffer
at full rate, a one-entry slice at half rate).

A *beat* is one transfer of a byte stream, ``{data, keep, last}`` plus ``err`` where a packet can
be found bad only at its end. AXI-Stream rules apply:

* lane 0 (``data[0:8]``) is the first byte on the wire;
* ``keep`` is all ones except on a ``last`` beat, where it is contiguous from lane 0
  (``0b0...01...1``) and never zero: there are no empty beats;
* ``err`` is meaningful on ``last`` beats only and marks the whole packet bad.

A *packet* on a parsed interface is a header stream (one transfer per packet, see
:mod:`iwarp_nic.hdrparse`) plus a payload stream of beats.

``data_bytes`` is the datapath width in bytes, one of :data:`DATA_BYTES`: 1 byte at 125 MHz is the
1G configuration, 8 bytes at 156.25 MHz the 10G one.
"""

from amaranth import Module, Mux, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .exact import mask, select
from .tcp.layouts import conn_bits

__all__ = ["DATA_BYTES", "check_data_bytes", "BeatLayout", "BeatStream", "keep_count", "SkidBuffer",
           "HalfRateSlice", "sliced", "pass_through"]

#: Datapath widths, in bytes per beat, that every streaming block supports.
DATA_BYTES = (1, 2, 4, 8, 16, 32, 64)


def check_data_bytes(data_bytes, *, what="data_bytes"):
    """Validate a width parameter; return it."""
    if not isinstance(data_bytes, int) or data_bytes not in DATA_BYTES:
        raise ValueError(f"{what} must be one of {DATA_BYTES}, not {data_bytes!r}")
    return data_bytes


def BeatLayout(data_bytes, *, err=False, conns=None):
    """The layout of one beat of a ``data_bytes``-wide byte stream; with ``conns``, of one that
    interleaves the packets of that many connections, each beat naming its own (``conn``)."""
    check_data_bytes(data_bytes)
    fields = {"data": 8 * data_bytes, "keep": data_bytes, "last": 1}
    if err:
        fields["err"] = 1
    if conns is not None:
        fields["conn"] = conn_bits(conns)
    return data.StructLayout(fields)


def BeatStream(data_bytes, *, err=False, conns=None):
    """``stream.Signature`` of a byte stream of :func:`BeatLayout` beats."""
    return stream.Signature(BeatLayout(data_bytes, err=err, conns=conns))


def pass_through(m, outer, inner, names, *, rename=None):
    """Connect the ports ``names`` of ``inner``, a submodule of the component ``outer``, to
    ``outer``'s ports of the same names (or of the names ``rename(name)`` gives): streams with
    ``wiring.connect``, plain ports by flow."""
    for name in names:
        outer_name = rename(name) if rename else name
        member, mine, theirs = outer.signature.members[outer_name], getattr(outer, outer_name), \
            getattr(inner, name)
        inward = member.flow == wiring.In
        if member.is_port:
            m.d.comb += theirs.eq(mine) if inward else mine.eq(theirs)
        elif inward:
            wiring.connect(m, wiring.flipped(mine), theirs)
        else:
            wiring.connect(m, theirs, wiring.flipped(mine))


def keep_count(m, keep, data_bytes, name):
    """The bytes of a beat: the number of lanes of a ``keep`` contiguous from lane 0, as a
    Signal of ``data_bytes.bit_length()`` bits (``data_bytes`` for a ``keep`` not of that form)."""
    return select(m, keep, {mask(k): k for k in range(data_bytes + 1)},
                  data_bytes.bit_length(), name)


class SkidBuffer(wiring.Component):
    """A two-entry register slice that cuts every combinational path between ``i`` and ``o``.

    ``o.payload``/``o.valid`` come from a register, and so does ``i.ready``: a chain of blocks can
    be split anywhere for timing with no loss of throughput.

    * Throughput: one transfer per cycle, sustained, in both directions of back-pressure.
    * Latency: one cycle from ``i`` to ``o``.
    * Order and content are preserved exactly; it never drops or duplicates a transfer.

    Parameters
    ----------
    shape : shape-like
        The payload shape (any ``stream.Signature`` payload, beats included).
    """

    def __init__(self, shape):
        self._shape = shape
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        # `main` feeds o; `skid` catches the one transfer accepted while o stalled.
        main = Signal(self._shape)
        main_valid = Signal()
        skid = Signal(self._shape)
        skid_valid = Signal()

        m.d.comb += [
            self.i.ready.eq(~skid_valid),
            self.o.valid.eq(main_valid),
            self.o.payload.eq(main),
        ]
        take = self.i.valid & self.i.ready
        with m.If(~main_valid | self.o.ready):
            # main is free this cycle: refill it from the skid slot first, then from the input.
            m.d.sync += [
                Value.cast(main).eq(
                    Mux(skid_valid, Value.cast(skid), Value.cast(self.i.payload))),
                main_valid.eq(skid_valid | take),
                skid_valid.eq(0),
            ]
        with m.Elif(take):
            m.d.sync += [skid.eq(self.i.payload), skid_valid.eq(1)]
        return m


class HalfRateSlice(wiring.Component):
    """A one-entry register slice: it cuts every path between ``i`` and ``o`` as
    :class:`SkidBuffer` does, for half its flip-flops and none of its multiplexers, at half its
    rate.

    ``o.payload``/``o.valid`` come from a register, and ``i.ready`` is the register's emptiness:
    a transfer is taken only into an empty slice, and leaves it a cycle or more later.

    * Throughput: one transfer every other cycle at most. Meant for streams that carry one
      transfer per packet, segment or request, where the blocks on either side already spend
      two cycles or more on each (a segment's header beside its beats, a request taking several
      cycles of a state machine): there the rate is never the limit, and the payload (often a
      header of hundreds of bits) is held once rather than twice.
    * Latency: one cycle from ``i`` to ``o``.
    * Order and content are preserved exactly; it never drops or duplicates a transfer.

    Parameters
    ----------
    shape : shape-like
        The payload shape.
    """

    def __init__(self, shape):
        self._shape = shape
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        held = Signal(self._shape)
        full = Signal()
        m.d.comb += [
            self.i.ready.eq(~full),
            self.o.valid.eq(full),
            self.o.payload.eq(held),
        ]
        with m.If(self.i.valid & ~full):
            m.d.sync += [held.eq(self.i.payload), full.eq(1)]
        with m.Elif(self.o.ready):
            m.d.sync += full.eq(0)
        return m


def sliced(m, name, source, sink, *, half_rate=False):
    """Connect ``source`` to ``sink`` through a :class:`SkidBuffer` (submodule ``name``), or a
    :class:`HalfRateSlice` with ``half_rate``: the two ends' valid, ready and payload then meet
    only at registers, for one cycle more."""
    kind = HalfRateSlice if half_rate else SkidBuffer
    buffer = m.submodules[name] = kind(source.payload.shape())
    wiring.connect(m, source, buffer.i)
    wiring.connect(m, buffer.o, sink)
