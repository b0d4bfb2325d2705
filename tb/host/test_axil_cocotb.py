"""The register bank of the example map as generated Verilog, under cocotbext-axi's
``AxiLiteMaster`` (an AXI4-Lite manager no one here wrote), against
:class:`iwarp_tb.axil.RegisterModel`.

Every channel of the manager pauses at random (AW, W, B, AR, R) and the doorbell streams'
``tready`` drops at random. Checked: the reset values of every word; then random reads and
writes of every kind (full words, and partial ones of 1 to 3 bytes at any byte offset, which
cocotbext turns into write strobes), with the RO inputs changed and W1C events pulsed between
them: each response, each read value, the RW outputs, every doorbell transfer and ``irq``; that
no write response is offered while a doorbell transfer waits; then writes and reads issued
together, many outstanding.
"""

import random
from pathlib import Path

import cocotb
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiLiteBus, AxiLiteMaster

from iwarp_nic.host import RegisterBank
from iwarp_tb import cocotb_env
from iwarp_tb.axil import OKAY, SLVERR, RegisterModel, example_map
from iwarp_tb.runner import run_cocotb
from iwarp_tb.streams import StreamPort, recv


def pauses(rng, chance):
    while True:
        yield rng.random() < chance


async def setup(dut):
    rng = cocotb_env.rng()
    for name in ("id", "rx_packets", "link", "qp_state", "int_status"):
        getattr(dut, name).value = 0
    for name in ("doorbell", "kick"):
        getattr(dut, f"m_axis_{name}_tready").value = 0
    bus = await cocotb_env.start(dut)
    master = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.clk, dut.rst)
    for channel in (master.write_if.aw_channel, master.write_if.w_channel,
                    master.write_if.b_channel, master.read_if.ar_channel,
                    master.read_if.r_channel):
        channel.set_pause_generator(pauses(rng, 0.3))
    regmap = example_map()
    model = RegisterModel(regmap)
    got = {"doorbell": [], "kick": []}
    for name in got:
        cocotb.start_soon(sink(bus, dut, name, got[name], rng))
    cocotb.start_soon(doorbell_holds_b(dut))
    return rng, master, regmap, model, got


async def sink(bus, dut, name, got, rng):
    """Take the PULSE stream ``name`` for ever, ``tready`` low 40% of the time."""
    port = StreamPort.axis(dut, f"m_axis_{name}")
    while True:
        got += [t["data"] for t in await recv(bus, port, 1, rng=rng, stall=0.4,
                                              timeout=1 << 30)]


async def doorbell_holds_b(dut):
    """While a doorbell transfer waits, its write's response is not offered."""
    while True:
        await RisingEdge(dut.clk)
        if int(dut.m_axis_doorbell_tvalid.value):
            assert not int(dut.s_axil_bvalid.value), "write response before the doorbell left"


def pulses(regmap, name, words):
    """The model's ``{"value", "index"}`` transfers as the packed ``tdata`` of the stream
    (``value`` in the low bits, then ``index``)."""
    width = regmap[name].width
    return [p["value"] | p.get("index", 0) << width for p in words]


def set_inputs(dut, model, rng):
    for (name, index) in model.inputs:
        width = model.map[name].width
        model.inputs[(name, index)] = rng.getrandbits(width)
    dut.id.value = model.inputs[("id", 0)]
    dut.link.value = model.inputs[("link", 0)]
    dut.rx_packets.value = model.inputs[("rx_packets", 0)]
    dut.qp_state.value = sum(model.inputs[("qp_state", k)] << 4 * k for k in range(4))


async def check_outputs(dut, model, regmap, got):
    await ClockCycles(dut.clk, 1)
    for (name, _), value in model.rw.items():        # no RW arrays in the example map
        assert int(getattr(dut, name).value) == value, name
    assert int(dut.irq.value) == model.irq
    for name in got:
        want = pulses(regmap, name, model.pulses[name])
        for _ in range(50):         # the last one may still wait for tready
            if len(got[name]) == len(want):
                break
            await RisingEdge(dut.clk)
        assert got[name] == want, name


