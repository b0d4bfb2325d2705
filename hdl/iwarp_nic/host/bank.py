"""A register bank generated from a :class:`~.regmap.RegisterMap`, on an AXI4-Lite bus (ARM IHI
0022, part B, through :class:`~.axil.AxiLiteTarget`): the storage, status and doorbell logic of
each access kind of :mod:`.regmap`.
"""

from amaranth import Cat, Const, Module, Signal, Value, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.data import ArrayLayout, StructLayout
from amaranth.lib.wiring import In, Out

from ..axi import AxiLite
from ..counters import WordRead
from ..exact import eq, lt, select, sub, wire
from .axil import AxiLiteTarget
from .regmap import PULSE, RO, RW, W1C, WORD_BITS, RegisterMap

__all__ = ["PulseLayout", "RegisterBank", "pulse_index"]


def PulseLayout(register):
    """The transfer of a ``PULSE`` register's stream: the written ``value``, and for an array
    the element ``index``."""
    fields = {"value": unsigned(register.width)}
    if register.count > 1:
        fields["index"] = range(register.count)
    return StructLayout(fields)


def pulse_index(port):
    """The element a transfer of a ``PULSE`` register's stream ``port`` names: its ``index``,
    or 0 for a register of one element (its layout has no ``index``)."""
    payload = port.payload
    return payload.index if "index" in payload.shape().members else Const(0, 1)


def _shape(register):
    if register.count == 1:
        return unsigned(register.width)
    return ArrayLayout(unsigned(register.width), register.count)


def _zero_extended(value, width=WORD_BITS):
    return Cat(value, Const(0, width - len(value))) if len(value) < width else value


