# amaranth: UnusedElaboratable=no
"""The host's register interface: the map description, the AXI4-Lite target, the generated bank,
the C header.

* The map: every validation error, the offsets of the example map against offsets written here
  by hand, field encode/decode, automatic placement.
* :class:`AxiLiteTarget` alone, at 32 and 64 bits, under the manager model of
  :mod:`iwarp_tb.axil` (random AW/W order, random ``bready``/``rready``, several writes and reads
  outstanding) with a responder that takes requests and answers them later with random stalls:
  every request appears once, in order, address aligned, and every response is the responder's.
* :class:`RegisterBank` of the example map, against :class:`~iwarp_tb.axil.RegisterModel`, a
  Python model of the access kinds written from :mod:`iwarp_nic.host.regmap`'s description:
  random single reads and writes (any address, partial strobes) between random RO input changes
  and W1C events; the RW outputs, the doorbell streams (randomly stalled) and ``irq`` after
  every step (one map with five RO words read from a memory, the bank's ``stored``); then
  writes and reads pipelined at the same time; then the throughput.
* The C header, compiled with ``cc``: a descriptor packed with its macros byte-for-byte equal to
  Amaranth's packing of the same values, and the register offsets equal to the map's.
"""

import random
import shutil
import subprocess

import pytest
from amaranth import Elaboratable, Module
from amaranth.back import verilog
from amaranth.lib import wiring
from amaranth.lib.data import ArrayLayout, StructLayout

from iwarp_nic.host import (
    PULSE,
    RO,
    RW,
    W1C,
    AxiLiteTarget,
    Field,
    Register,
    RegisterBank,
    RegisterMap,
    c_header,
    write_header,
)
from iwarp_nic.host import AxiLiteManager as GatewareManager
from iwarp_tb import toolchain
from iwarp_tb.amsim import run
from iwarp_tb.axil import OKAY, SLVERR, AxiLiteManager, AxiLitePort, RegisterModel, example_map
from iwarp_tb.lint import lint
from iwarp_tb.streams import AmaranthBus, StreamPort, collector, recv, send

M32 = 0xFFFF_FFFF


#: The example map's words, by hand: (name, index, offset).
OFFSETS = [("id", 0, 0x00), ("scratch", 0, 0x04), ("ctrl", 0, 0x08), ("rx_packets_lo", 0, 0x10),
           ("rx_packets_hi", 0, 0x14), ("ring_base_lo", 0, 0x18), ("ring_base_hi", 0, 0x1C),
           ("int_status", 0, 0x20), ("int_enable", 0, 0x24), ("link", 0, 0x28),
           ("kick", 0, 0x2C), ("qp_state", 3, 0x4C), ("doorbell", 0, 0x100),
           ("doorbell", 5, 0x128), ("doorbell", 15, 0x178)]


# --- the map ----------------------------------------------------------------------------------

def test_map_offsets_and_fields():
    regmap = example_map()
    for name, index, offset in OFFSETS:
        assert regmap.offset(name, index) == offset, name
    assert [w.offset for w in regmap.words()] == sorted(
        [0, 4, 8, 0x10, 0x14, 0x18, 0x1C, 0x20, 0x24, 0x28, 0x2C, 0x40, 0x44, 0x48, 0x4C]
        + [0x100 + 8 * k for k in range(16)])
    assert regmap.end == 0x17C and regmap.has_irq
    assert regmap.word_at(0x13).name == "rx_packets_lo" and regmap.word_at(0x104) is None
    ctrl = regmap["ctrl"]
    assert ctrl.encode(enable=1, mode=5) == 0x51
    assert ctrl.decode(0x51) == {"enable": 1, "mode": 5}
    assert regmap["ring_base"].field("page").mask == ((1 << 52) - 1) << 12
    with pytest.raises(ValueError, match="does not fit"):
        ctrl.encode(mode=8)
    with pytest.raises(KeyError):
        regmap.offset("nothing")
    with pytest.raises(IndexError):
        regmap.offset("doorbell", 16)
    # Automatic placement leaves the caller's Register as it was.
    reg = Register("b", None, RO)
    assert RegisterMap("m", [Register("a", 0x10, RO, width=64), reg]).offset("b") == 0x18
    assert reg.offset is None


