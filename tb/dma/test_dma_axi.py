"""DmaMaster as generated Verilog (``iwarp_dma_w8``, ``iwarp_dma_w64``: three write and three
read clients) under Verilator, against cocotbext-axi's ``AxiRam``, an independent AXI4
subordinate that asserts the 4 KiB rule and ``wlast`` itself.

* ``random_traffic``: every client at once, each with random idle cycles and back-pressure, and
  random pauses on all five AXI channels of the RAM: write clients write random disjoint
  ranges (any alignment and length, 0 included, across 4 KiB boundaries) and read clients read
  others. Reference: a Python byte model of the whole region (random old contents plus the
  commanded writes), so a stray byte written anywhere in it fails; the read data must be the
  RAM's bytes; each write client gets one ``done`` per command, without error.
* ``write_then_read``: a client reads back what a write client wrote, each read issued after
  the write's ``done`` (the ordering the upper layers rely on).
* ``own_memory_model``: the same kind of traffic against the project's own
  :class:`iwarp_tb.axi_memory.AxiMemory` (so that model is known to work under cocotb as well).

AxiRam has no error injection: SLVERR/DECERR handling is covered by ``hdl/tests/test_dma.py``.
"""

import random
from pathlib import Path

import cocotb
import pytest
from cocotbext.axi import AxiBus, AxiRam

from iwarp_nic.dma import DmaMaster
from iwarp_tb import cocotb_env
from iwarp_tb.runner import run_cocotb
from iwarp_tb.streams import StreamPort, recv, recv_packets, send, send_packets

CLIENTS = 3
COMMANDS = 60                         # per client in random_traffic
BASE = 0xFFFF_F000_0000_0000          # high address bits set; the RAM takes addresses modulo
RAM_SIZE = 1 << 22
SPAN = 1 << 21                        # the region the test uses, from BASE


def pauses(rng, chance):
    """A pause generator for a cocotbext-axi channel: paused ``chance`` of the cycles."""
    while True:
        yield rng.random() < chance


def ranges(rng, n, count, at):
    """``count`` disjoint ``(addr, length)`` from ``at``; returns them and the next address."""
    out = []
    for _ in range(count):
        at += rng.randint(0, 100)
        if rng.random() < 0.3:
            at = max(at, (at | 0xFFF) + 1 - rng.randint(1, 3 * n))
        length = rng.choice([0, rng.randint(1, 2 * n + 1), rng.randint(1, 3000)])
        out.append((at, length))
        at += length
    return out, at


def command(addr, length):
    return {"data": addr | length << 64}   # DmaCommand packed: addr, then length


async def setup(dut):
    width = cocotb_env.param("WIDTH")
    rng = cocotb_env.rng()
    for k in range(CLIENTS):
        getattr(dut, f"s_axis_write{k}_command_tvalid").value = 0
        getattr(dut, f"s_axis_write{k}_data_tvalid").value = 0
        getattr(dut, f"m_axis_write{k}_done_tready").value = 0
        getattr(dut, f"s_axis_read{k}_command_tvalid").value = 0
        getattr(dut, f"m_axis_read{k}_data_tready").value = 0
    ram = AxiRam(AxiBus.from_prefix(dut, "m_axi"), dut.clk, dut.rst, size=RAM_SIZE)
    bus = await cocotb_env.start(dut)
    return width, rng, bus, ram


def ram_offset(addr):
    return addr % RAM_SIZE


async def write_client(bus, dut, k, cmds, payloads, rng, *, idle, stall):
    """Commands and data (each on its own, the data may lead); returns the done flags."""
    port = StreamPort.axis
    commander = cocotb.start_soon(send(bus, port(dut, f"s_axis_write{k}_command"),
                                       [command(a, n) for a, n in cmds], rng=rng, idle=idle,
                                       timeout=100_000))
    feeder = cocotb.start_soon(send_packets(bus, port(dut, f"s_axis_write{k}_data"),
                                            [p for p in payloads if p],
                                            len(dut.s_axis_write0_data_tkeep), rng=rng,
                                            idle=idle, timeout=100_000))
    done = await recv(bus, port(dut, f"m_axis_write{k}_done"), len(cmds), rng=rng, stall=stall,
                      timeout=100_000)
    await commander
    await feeder
    return [t["data"] for t in done]


async def read_client(bus, dut, k, cmds, rng, *, idle, stall):
    port = StreamPort.axis
    commander = cocotb.start_soon(send(bus, port(dut, f"s_axis_read{k}_command"),
                                       [command(a, n) for a, n in cmds], rng=rng, idle=idle,
                                       timeout=100_000))
    got = await recv_packets(bus, port(dut, f"m_axis_read{k}_data"),
                             sum(1 for _, n in cmds if n), len(dut.s_axis_write0_data_tkeep),
                             rng=rng, stall=stall, timeout=100_000)
    await commander
    return got


