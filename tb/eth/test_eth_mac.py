"""The GMII and XGMII MACs as generated Verilog, against cocotbext-eth's PHY-side models.

* RX: frames from ``GmiiSource``/``XgmiiSource`` (with the default deficit idle count, so XGMII
  starts land in lane 0 and lane 4) come out of ``m_axis`` byte-exact, FCS stripped; frames with
  a bad FCS or a PHY error come out with ``tuser`` (err) set, and the counters agree.
* TX: frames into ``s_axis`` leave on the PHY pins, and ``GmiiSink``/``XgmiiSink`` decode them
  with a good FCS (checked by ``check_fcs``); runts are padded to 60 bytes.
* Throughput: a train of 1514-byte frames through TX and through RX, in bytes per cycle,
  printed against the line-rate ceiling (preamble, FCS and a 12-byte gap per frame).
"""

import random
import struct
import zlib
from pathlib import Path

import cocotb
import pytest
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.eth import GmiiFrame, GmiiSink, GmiiSource, XgmiiFrame, XgmiiSink, XgmiiSource
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from iwarp_nic.eth import GmiiMac, XgmiiMac
from iwarp_tb import cocotb_env
from iwarp_tb.beats import Packet
from iwarp_tb.runner import run_cocotb
from iwarp_tb.streams import StreamPort, recv_packets, send_packets

TRAIN = 20
FRAME = 1514


def scapy_frame(rng, length):
    """A UDP/IPv4 Ethernet frame (no FCS) of ``length`` >= 42 bytes, or raw bytes below."""
    if length < 42:
        return rng.randbytes(length)
    udp = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(
        src="10.0.0.1", dst="10.0.0.2") / UDP(sport=rng.randrange(65536), dport=4791)
    return bytes(udp / rng.randbytes(length - 42))


def phy_models(dut, width):
    """(source into RX, sink from TX, Frame class)."""
    if width == 1:
        return (GmiiSource(dut.gmii_rxd, dut.gmii_rx_er, dut.gmii_rx_dv, dut.clk, dut.rst),
                GmiiSink(dut.gmii_txd, dut.gmii_tx_er, dut.gmii_tx_en, dut.clk, dut.rst),
                GmiiFrame)
    return (XgmiiSource(dut.xgmii_rxd, dut.xgmii_rxc, dut.clk, dut.rst),
            XgmiiSink(dut.xgmii_txd, dut.xgmii_txc, dut.clk, dut.rst), XgmiiFrame)


def corrupt(frame_cls, payload, rng):
    """A frame with a PHY error on one byte: rx_er on GMII, /E/ on XGMII."""
    frame = frame_cls.from_payload(payload)
    at = rng.randrange(8, len(frame.data))
    if frame_cls is GmiiFrame:
        frame.error = [int(j == at) for j in range(len(frame.data))]
        return frame, payload
    frame.ctrl = [int(j == at) for j in range(len(frame.data))]
    frame.data[at] = 0xFE
    seen = bytearray(payload)
    if at - 8 < len(seen):
        seen[at - 8] = 0xFE
    return frame, bytes(seen)


async def setup(dut):
    width = cocotb_env.param("WIDTH")
    rng = cocotb_env.rng()
    bus = await cocotb_env.start(dut, period_ns=8 if width == 1 else 6.4)
    source, sink, frame_cls = phy_models(dut, width)
    dut.s_axis_tvalid.value = 0
    dut.m_axis_tready.value = 1
    return width, rng, bus, source, sink, frame_cls


@cocotb.test()
async def rx_frames(dut):
    width, rng, bus, source, _, frame_cls = await setup(dut)
    expected, counts = [], {"ok": 0, "fcs": 0, "phy": 0}
    for _ in range(60):
        payload = scapy_frame(rng, rng.randint(60, 400))
        kind = rng.choice(["ok", "ok", "ok", "fcs", "phy"])
        if kind == "ok":
            await source.send(frame_cls.from_payload(payload))
            expected.append(Packet(payload))
        elif kind == "fcs":
            bad = struct.pack("<L", zlib.crc32(payload) ^ 1)
            await source.send(frame_cls.from_raw_payload(payload + bad))
            expected.append(Packet(payload, True))
        else:
            frame, seen = corrupt(frame_cls, payload, rng)
            await source.send(frame)
            expected.append(Packet(seen, True))
        counts[kind] += 1
    got = await recv_packets(bus, StreamPort.axis(dut, "m_axis"), len(expected), width,
                             timeout=100_000)
    assert got == expected
    assert [p.err for p in got] == [p.err for p in expected]
    await ClockCycles(dut.clk, 10)
    assert int(dut.rx_frames_ok.value) == counts["ok"]
    assert int(dut.rx_bad_fcs.value) == counts["fcs"]
    assert int(dut.rx_phy_errors.value) == counts["phy"]
    assert int(dut.rx_runts.value) == int(dut.rx_oversize.value) == 0