@pytest.mark.parametrize("make, message", [
    (lambda: Register("Bad", 0, RO), "lower-case identifier"),
    (lambda: Register("irq", 0, RO), "reserved"),
    (lambda: Register("a", 2, RO), "not a multiple of 4"),
    (lambda: Register("a", 0, "RX"), "access must be one of"),
    (lambda: Register("a", 0, RO, width=65), "width must be an integer from 1 to 64"),
    (lambda: Register("a", 0, PULSE, width=33), "width must be an integer from 1 to 32"),
    (lambda: Register("a", 0, RW, width=64, count=2, stride=4), "stride 4 must be"),
    (lambda: Register("a", 0, RO, [Field("x", 4, 2), Field("y", 5, 3)]),
     r"fields 'x' \(bits 4-5\) and 'y' \(bits 5-7\) overlap"),
    (lambda: Register("a", 0, RO, [Field("x", 5, 3), Field("y", 4, 2)]),
     r"fields 'x' \(bits 5-7\) and 'y' \(bits 4-5\) overlap"),
    (lambda: Register("a", 0, RO, [Field("x", 30, 4)]), r"field 'x' \(bits 30-33\) does not fit"),
    (lambda: Register("a", 0, RO, [Field("x", 0), Field("x", 1)]), "two fields named 'x'"),
    (lambda: Field("x", 0, 0), "width must be an integer of 1 or more"),
    (lambda: Register("a", 0, RO, reset=1), "only an RW register has a reset"),
    (lambda: Register("a", 0, RW, width=4, reset=16), "reset must be an integer from 0 to 15"),
    (lambda: Register("a", 0, W1C, count=2), "W1C arrays"),
    (lambda: Register("a", 0, RO, enable="b"), "only a W1C register has an enable"),
    (lambda: RegisterMap("m", [Register("a", 0, RO, width=64), Register("b", 4, RW)]),
     r"registers 'a' \(0x0000..0x0007\) and 'b' \(0x0004..0x0007\) overlap at 0x0004"),
    (lambda: RegisterMap("m", [Register("a", 0, RO, count=4, stride=8),
                               Register("b", 0x10, RW)]), "overlap at 0x0010"),
    (lambda: RegisterMap("m", [Register("a", 0, RO), Register("a", 4, RO)]), "used twice"),
    (lambda: RegisterMap("m", [Register("a", 0, RO, width=40), Register("a_hi", 8, RO)]),
     "'a_hi' is used twice"),
    (lambda: RegisterMap("m", [Register("a", 0, W1C, enable="e")]), "not a register of the map"),
    (lambda: RegisterMap("m", [Register("a", 0, W1C, width=3, enable="e"),
                               Register("e", 4, RW, width=4)]), "single RW register of 3 bits"),
    (lambda: RegisterMap("m", [Register("a", 0xFFFC, RO, width=64)]), "beyond the 16-bit"),
])
def test_map_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# --- the AXI-Lite target alone --------------------------------------------------------------

def _responder(taken, n, rng, request, answer, make):
    """Testbenches of a register responder on a target's streams: take ``n`` requests into
    ``taken`` (randomly stalled) and answer each, once it has been taken, with
    ``make(request)`` (after random idle cycles)."""
    async def take(ctx):
        bus, port = AmaranthBus(ctx), StreamPort.amaranth(request)
        for _ in range(n):
            taken.extend(await recv(bus, port, 1, rng=rng, stall=0.4))

    async def give(ctx):
        bus, port = AmaranthBus(ctx), StreamPort.amaranth(answer)
        for k in range(n):
            while len(taken) <= k:       # answer only requests already made
                await ctx.tick()
            await send(bus, port, [make(taken[k])], rng=rng, idle=0.3)
    return take, give


