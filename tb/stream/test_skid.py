"""SkidBuffer and HalfRateSlice as generated Verilog: cocotb with random back-pressure, and bulk
via the player."""

import random
from pathlib import Path

import cocotb
import pytest

from iwarp_nic.stream import BeatLayout, HalfRateSlice, SkidBuffer
from iwarp_tb import cocotb_env
from iwarp_tb.beats import Packet, from_beats, to_beats
from iwarp_tb.runner import BeatPlayer, run_cocotb
from iwarp_tb.streams import StreamPort, recv_packets, send_packets

WIDTHS = (1, 8, 64)
#: Each slice by its tops' name, and the cycles it takes per transfer with no idles or stalls.
KINDS = {"skid": (SkidBuffer, 1), "half_slice": (HalfRateSlice, 2)}


def random_packets(rng, count, max_len, err_rate=0.2):
    return [Packet(rng.randbytes(rng.randint(1, max_len)), rng.random() < err_rate)
            for _ in range(count)]


@cocotb.test()
async def skid_random_backpressure(dut):
    width = cocotb_env.param("WIDTH")
    rng = cocotb_env.rng()
    bus = await cocotb_env.start(dut)
    packets = random_packets(rng, 300, 200)
    sender = cocotb.start_soon(send_packets(bus, StreamPort.axis(dut, "s_axis"), packets, width,
                                            rng=rng, idle=0.3))
    got = await recv_packets(bus, StreamPort.axis(dut, "m_axis"), len(packets), width, rng=rng,
                             stall=0.3)
    await sender
    assert got == packets
    assert [p.err for p in got] == [p.err for p in packets]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("width", WIDTHS)
def test_skid_cocotb(width, kind):
    cls, _ = KINDS[kind]
    run_cocotb(f"iwarp_{kind}_w{width}", cls(BeatLayout(width, err=True)), "test_skid",
               test_dir=Path(__file__).parent, env={"WIDTH": width, "IWARP_SEED": width})


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("width", WIDTHS)
def test_skid_bulk(width, kind):
    """200 000 beats with random idles and stalls: every byte and err flag comes out in order,
    and with no idles or stalls the skid buffer passes one beat per cycle, the half-rate slice
    one every other cycle."""
    cls, cycles_per_beat = KINDS[kind]
    rng = random.Random(width)
    player = BeatPlayer(f"iwarp_{kind}_w{width}", cls(BeatLayout(width, err=True)))
    packets = random_packets(rng, 200_000 * width // 500, 1000)
    out = player.play(packets, idle=0.3, ready=0.7, seed=width)
    got = from_beats(out, width)
    assert got == packets and [p.err for p in got] == [p.err for p in packets]

    beats = sum(len(to_beats(p, width)) for p in packets)
    out = player.play(packets)
    assert out.stats["in_beats"] == out.stats["out_transfers"] == beats
    assert out.cycles[-1] - out.cycles[0] == cycles_per_beat * (beats - 1)
