"""Cutting a DMA command into AXI4 INCR bursts: ARM IHI 0022 (AMBA AXI and ACE protocol
specification), A3.4.1 (burst length at most 256 transfers; a burst must not cross a 4 KiB
address boundary; INCR bursts may start at an unaligned address, A3.4.3).

The one splitter serves both directions: :class:`~.write.DmaWriter` and
:class:`~.read.DmaReader` each run their commands through a :class:`BurstSplitter`.

Bursts are cut at every multiple of the *chunk*, ``min(max_burst * data_bytes, 4096)`` bytes of
address, so a burst never crosses 4 KiB (4096 is a multiple of the chunk) and never has more
than ``max_burst`` beats; a burst after the first of a command starts chunk-aligned, as memory
controllers and PCIe bridges prefer.
"""

from amaranth import Cat, Const, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..axi import BOUNDARY, MAX_BURST, Axi4
from ..exact import add, is_zero, same, sub, wire, wrap_add, wrap_sub
from ..stream import check_data_bytes

__all__ = ["DmaCommand", "DmaDone", "BurstLayout", "BurstSplitter", "check_dma", "chunk_bits",
           "take_commands"]

#: A DMA command: ``length`` bytes (0 to 65535) at host address ``addr`` (any alignment). The
#: same layout as :data:`iwarp_nic.ddp.PlaceRequest`.
DmaCommand = data.StructLayout({"addr": 64, "length": 16})

#: A write command is done: every burst of it has its write response; ``error`` when any of them
#: was not OKAY (SLVERR or DECERR).
DmaDone = data.StructLayout({"error": 1})

#: Widths the DMA supports: the widths both :class:`~iwarp_nic.axi.Axi4` and the byte streams
#: (:data:`iwarp_nic.stream.DATA_BYTES`) allow.
DATA_BYTES = tuple(n for n in Axi4.DATA_BYTES if n in (1, 2, 4, 8, 16, 32, 64))


def check_dma(data_bytes, *, max_burst, outstanding, addr_width, what="outstanding"):
    """Validate the parameters the DMA blocks share (``outstanding`` named ``what``)."""
    if not isinstance(data_bytes, int) or data_bytes not in DATA_BYTES:
        raise ValueError(f"data_bytes must be one of {DATA_BYTES}, not {data_bytes!r}")
    check_data_bytes(data_bytes)
    if (not isinstance(max_burst, int) or not 1 <= max_burst <= MAX_BURST
            or max_burst & (max_burst - 1)):
        raise ValueError(f"max_burst must be a power of two from 1 to {MAX_BURST}, "
                         f"not {max_burst!r}")
    if not isinstance(outstanding, int) or not 3 <= outstanding <= 256:
        raise ValueError(f"{what} must be an integer from 3 to 256, not {outstanding!r}")
    if not isinstance(addr_width, int) or not 32 <= addr_width <= 64:
        raise ValueError(f"addr_width must be an integer from 32 to 64, not {addr_width!r}")


def chunk_bits(data_bytes, max_burst):
    """log2 of the chunk: bursts are cut at every multiple of ``2**chunk_bits`` bytes."""
    return min(max_burst * data_bytes, BOUNDARY).bit_length() - 1


def BurstLayout(data_bytes, addr_width):
    """One burst of a command: ``len`` + 1 beats from ``addr`` (the command's address for its
    first burst, chunk-aligned after); ``last`` on the command's last burst, where ``end`` is
    the lane of the command's last byte. ``empty``: the command had length 0 and this is its
    only transfer, which names no burst (``addr``, ``len`` and ``end`` mean nothing)."""
    lanes = data_bytes.bit_length() - 1
    return data.StructLayout({"addr": addr_width, "len": 8, "last": 1, "empty": 1,
                              "end": lanes})


def take_commands(m, command, split, offsets):
    """Pass the command stream ``command`` into the splitter ``split``, and each non-empty
    command's start lane (its address modulo the width) into the FIFO ``offsets``; a command
    waits while that FIFO is full."""
    nonempty = ~is_zero(command.payload.length)
    room = ~nonempty | offsets.w_rdy
    m.d.comb += [
        split.i.valid.eq(command.valid & room), split.i.payload.eq(command.payload),
        command.ready.eq(split.i.ready & room),
        offsets.w_en.eq(command.valid & command.ready & nonempty),
        offsets.w_data.eq(command.payload.addr[:offsets.width]),
    ]


class BurstSplitter(wiring.Component):
    """Cut each command into the bursts that cover its bytes, in address order.

    Ports
    -----
    i : In(stream.Signature(DmaCommand))
        Commands. ``addr`` is taken modulo ``2**addr_width``; a command must not run past the
        top of that address space (it would wrap into address 0's chunk).
    o : Out(stream.Signature(BurstLayout(data_bytes, addr_width)))
        Each command's bursts, ``last`` on its final one; a command of length 0 gives one
        transfer with ``empty`` and ``last`` set, so that users that count commands still
        see it in order.

    Throughput: one burst per cycle, back to back across commands: the next command is taken in
    the cycle the last burst of the one before leaves. Latency: a command's first burst is
    offered (from registers) the cycle after the command is taken. ``o`` may stall at any time;
    ``i.ready`` is high while no command is held, or with ``o.ready`` in the cycle the held
    command's last burst leaves.
    """

    def __init__(self, data_bytes, *, max_burst=16, addr_width=64):
        check_dma(data_bytes, max_burst=max_burst, outstanding=16, addr_width=addr_width)
        self.data_bytes, self.max_burst, self.addr_width = data_bytes, max_burst, addr_width
        super().__init__({
            "i": In(stream.Signature(DmaCommand)),
            "o": Out(stream.Signature(BurstLayout(data_bytes, addr_width))),
        })

    def elaborate(self, platform):
        m = Module()
        aw = self.addr_width
        lanes = self.data_bytes.bit_length() - 1
        cb = chunk_bits(self.data_bytes, self.max_burst)
        beat_bits = cb - lanes                  # bits of a beat index within a chunk, 0 to 8

        cur = Signal(aw)                        # the next burst's first byte
        end = Signal(aw)                        # the command's last byte
        busy = Signal()
        empty = Signal()
        cmd = self.i.payload
        out = self.o.payload

        last = wire(m, same(cur[cb:], end[cb:]), "last")
        if beat_bits:
            top = Signal(beat_bits)             # the burst's last beat within the chunk
            m.d.comb += top.eq(Cat(end[lanes:cb]))
            with m.If(~last):
                m.d.comb += top.eq(Const(-1, beat_bits))
            length = wrap_sub(m, top, cur[lanes:cb], beat_bits, "beats")
            awlen = Cat(length, Const(0, 8 - beat_bits)) if beat_bits < 8 else length
        else:
            awlen = Const(0, 8)
        m.d.comb += [
            self.o.valid.eq(busy),
            out.addr.eq(cur), out.len.eq(awlen), out.last.eq(last | empty), out.empty.eq(empty),
            out.end.eq(end[:lanes]),
        ]

        done = ~busy | (self.o.ready & (last | empty))
        m.d.comb += self.i.ready.eq(done)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += [cur.eq(Cat(Const(0, cb), add(cur[cb:], 1))), busy.eq(~(last | empty))]
        with m.If(self.i.valid & self.i.ready):
            start = wire(m, cmd.addr[:aw], "start")
            m.d.sync += [cur.eq(start), busy.eq(1), empty.eq(is_zero(cmd.length)),
                         end.eq(wrap_add(m, start, sub(cmd.length, 1), aw, "last_byte"))]
        return m