@pytest.mark.parametrize("data_bytes", [4, 8])
def test_target(data_bytes):
    """Requests once each, in order, aligned; responses as the responder gave them."""
    rng = random.Random(data_bytes)
    dut = AxiLiteTarget(16, data_bytes)
    n = 150
    writes = [(rng.getrandbits(16), rng.getrandbits(8 * data_bytes),
               rng.getrandbits(data_bytes)) for _ in range(n)]
    reads = [rng.getrandbits(16) for _ in range(n)]
    lanes = data_bytes.bit_length() - 1

    def align(addr):
        return addr >> lanes << lanes

    def write_error(req):
        return (req["data"] ^ req["addr"] >> 2) & 1

    def read_answer(addr):
        return {"data": (addr * 0x9E37_79B9_7F4A_7C15) % (1 << 8 * data_bytes),
                "error": addr >> 3 & 1}

    taken = {"w": [], "r": []}
    got = {}

    async def manager_w(ctx):
        mgr = AxiLiteManager(AmaranthBus(ctx), AxiLitePort.amaranth(dut.s_axil), rng=rng,
                             idle=0.3, stall=0.4)
        got["b"] = await mgr.writes(writes)

    async def manager_r(ctx):
        mgr = AxiLiteManager(AmaranthBus(ctx), AxiLitePort.amaranth(dut.s_axil), rng=rng,
                             idle=0.3, stall=0.4)
        got["r"] = await mgr.reads(reads)

    run(dut, manager_w, manager_r,
        *_responder(taken["w"], n, rng, dut.o_write, dut.i_write_done,
                    lambda q: {"error": write_error(q)}),
        *_responder(taken["r"], n, rng, dut.o_read, dut.i_read,
                    lambda q: read_answer(q["addr"])),
        name=f"axil_target_{data_bytes}")
    assert taken["w"] == [{"addr": align(a), "data": d, "strb": s} for a, d, s in writes]
    assert got["b"] == [SLVERR if write_error(q) else OKAY for q in taken["w"]]
    assert taken["r"] == [{"addr": align(a)} for a in reads]
    answers = [read_answer(align(a)) for a in reads]
    assert got["r"] == [(q["data"], SLVERR if q["error"] else OKAY) for q in answers]


class _ManagerToTarget(Elaboratable):
    """The gateware manager on the bus of the target."""

    def __init__(self, data_bytes):
        self.manager = GatewareManager(16, data_bytes)
        self.target = AxiLiteTarget(16, data_bytes)

    def elaborate(self, platform):
        m = Module()
        m.submodules.manager, m.submodules.target = self.manager, self.target
        wiring.connect(m, self.manager.m_axil, self.target.s_axil)
        return m


@pytest.mark.parametrize("data_bytes", [4, 8])
def test_manager(data_bytes):
    """The gateware :class:`~iwarp_nic.host.axil.AxiLiteManager` in front of the target
    above: every write and read request fed in (random idle) reaches the responder once, in
    order, as it was made, and every answer comes back (randomly stalled) as the responder
    gave it, writes and reads at once."""
    rng = random.Random(10 + data_bytes)
    dut = _ManagerToTarget(data_bytes)
    n, low = 120, data_bytes.bit_length() - 1
    writes = [{"addr": rng.getrandbits(16 - low) << low, "data": rng.getrandbits(8 * data_bytes),
               "strb": rng.getrandbits(data_bytes)} for _ in range(n)]
    reads = [{"addr": rng.getrandbits(16 - low) << low} for _ in range(n)]
    taken = {"w": [], "r": []}
    got = {}

    def feed(port, requests):
        async def bench(ctx):
            await send(AmaranthBus(ctx), StreamPort.amaranth(port), requests, rng=rng, idle=0.3)
        return bench

    def collect(port, name):
        async def bench(ctx):
            got[name] = await recv(AmaranthBus(ctx), StreamPort.amaranth(port), n, rng=rng,
                                   stall=0.4)
        return bench

    def read_answer(q):
        return {"data": q["addr"] * 0x9E37_79B9 % (1 << 8 * data_bytes),
                "error": q["addr"] >> 4 & 1}

    manager, target = dut.manager, dut.target
    run(dut, feed(manager.i_write, writes), feed(manager.i_read, reads),
        collect(manager.o_write_done, "b"), collect(manager.o_read, "r"),
        *_responder(taken["w"], n, rng, target.o_write, target.i_write_done,
                    lambda q: {"error": q["data"] & 1}),
        *_responder(taken["r"], n, rng, target.o_read, target.i_read, read_answer),
        name=f"axil_manager_{data_bytes}")
    assert taken["w"] == writes and taken["r"] == reads
    assert got["b"] == [{"error": q["data"] & 1} for q in writes]
    assert got["r"] == [read_answer(q) for q in reads]


# --- the register bank ------------------------------------------------------------------------