@cocotb.test()
async def tx_frames(dut):
    width, rng, bus, _, sink, _ = await setup(dut)
    packets = [scapy_frame(rng, rng.choice([rng.randint(14, 59), rng.randint(60, 400)]))
               for _ in range(60)]
    sender = cocotb.start_soon(send_packets(bus, StreamPort.axis(dut, "s_axis"), packets,
                                            width))
    for packet in packets:
        frame = await sink.recv()
        assert frame.check_fcs(), "cocotbext-eth finds a bad FCS"
        assert frame.get_payload() == packet + bytes(max(0, 60 - len(packet)))
    await sender
    # A frame sent with err leaves with a bad FCS.
    await send_packets(bus, StreamPort.axis(dut, "s_axis"), [Packet(packets[0], True)], width)
    frame = await sink.recv()
    assert not frame.check_fcs()
    assert int(dut.tx_frames.value) == len(packets) + 1


async def count_cycles(dut, valid, ready, last, frames):
    """Cycles from the first transfer of the first frame to the first of frame ``frames``."""
    cycle, starts, first = 0, [], True
    while len(starts) <= frames:
        await RisingEdge(dut.clk)
        cycle += 1
        if int(valid.value) and int(ready.value):
            if first:
                starts.append(cycle)
            first = bool(int(last.value))
    return starts[-1] - starts[0]


@cocotb.test()
async def throughput(dut):
    width, rng, bus, source, sink, frame_cls = await setup(dut)
    packets = [scapy_frame(rng, FRAME) for _ in range(TRAIN + 1)]
    ceiling = width * FRAME / (FRAME + 4 + 8 + 12)

    # TX: the source offers every beat at once; the MAC sets the pace.
    counter = cocotb.start_soon(count_cycles(dut, dut.s_axis_tvalid, dut.s_axis_tready,
                                             dut.s_axis_tlast, TRAIN))
    sender = cocotb.start_soon(send_packets(bus, StreamPort.axis(dut, "s_axis"), packets,
                                            width))
    tx_cycles = await counter
    await sender
    for _ in packets:
        assert (await sink.recv()).check_fcs()

    # RX: the PHY model sends back to back with the minimum gap.
    for packet in packets:
        await source.send(frame_cls.from_payload(packet))
    counter = cocotb.start_soon(count_cycles(dut, dut.m_axis_tvalid, dut.m_axis_tready,
                                             dut.m_axis_tlast, TRAIN))
    rx = cocotb.start_soon(recv_packets(bus, StreamPort.axis(dut, "m_axis"), len(packets),
                                        width, timeout=100_000))
    rx_cycles = await counter
    assert await rx == packets
    tx_rate, rx_rate = TRAIN * FRAME / tx_cycles, TRAIN * FRAME / rx_cycles
    cocotb.log.info("MAC w%d, %d-byte frames: TX %.4f, RX %.4f bytes/cycle; ceiling %.4f",
                    width, FRAME, tx_rate, rx_rate, ceiling)
    print(f"\nMAC w{width} {FRAME}-byte frames: TX {tx_rate:.4f} B/cycle, RX {rx_rate:.4f} "
          f"B/cycle, line-rate ceiling {ceiling:.4f}")
    # TX rounds the gap up to whole words at width 8 (no deficit idle count): 193 cycles/frame.
    assert tx_rate >= (ceiling if width == 1 else FRAME / 193) - 1e-9
    assert rx_rate >= ceiling - 0.01


@pytest.mark.parametrize("phy", ["gmii", "xgmii"])
def test_mac_cocotb(phy):
    width, mac = {"gmii": (1, GmiiMac), "xgmii": (8, XgmiiMac)}[phy]
    run_cocotb(f"iwarp_mac_{phy}", mac(), "test_eth_mac", test_dir=Path(__file__).parent,
               env={"WIDTH": width, "IWARP_SEED": random.Random(phy).randrange(1000)})
