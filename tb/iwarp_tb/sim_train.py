"""cocotb test module for ``make sim``: a packet train through one CRC engine at full rate.

Parameters (environment, set by :mod:`iwarp_tb.sim`): ``WIDTH``, ``TRAIN`` (a file of packets,
each a u32 length then the bytes) and ``RESULTS`` (where the JSON goes). Input is offered every
cycle and the output is always ready; a monitor records the cycle of every last input beat and
every result, which give throughput and latency.
"""

import json
import struct
from pathlib import Path

import cocotb
from cocotb.triggers import RisingEdge

from . import cocotb_env
from .streams import StreamPort, recv, send_packets


def read_train(path):
    raw, packets, offset = Path(path).read_bytes(), [], 0
    while offset < len(raw):
        (length,) = struct.unpack_from("<I", raw, offset)
        packets.append(raw[offset + 4:offset + 4 + length])
        offset += 4 + length
    return packets


def write_train(path, packets):
    Path(path).write_bytes(b"".join(struct.pack("<I", len(p)) + p for p in packets))


async def _monitor(dut, events):
    cycle = 0
    while True:
        await RisingEdge(dut.clk)
        if dut.s_axis_tvalid.value and dut.s_axis_tready.value:
            events["first_in"] = events.get("first_in", cycle)
            if dut.s_axis_tlast.value:
                events["last_in"].append(cycle)
        if dut.m_axis_tvalid.value and dut.m_axis_tready.value:
            events["out"].append(cycle)
        cycle += 1


@cocotb.test()
async def packet_train(dut):
    width = cocotb_env.param("WIDTH")
    packets = read_train(cocotb_env.param("TRAIN", cast=str))
    bus = await cocotb_env.start(dut, period_ns=cocotb_env.param("PERIOD_PS") / 1000)
    events = {"last_in": [], "out": []}
    cocotb.start_soon(_monitor(dut, events))
    sender = cocotb.start_soon(send_packets(bus, StreamPort.axis(dut, "s_axis"), packets, width))
    results = await recv(bus, StreamPort.axis(dut, "m_axis"), len(packets))
    await sender
    Path(cocotb_env.param("RESULTS", cast=str)).write_text(json.dumps({
        "crcs": [r["data"] for r in results],
        "first_in_cycle": events["first_in"],
        "last_in_cycles": events["last_in"],
        "out_cycles": events["out"],
    }))