def other_map():
    """Shapes the example map lacks: RW and RO arrays of 64-bit values, a wide W1C register
    with no enable (so no ``irq``), a 12-bit address space mapped up to its last word, and no
    PULSE register."""
    return RegisterMap("other", [
        Register("bases", 0x100, RW, width=64, count=3, stride=16, reset=0xDEAD_BEEF_0000_0001),
        Register("counters", None, RO, width=48, count=2),
        Register("events", 0x200, W1C, width=40),
        Register("flag", 0xFFC, RO, width=1),
    ], addr_width=12)


def stored_map():
    """Five consecutive RO words that the bank reads from a memory (``stored``), between
    registers of every other kind."""
    return RegisterMap("stored", [
        Register("id", 0x00, RO),
        Register("scratch", 0x04, RW),
        *(Register(f"count{k}", 0x10 + 4 * k, RO) for k in range(5)),
        Register("wide", None, RO, width=64),
        Register("events", 0x40, W1C, width=8),
    ], addr_width=12)


STORED = {"stored": tuple(f"count{k}" for k in range(5))}


def _addresses(rng, regmap):
    """A random address: mostly a mapped word (sometimes unaligned), else anywhere."""
    x = rng.random()
    if x < 0.75:
        return rng.choice(regmap.words()).offset + (rng.randrange(4) if x < 0.1 else 0)
    return rng.choice([rng.randrange(0x200), rng.getrandbits(regmap.addr_width)])


def _data(rng):
    return rng.choice([rng.getrandbits(32), M32, 0, 1 << rng.randrange(32)])


def _set_inputs(ctx, dut, model, rng):
    """New random values on every RO input (wide ones often about to carry into the high
    word), and in the memory of the ``stored`` ones (:func:`_stored_memory`)."""
    for (name, index) in model.inputs:
        reg = model.map[name]
        value = rng.getrandbits(reg.width)
        if reg.wide and rng.random() < 0.5:
            value = (rng.getrandbits(reg.width - 32) << 32) | M32 - rng.randrange(3)
        if name not in STORED.get(model.map.name, ()):
            port = getattr(dut, name)
            ctx.set(port if reg.count == 1 else port[index], value)
        model.inputs[(name, index)] = value


def _stored_memory(dut, model, rng):
    """The memory behind the bank's ``stored`` port: the word asked for in a cycle is the
    model's value in the next; random data in every other cycle."""
    names = STORED[model.map.name]

    async def memory(ctx):
        async for _clk, _rst, en, addr in ctx.tick().sample(dut.stored.en, dut.stored.addr):
            ctx.set(dut.stored.data, model.inputs[(names[addr], 0)] if en else
                    rng.getrandbits(32))
    return memory


def _check_outputs(ctx, dut, model, pulses):
    for (name, index), value in model.rw.items():
        port = getattr(dut, name)
        assert ctx.get(port if model.map[name].count == 1 else port[index]) == value, name
    if model.map.has_irq:
        assert ctx.get(dut.irq) == model.irq
    for name, expected in model.pulses.items():
        assert pulses.get(name, []) == expected, name


@pytest.mark.parametrize("make_map, seed", [(example_map, 1), (example_map, 2), (other_map, 3),
                                            (stored_map, 4)])