class RegisterBank(wiring.Component):
    """The registers of ``regmap`` behind an AXI4-Lite subordinate port.

    Ports
    -----
    s_axil : In(AxiLite(addr_width=regmap.addr_width, data_bytes=4))
        The host's bus.
    <name> of an RO register : In(width), or In(ArrayLayout(width, count))
        The value reads return (sampled the cycle after the read address is taken).
    stored : Out(WordRead(len(stored))), if ``stored`` names registers
        The RO registers named in ``stored`` (one word each, consecutive) are read from a
        memory instead of an input: a read of the ``k``-th of them (in address order) asks
        for word ``k`` in the cycle its address is taken and answers the data of the next.
    <name> of an RW register : Out(width), or Out(ArrayLayout(width, count))
        The stored value, from a register; a write shows from the cycle after it is taken.
    <name> of a W1C register : In(width)
        Event pulses: each bit high in a cycle sets that status bit.
    <name> of a PULSE register : Out(stream.Signature(PulseLayout(register)))
        One transfer per write (AXI-Stream ports ``m_axis_<name>_*``).
    irq : Out(1), if ``regmap.has_irq``
        High while a W1C register has a bit set whose enable bit is set; a combinational
        function of registers, so it follows a write or event by one cycle.

    Responses: a read or write of an unmapped word answers SLVERR (reads give 0, writes do
    nothing), and so does a write to an RO register (no effect). Reads of a PULSE register
    answer 0, OKAY. Partial strobes write only the strobed bytes of RW registers, clear only
    strobed bytes of W1C registers, and give 0 in the unstrobed bytes of a pulse value.

    Wide values: reading the low word of a wide RO register latches its high word (one latch
    per element) and reading the high word answers that latch; see :mod:`.regmap`.

    Concurrency, latency, throughput: reads and writes are served at the same time, one of
    each in flight (a read and a write taken in one cycle do not see each other). A read
    answers two cycles after its AR transfer is taken (three for a ``stored`` word); a
    write's B response is offered two cycles after the later of its AW and W transfers, then
    one write every two cycles while ``bready`` is high. A write to a PULSE register offers
    its transfer the cycle after AW and W are taken and holds it (and the B response) until
    the stream takes it; every other register answers at once.
    """

    def __init__(self, regmap, *, stored=()):
        if not isinstance(regmap, RegisterMap):
            raise TypeError(f"regmap must be a RegisterMap, not {regmap!r}")
        self.regmap = regmap
        self._stored_offsets = self._stored_words(regmap, stored)
        self._stored_names = frozenset(stored)
        members = {}
        if stored:
            members["stored"] = Out(WordRead(len(stored)))
        for reg in regmap:
            if reg.name in self._stored_names:
                continue
            if reg.access == RO or reg.access == W1C:
                members[reg.name] = In(_shape(reg))
            elif reg.access == RW:
                members[reg.name] = Out(_shape(reg), init=(reg.reset if reg.count == 1 else
                                                           [reg.reset] * reg.count))
            else:
                members[reg.name] = Out(stream.Signature(PulseLayout(reg)))
        self._target = AxiLiteTarget(regmap.addr_width, 4)
        members["s_axil"] = In(AxiLite(addr_width=regmap.addr_width, data_bytes=4))
        if regmap.has_irq:
            members["irq"] = Out(1)
        super().__init__(members)

    @staticmethod
    def _stored_words(regmap, names):
        """The byte offsets of the registers ``names``, each one word of an RO register, in
        address order; they must follow each other."""
        offsets = []
        for name in names:
            reg = regmap[name]
            if reg.access != RO or reg.count != 1 or reg.wide:
                raise ValueError(f"stored register {name!r} must be an RO register of one "
                                 f"word")
            offsets.append(regmap.offset(name))
        offsets.sort()
        if any(b - a != WORD_BITS // 8 for a, b in zip(offsets, offsets[1:])):
            raise ValueError("the stored registers must be consecutive words")
        return offsets

    def _element(self, reg, index):
        port = getattr(self, reg.name)
        return port if reg.count == 1 else port[index]

    def elaborate(self, platform):
        m = Module()
        m.submodules.target = target = self._target
        wiring.connect(m, wiring.flipped(self.s_axil), target.s_axil)
        regmap = self.regmap
        words = regmap.words()

        def hits(request, tag):
            index = request.payload.addr[2:]
            return {w.offset: wire(m, eq(index, w.offset >> 2), f"{tag}_{w.name}_{w.index}")
                    for w in words}

        # Write side: one write in flight; `pending` holds its answer until B is taken.
        wr, done = target.o_write, target.i_write_done
        whit = hits(wr, "w")
        pending, error = Signal(), Signal()
        strobed = Cat(bit.replicate(8) for bit in wr.payload.strb)
        data = wr.payload.data & strobed
        pulse_words = [w for w in words if w.register.access == PULSE]
        pulse_hit = Cat(whit[w.offset] for w in pulse_words).any()
        pulse_ready = Cat(whit[w.offset] & getattr(self, w.register.name).ready
                          for w in pulse_words).any()
        m.d.comb += wr.ready.eq(~pending & (~pulse_hit | pulse_ready))
        take = wire(m, wr.valid & wr.ready, "write_take")
        writable = Cat(whit[w.offset] for w in words if w.register.access != RO).any()
        with m.If(take):
            m.d.sync += [pending.eq(1), error.eq(~writable)]
        with m.If(done.valid & done.ready):
            m.d.sync += pending.eq(0)
        m.d.comb += [done.valid.eq(pending), done.payload.error.eq(error)]

        # Read side: one read in flight, its answer registered.
        rd, answer = target.o_read, target.i_read
        rhit = hits(rd, "r")
        r_pending = Signal()
        stored_wait = Signal()      # a stored word's read: its data comes in the next cycle
        m.d.comb += [rd.ready.eq(~r_pending & ~stored_wait), answer.valid.eq(r_pending)]
        read = wire(m, rd.valid & rd.ready, "read_take")
        in_stored = Const(0, 1)
        if self._stored_offsets:
            index, first = rd.payload.addr[2:], self._stored_offsets[0] >> 2
            after_first = ~lt(index, first) if first else Const(1, 1)
            in_stored = wire(m, after_first & lt(index, first + len(self._stored_offsets)),
                             "r_stored")
            m.d.comb += [self.stored.addr.eq(sub(index, first)[:len(self.stored.addr)]),
                         self.stored.en.eq(read & in_stored)]
            with m.If(stored_wait):
                m.d.sync += [stored_wait.eq(0), r_pending.eq(1),
                             answer.payload.data.eq(self.stored.data)]
        with m.If(read):
            m.d.sync += [r_pending.eq(~in_stored), stored_wait.eq(in_stored)]
        with m.If(answer.valid & answer.ready):
            m.d.sync += r_pending.eq(0)

        values = {}        # word offset -> its 32-bit read value
        irqs = []
        for reg in regmap:
            own = [w for w in words if w.register is reg]
            if reg.name in self._stored_names:
                continue
            if reg.access == RO:
                for w in own:
                    bits = Value.cast(self._element(reg, w.index))[w.lo:w.hi]
                    if w.half == 0:
                        values[w.offset] = _zero_extended(bits)
                        continue
                    latch = Signal(w.hi - w.lo, name=f"{reg.name}_{w.index}_latch")
                    with m.If(read & rhit[w.offset - 4]):
                        m.d.sync += latch.eq(bits)
                    values[w.offset] = _zero_extended(latch)
            elif reg.access == RW:
                for w in own:
                    bits = Value.cast(self._element(reg, w.index))[w.lo:w.hi]
                    n = w.hi - w.lo
                    with m.If(take & whit[w.offset]):
                        m.d.sync += bits.eq((bits & ~strobed[:n]) | data[:n])
                    values[w.offset] = _zero_extended(bits)
            elif reg.access == W1C:
                status = Signal(reg.width, name=f"{reg.name}_status")
                cleared = Cat(data[:w.hi - w.lo] & (take & whit[w.offset]).replicate(w.hi - w.lo)
                              for w in own)
                m.d.sync += status.eq((status & ~cleared) | getattr(self, reg.name))
                for w in own:
                    values[w.offset] = _zero_extended(status[w.lo:w.hi])
                if reg.enable is not None:
                    irqs.append((status & getattr(self, reg.enable)).any())
            else:
                port = getattr(self, reg.name)
                hit = [whit[w.offset] for w in own]
                m.d.comb += [port.valid.eq(wr.valid & ~pending & Cat(hit).any()),
                             port.payload.value.eq(data[:reg.width])]
                if reg.count > 1:
                    m.d.comb += port.payload.index.eq(Cat(
                        Cat(h for i, h in enumerate(hit) if i >> b & 1).any()
                        for b in range(len(port.payload.index))))
                for w in own:
                    values[w.offset] = Const(0, WORD_BITS)
        if regmap.has_irq:
            m.d.comb += self.irq.eq(Cat(irqs).any())

        # The read multiplexer: {data, error} by word; every other word gives {0, 1}.
        entries = {w.offset >> 2: Cat(values[w.offset], Const(0, 1)) for w in words
                   if w.offset in values}
        spare = next((k for k in range(1 << (regmap.addr_width - 2)) if k not in entries), None)
        if spare is not None:
            entries[spare] = Cat(Const(0, WORD_BITS), Const(1, 1))
        out = select(m, rd.payload.addr[2:], entries, WORD_BITS + 1, "read_mux")
        with m.If(read):
            m.d.sync += [answer.payload.data.eq(out[:WORD_BITS]),
                         answer.payload.error.eq(out[WORD_BITS] & ~in_stored)]
        return m