@cocotb.test()
async def random_traffic(dut):
    width, rng, bus, ram = await setup(dut)
    for channel in (ram.write_if.aw_channel, ram.write_if.w_channel, ram.write_if.b_channel,
                    ram.read_if.ar_channel, ram.read_if.r_channel):
        channel.set_pause_generator(pauses(random.Random(rng.random()), 0.3))
    model = bytearray(rng.randbytes(SPAN))
    ram.write(ram_offset(BASE), model)

    at, writes, reads = BASE + 1, [], []
    for _ in range(CLIENTS):
        cmds, at = ranges(rng, width, COMMANDS, at)
        payloads = [rng.randbytes(n) for _, n in cmds]
        writes.append((cmds, payloads))
        for (a, n), p in zip(cmds, payloads):
            model[a - BASE:a - BASE + n] = p
    for _ in range(CLIENTS):
        cmds, at = ranges(rng, width, COMMANDS, at)
        reads.append(cmds)
    assert at < BASE + SPAN

    tasks = [cocotb.start_soon(write_client(bus, dut, k, cmds, payloads,
                                            random.Random(rng.random()), idle=0.3, stall=0.3))
             for k, (cmds, payloads) in enumerate(writes)]
    tasks += [cocotb.start_soon(read_client(bus, dut, k, cmds, random.Random(rng.random()),
                                            idle=0.3, stall=0.3))
              for k, cmds in enumerate(reads)]
    results = [await t for t in tasks]
    for k, (cmds, _) in enumerate(writes):
        assert results[k] == [0] * len(cmds), f"write client {k}: done flags"
    for k, cmds in enumerate(reads):
        expect = [bytes(model[a - BASE:a - BASE + n]) for a, n in cmds if n]
        got = results[CLIENTS + k]
        assert [bytes(p) for p in got] == expect, f"read client {k}"
        assert not any(p.err for p in got)
    assert ram.read(ram_offset(BASE), SPAN) == model, "memory differs from the byte model"


@cocotb.test()
async def write_then_read(dut):
    width, rng, bus, ram = await setup(dut)
    for channel in (ram.write_if.w_channel, ram.read_if.r_channel):
        channel.set_pause_generator(pauses(random.Random(rng.random()), 0.2))
    cmds, _ = ranges(rng, width, 16, BASE + 3)
    cmds = [(a, n) for a, n in cmds if n]
    for a, n in cmds:
        data = rng.randbytes(n)
        done = await write_client(bus, dut, 1, [(a, n)], [data], rng, idle=0.1, stall=0.1)
        assert done == [0]
        got = await read_client(bus, dut, 2, [(a, n)], rng, idle=0.1, stall=0.1)
        assert [bytes(p) for p in got] == [data]


@pytest.mark.parametrize("width", (8, 64))
def test_dma_axi(width):
    run_cocotb(f"iwarp_dma_w{width}",
               DmaMaster(width, write_clients=CLIENTS, read_clients=CLIENTS), "test_dma_axi",
               test_dir=Path(__file__).parent, env={"WIDTH": width, "IWARP_SEED": width})


@cocotb.test()
async def own_memory_model(dut):
    """The project's own AXI4 memory model (:mod:`iwarp_tb.axi_memory`) serves the Verilog too:
    random writes and reads through it, with its protocol and shadow checks."""
    from iwarp_tb.axi_memory import AxiMemory
    width = cocotb_env.param("WIDTH")
    rng = cocotb_env.rng()
    for k in range(CLIENTS):
        getattr(dut, f"s_axis_write{k}_command_tvalid").value = 0
        getattr(dut, f"s_axis_write{k}_data_tvalid").value = 0
        getattr(dut, f"m_axis_write{k}_done_tready").value = 0
        getattr(dut, f"s_axis_read{k}_command_tvalid").value = 0
        getattr(dut, f"m_axis_read{k}_data_tready").value = 0
    bus = await cocotb_env.start(dut)
    memory = AxiMemory.from_prefix(dut, "m_axi", width, rng=random.Random(rng.random()),
                                   stall=0.3, b_latency=(0, 10), r_latency=(0, 20), max_burst=16)
    server = cocotb.start_soon(memory.run(bus))
    writes, at = ranges(rng, width, 20, BASE + 5)
    payloads = [rng.randbytes(n) for _, n in writes]
    for a, n in writes:
        memory.allow_write(a, n)
    reads, end = ranges(rng, width, 20, at)
    memory.write(at, rng.randbytes(end - at))
    done = cocotb.start_soon(write_client(bus, dut, 0, writes, payloads, rng, idle=0.3,
                                          stall=0.3))
    got = await read_client(bus, dut, 1, reads, rng, idle=0.3, stall=0.3)
    assert await done == [0] * len(writes)
    assert [bytes(p) for p in got] == [memory.read(a, n) for a, n in reads if n]
    for (a, n), p in zip(writes, payloads):
        assert memory.read(a, n) == p
    server.cancel()
