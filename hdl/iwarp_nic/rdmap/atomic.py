"""The responder's atomic operation: RFC 7306 section 5.2 (FetchAdd and CmpSwap on 8 octets,
with their masks: a FetchAdd's add mask ends its fields, a CmpSwap compares and swaps the bits
of its masks), executed as a read-modify-write of host memory, little-endian as the model's
host memory is.

:class:`AtomicExecutor` performs one operation at a time on the memory side of the responder:
between its read and its write no other atomic of this executor runs, which makes atomics of
every stream that shares it atomic with respect to each other (RFC 7306 section 5: atomicity
is owed to other atomics of the RNIC, not to the host's processors).
"""

from amaranth import Module, Mux, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.data import StructLayout
from amaranth.lib.wiring import In, Out

from ..exact import Machine, is_zero

__all__ = ["HostAtomic", "HostWord", "atomic_result", "AtomicExecutor"]

#: One atomic operation on the 8 octets of host memory at ``addr``: a CmpSwap when
#: ``cmp_swap``, else a FetchAdd; the operands of the Atomic Request (RFC 7306 figure 10).
HostAtomic = StructLayout({"addr": 64, "cmp_swap": 1, "add_swap_data": 64,
                           "add_swap_mask": 64, "compare_data": 64, "compare_mask": 64})

#: 8 octets of host memory at ``addr`` (``data`` little-endian: the octet at ``addr`` in bits
#: 0 to 7).
HostWord = StructLayout({"addr": 64, "data": 64})


def atomic_result(op, original):
    """The value ``op`` (a :data:`HostAtomic`) leaves in memory over ``original``, as the model's
    ``_atomic_result`` works it out.

    FetchAdd: a set bit of the add mask ends a field, so no carry leaves it. Adding the operands
    with those bits cleared lets the carry chain run inside each field and stop at its end (the
    cleared bit absorbs the carry and shows it); the end bit's own sum bit is then that carry
    XOR the operands' bits. CmpSwap: the swap data replaces the bits of the swap mask when the
    bits of the compare mask match.
    """
    a, b, ends = original, op.add_swap_data, op.add_swap_mask
    inner = ((a & ~ends) + (b & ~ends))[:64]
    added = inner ^ ((a ^ b) & ends)
    match = is_zero((original ^ op.compare_data) & op.compare_mask)
    swapped = (original & ~op.add_swap_mask) | (op.add_swap_data & op.add_swap_mask)
    return Mux(op.cmp_swap, Mux(match, swapped, original), added)


class AtomicExecutor(wiring.Component):
    """Read-modify-write 8 octets of host memory for each atomic operation, one at a time.

    Ports
    -----
    i_atomic : In(stream.Signature(HostAtomic))
        The operations, each with its host address (8-octet aligned: the responder checked).
    o_read : Out(stream.Signature(unsigned(64)))
        A read of the 8 octets at the address given.
    i_read : In(stream.Signature(unsigned(64)))
        Its data, little-endian.
    o_write : Out(stream.Signature(HostWord))
        The new value, written back; the memory side orders any later read after it.
    o_original : Out(stream.Signature(unsigned(64)))
        The value found, one per operation, once its write has been taken (the Atomic
        Response's Original Remote Data).

    Latency: the read is offered a cycle after the operation is taken, the write two cycles after
    the data arrives, the original value a cycle after the write is taken. Throughput: one
    operation per memory round trip plus five cycles.
    """

    def __init__(self):
        super().__init__({
            "i_atomic": In(stream.Signature(HostAtomic)),
            "o_read": Out(stream.Signature(unsigned(64))),
            "i_read": In(stream.Signature(unsigned(64))),
            "o_write": Out(stream.Signature(HostWord)),
            "o_original": Out(stream.Signature(unsigned(64))),
        })

    def elaborate(self, platform):
        m = Module()
        op = Signal(HostAtomic)
        result = Signal(64)
        original = self.o_original.payload
        m.d.comb += [self.o_read.payload.eq(op.addr), self.o_write.payload.addr.eq(op.addr),
                     self.o_write.payload.data.eq(result)]

        stage = Machine(m, ["TAKE", "READ", "AWAIT", "MODIFY", "WRITE", "ANSWER"], "atomic")
        with stage.state("TAKE"):
            m.d.comb += self.i_atomic.ready.eq(1)
            with m.If(self.i_atomic.valid):
                m.d.sync += op.eq(self.i_atomic.payload)
                stage.goto("READ")
        with stage.state("READ"):
            m.d.comb += self.o_read.valid.eq(1)
            with m.If(self.o_read.ready):
                stage.goto("AWAIT")
        with stage.state("AWAIT"):
            m.d.comb += self.i_read.ready.eq(1)
            with m.If(self.i_read.valid):
                m.d.sync += original.eq(self.i_read.payload)
                stage.goto("MODIFY")
        with stage.state("MODIFY"):
            m.d.sync += result.eq(atomic_result(op, original))
            stage.goto("WRITE")
        with stage.state("WRITE"):
            m.d.comb += self.o_write.valid.eq(1)
            with m.If(self.o_write.ready):
                stage.goto("ANSWER")
        with stage.state("ANSWER"):
            m.d.comb += self.o_original.valid.eq(1)
            with m.If(self.o_original.ready):
                stage.goto("TAKE")
        return m