async def read(master, model, addr, length):
    """A read of ``length`` bytes at ``addr`` (within one word) against the model."""
    data, resp = model.read(addr)
    shift = addr % 4
    answer = await master.read(addr, length)
    assert int(answer.resp) == resp, f"read {addr:#x}"
    want = (data >> 8 * shift & (1 << 8 * length) - 1).to_bytes(length, "little")
    assert answer.data == want, f"read {addr:#x}"
    return resp


async def write(master, model, addr, value, length):
    """A write of ``length`` bytes of ``value`` at ``addr`` (within one word)."""
    shift = addr % 4
    strb = ((1 << length) - 1) << shift
    resp = model.write(addr - shift, value << 8 * shift, strb)
    answer = await master.write(addr, (value & (1 << 8 * length) - 1).to_bytes(length, "little"))
    assert int(answer.resp) == resp, f"write {addr:#x}"
    return resp


@cocotb.test()
async def every_kind(dut):
    rng, master, regmap, model, got = await setup(dut)
    for word in regmap.words():             # reset values (RO inputs 0)
        await read(master, model, word.offset, 4)
    await check_outputs(dut, model, regmap, got)
    counts = {OKAY: 0, SLVERR: 0}
    for _ in range(600):
        x = rng.random()
        if x < 0.1:
            set_inputs(dut, model, rng)
        elif x < 0.25:
            events = rng.getrandbits(3)
            dut.int_status.value = events
            await RisingEdge(dut.clk)
            dut.int_status.value = 0
            model.status["int_status"] |= events
        if rng.random() < 0.7:
            addr = rng.choice(regmap.words()).offset
        else:
            addr = rng.choice([rng.randrange(0x200), rng.getrandbits(16)]) & ~3
        length = 4
        if rng.random() < 0.25:
            length = rng.randint(1, 3)
            addr += rng.randrange(5 - length)
        if rng.random() < 0.5:
            resp = await read(master, model, addr, length)
        else:
            resp = await write(master, model, addr, rng.getrandbits(32), length)
        counts[resp] += 1
        await check_outputs(dut, model, regmap, got)
    # A 64-bit counter about to carry: the high word is the one latched by the low read.
    value = (rng.getrandbits(32) << 32) | 0xFFFF_FFFF
    dut.rx_packets.value = value
    await RisingEdge(dut.clk)
    lo = await master.read(0x10, 4)
    dut.rx_packets.value = (value + 1) % (1 << 64)
    hi = await master.read(0x14, 4)
    assert int.from_bytes(lo.data + hi.data, "little") == value
    assert counts[OKAY] > 300 and counts[SLVERR] > 60
    assert len(got["doorbell"]) > 20 and len(got["kick"]) > 5


@cocotb.test()
async def pipelined(dut):
    """Writes and reads issued at once (cocotbext keeps many outstanding): responses in order."""
    rng, master, regmap, model, got = await setup(dut)
    set_inputs(dut, model, rng)
    await RisingEdge(dut.clk)
    targets = [w.offset for w in regmap.words() if w.register.name != "int_status"]
    writes = [(rng.choice(targets + [0x104, 0x3000]), rng.getrandbits(32)) for _ in range(150)]
    reads = [rng.choice([0x00, 0x10, 0x14, 0x28, 0x40, 0x4C, 0x104]) for _ in range(150)]
    want_b = [model.write(a, v, 0xF) for a, v in writes]
    want_r = [model.read(a) for a in reads]
    pending = [cocotb.start_soon(master.write(a, v.to_bytes(4, "little"))) for a, v in writes]
    pending += [cocotb.start_soon(master.read(a, 4)) for a in reads]
    answers = [await task for task in pending]
    assert [int(a.resp) for a in answers[:len(writes)]] == want_b
    assert [(int.from_bytes(a.data, "little"), int(a.resp)) for a in answers[len(writes):]] \
        == want_r
    await check_outputs(dut, model, regmap, got)


def test_axil_bank_cocotb():
    run_cocotb("iwarp_csr_example", RegisterBank(example_map()), "test_axil_cocotb",
               test_dir=Path(__file__).parent, env={"IWARP_SEED": random.Random(5).randrange(1000)})