def test_bank_random(make_map, seed):
    """Single reads and writes of every kind, at random, against the model; with
    :func:`stored_map`, five of its RO words from a memory."""
    rng = random.Random(seed)
    regmap = make_map()
    dut = RegisterBank(regmap, stored=STORED.get(regmap.name, ()))
    model = RegisterModel(regmap)
    pulses = {}
    counts = {"read": 0, "write": 0, "slverr": 0}
    w1c = [r for r in regmap if r.access == W1C]

    async def main(ctx):
        mgr = AxiLiteManager(AmaranthBus(ctx), AxiLitePort.amaranth(dut.s_axil), rng=rng,
                             idle=0.3, stall=0.4)
        _check_outputs(ctx, dut, model, pulses)          # reset values
        for reg in w1c:                                 # all interrupts enabled at first
            if reg.enable:
                addr = regmap.offset(reg.enable)
                assert await mgr.write(addr, M32) == model.write(addr, M32, 0xF)
        for _ in range(500):
            x = rng.random()
            if x < 0.1:
                _set_inputs(ctx, dut, model, rng)
            elif x < 0.25:
                for reg in w1c:
                    events = rng.getrandbits(reg.width)
                    ctx.set(getattr(dut, reg.name), events)
                    model.status[reg.name] |= events
                await ctx.tick()
                for reg in w1c:
                    ctx.set(getattr(dut, reg.name), 0)
            addr = _addresses(rng, regmap)
            if rng.random() < 0.5:
                want = model.read(addr)
                assert await mgr.read(addr) == want, f"read {addr:#x}"
                counts["read"] += 1
                counts["slverr"] += want[1] == SLVERR
            else:
                data = _data(rng)
                strb = rng.choice([0xF, 0xF, rng.getrandbits(4)])
                want = model.write(addr, data, strb)
                assert await mgr.write(addr, data, strb) == want, f"write {addr:#x}"
                counts["write"] += 1
                counts["slverr"] += want == SLVERR
            await ctx.tick()
            _check_outputs(ctx, dut, model, pulses)
        # A wide counter about to carry: the high word is the one latched by the low read.
        reg = next(r for r in regmap if r.access == RO and r.wide)
        _set_inputs(ctx, dut, model, rng)
        port = getattr(dut, reg.name)
        port = port if reg.count == 1 else port[reg.count - 1]
        before = (rng.getrandbits(reg.width - 32) << 32) | M32
        ctx.set(port, before)
        lo = await mgr.read(reg.addr(reg.count - 1, 0))
        ctx.set(port, (before + 1) % (1 << reg.width))
        hi = await mgr.read(reg.addr(reg.count - 1, 1))
        assert (hi[0] << 32 | lo[0]) == before

    memory = [_stored_memory(dut, model, rng)] if regmap.name in STORED else []
    run(dut, main, name=f"bank_random_{regmap.name}_{seed}",
        monitors=[*memory, *(collector(pulses, r.name, getattr(dut, r.name), rng=rng, stall=0.5)
                             for r in regmap if r.access == PULSE)])
    assert counts["read"] > 150 and counts["write"] > 150 and counts["slverr"] > 30
    assert sum(len(v) for v in model.pulses.values()) > 20 or not model.pulses


def test_bank_pipelined():
    """Writes and reads pipelined at once: every response and pulse in order; a doorbell holds
    its write response until the stream takes it."""
    rng = random.Random(7)
    regmap = example_map()
    dut = RegisterBank(regmap)
    model = RegisterModel(regmap)
    pulses, got = {}, {}
    # Writes to anything but the registers the reads look at; reads of RO registers (whose
    # inputs stay still) and unmapped words, so that their answers do not depend on timing.
    write_words = [w.offset for w in regmap.words()
                   if w.register.name not in ("int_status",)]
    writes = [(rng.choice(write_words + [0x104, 0x3000]), _data(rng), rng.getrandbits(4) or 1)
              for _ in range(200)]
    reads = [rng.choice([0x00, 0x10, 0x14, 0x28, 0x40, 0x4C, 0x104, 0x8000]) for _ in range(200)]
    expect_b = [model.write(*op) for op in writes]

    async def inputs(ctx):
        _set_inputs(ctx, dut, model, rng)

    async def writer(ctx):
        await ctx.tick()
        got["b"] = await AxiLiteManager(AmaranthBus(ctx), AxiLitePort.amaranth(dut.s_axil),
                                        rng=rng, idle=0.2, stall=0.3).writes(writes)

    async def reader(ctx):
        await ctx.tick()
        got["r"] = await AxiLiteManager(AmaranthBus(ctx), AxiLitePort.amaranth(dut.s_axil),
                                        rng=rng, idle=0.2, stall=0.3).reads(reads)

    async def stalled_doorbell(ctx):
        """The doorbell stream refuses for 40 cycles: no write response meanwhile."""
        for _ in range(40):
            valid, bvalid = (await ctx.tick().sample(dut.doorbell.valid, dut.s_axil.bvalid))[2:]
            if valid:
                assert not bvalid
        got["db"] = await recv(AmaranthBus(ctx), StreamPort.amaranth(dut.doorbell),
                               len(model.pulses["doorbell"]), rng=rng, stall=0.5)

    run(dut, inputs, writer, reader, stalled_doorbell, name="bank_pipelined",
        monitors=[collector(pulses, "kick", dut.kick, rng=rng, stall=0.5)])
    assert got["b"] == expect_b
    assert got["db"] == model.pulses["doorbell"] and pulses["kick"] == model.pulses["kick"]
    assert got["r"] == [model.read(a) for a in reads]
    assert SLVERR in expect_b and OKAY in expect_b


