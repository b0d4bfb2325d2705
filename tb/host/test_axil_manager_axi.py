"""The gateware AXI4-Lite manager (``iwarp_host_axil_manager_w4``:
:class:`iwarp_nic.host.axil.AxiLiteManager`, 16-bit addresses, 32-bit data) as generated
Verilog under Verilator, against cocotbext-axi's ``AxiLiteRam``, an independent AXI4-Lite
subordinate, with random pauses on its five channels and random idle and back-pressure on the
manager's request and answer streams.

``random_access``: 300 writes (random strobes) and 300 reads of random words, in rounds of
ten writes fed back to back then ten reads (a read is issued only once the writes it must see
are answered): every write is answered OKAY, every read returns the word the writes left,
and at the end the RAM holds exactly the writes' octets.
"""

import random
from pathlib import Path

import cocotb
from cocotbext.axi import AxiLiteBus, AxiLiteRam

from iwarp_nic.host.axil import AxiLiteManager
from iwarp_tb import cocotb_env
from iwarp_tb.runner import run_cocotb
from iwarp_tb.streams import StreamPort, recv, send

SIZE, COUNT = 4096, 300


def pauses(rng, chance):
    """A pause generator for a cocotbext-axi channel: paused ``chance`` of the cycles."""
    while True:
        yield rng.random() < chance


@cocotb.test()
async def random_access(dut):
    rng = cocotb_env.rng()
    ram = AxiLiteRam(AxiLiteBus.from_prefix(dut, "m_axil"), dut.clk, dut.rst, size=SIZE)
    for channel in (ram.write_if.aw_channel, ram.write_if.w_channel, ram.write_if.b_channel,
                    ram.read_if.ar_channel, ram.read_if.r_channel):
        channel.set_pause_generator(pauses(random.Random(rng.random()), 0.3))
    dut.s_axis_write_tvalid.value = 0
    dut.s_axis_read_tvalid.value = 0
    dut.m_axis_write_done_tready.value = 0
    dut.m_axis_read_tready.value = 0
    bus = await cocotb_env.start(dut)
    memory = bytearray(SIZE)
    port = StreamPort.axis
    for _ in range(COUNT // 10):
        writes = [(rng.randrange(SIZE // 4) * 4, rng.getrandbits(32), rng.getrandbits(4))
                  for _ in range(10)]
        reads = [rng.randrange(SIZE // 4) * 4 for _ in range(10)]
        feeder = cocotb.start_soon(send(bus, port(dut, "s_axis_write"),
                                        [{"data": a | d << 16 | s << 48} for a, d, s in writes],
                                        rng=rng, idle=0.3))
        done = await recv(bus, port(dut, "m_axis_write_done"), len(writes), rng=rng, stall=0.3)
        await feeder
        assert [t["data"] for t in done] == [0] * len(writes)          # OKAY: no error
        for a, d, s in writes:
            for lane in range(4):
                if s >> lane & 1:
                    memory[a + lane] = d >> 8 * lane & 0xFF
        asker = cocotb.start_soon(send(bus, port(dut, "s_axis_read"),
                                       [{"data": a} for a in reads], rng=rng, idle=0.3))
        got = await recv(bus, port(dut, "m_axis_read"), len(reads), rng=rng, stall=0.3)
        await asker
        assert [t["data"] for t in got] == [int.from_bytes(memory[a:a + 4], "little")
                                            for a in reads]       # data, error 0
    assert ram.read(0, SIZE) == bytes(memory)


def test_axil_manager_axi():
    run_cocotb("iwarp_host_axil_manager_w4", AxiLiteManager(16, 4), "test_axil_manager_axi",
               test_dir=Path(__file__).parent, env={"IWARP_SEED": 4})
