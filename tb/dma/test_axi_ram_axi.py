"""AxiRam's AXI4 port as generated Verilog (``iwarp_axi_ram_w8``, ``iwarp_axi_ram_w64``: 64 KiB
at 0; the word port idle: ``hdl/tests/test_axi_ram.py`` covers it) under Verilator, driven by
cocotbext-axi's ``AxiMaster``, an independent AXI4 manager (it splits at 4 KiB, strobes
unaligned ends, and checks IDs and ``rlast``), with random pauses on all five channels.

* ``random_access``: 200 writes and reads of random ranges (any alignment, 1 octet to 3 KiB,
  several in flight at once) against a bytearray of the whole RAM, then the whole RAM read
  back: the writes landed, and no octet outside them changed.
* ``refused_bursts``: writes and reads outside the RAM answer DECERR, a narrow write or read
  (``size`` below the lanes) SLVERR; none of them changes the RAM, and refused reads return
  zeros.
"""

import random
from pathlib import Path

import cocotb
import pytest
from cocotb.triggers import Combine
from cocotbext.axi import AxiBus, AxiMaster, AxiResp

from iwarp_nic.axi_ram import AxiRam
from iwarp_tb import cocotb_env
from iwarp_tb.runner import run_cocotb

SIZE = 65536


def pauses(rng, chance):
    """A pause generator for a cocotbext-axi channel: paused ``chance`` of the cycles."""
    while True:
        yield rng.random() < chance


async def setup(dut):
    rng = cocotb_env.rng()
    master = AxiMaster(AxiBus.from_prefix(dut, "s_axi"), dut.clk, dut.rst)
    for channel in (master.write_if.aw_channel, master.write_if.w_channel,
                    master.write_if.b_channel, master.read_if.ar_channel,
                    master.read_if.r_channel):
        channel.set_pause_generator(pauses(random.Random(rng.random()), 0.3))
    dut.s_axis_write_tvalid.value = 0           # the word port stays idle here
    dut.s_axis_read_tvalid.value = 0
    await cocotb_env.start(dut)
    return rng, master


@cocotb.test()
async def random_access(dut):
    rng, master = await setup(dut)
    memory = bytearray(SIZE)

    async def one(addr, length, write):
        if write:
            data = rng.randbytes(length)
            memory[addr:addr + length] = data      # ranges in flight at once are disjoint
            response = await master.write(addr, data)
            assert response.resp == AxiResp.OKAY
        else:
            expect = bytes(memory[addr:addr + length])
            response = await master.read(addr, length)
            assert response.resp == AxiResp.OKAY
            assert response.data == expect, hex(addr)

    for _ in range(50):
        starts = sorted(rng.sample(range(0, SIZE - 3072, 3072), 4))
        batch = [one(a + rng.randrange(64), rng.randint(1, 3000), rng.random() < 0.6)
                 for a in starts]
        await Combine(*[cocotb.start_soon(c) for c in batch])
    whole = await master.read(0, SIZE)
    assert whole.resp == AxiResp.OKAY and whole.data == bytes(memory)


@cocotb.test()
async def refused_bursts(dut):
    rng, master = await setup(dut)
    width = cocotb_env.param("WIDTH")
    contents = rng.randbytes(SIZE)
    assert (await master.write(0, contents)).resp == AxiResp.OKAY
    for addr in (SIZE, SIZE + 4096 + 7, 1 << 40, (1 << 64) - 4096):
        assert (await master.write(addr, bytes(range(100)))).resp == AxiResp.DECERR
        read = await master.read(addr, 100)
        assert read.resp == AxiResp.DECERR and read.data == bytes(100)
    narrow = (width // 2).bit_length() - 1
    assert (await master.write(256, bytes(64), size=narrow)).resp == AxiResp.SLVERR
    read = await master.read(256, 64, size=narrow)
    assert read.resp == AxiResp.SLVERR and read.data == bytes(64)
    whole = await master.read(0, SIZE)
    assert whole.resp == AxiResp.OKAY and whole.data == contents


@pytest.mark.parametrize("width", (8, 64))
def test_axi_ram_axi(width):
    run_cocotb(f"iwarp_axi_ram_w{width}", AxiRam(width, SIZE), "test_axi_ram_axi",
               test_dir=Path(__file__).parent, env={"WIDTH": width, "IWARP_SEED": width})