def test_bank_stored_words_checked():
    """Only one-word RO registers that follow each other can be read from a memory."""
    regmap = stored_map()
    for name in ("scratch", "wide", "events"):
        with pytest.raises(ValueError, match="must be an RO register of one word"):
            RegisterBank(regmap, stored=(name,))
    with pytest.raises(ValueError, match="consecutive"):
        RegisterBank(regmap, stored=("count0", "count2"))


def test_w1c_event_wins():
    """An event in the very cycle a write clears its bit leaves the bit set; the bits the write
    clears without an event are cleared."""
    dut = RegisterBank(example_map())
    take = dut._target.o_write        # the request the bank takes in the clearing cycle
    got = []

    async def main(ctx):
        mgr = AxiLiteManager(AmaranthBus(ctx), AxiLitePort.amaranth(dut.s_axil))
        for events in (0b101, 0b010):
            ctx.set(dut.int_status, 0b111)
            await ctx.tick()
            ctx.set(dut.int_status, 0)
            got.append(await mgr.write(0x20, 0b111))
            got.append(await mgr.read(0x20))
            got.append(await mgr.write(0x20, 0b111))        # and with no event: all cleared
            got.append(await mgr.read(0x20))
            got.append(events)

    async def event(ctx):
        for events in (0b101, 0b010):
            for pulse in (events, 0):       # the clearing write of each pair, then the other
                while not (ctx.get(take.valid) and ctx.get(take.ready)):
                    await ctx.tick()
                ctx.set(dut.int_status, pulse)
                await ctx.tick()
                ctx.set(dut.int_status, 0)

    run(dut, main, event)
    assert got == [OKAY, (0b101, OKAY), OKAY, (0, OKAY), 0b101,
                   OKAY, (0b010, OKAY), OKAY, (0, OKAY), 0b010]


def test_bank_throughput():
    """With nothing stalling, a read is answered two cycles after its AR transfer, and writes
    (doorbells, whose stream is always ready) go one every two cycles."""
    dut = RegisterBank(example_map())
    clock = {"cycles": 0}
    got = {}

    async def count(ctx):
        while True:
            await ctx.tick()
            clock["cycles"] += 1

    async def main(ctx):
        bus, port = AmaranthBus(ctx), AxiLitePort.amaranth(dut.s_axil)
        mgr = AxiLiteManager(bus, port)
        ctx.set(dut.doorbell.ready, 1)
        ctx.set(port.rready, 1)
        ctx.set(port.araddr, 0x04)
        ctx.set(port.arvalid, 1)
        waited = None
        while True:
            arready, rvalid, rdata = await bus.edge(port.arready, port.rvalid, port.rdata)
            if rvalid:
                break
            if arready:
                ctx.set(port.arvalid, 0)
                waited = 0
            waited += 1
        got["read"] = (waited, rdata)
        start = clock["cycles"]
        await mgr.writes([(0x100 + 8 * k, k, 0xF) for k in range(20)])
        got["writes"] = clock["cycles"] - start

    run(dut, main, monitors=[count])
    assert got["read"] == (2, 0x1234_5678)
    assert got["writes"] <= 2 * 20 + 2


def test_bank_rejects_non_map():
    with pytest.raises(TypeError, match="must be a RegisterMap"):
        RegisterBank([Register("a", 0, RO)])


def test_lint(tmp_path):
    toolchain.setup()
    for name, component in [("csr_target", AxiLiteTarget()),
                            ("csr_target64", AxiLiteTarget(12, 8)),
                            ("csr_bank", RegisterBank(example_map())),
                            ("csr_bank_other", RegisterBank(other_map()))]:
        path = tmp_path / f"{name}.v"
        path.write_text(verilog.convert(component, name=name))
        assert lint(path) == "", name


# --- the C header -----------------------------------------------------------------------------

#: A descriptor with narrow, unaligned, 64-bit, over-64-bit, nested and array fields.
WQE = StructLayout({
    "opcode": 4, "flags": 3, "addr": 64, "length": 32, "stag": 32,
    "remote": StructLayout({"to": 64, "stag": 32, "odd": 61}),
    "sge": ArrayLayout(StructLayout({"len": 12, "key": 20}), 2),
    "big": 100, "_reserved": 3, "tail": 5,
})
CQE = StructLayout({"wr_id": 64, "status": 8, "qp": 24})


def _random_value(rng, layout, prefix, flat):
    """A random value of ``layout`` for ``layout.const``, and its leaves by flattened name."""
    if isinstance(layout, ArrayLayout):
        return [_random_value(rng, layout.elem_shape, f"{prefix}_{k}", flat)
                for k in range(layout.length)]
    if isinstance(layout, StructLayout):
        return {name: _random_value(rng, field.shape, f"{prefix}_{name}" if prefix else name,
                                    flat) for name, field in layout}
    width = layout if isinstance(layout, int) else layout.width
    if prefix.startswith("_"):
        return 0                # reserved: no macros, zero in memory
    value = rng.getrandbits(width)
    flat[prefix] = (value, width)
    return value


def _compile_and_run(tmp_path, source):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "main.c").write_text(source)
    subprocess.run([cc, "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-I",
                    str(tmp_path / "include"), "-o", str(tmp_path / "main"),
                    str(tmp_path / "main.c")], check=True, capture_output=True, text=True)
    return subprocess.run([str(tmp_path / "main")], check=True, capture_output=True,
                          text=True).stdout


def test_c_header(tmp_path):
    regmap = example_map()
    rng = random.Random(5)
    layouts = {"wqe": WQE, "cqe": CQE}
    write_header(tmp_path / "include" / "iwarp_nic.h", regmap, layouts)
    values, lines = {}, []
    for name, layout in layouts.items():
        flat = {}
        packed = layout.const(_random_value(rng, layout, "", flat)).as_value().value
        values[name] = (packed.to_bytes(-(-layout.size // 8), "little"), flat)
        P = f"IWARP_NIC_{name.upper()}"
        lines += [f"  {{ uint8_t a[{P}_SIZE + 8] = {{0}}, b[{P}_SIZE + 8] = {{0}};"]
        for leaf, (value, width) in flat.items():
            pieces = [(leaf, value)] if width <= 64 else [
                (f"{leaf}_{k}", value >> 64 * k & (1 << 64) - 1)
                for k in range(-(-width // 64))]
            for piece, v in pieces:
                F = f"{P}_{piece.upper()}"
                lines += [f"    IWARP_NIC_DESC_SET(a, {F}, {v:#x}ull);",
                          f"    if (IWARP_NIC_DESC_GET(a, {F}) != {v:#x}ull) "
                          f'printf("get {piece} wrong\\n");',
                          f"#ifdef {F}_BYTE",
                          f"    put(b, {F}_BYTE, {F}_SHIFT, {F}_MASK, {v:#x}ull); direct++;",
                          "#else",
                          f"    IWARP_NIC_DESC_SET(b, {F}, {v:#x}ull);",
                          "#endif"]
        lines += [f'    dump("{name}", a, {P}_SIZE); dump("{name}_direct", b, {P}_SIZE);',
                  f'    printf("{name}_pad %d\\n", a[{P}_SIZE] | b[{P}_SIZE]); }}']
    arrays = {r.name for r in regmap if r.count > 1}
    for name, index, _ in OFFSETS:
        macro = f"IWARP_NIC_{name.upper()}" + (f"_ADDR({index})" if name in arrays else "")
        lines.append(f'  printf("off {name} {index} %u\\n", (unsigned)({macro}));')
    lines += ['  printf("field %u %u %llx\\n", (unsigned)IWARP_NIC_CTRL_MODE_SHIFT, '
              "(unsigned)IWARP_NIC_CTRL_MODE_WIDTH, "
              "(unsigned long long)IWARP_NIC_RING_BASE_PAGE_MASK);",
              '  printf("prep %x\\n", (unsigned)IWARP_NIC_FIELD_PREP(IWARP_NIC_CTRL_MODE, 5u));',
              '  printf("get %x\\n", (unsigned)IWARP_NIC_FIELD_GET(IWARP_NIC_LINK_SPEED, 0x1bu));',
              '  printf("array %u %u\\n", (unsigned)IWARP_NIC_DOORBELL_COUNT, '
              "(unsigned)IWARP_NIC_DOORBELL_STRIDE);",
              '  printf("direct %d\\n", direct);']
    source = ("#include <stdio.h>\n#include \"iwarp_nic.h\"\n"
              "static void put(uint8_t *p, unsigned byte, unsigned shift, uint64_t mask, "
              "uint64_t v) {\n  uint64_t w = 0;\n"
              "  for (int i = 0; i < 8; i++) w |= (uint64_t)p[byte + i] << 8 * i;\n"
              "  w = (w & ~mask) | ((v << shift) & mask);\n"
              "  for (int i = 0; i < 8; i++) p[byte + i] = (uint8_t)(w >> 8 * i);\n}\n"
              "static void dump(const char *name, const uint8_t *p, unsigned n) {\n"
              '  printf("%s ", name);\n  for (unsigned i = 0; i < n; i++) printf("%02x", p[i]);\n'
              '  printf("\\n");\n}\n'
              "int main(void) {\n  int direct = 0;\n" + "\n".join(lines) + "\n  return 0;\n}\n")
    out = _compile_and_run(tmp_path, source).splitlines()
    assert not [line for line in out if "wrong" in line]
    got = dict(line.split(" ", 1) for line in out if not line.startswith("off "))
    for name, (packed, _) in values.items():
        assert got[name] == packed.hex(), name
        assert got[f"{name}_direct"] == packed.hex(), name
        assert got[f"{name}_pad"] == "0"
    offsets = [tuple(line.split()[1:]) for line in out if line.startswith("off ")]
    assert offsets == [(n, str(i), str(o)) for n, i, o in OFFSETS]
    assert got["field"] == f"4 3 {((1 << 52) - 1) << 12:x}"
    assert got["prep"] == "50" and got["get"] == "d"
    assert got["array"] == "16 8"
    assert int(got["direct"]) > 10        # most fields fit one 64-bit load
    text = c_header(regmap, layouts)
    assert "#ifndef IWARP_NIC_H" in text and "IWARP_NIC_WQE_ADDR_BYTE" not in text  # bit 7 + 64
    assert "RESERVED" not in text


def test_c_header_project_descriptors(tmp_path):
    """The header of the example map and the project's own descriptors compiles cleanly."""
    from iwarp_nic.host.formats import Cqe, RqWqe, SqWqe

    write_header(tmp_path / "include" / "iwarp_nic.h", example_map(),
                 {"sq_wqe": SqWqe, "rq_wqe": RqWqe, "cqe": Cqe})
    out = _compile_and_run(tmp_path, '#include <stdio.h>\n#include "iwarp_nic.h"\n'
                           'int main(void) { printf("%u %u %u\\n", IWARP_NIC_SQ_WQE_SIZE, '
                           "IWARP_NIC_RQ_WQE_SIZE, IWARP_NIC_CQE_SIZE); return 0; }\n")
    assert out.split() == [str(layout.size // 8) for layout in (SqWqe, RqWqe, Cqe)]


def test_c_header_nic(tmp_path):
    """``python -m iwarp_nic header``: the NIC's own header compiles, and its offsets (every
    counter register's too) and sizes are the map's and the layouts'."""
    from iwarp_nic.__main__ import main
    from iwarp_nic.host.nicmap import COUNTERS, header_layouts, nic_map

    assert main(["header", "--out", str(tmp_path / "include" / "iwarp_nic.h")]) == 0
    sizes = {"conns": 16, "cqs": 16, "srqs": 4}
    regmap, layouts = nic_map(**sizes), header_layouts(**sizes, pd_bits=16, stag_entries=4096)
    names = ["command", "cmd_args", "event0_lo", "sq_doorbell", "cq_head", "srq_doorbell",
             *COUNTERS]
    out = _compile_and_run(tmp_path, '#include <stdio.h>\n#include "iwarp_nic.h"\n'
                           "int main(void) {\n" + "".join(
                               f'  printf("%u\\n", (unsigned)IWARP_NIC_{n.upper()});\n'
                               for n in names) + "".join(
                               f'  printf("%u\\n", (unsigned)IWARP_NIC_{n.upper()}_SIZE);\n'
                               for n in layouts) + "  return 0;\n}\n")
    assert out.split() == [str(regmap.offset(n)) for n in names] + [
        str(-(-layout.size // 8)) for layout in layouts.values()]


def test_c_header_errors():
    regmap = RegisterMap("m", [Register("a_size", 0, RO)])
    with pytest.raises(ValueError, match="M_A_SIZE would be defined twice"):
        c_header(regmap, {"a": StructLayout({"x": 1})})
    with pytest.raises(ValueError, match="not a C identifier"):
        c_header(regmap, {"a-b": StructLayout({"x": 1})})
